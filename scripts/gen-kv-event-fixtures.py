#!/usr/bin/env python3
"""Writes KV-event payloads to test/fixtures/kv-events/, encoded the way the engines encode them.

Each engine encodes its events with msgspec (vLLM: vllm/distributed/kv_events.py; SGLang:
python/sglang/srt/disaggregation/kv_events.py). This script declares msgspec Structs that
mirror those definitions field for field, in every historical shape, and encodes with
msgspec's own msgpack encoder, so the bytes are what an engine of that release sends. Shapes
(vLLM pull requests that changed the schema, as listed in vllm-project/vllm#42892):

  v0.9     array_like batch [ts, events]; BlockStored [hashes, parent, tokens, block_size,
           lora_id]; BlockRemoved [hashes]                                (#16750)
  dp       EventBatch gains data_parallel_rank = None
  medium   BlockStored/BlockRemoved gain medium                             (#19737)
  lora     BlockStored gains lora_name                                      (#27577)
  extra    BlockStored gains extra_keys = None                              (#33304)
  group    BlockStored/BlockRemoved gain group_idx = None                   (#37688)
  spec     BlockStored gains kv_cache_spec_kind, kv_cache_spec_sliding_window = None (#40984)
  mapev    events are tagged maps, the batch stays an array                 (#42892)
  map      the batch is a map too (EventBatch without array_like, as on vLLM main)
  typed    (proposed in #55488, closed without merging: no release sends it) BlockStored gains
           event_version (1 when its extra_keys are typed) and its extra_keys
           entries are tuples of tagged ExtraKey maps (LoRAKey, CacheSaltKey, PromptEmbedsKey,
           MultiModalKey, LegacyExtraKey) built by extra_keys_to_typed; with the placement
           fields, the batch positional

plus SGLang's (array_like, one BlockStored per page with block_size = len(page), signed
64-bit hashes; newer releases add medium; since sgl-project/sglang#30827 a salted store
appends a {cache_salt} metadata map after medium; since sgl-project/sglang#37482 events are
tagged maps with cache_salt and session_id fields, and later lora_name), vLLM's offloading connector (BlockStored with
token_ids [], parent None, medium "CPU", its own block size), hybrid models (group_idx,
kv_cache_spec_kind "sliding_window"/"mamba"), and a future release adding a field.

Each fixture: NAME.bin (the payload) and NAME.json (what it must decode to, written from the
values given to the encoder, not from the decoder under test). Also writes
vllm-block-hash.json: vLLM's block hashes (vllm/v1/core/kv_cache_utils.py hash_block_tokens,
NONE_HASH from PYTHONHASHSEED) under each --prefix-caching-hash-algo (sha256, sha256_cbor,
xxhash, xxhash_cbor: vllm/utils/hashing.py) computed here with pickle, cbor2, hashlib and
xxhash, exactly as vLLM computes them; and xxh3-128.json: xxhash.xxh3_128_digest of inputs of
every length class.

Run: pip install msgspec cbor2 xxhash && python3 scripts/gen-kv-event-fixtures.py
"""
import hashlib
import pickle
import json
import os
import shutil
from typing import Any, Optional, Union

import cbor2
import msgspec
import xxhash

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures", "kv-events")
Hash = Union[bytes, int]


# vLLM's typed extra keys (vllm/distributed/kv_events.py: ExtraKey, its subclasses and
# ExtraKeyUnion), field for field: each encodes as a map {"type": tag, fields...}
class ExtraKey(msgspec.Struct, gc=False, frozen=True, tag=True):
    pass


class LoRAKey(ExtraKey, frozen=True, tag="lora"):
    name: str


class CacheSaltKey(ExtraKey, frozen=True, tag="cache_salt"):
    salt: str


class PromptEmbedsKey(ExtraKey, frozen=True, tag="prompt_embeds"):
    hash: bytes


class MultiModalKey(ExtraKey, frozen=True, tag="mm"):
    modality: str
    hash: str
    block_offset: int


class LegacyExtraKey(ExtraKey, frozen=True, tag="legacy"):
    value: Any


ExtraKeyUnion = Union[ExtraKey, LoRAKey, CacheSaltKey, PromptEmbedsKey, MultiModalKey, LegacyExtraKey]


def extra_keys_to_typed(extra_keys_list, lora_name=None, cache_salt=None, mm_features=()):
    """vllm/distributed/kv_events.py extra_keys_to_typed, the request given by its LoRA name, its
    cache_salt and its mm_features as (identifier, modality, mm_hash): each block's bare keys
    (generate_block_hash_extra_keys) as typed ones, an unknown shape kept as LegacyExtraKey."""
    if extra_keys_list is None:
        return None
    id_to_mm = {identifier: (modality, mm_hash or identifier) for identifier, modality, mm_hash in mm_features}
    out = []
    for block_keys in extra_keys_list:
        if block_keys is None:
            out.append(None)
            continue
        typed = []
        for key in block_keys:
            if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], int):
                modality, mm_hash = id_to_mm.get(key[0], ("", key[0]))
                typed.append(MultiModalKey(modality=modality, hash=mm_hash, block_offset=key[1]))
            elif isinstance(key, bytes):
                typed.append(PromptEmbedsKey(hash=key))
            elif isinstance(key, str) and lora_name is not None and key == lora_name:
                typed.append(LoRAKey(name=key))
            elif isinstance(key, str) and cache_salt is not None and key == cache_salt:
                typed.append(CacheSaltKey(salt=key))
            else:
                typed.append(LegacyExtraKey(value=key))
        out.append(tuple(typed))
    return out


