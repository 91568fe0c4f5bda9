#!/usr/bin/env python3
"""A few hot shared prefixes on workers with little KV, a Mooncake-format trace shape the routing
defaults were not chosen on (docs/routing.md §7, "Queued prefixes held on several workers").

    python3 scripts/gen-hot-prefix-traces.py bench/traces/hot-prefixes

writes hot-prefixes.{1,2}.jsonl.gz: 3,000 requests arriving at 15 a second (Poisson), each one
of 5 shared prefixes of 4,096-16,384 tokens (8-32 blocks, drawn once per file) picked uniformly,
followed by 50-800 tokens of its own; answers of 50-600 tokens. Timestamps in ms; one hash id per
512-token block. Run them on workers whose KV holds a few such prefixes at once:
`simulate --trace FILE --kv-tokens 40000 --speed 2` (or 100,000 tokens at ×3).

    python3 scripts/gen-hot-prefix-traces.py bench/traces/hot-prefixes --seeds 10,11,...,39

writes the same shape from other seeds (hot-prefixes.10.jsonl.gz, ...), the ones `npm run
bench:trace-seeds` runs: a change to how hot prefixes are placed is chosen on 10-29, 30-39 are
kept apart until it is, and seeds 1 and 2 (bench:held-out) are read after.
"""
import gzip, json, math, os, random, sys

BLOCK = 512
REQUESTS = 3000
RATE_PER_S = 15.0


def write(path, seed):
    rng = random.Random(seed)
    next_id = [1]

    def new(k):
        ids = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return ids

    prefixes = [new(rng.randint(8, 32)) for _ in range(5)]
    t = 0.0
    with gzip.open(path, 'wt') as f:
        for _ in range(REQUESTS):
            t += rng.expovariate(RATE_PER_S)
            prefix = rng.choice(prefixes)
            prompt = len(prefix) * BLOCK + rng.randint(50, 800)
            own = math.ceil(prompt / BLOCK) - len(prefix)
            line = {
                'timestamp': int(t * 1000),
                'input_length': prompt,
                'output_length': rng.randint(50, 600),
                'hash_ids': prefix + new(own),
            }
            f.write(json.dumps(line) + '\n')


def seeds_of(arg):
    """The seeds of `--seeds A,B,...` (positive integers), or exits with a message naming the flag."""
    try:
        seeds = [int(s) for s in arg.split(',')]
    except ValueError:
        sys.exit(f"error: --seeds must be comma-separated positive integers, got '{arg}'")
    if not seeds or any(s < 1 for s in seeds):
        sys.exit(f"error: --seeds must be comma-separated positive integers, got '{arg}'")
    return seeds


if __name__ == '__main__':
    args = sys.argv[1:]
    seeds = (1, 2)
    if '--seeds' in args:
        i = args.index('--seeds')
        if i + 1 >= len(args):
            sys.exit('error: --seeds needs a value, e.g. --seeds 11,12,13,14')
        seeds = seeds_of(args[i + 1])
        del args[i : i + 2]
    out = args[0] if args else 'bench/traces/hot-prefixes'
    os.makedirs(out, exist_ok=True)
    for seed in seeds:
        write(os.path.join(out, f'hot-prefixes.{seed}.jsonl.gz'), seed)
