#!/usr/bin/env python3
"""Coding-agent tool loops, a Mooncake-format trace shape the routing defaults were not chosen
on until the prefix at risk, chosen on seeds 10-29 (docs/routing.md §7, "Where `cost` trails:
agent loops that outgrow their worker", "The prefix at risk while a turn waits").

    python3 scripts/gen-agent-loop-traces.py bench/traces/agent-loops [FIRST [LAST]]

writes agent-loops.{1..9}.jsonl.gz, or the seeds FIRST to LAST (FIRST alone: that seed; `10
39`: the ones `npm run bench:trace-seeds` runs): 40 sessions, one starting every 15 s on
average, each a loop of 20-60 turns. A session's first prompt is 8,000-20,000 tokens; every
turn adds its answer (100-600 tokens) and a tool result (500-3,000 tokens), so a session ends
at 50,000- 140,000 tokens. The next turn comes 1-4 s after the answer ends (the answer's tokens
at 40 a second), so about ten sessions run at once and each worker holds one or two that keep
growing. Timestamps in ms; one hash id per 512-token block, chained by prefix: a turn's prompt
keeps the previous prompt's full blocks. Run them on the simulator's default workers: `simulate
--trace FILE --max-model-len 150000`.
"""
import math, os, random, sys

from trace_writing import BLOCK, Ids, seed_range, write_trace


def agent_loops(rng, sessions=40, start_rate=1 / 15):
    ids = Ids()
    out = []
    t = 0.0
    for s in range(sessions):
        t += rng.expovariate(start_rate) * 1000
        length = rng.randint(8000, 20000)
        cur = ids.new(math.ceil(length / BLOCK))
        at = t
        for _ in range(rng.randint(20, 60)):
            answer = rng.randint(100, 600)
            out.append({"timestamp": int(at), "input_length": length, "output_length": answer,
                        "hash_ids": list(cur), "session_id": f"a{s}"})
            grown = length + answer + rng.randint(500, 3000)
            full = length // BLOCK
            cur = cur[:full] + ids.new(math.ceil(grown / BLOCK) - full)
            length = grown
            at += (rng.uniform(1, 4) + answer / 40) * 1000
    return out


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "bench/traces/agent-loops"
    # a seed's file is the same whichever range writes it
    seeds = seed_range(sys.argv, 9)
    os.makedirs(out_dir, exist_ok=True)
    for seed in seeds:
        rng = random.Random(seed * 1000 + sum(map(ord, "agentloop")))
        rows = sorted(agent_loops(rng), key=lambda d: d["timestamp"])
        path = os.path.join(out_dir, f"agent-loops.{seed}.jsonl.gz")
        write_trace(path, rows)