def expected_extra_key(k):
    """An extra key as the decoder gives it: a typed key as the bare key it stands for (its
    to_tuple() in vLLM, one value unwrapped, a multimodal one [hash, block_offset]), bytes as
    {bytes: hex}, tuples as lists."""
    if isinstance(k, (LoRAKey, CacheSaltKey, PromptEmbedsKey, LegacyExtraKey)):
        k = {LoRAKey: lambda x: x.name, CacheSaltKey: lambda x: x.salt, PromptEmbedsKey: lambda x: x.hash,
             LegacyExtraKey: lambda x: x.value}[type(k)](k)
    elif isinstance(k, MultiModalKey):
        k = (k.hash, k.block_offset)
    if isinstance(k, bytes):
        return {"bytes": k.hex()}
    if isinstance(k, (tuple, list)):
        return [expected_extra_key(x) for x in k]
    return k


def shapes():
    """One namespace of msgspec Structs per historical shape (class names are the wire tags)."""
    out = {}

    def family(name, *, batch_array, events_array, rank, medium, lora_name, extra, group, spec, future=False,
               placement=False, typed=False):
        ev_kw = dict(omit_defaults=True, gc=False, tag=True)
        if events_array:
            ev_kw["array_like"] = True
        b_kw = dict(omit_defaults=True, gc=False)
        if batch_array:
            b_kw["array_like"] = True

        class KVCacheEvent(msgspec.Struct, **ev_kw):
            pass

        stored_fields = [("block_hashes", list[Hash]), ("parent_block_hash", Optional[Hash]), ("token_ids", list[int]),
                         ("block_size", int), ("lora_id", Optional[int])]
        removed_fields = [("block_hashes", list[Hash])]
        if medium:
            stored_fields.append(("medium", Optional[str]))
            removed_fields.append(("medium", Optional[str]))
        if lora_name:
            stored_fields.append(("lora_name", Optional[str]))
        if typed:
            stored_fields.append(("event_version", Optional[int], None))
            stored_fields.append(("extra_keys", Optional[list[Optional[tuple[ExtraKeyUnion, ...]]]], None))
        elif extra:
            stored_fields.append(("extra_keys", Optional[list[Optional[tuple]]], None))
        if group:
            stored_fields.append(("group_idx", Optional[int], None))
            removed_fields.append(("group_idx", Optional[int], None))
        if spec:
            stored_fields.append(("kv_cache_spec_kind", Optional[str], None))
            stored_fields.append(("kv_cache_spec_sliding_window", Optional[int], None))
        if placement:
            stored_fields += [("locality", Optional[str], None), ("ownership", Optional[str], None),
                              ("session_id", Optional[str], None)]
            removed_fields += [("locality", Optional[str], None), ("ownership", Optional[str], None)]
        if future:
            stored_fields.append(("future_field", Optional[str], None))
        BlockStored = msgspec.defstruct("BlockStored", stored_fields, bases=(KVCacheEvent,))
        BlockRemoved = msgspec.defstruct("BlockRemoved", removed_fields, bases=(KVCacheEvent,))
        AllBlocksCleared = msgspec.defstruct("AllBlocksCleared", [], bases=(KVCacheEvent,))
        batch_fields = [("ts", float), ("events", list[Any])]
        if rank:
            batch_fields.append(("data_parallel_rank", Optional[int], None))
        EventBatch = msgspec.defstruct("EventBatch", batch_fields, **b_kw)
        out[name] = dict(BlockStored=BlockStored, BlockRemoved=BlockRemoved, AllBlocksCleared=AllBlocksCleared,
                         EventBatch=EventBatch, stored=[f[0] for f in stored_fields], removed=[f[0] for f in removed_fields],
                         rank=rank)

    arr = dict(batch_array=True, events_array=True)
    family("v0.9", **arr, rank=False, medium=False, lora_name=False, extra=False, group=False, spec=False)
    family("dp", **arr, rank=True, medium=False, lora_name=False, extra=False, group=False, spec=False)
    family("medium", **arr, rank=True, medium=True, lora_name=False, extra=False, group=False, spec=False)
    family("lora", **arr, rank=True, medium=True, lora_name=True, extra=False, group=False, spec=False)
    family("extra", **arr, rank=True, medium=True, lora_name=True, extra=True, group=False, spec=False)
    family("group", **arr, rank=True, medium=True, lora_name=True, extra=True, group=True, spec=False)
    family("spec", **arr, rank=True, medium=True, lora_name=True, extra=True, group=True, spec=True)
    family("future", **arr, rank=True, medium=True, lora_name=True, extra=True, group=True, spec=True, future=True)
    family("mapev", batch_array=True, events_array=False, rank=True, medium=True, lora_name=True, extra=True, group=True, spec=True)
    family("map", batch_array=False, events_array=False, rank=True, medium=True, lora_name=True, extra=True, group=True, spec=True)
    # vLLM 0.26+: optional locality (#48281), ownership (#52067), session_id (#51381); the batch
    # positional, events tagged maps, as tests/v1/core/test_kv_events_contract.py pins them
    family("placement", batch_array=True, events_array=False, rank=True, medium=True, lora_name=True, extra=True, group=True,
           spec=True, placement=True)
    # typed extra keys as vllm-project/vllm#55488 proposed them (ExtraKey; not merged, no release
    # sends them): event_version is None
    # unless the extra_keys are typed, then 1 (BlockStored.to_typed(), as vLLM's kv_events tests
    # pin it on the wire: a default of 1 would be dropped by omit_defaults)
    family("typed", batch_array=True, events_array=False, rank=True, medium=True, lora_name=True, extra=True, group=True,
           spec=True, placement=True, typed=True)
    # SGLang (python/sglang/srt/disaggregation/kv_events.py): vLLM's first schema, no rank
    family("sglang", **arr, rank=False, medium=False, lora_name=False, extra=False, group=False, spec=False)
    family("sglang-medium", **arr, rank=False, medium=True, lora_name=False, extra=False, group=False, spec=False)
    return out


