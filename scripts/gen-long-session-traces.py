#!/usr/bin/env python3
"""Long agent sessions among short chats, a Mooncake-format trace shape the routing defaults
were not chosen on (docs/routing.md §7, "Arrivals that can leave").

    python3 scripts/gen-long-session-traces.py bench/traces/long-sessions

writes long-sessions.{1..6}.jsonl.gz: 6 sessions whose first prompt is 100,000-150,000 tokens
and which grow by their answer plus 8,000-25,000 tokens a turn over 10-16 turns (5-30 s apart),
starting one every 20 s on average, among 120 chats of 2-6 turns of 500-4,000 tokens (one a
second). Timestamps in ms; one hash id per 512-token block, chained by prefix: a turn's prompt
keeps the previous prompt's full blocks and replaces its partial last block. Run them on
workers whose KV holds about three such sessions, where they cannot all share one worker:
`simulate --trace FILE --kv-tokens 450000 --max-model-len 450000`.
"""
import math, os, random, sys

from trace_writing import BLOCK, Ids, write_trace


def poisson(rng, rate_per_s, n):
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate_per_s) * 1000
        out.append(t)
    return out


def sessions(rng, ids, count, start_rate, turns, first, grow, think, out_len, sid0=0):
    out = []
    for s, t in enumerate(poisson(rng, start_rate, count)):
        length = first()
        cur = ids.new(math.ceil(length / BLOCK))
        for _ in range(turns()):
            o = out_len()
            out.append({"timestamp": int(t), "input_length": int(length), "output_length": int(o),
                        "hash_ids": list(cur), "session_id": f"s{sid0 + s}"})
            grown = length + o + grow()
            full = length // BLOCK
            cur = cur[:full] + ids.new(math.ceil(grown / BLOCK) - full)
            length = grown
            t += think() * 1000
    return out


def long_sessions(rng):
    ids = Ids()
    long = sessions(rng, ids, 6, 1 / 20, lambda: rng.randint(10, 16), lambda: rng.randint(100_000, 150_000),
                    lambda: rng.randint(8000, 25000), lambda: rng.uniform(5, 30), lambda: rng.randint(100, 800))
    chats = sessions(rng, ids, 120, 1.0, lambda: rng.randint(2, 6), lambda: rng.randint(500, 4000),
                     lambda: rng.randint(50, 800), lambda: rng.uniform(3, 30), lambda: rng.randint(50, 400), sid0=1000)
    return long + chats


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "bench/traces/long-sessions"
    os.makedirs(out_dir, exist_ok=True)
    for seed in range(1, 7):
        rng = random.Random(seed * 1000 + sum(map(ord, "longctx")))
        rows = sorted(long_sessions(rng), key=lambda d: d["timestamp"])
        path = os.path.join(out_dir, f"long-sessions.{seed}.jsonl.gz")
        write_trace(path, rows)
