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

    python3 scripts/gen-shared-prefix-traces.py DIR FIRST [LAST]

writes the same shapes from other seeds. Timestamps in ms; one hash id per 512-token block, the
system prompt's four blocks shared by its group, the question's partial block its own; the same
seed writes the same bytes.
"""
import os, random, sys

from trace_writing import BLOCK, Ids, seed_range, write_trace

SYSTEM_PROMPT = 2048
QUESTION = 128
OUTPUT = 256
RATE_PER_S = 100.0
SHAPES = {'shared-prefix': (64, 16), 'shared-prefix-8x128': (8, 128)}


def rows(seed, groups, per_group):
    rng = random.Random(seed)
    ids = Ids()
    prefixes = [ids.new(SYSTEM_PROMPT // BLOCK) for _ in range(groups)]
    # bench_serving shuffles the prompts of every group together
    order = [g for g in range(groups) for _ in range(per_group)]
    rng.shuffle(order)
    t = 0.0
    for g in order:
        t += rng.expovariate(RATE_PER_S)
        yield {
            'timestamp': int(t * 1000),
            'input_length': SYSTEM_PROMPT + QUESTION,
            'output_length': OUTPUT,
            'hash_ids': prefixes[g] + ids.new(1),
        }


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit(f'usage: {sys.argv[0]} DIR [FIRST [LAST]]')
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for seed in seed_range(sys.argv, 3):
        for name, (groups, per_group) in SHAPES.items():
            write_trace(os.path.join(out, f'{name}.{seed}.jsonl.gz'), rows(seed, groups, per_group))