SHAPES = shapes()
TS = 1730000000.25


def sglang_shapes():
    """SGLang's structs (python/sglang/srt/disaggregation/kv_events.py) in its two salted shapes."""

    # sgl-project/sglang#30827 (0.5.18): positional events; a salted store is BlockStored plus
    # a kw_only metadata struct, so unsalted stores keep their seven elements
    class Batch(msgspec.Struct, array_like=True, gc=False):
        ts: float
        events: list[Any]
        attn_dp_rank: Optional[int] = None

    class PosEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
        pass

    class PosBlockStored(PosEvent, tag="BlockStored"):
        block_hashes: list[int]
        parent_block_hash: Optional[int]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str] = None

    class BlockStoredMetadata(msgspec.Struct, omit_defaults=True, gc=False):
        cache_salt: str

    class PosBlockStoredWithMetadata(PosBlockStored, tag="BlockStored", kw_only=True):
        metadata: BlockStoredMetadata

    class PosBlockRemoved(PosEvent, tag="BlockRemoved"):
        block_hashes: list[int]
        medium: Optional[str] = None

    # sgl-project/sglang#37482: events are tagged maps; the salt is a field of BlockStored. Newer
    # releases add lora_name (mem_cache/events.py record_store passes lora_name= with lora_id
    # None, and namespaces a LoRA page's hash by the name: kv_event_lora_seed)
    class MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
        pass

    class MapBlockStored(MapEvent, tag="BlockStored"):
        block_hashes: list[int]
        parent_block_hash: Optional[int]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str] = None
        cache_salt: Optional[str] = None
        session_id: Optional[str] = None
        lora_name: Optional[str] = None

    class MapBlockRemoved(MapEvent, tag="BlockRemoved"):
        block_hashes: list[int]
        medium: Optional[str] = None

    def positional(kind, f):
        if kind == "BlockRemoved":
            return PosBlockRemoved(block_hashes=f["block_hashes"], medium=f.get("medium"))
        base = {k: f.get(k) for k in ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")}
        if f.get("cache_salt"):
            return PosBlockStoredWithMetadata(**base, metadata=BlockStoredMetadata(cache_salt=f["cache_salt"]))
        return PosBlockStored(**base)

    def tagged_map(kind, f):
        if kind == "BlockRemoved":
            return MapBlockRemoved(block_hashes=f["block_hashes"], medium=f.get("medium"))
        return MapBlockStored(**{k: f.get(k) for k in ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                                                       "lora_id", "medium", "cache_salt", "session_id", "lora_name")})

    return dict(Batch=Batch, positional=positional, tagged_map=tagged_map)


def sglang_expected(kind, f):
    if kind == "BlockRemoved":
        return {"type": kind, "blockHashes": [expected_hash(h) for h in f["block_hashes"]], "medium": f.get("medium"),
                "groupIdx": None}
    e = {"type": kind, "blockHashes": [expected_hash(h) for h in f["block_hashes"]],
         "parentBlockHash": None if f.get("parent_block_hash") is None else expected_hash(f["parent_block_hash"]),
         "tokenIds": f["token_ids"], "blockSize": f["block_size"], "loraId": f.get("lora_id"), "medium": f.get("medium"),
         "loraName": f.get("lora_name"), "extraKeys": None, "groupIdx": None, "kvCacheSpecKind": None,
         "kvCacheSpecSlidingWindow": None}
    if f.get("cache_salt"):
        e["cacheSalt"] = f["cache_salt"]
    return e


def sglang_fixture(name, form, events, rank):
    sg = sglang_shapes()
    batch = sg["Batch"](ts=TS, events=[sg[form](k, f) for k, f in events], attn_dp_rank=rank)
    write(name, msgspec.msgpack.encode(batch),
          {"ts": TS, "dataParallelRank": rank, "events": [sglang_expected(k, f) for k, f in events]})
    return name


def expected_hash(h):
    if isinstance(h, int):
        return {"bigint": str(h & 0xFFFFFFFFFFFFFFFF)}
    return {"hex": h.hex()}


def expected_event(kind, f, shape):
    names = SHAPES[shape]["stored" if kind == "BlockStored" else "removed"]
    get = lambda n: f.get(n) if n in names else None  # noqa: E731 (fields the shape lacks decode as null)
    # locality (vLLM #48281) decodes only when sent: absent, it is unspecified
    locality = {"locality": get("locality")} if get("locality") is not None else {}
    if kind == "BlockStored":
        ek = get("extra_keys")
        return {"type": kind, "blockHashes": [expected_hash(h) for h in f["block_hashes"]],
                "parentBlockHash": None if f.get("parent_block_hash") is None else expected_hash(f["parent_block_hash"]),
                "tokenIds": f["token_ids"], "blockSize": f["block_size"], "loraId": f.get("lora_id"),
                "medium": get("medium"), "loraName": get("lora_name"),
                "extraKeys": None if ek is None else [None if k is None else [expected_extra_key(x) for x in k] for k in ek],
                "groupIdx": get("group_idx"), "kvCacheSpecKind": get("kv_cache_spec_kind"),
                "kvCacheSpecSlidingWindow": get("kv_cache_spec_sliding_window"), **locality}
    if kind == "BlockRemoved":
        return {"type": kind, "blockHashes": [expected_hash(h) for h in f["block_hashes"]], "medium": get("medium"),
                "groupIdx": get("group_idx"), **locality}
    return {"type": kind}


