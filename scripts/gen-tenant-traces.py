#!/usr/bin/env python3
"""Many tenants' system prompts under short user sessions, a Mooncake-format trace shape the
routing defaults were not chosen on until the prefix at risk, chosen on seeds 7-16
(docs/routing.md §7, "Agent loops that outgrow their worker; a worker running late", "The
prefix at risk while a turn waits").

    python3 scripts/gen-tenant-traces.py bench/traces/tenants [FIRST [LAST]]

writes tenants.{1..6}.jsonl.gz, or the seeds FIRST to LAST (FIRST alone: that seed; `7 26`: the
ones `npm run bench:trace-seeds` runs): 3,000 requests from user sessions arriving at 2 a
second, each session 1-5 turns (5-40 s apart) on top of one of 24 tenants' system prompts
(2,000-8,000 tokens, whole blocks; the tenant drawn with Zipf weights 1/k^1.1, so the first few
tenants carry most sessions). A turn adds 100-1,500 tokens to the session's context, and its
answer (50-500 tokens) is part of the next turn's. Timestamps in ms; one hash id per 512-token
block, chained by prefix: a turn's prompt keeps the previous prompt's full blocks. Its figures
quoted in the docs are on workers with little KV: `simulate --trace FILE --kv-tokens 60000
--speed 3`.
"""
import math, os, random, sys

from trace_writing import BLOCK, Ids, seed_range, write_trace


def tenants(rng, requests=3000, session_rate=2.0, count=24):
    ids = Ids()
    lengths = [(rng.randint(2000, 8000) // BLOCK) * BLOCK for _ in range(count)]
    prompts = [ids.new(length // BLOCK) for length in lengths]
    weights = [1 / (k + 1) ** 1.1 for k in range(count)]
    out = []
    t = 0.0
    session = 0
    while len(out) < requests:
        t += rng.expovariate(session_rate) * 1000
        k = rng.choices(range(count), weights)[0]
        cur, length, at = list(prompts[k]), lengths[k], t
        for _ in range(rng.randint(1, 5)):
            grown = length + rng.randint(100, 1500)
            full = length // BLOCK
            cur = cur[:full] + ids.new(math.ceil(grown / BLOCK) - full)
            length = grown
            answer = rng.randint(50, 500)
            out.append({"timestamp": int(at), "input_length": length, "output_length": answer,
                        "hash_ids": list(cur), "session_id": f"t{k}s{session}"})
            length += answer
            at += rng.uniform(5, 40) * 1000
        session += 1
    return out[:requests]


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "bench/traces/tenants"
    # a seed's file is the same whichever range writes it
    seeds = seed_range(sys.argv, 6)
    os.makedirs(out_dir, exist_ok=True)
    for seed in seeds:
        rng = random.Random(seed * 1000 + sum(map(ord, "tenants")))
        rows = sorted(tenants(rng), key=lambda d: d["timestamp"])
        path = os.path.join(out_dir, f"tenants.{seed}.jsonl.gz")
        write_trace(path, rows)
