#!/usr/bin/env python3
"""SGLang's generated-shared-prefix benchmark as a Mooncake-format trace: a shape the routing
defaults were not chosen on (docs/routing.md §7, "A benchmark's shared prefixes from a cold
start").

    python3 scripts/gen-shared-prefix-traces.py bench/traces/shared-prefix

writes shared-prefix.{1,2,3}.jsonl.gz with SGLang's defaults (python/sglang/bench_serving.py,
dataset "generated-shared-prefix": gsp_num_groups 64, gsp_prompts_per_group 16,
gsp_system_prompt_len 2048, gsp_question_len 128, gsp_output_len 256, lengths fixed): 64 groups
of 16 prompts, each a group's system prompt of 2,048 tokens and a question of 128 of its own,
answers of 256 tokens, in shuffled order, arriving as a Poisson process of 100 a second
(`bench_serving --request-rate 100`; `simulate --speed S` scales it). And
shared-prefix-8x128.{1,2,3}.jsonl.gz, the same with 8 groups of 128 prompts (a few prefixes, each
hot). Every trace starts cold: no engine holds any group's prompt at its first request.

    python3 scripts/gen-shared-prefix-traces.py DIR --seeds 4,5

writes the same shapes from other seeds. Timestamps in ms; one hash id per 512-token block, the
system prompt's four blocks shared by its group, the question's partial block its own.
"""
import gzip, io, json, os, random, sys

BLOCK = 512
SYSTEM_PROMPT = 2048
QUESTION = 128
OUTPUT = 256
RATE_PER_S = 100.0
SHAPES = {'shared-prefix': (64, 16), 'shared-prefix-8x128': (8, 128)}


def write(path, seed, groups, per_group):
    rng = random.Random(seed)
    next_id = [1]

    def new(k):
        ids = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return ids

    prefixes = [new(SYSTEM_PROMPT // BLOCK) for _ in range(groups)]
    # bench_serving shuffles the prompts of every group together
    order = [g for g in range(groups) for _ in range(per_group)]
    rng.shuffle(order)
    t = 0.0
    # no time stamp in the gzip header: the same seed writes the same bytes
    with open(path, 'wb') as raw, gzip.GzipFile(fileobj=raw, mode='wb', mtime=0) as z, io.TextIOWrapper(z) as f:
        for g in order:
            t += rng.expovariate(RATE_PER_S)
            line = {
                'timestamp': int(t * 1000),
                'input_length': SYSTEM_PROMPT + QUESTION,
                'output_length': OUTPUT,
                'hash_ids': prefixes[g] + new(1),
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
    seeds = (1, 2, 3)
    if '--seeds' in args:
        i = args.index('--seeds')
        if i + 1 >= len(args):
            sys.exit('error: --seeds needs a value, e.g. --seeds 4,5')
        seeds = seeds_of(args[i + 1])
        del args[i : i + 2]
    out = args[0] if args else 'bench/traces/shared-prefix'
    os.makedirs(out, exist_ok=True)
    for name, (groups, per_group) in SHAPES.items():
        for seed in seeds:
            write(os.path.join(out, f'{name}.{seed}.jsonl.gz'), seed, groups, per_group)