def build(shape, events, rank=None):
    s = SHAPES[shape]
    objs = []
    for kind, f in events:
        names = s["stored"] if kind == "BlockStored" else s["removed"] if kind == "BlockRemoved" else []
        objs.append(s[kind](**{n: f.get(n) for n in names if n in f or n not in ("extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "future_field", "locality", "ownership", "session_id", "event_version")}))
    batch = s["EventBatch"](ts=TS, events=objs, **({"data_parallel_rank": rank} if s["rank"] else {}))
    return msgspec.msgpack.encode(batch)


def write(name, payload, exp):
    with open(os.path.join(OUT, name + ".bin"), "wb") as fh:
        fh.write(payload)
    with open(os.path.join(OUT, name + ".json"), "w") as fh:
        json.dump(exp, fh, indent=1)
        fh.write("\n")


def fixture(name, shape, events, rank=None, skipped=None):
    payload = build(shape, events, rank)
    exp = {"ts": TS, "dataParallelRank": rank if SHAPES[shape]["rank"] else None,
           "events": [expected_event(k, f, shape) for k, f in events]}
    if skipped:
        exp["skipped"] = skipped
    write(name, payload, exp)
    return name


# ----------------------------------------------------------------- vLLM's block hash


def vllm_none_hash(seed: str) -> bytes:
    # vllm/v1/core/kv_cache_utils.py init_none_hash: NONE_HASH = hash_fn(os.getenv("PYTHONHASHSEED"))
    return sha256_cbor(seed)


def sha256_cbor(obj) -> bytes:
    # vllm/utils/hashing.py sha256_cbor
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def vllm_block_hashes(tokens, block_size, seed, extra_for_block=lambda i: None):
    """hash_block_tokens over every full block: sha256_cbor((parent or NONE_HASH, tuple(tokens), extra_keys))."""
    parent = None
    out = []
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size:(i + 1) * block_size])
        h = sha256_cbor((parent if parent else vllm_none_hash(seed), block, extra_for_block(i)))
        out.append(h)
        parent = h
    return out


def sha256_pickle(obj) -> bytes:
    # vllm/utils/hashing.py sha256, the default --prefix-caching-hash-algo: sha256 of the pickle
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def vllm_block_hashes_with(hash_fn, tokens, block_size, seed):
    """hash_block_tokens as above, with another hash function for the blocks and NONE_HASH."""
    parent = None
    out = []
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size:(i + 1) * block_size])
        h = hash_fn((parent if parent else hash_fn(seed), block, None))
        out.append(h)
        parent = h
    return out


# vllm/utils/hashing.py, function for function (get_hash_fn_by_name picks one by the engine's
# --prefix-caching-hash-algo; _xxhash_digest is xxhash.xxh3_128_digest)
def vllm_sha256(input) -> bytes:
    input_bytes = pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(input_bytes).digest()


def vllm_sha256_cbor(input) -> bytes:
    input_bytes = cbor2.dumps(input, canonical=True)
    return hashlib.sha256(input_bytes).digest()


def vllm_xxhash(input) -> bytes:
    input_bytes = pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)
    return xxhash.xxh3_128_digest(input_bytes)


def vllm_xxhash_cbor(input) -> bytes:
    input_bytes = cbor2.dumps(input, canonical=True)
    return xxhash.xxh3_128_digest(input_bytes)


HASH_FNS = {"sha256": vllm_sha256, "sha256_cbor": vllm_sha256_cbor, "xxhash": vllm_xxhash,
            "xxhash_cbor": vllm_xxhash_cbor}


def init_none_hash(hash_fn, hash_seed: str) -> bytes:
    # vllm/v1/core/kv_cache_utils.py init_none_hash, with PYTHONHASHSEED set
    return hash_fn(hash_seed)


def hash_block_tokens(hash_fn, none_hash, parent_block_hash, curr_block_token_ids, extra_keys=None) -> bytes:
    # vllm/v1/core/kv_cache_utils.py hash_block_tokens
    if not parent_block_hash:
        parent_block_hash = none_hash
    curr_block_token_ids_tuple = tuple(curr_block_token_ids)
    return hash_fn((parent_block_hash, curr_block_token_ids_tuple, extra_keys))


