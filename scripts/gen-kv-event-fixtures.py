#!/usr/bin/env python3
"""Writes byte-exact vLLM KV-event payloads to test/fixtures/kv-events/.

How they are built: vLLM encodes its events with msgspec (vllm/distributed/kv_events.py).
EventBatch and the events are msgspec Structs with omit_defaults=True; the events are
tagged (tag=True), so the tag field "type" with the class name comes first. Newer releases
encode structs as maps (field names in declaration order, fields equal to their default
omitted); older releases used array_like=True, which encodes the same fields positionally
(the tag first, trailing defaults omitted). msgspec writes floats as float64, ints in the
smallest msgpack integer form, bytes as bin, None as nil. This script has its own minimal
msgpack writer following those rules (no msgpack library is installed here), so the
fixtures do not come from the decoder under test.
Each fixture: NAME.bin (the payload) and NAME.json (what it must decode to).
"""
import hashlib
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures", "kv-events")


def pack(v):
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v <= 0x7F:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack("b", v)
        if 0 <= v <= 0xFF:
            return b"\xcc" + struct.pack(">B", v)
        if 0 <= v <= 0xFFFF:
            return b"\xcd" + struct.pack(">H", v)
        if 0 <= v <= 0xFFFFFFFF:
            return b"\xce" + struct.pack(">I", v)
        if 0 <= v <= 0xFFFFFFFFFFFFFFFF:
            return b"\xcf" + struct.pack(">Q", v)
        if -0x80 <= v:
            return b"\xd0" + struct.pack(">b", v)
        if -0x8000 <= v:
            return b"\xd1" + struct.pack(">h", v)
        if -0x80000000 <= v:
            return b"\xd2" + struct.pack(">i", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode()
        if len(b) < 32:
            return bytes([0xA0 | len(b)]) + b
        if len(b) <= 0xFF:
            return b"\xd9" + bytes([len(b)]) + b
        return b"\xda" + struct.pack(">H", len(b)) + b
    if isinstance(v, bytes):
        if len(v) <= 0xFF:
            return b"\xc4" + bytes([len(v)]) + v
        return b"\xc5" + struct.pack(">H", len(v)) + v
    if isinstance(v, list):
        head = bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdc" + struct.pack(">H", len(v))
        return head + b"".join(pack(x) for x in v)
    if isinstance(v, dict):
        head = bytes([0x80 | len(v)]) if len(v) < 16 else b"\xde" + struct.pack(">H", len(v))
        return head + b"".join(pack(k) + pack(x) for k, x in v.items())
    raise TypeError(type(v))


STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                 "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
STORED_DEFAULTED = {"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"]
REMOVED_DEFAULTED = {"group_idx"}


def event(kind, fields, array_like):
    names = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS, "AllBlocksCleared": []}[kind]
    defaulted = {"BlockStored": STORED_DEFAULTED, "BlockRemoved": REMOVED_DEFAULTED, "AllBlocksCleared": set()}[kind]
    if array_like:
        values = [fields.get(n) for n in names]
        while values and names[len(values) - 1] in defaulted and values[-1] is None:
            values.pop()  # trailing defaults are omitted
        return [kind] + values
    m = {"type": kind}
    for n in names:
        if n in defaulted and fields.get(n) is None:
            continue
        m[n] = fields.get(n)
    return m


def batch(ts, events, rank, array_like):
    if array_like:
        return [ts, events] if rank is None else [ts, events, rank]
    m = {"ts": ts, "events": events}
    if rank is not None:
        m["data_parallel_rank"] = rank
    return m


def expected_hash(h):
    return {"bigint": str(h)} if isinstance(h, int) else {"hex": h.hex()}


def expected(kind, f):
    if kind == "BlockStored":
        return {"type": kind, "blockHashes": [expected_hash(h) for h in f["block_hashes"]],
                "parentBlockHash": None if f.get("parent_block_hash") is None else expected_hash(f["parent_block_hash"]),
                "tokenIds": f["token_ids"], "blockSize": f["block_size"], "loraId": f.get("lora_id"),
                "medium": f.get("medium"), "loraName": f.get("lora_name"), "groupIdx": f.get("group_idx")}
    if kind == "BlockRemoved":
        return {"type": kind, "blockHashes": [expected_hash(h) for h in f["block_hashes"]], "medium": f.get("medium"),
                "groupIdx": f.get("group_idx")}
    return {"type": kind}


def main():
    os.makedirs(OUT, exist_ok=True)
    tokens = list(range(1000, 1032))  # two blocks of 16
    big = [0xFEDCBA9876543210, 0x8000000000000001]  # above 2^53: plain JS numbers would lose bits
    digests = [hashlib.sha256(b"block-%d" % i).digest() for i in range(2)]
    cases = {
        "stored-int": ("BlockStored", {"block_hashes": big, "parent_block_hash": 12345, "token_ids": tokens, "block_size": 16,
                                        "lora_id": None, "medium": "GPU", "lora_name": None}),
        "stored-bytes-lora": ("BlockStored", {"block_hashes": digests, "parent_block_hash": None, "token_ids": tokens,
                                               "block_size": 16, "lora_id": 3, "medium": "CPU", "lora_name": "sql-adapter",
                                               "group_idx": 0}),
        "removed-int": ("BlockRemoved", {"block_hashes": big, "medium": "GPU"}),
        "removed-bytes": ("BlockRemoved", {"block_hashes": digests, "medium": None, "group_idx": 1}),
        "cleared": ("AllBlocksCleared", {}),
    }
    index = []
    for name, (kind, fields) in cases.items():
        for array_like in (False, True):
            for rank in ((0,) if not array_like else (None, 2)):
                enc = "array" if array_like else "map"
                fname = f"{name}-{enc}" + ("" if rank in (0,) and not array_like else f"-rank{rank}" if rank is not None else "-norank")
                payload = pack(batch(1730000000.25, [event(kind, fields, array_like)], rank, array_like))
                with open(os.path.join(OUT, fname + ".bin"), "wb") as f:
                    f.write(payload)
                exp = {"ts": 1730000000.25, "dataParallelRank": rank, "events": [expected(kind, fields)]}
                with open(os.path.join(OUT, fname + ".json"), "w") as f:
                    json.dump(exp, f, indent=1)
                index.append(fname)
    print(f"wrote {len(index)} fixtures to {OUT}: {', '.join(index)}")


if __name__ == "__main__":
    main()