def request_block_hashes(algo, tokens, block_size, seed, lora, salt):
    """get_request_block_hasher over a prompt: extra_keys as generate_block_hash_extra_keys builds
    them from a LoRA name and a cache salt (first block only)."""
    hash_fn = HASH_FNS[algo]
    none_hash = init_none_hash(hash_fn, seed)
    parent = None
    out = []
    for i in range(len(tokens) // block_size):
        keys = ([lora] if lora else []) + ([salt] if salt and i == 0 else [])
        parent = hash_block_tokens(hash_fn, none_hash, parent, tokens[i * block_size:(i + 1) * block_size],
                                   tuple(keys) if keys else None)
        out.append(parent)
    return none_hash, out


def lcg_bytes(n: int) -> bytes:
    """n pseudo-random bytes, from an LCG seeded with n (test/core/xxh3-128.test.ts makes the same)."""
    x = n
    out = bytearray(n)
    for i in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out[i] = (x >> 16) & 0xFF
    return bytes(out)


def as_int(h: bytes) -> int:
    # vllm/v1/core/kv_cache_utils.py maybe_convert_block_hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
    return int.from_bytes(h, "big") & ((1 << 64) - 1)


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    tokens = list(range(1000, 1032))  # two blocks of 16
    big = [0xFEDCBA9876543210, 0x8000000000000001]  # above 2^53: plain JS numbers would lose bits
    digests = [hashlib.sha256(b"block-%d" % i).digest() for i in range(2)]
    stored_int = {"block_hashes": big, "parent_block_hash": 12345, "token_ids": tokens, "block_size": 16,
                  "lora_id": None, "medium": "GPU", "lora_name": None}
    stored_bytes_lora = {"block_hashes": digests, "parent_block_hash": None, "token_ids": tokens, "block_size": 16,
                         "lora_id": 3, "medium": "GPU", "lora_name": "sql-adapter",
                         "extra_keys": [("sql-adapter",), ("sql-adapter",)], "group_idx": 0,
                         "kv_cache_spec_kind": "full_attention"}
    removed_int = {"block_hashes": big, "medium": "GPU"}
    removed_bytes = {"block_hashes": digests, "medium": None, "group_idx": 1}
    names = []
    for shape in ["v0.9", "dp", "medium", "lora", "extra", "group", "spec", "mapev", "map"]:
        rank = 2 if SHAPES[shape]["rank"] else None
        names.append(fixture(f"{shape}-stored-int", shape, [("BlockStored", stored_int)], rank))
        names.append(fixture(f"{shape}-removed-int", shape, [("BlockRemoved", removed_int)], rank))
        names.append(fixture(f"{shape}-cleared", shape, [("AllBlocksCleared", {})], rank))
        if shape not in ("v0.9", "dp"):
            names.append(fixture(f"{shape}-stored-bytes-lora", shape, [("BlockStored", stored_bytes_lora)], rank))
            names.append(fixture(f"{shape}-removed-bytes", shape, [("BlockRemoved", removed_bytes)], rank))
    # rank 0 and no rank: omit_defaults drops a None rank, never a 0
    names.append(fixture("map-rank0", "map", [("AllBlocksCleared", {})], 0))
    names.append(fixture("spec-norank", "spec", [("AllBlocksCleared", {})], None))

    # a future vLLM adding a trailing field: readers ignore what they do not know
    fut = dict(stored_int, future_field="something new")
    names.append(fixture("future-stored-int", "future", [("BlockStored", fut)], 0))

    # the offloading connector: GPU stores, then the CPU copy of the last block (its own block size)
    gpu = {"block_hashes": big, "parent_block_hash": None, "token_ids": tokens, "block_size": 16, "lora_id": None,
           "medium": "GPU", "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    cpu = {"block_hashes": [big[1]], "parent_block_hash": None, "token_ids": [], "block_size": 32, "lora_id": None,
           "medium": "CPU", "lora_name": None}
    names.append(fixture("offload-cpu", "mapev", [("BlockStored", gpu), ("BlockStored", cpu),
                                                  ("BlockRemoved", {"block_hashes": [big[1]], "medium": "CPU"})], 0))

    # hybrid model: full-attention group 0, sliding-window group 1 (null blocks skipped from the
    # hashes while token_ids spans the range), a Mamba group 2
    sw = {"block_hashes": [0x1111], "parent_block_hash": None, "token_ids": tokens, "block_size": 16, "lora_id": None,
          "medium": "GPU", "lora_name": None, "group_idx": 1, "kv_cache_spec_kind": "sliding_window",
          "kv_cache_spec_sliding_window": 8}
    mamba = {"block_hashes": [0x2222], "parent_block_hash": None, "token_ids": tokens, "block_size": 32, "lora_id": None,
             "medium": "GPU", "lora_name": None, "group_idx": 2, "kv_cache_spec_kind": "mamba"}
    names.append(fixture("hybrid", "mapev", [("BlockStored", gpu), ("BlockStored", sw), ("BlockStored", mamba),
                                             ("BlockRemoved", {"block_hashes": [0x1111], "medium": "GPU", "group_idx": 1})], 0))
    names.append(fixture("hybrid-array", "spec", [("BlockStored", gpu), ("BlockStored", sw), ("BlockStored", mamba)], 0))

    # the offloading connector as vLLM ships it now (vllm/distributed/kv_transfer/kv_connector/
    # v1/offloading/ events tracker, placeholder payload unless self_describing_kv_events): a
    # CPU copy named by its chunk's last block hash, block_size 0, group_idx set; removed alike
    placeholder = {"block_hashes": [big[1]], "parent_block_hash": None, "token_ids": [], "block_size": 0, "lora_id": None,
                   "medium": "CPU", "lora_name": None, "group_idx": 0}
    names.append(fixture("offload-cpu-unsized", "placement",
                         [("BlockStored", gpu), ("BlockStored", placeholder),
                          ("BlockRemoved", {"block_hashes": [big[1]], "medium": "CPU", "group_idx": 0})], 0))

    # with self_describing_kv_events (vllm-project/vllm#43468, #51614): the CPU copy of a chunk of
    # two GPU blocks carries their hashes, its tokens, the parent and the GPU block size
    described = {"block_hashes": big, "parent_block_hash": None, "token_ids": tokens, "block_size": 16, "lora_id": None,
                 "medium": "CPU", "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    names.append(fixture("offload-cpu-described", "placement",
                         [("BlockStored", gpu), ("BlockStored", described),
                          ("BlockRemoved", {"block_hashes": big, "medium": "GPU", "group_idx": 0})], 0))

    # a native storage tier's copy (medium "STORAGE", vLLM #48123) on remote storage, and a GPU
    # store naming its session: locality decodes, ownership and session_id are ignored
    storage = dict(cpu, medium="STORAGE", locality="REMOTE", ownership="tier-1")
    names.append(fixture("placement-fields", "placement",
                         [("BlockStored", dict(gpu, session_id="s-1")), ("BlockStored", storage),
                          ("BlockRemoved", {"block_hashes": [big[1]], "medium": "STORAGE", "locality": "REMOTE",
                                            "ownership": "tier-1"})], 0))

    # storage tiers with locality (vLLM #48281, v0.26.0), hash-only copies as the tiers send them:
    # the engine's own (LOCAL) copy of block 1, a REMOTE copy of block 0 (shared storage, not the
    # worker's), the REMOTE copy of block 1 removed (the LOCAL one stays), block 0's GPU copy evicted
    own = dict(placeholder, block_hashes=[big[1]], medium="STORAGE", locality="LOCAL")
    shared = dict(placeholder, block_hashes=[big[0]], medium="STORAGE", locality="REMOTE")
    names.append(fixture("storage-locality", "placement",
                         [("BlockStored", gpu), ("BlockStored", own), ("BlockStored", shared),
                          ("BlockRemoved", {"block_hashes": [big[1]], "medium": "STORAGE", "group_idx": 0,
                                            "locality": "REMOTE"}),
                          ("BlockRemoved", {"block_hashes": [big[0]], "medium": "GPU", "group_idx": 0})], 0))

    # multimodal and salted blocks: extra_keys per block ((mm identifier, offset), salt on block 0)
    mm = dict(gpu, extra_keys=[("salt-a", ), (("img-sha", 3),)])
    names.append(fixture("extra-keys-mm-salt", "mapev", [("BlockStored", mm)], 0))

    # the same store from a release with typed extra keys: what it must decode to is the same
    typed_mm = dict(gpu, event_version=1, extra_keys=extra_keys_to_typed(mm["extra_keys"], cache_salt="salt-a",
                                                                         mm_features=[("img-sha", "image", "img-sha")]))
    names.append(fixture("typed-extra-keys-mm-salt", "typed", [("BlockStored", typed_mm)], 0))
    # every typed key: the LoRA name on each block, an image (its identifier prefixed by the LoRA
    # name, its hash not), the salt and a prompt-embedding digest on block 0, a key of a shape
    # vLLM does not classify on block 1
    typed_all = dict(gpu, lora_name="sql-adapter", session_id="s-1", locality="LOCAL", event_version=1,
                     extra_keys=extra_keys_to_typed(
                         [("sql-adapter", ("sql-adapter:img-a", 5), "tenant-a", b"\x01\x02\x03"),
                          ("sql-adapter", ("future", "key"))],
                         lora_name="sql-adapter", cache_salt="tenant-a",
                         mm_features=[("sql-adapter:img-a", "image", "img-a")]))
    names.append(fixture("typed-extra-keys-all", "typed", [("BlockStored", typed_all)], 0))

    # SGLang: one BlockStored per page, signed 64-bit hashes, parent = the previous page
    sg_events = []
    parent = None
    for i, tok in enumerate([11, 12, 13]):
        h = -(0x7000000000000000 + i) if i % 2 == 0 else 0x7000000000000000 + i
        sg_events.append(("BlockStored", {"block_hashes": [h], "parent_block_hash": parent, "token_ids": [tok],
                                          "block_size": 1, "lora_id": None}))
        parent = h
    sg_events.append(("BlockRemoved", {"block_hashes": [parent]}))
    names.append(fixture("sglang-page1", "sglang", sg_events))
    page16 = [("BlockStored", {"block_hashes": [-5], "parent_block_hash": None, "token_ids": tokens[:16], "block_size": 16,
                               "lora_id": None, "medium": "GPU"}),
              ("BlockStored", {"block_hashes": [7], "parent_block_hash": -5, "token_ids": tokens[16:], "block_size": 16,
                               "lora_id": None, "medium": "GPU"}),
              ("BlockRemoved", {"block_hashes": [7], "medium": "GPU"})]
    names.append(fixture("sglang-page16", "sglang-medium", page16))
    # SGLang's page events as first published (sgl-project/sglang#6824, mem_cache/radix_cache.py
    # _record_store_event): a page's hash is Python's hash(tuple(page_tokens)), the same at any
    # position, and with `if node.parent is None or node != self.root_node` every radix node's
    # first page goes without a parent. Three requests of 4-token pages, as that radix cache emits
    # them: [P, Q] (a node under the root), [P, X] (the node split, a node [X] under [P]) and
    # [R, P, S] (a node under the root, P again after R).
    def position_free_node(pages):
        out, parent = [], None
        for page in pages:
            h = hash(tuple(page))
            out.append(("BlockStored", {"block_hashes": [h], "parent_block_hash": parent, "token_ids": page,
                                        "block_size": len(page), "lora_id": None}))
            parent = h
        return out
    pf = {name: [base + i for i in range(4)] for name, base in (("P", 110), ("Q", 120), ("X", 130), ("R", 140), ("S", 150))}
    names.append(fixture("sglang-position-free", "sglang",
                         position_free_node([pf["P"], pf["Q"]]) + position_free_node([pf["X"]])
                         + position_free_node([pf["R"], pf["P"], pf["S"]])))
    # SGLang salted stores: the salt namespaces the page chain from its root
    salted = [("BlockStored", {"block_hashes": [-11], "parent_block_hash": None, "token_ids": tokens[:16], "block_size": 16,
                               "lora_id": None, "medium": "GPU", "cache_salt": "tenant-a", "session_id": "s-1"}),
              ("BlockStored", {"block_hashes": [13], "parent_block_hash": -11, "token_ids": tokens[16:], "block_size": 16,
                               "lora_id": None, "medium": "GPU", "cache_salt": "tenant-a", "session_id": "s-1"}),
              ("BlockStored", {"block_hashes": [21], "parent_block_hash": None, "token_ids": tokens[:16], "block_size": 16,
                               "lora_id": None, "medium": "GPU"}),
              ("BlockRemoved", {"block_hashes": [13], "medium": "GPU"}),
              ("BlockStored", {"block_hashes": [13], "parent_block_hash": -11, "token_ids": tokens[16:], "block_size": 16,
                               "lora_id": None, "medium": "GPU", "cache_salt": "tenant-a"})]
    names.append(sglang_fixture("sglang-salt-array", "positional", salted, 0))
    names.append(sglang_fixture("sglang-salt-map", "tagged_map", salted, 0))
    # SGLang LoRA pages as current releases publish them: lora_id None, the adapter's name in
    # lora_name, hashes namespaced by it (so unlike the base model's)
    lora_pages = [("BlockStored", {"block_hashes": [-31], "parent_block_hash": None, "token_ids": tokens[:16], "block_size": 16,
                                   "lora_id": None, "medium": "GPU", "lora_name": "sql-adapter"}),
                  ("BlockStored", {"block_hashes": [33], "parent_block_hash": -31, "token_ids": tokens[16:], "block_size": 16,
                                   "lora_id": None, "medium": "GPU", "lora_name": "sql-adapter"})]
    names.append(sglang_fixture("sglang-lora-map", "tagged_map", lora_pages, 0))
    # SGLang's storage tiers (StorageMedium: "GPU" L1, "CPU_PINNED" L2 host memory, "DISK" L3
    # SSD/NVMe, "EXTERNAL" L4 a shared or remote pool such as Mooncake's store): the first page on
    # the GPU and in the external pool, the second in the external pool alone, then gone from it
    tiers = [("BlockStored", {"block_hashes": [-41], "parent_block_hash": None, "token_ids": tokens[:16], "block_size": 16,
                              "lora_id": None, "medium": "GPU"}),
             ("BlockStored", {"block_hashes": [-41], "parent_block_hash": None, "token_ids": tokens[:16], "block_size": 16,
                              "lora_id": None, "medium": "EXTERNAL"}),
             ("BlockStored", {"block_hashes": [43], "parent_block_hash": -41, "token_ids": tokens[16:], "block_size": 16,
                              "lora_id": None, "medium": "EXTERNAL"}),
             ("BlockRemoved", {"block_hashes": [-41], "medium": "EXTERNAL"})]
    names.append(sglang_fixture("sglang-external-map", "tagged_map", tiers, 0))

    # one bad event among good ones (hand-made: no engine sends it, a corrupt or future one might)
    bad = [["BlockStored", big, None, tokens, 16, None, "GPU", None],
           ["BlockStored", [1], None, [1, 2, 3], 16, None, "GPU", None],
           ["BlockMoved", [1]],
           ["BlockRemoved", [big[0]], "GPU"]]
    write("mixed-bad", msgspec.msgpack.encode([TS, bad, 0]),
          {"ts": TS, "dataParallelRank": 0,
           "events": [expected_event("BlockStored", dict(gpu, group_idx=None, kv_cache_spec_kind=None), "lora"),
                      expected_event("BlockRemoved", {"block_hashes": [big[0]], "medium": "GPU"}, "medium")],
           "skipped": [{"index": 1, "reason": "token_count"}, {"index": 2, "reason": "unknown_type"}]})
    names.append("mixed-bad")

    # vLLM's own block hashes, for --block-hash vllm
    hash_cases = []
    for seed, block_size, n, lora, salt in [("0", 16, 64, None, None), ("1234", 16, 50, None, None), ("42", 4, 21, None, None),
                                            ("0", 16, 48, "sql-adapter", None), ("0", 16, 48, None, "tenant-a"),
                                            ("7", 16, 40, "sql-adapter", "tenant-a")]:
        toks = [(i * 7919 + len(seed)) % 151_000 for i in range(n)]

        def extra(i, lora=lora, salt=salt):
            keys = ([lora] if lora else []) + ([salt] if salt and i == 0 else [])
            return tuple(keys) if keys else None

        hs = vllm_block_hashes(toks, block_size, seed, extra)
        hash_cases.append({"pythonHashSeed": seed, "blockSize": block_size, "tokens": toks, "lora": lora, "cacheSalt": salt,
                           "noneHash": vllm_none_hash(seed).hex(), "hashes": [h.hex() for h in hs],
                           "intHashes": [str(as_int(h)) for h in hs]})
    for c in hash_cases:
        c["algo"] = "sha256_cbor"
    # every --prefix-caching-hash-algo: the cases above, plus each pickle int opcode (BININT1,
    # BININT2, BININT, LONG1), TUPLE1-3, BINUNICODE and non-ASCII strings, a block whose pickle
    # spans frames (over 64 KiB), a salt of 64 KiB (written unframed) and PYTHONHASHSEED=random
    edges = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 151_000]
    more = [("0", 16, [(i * 7919 + 1) % 151_000 for i in range(64)], None, None),
            ("1234", 16, [(i * 7919 + 4) % 151_000 for i in range(50)], None, None),
            ("0", 16, [(i * 7919 + 1) % 151_000 for i in range(48)], "sql-adapter", None),
            ("7", 16, [(i * 7919 + 1) % 151_000 for i in range(40)], "sql-adapter", "tenant-a"),
            ("42", 5, edges * 2, None, None),
            ("random", 1, edges[:4], None, None),
            ("0", 2, edges[:6], "lorä-адаптер", None),
            ("0", 3, edges[:6], None, "s" * 300),
            ("4294967295", 4, edges[:8], "x" * 255, "ü" * 200),
            ("0", 16, edges[:8] * 4, None, ("z", 70_000)),
            ("0", 9_400, [(2**31, 9_400), (0, 9_400)], None, None)]
    for algo in HASH_FNS:
        for seed, block_size, toks, lora, salt in more:
            # long inputs written compactly: tokens as runs [start, count], the salt as [text, times]
            runs = toks if isinstance(toks[0], tuple) else None
            tokens = [t for start, count in runs for t in range(start, start + count)] if runs else toks
            salt_text = salt[0] * salt[1] if isinstance(salt, tuple) else salt
            none_hash, hs = request_block_hashes(algo, tokens, block_size, seed, lora, salt_text)
            case = {"algo": algo, "pythonHashSeed": seed, "blockSize": block_size}
            case.update({"tokenRuns": [list(r) for r in runs]} if runs else {"tokens": tokens})
            case.update({"lora": lora}, **({"cacheSaltRepeat": list(salt)} if isinstance(salt, tuple) else {"cacheSalt": salt}))
            case.update({"noneHash": none_hash.hex(), "hashes": [h.hex() for h in hs],
                         "intHashes": [str(as_int(h)) for h in hs]})
            hash_cases.append(case)
    with open(os.path.join(OUT, "vllm-block-hash.json"), "w") as fh:
        fh.write('{"source": "vllm/v1/core/kv_cache_utils.py hash_block_tokens with vllm/utils/hashing.py '
                 'sha256, sha256_cbor, xxhash, xxhash_cbor",\n "cases": [\n')
        # one case a line: a reviewable diff without a line per token
        fh.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in hash_cases))
        fh.write("\n ]\n}\n")
    with open(os.path.join(OUT, "xxh3-128.json"), "w") as fh:
        lengths = list(range(0, 257)) + [300, 511, 512, 513, 1023, 1024, 1025, 1087, 1088, 1089, 2047, 2048, 2049,
                                         3000, 4096, 10_000, 65_536, 100_003]
        fh.write('{"source": "xxhash.xxh3_128_digest(data), data = lcg_bytes(length) (scripts/gen-kv-event-fixtures.py)",\n'
                 ' "cases": [\n')
        fh.write(",\n".join(f'  [{n}, "{xxhash.xxh3_128_digest(lcg_bytes(n)).hex()}"]' for n in lengths))
        fh.write("\n ]\n}\n")

    # the same stream as an engine with PYTHONHASHSEED=0 publishes it (int hashes), for the applier
    c = hash_cases[0]
    toks = c["tokens"]
    ints = [int(x) for x in c["intHashes"]]
    ev = [("BlockStored", {"block_hashes": ints[2:4], "parent_block_hash": ints[1], "token_ids": toks[32:64], "block_size": 16,
                           "lora_id": None, "medium": "GPU", "lora_name": None})]
    names.append(fixture("vllm-seed0-late-join", "lora", ev, 0))

    # a prompt's first two blocks as engines publish them: with sha256_cbor and PYTHONHASHSEED=0
    # (what --block-hash vllm --python-hash-seed 0 computes), with vLLM's default sha256 (pickle),
    # with sha256_cbor under another seed, and with xxhash and xxhash_cbor (XXH3-128 digests)
    for name, hs in [("vllm-seed0-first-blocks", [bytes.fromhex(h) for h in c["hashes"][:2]]),
                     ("vllm-sha256-pickle-first-blocks", vllm_block_hashes_with(sha256_pickle, toks[:32], 16, "0")),
                     ("vllm-seed1-first-blocks", vllm_block_hashes(toks[:32], 16, "1")),
                     ("vllm-xxhash-first-blocks", request_block_hashes("xxhash", toks[:32], 16, "0", None, None)[1]),
                     ("vllm-xxhash-cbor-first-blocks",
                      request_block_hashes("xxhash_cbor", toks[:32], 16, "0", None, None)[1])]:
        ev = [("BlockStored", {"block_hashes": [as_int(h) for h in hs], "parent_block_hash": None, "token_ids": toks[:32],
                               "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None})]
        names.append(fixture(name, "lora", ev, 0))
    print(f"wrote {len(names)} fixtures and vllm-block-hash.json to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
