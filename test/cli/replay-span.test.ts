import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { tuneCostWeights } from '../../src/sim/tune.js';
import type { TraceRequest } from '../../src/sim/trace.js';
import { CLI } from '../helpers/cli-entry.js';

const cli = (args: string[]) => spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8', timeout: 120_000 });

const DAY = 86_400_000;
const LIMIT = 'more than the 2678400000 ms (31 days) a replay may cover';

/** A Mooncake trace of one short request at each of `days`. */
function traceFile(dir: string, name: string, days: number[]): string {
  const lines = days.map((d, i) =>
    JSON.stringify({ timestamp: d * DAY, input_length: 32, output_length: 4, hash_ids: [i, i + 100] }),
  );
  const file = join(dir, name);
  writeFileSync(file, `${lines.join('\n')}\n`);
  return file;
}

test('a trace past the span of a replay is named as --trace gave it, with its span at the speed', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cfr-span-'));
  try {
    const long = traceFile(dir, 'long.jsonl', [0, 10, 20, 30, 40]);
    const r = cli(['simulate', '--trace', long, '--no-progress']);
    assert.equal(r.status, 2, r.stderr);
    assert.equal(r.stderr, `error: --trace ${long}: the trace spans 3456000000 ms (40.0 days) at speed ×1, ${LIMIT}\n`);
    // at half speed 20 days take 40
    const twenty = traceFile(dir, 'twenty.jsonl', [0, 20]);
    const slow = cli(['simulate', '--trace', twenty, '--speed', '0.5', '--no-progress']);
    assert.equal(slow.status, 2, slow.stderr);
    assert.match(slow.stderr, /: the trace spans 3456000000 ms \(40\.0 days\) at speed ×0\.5, more than/);
    // answers that outlast the span: the trace is named too
    const out = join(dir, 'long-output.jsonl');
    writeFileSync(
      out,
      '{"timestamp":0,"input_length":1024,"output_length":4,"hash_ids":[1,2]}\n' +
        '{"timestamp":0,"input_length":1024,"output_length":16000000,"hash_ids":[3,4]}\n',
    );
    const answers = cli([
      ...['simulate', '--trace', out, '--workers', '1', '--policies', 'round-robin', '--no-progress'],
      ...['--kv-tokens', '16777216', '--max-model-len', '16777216', '--scrape-interval-ms', '86400000'],
    ]);
    assert.equal(answers.status, 2, answers.stderr);
    assert.match(
      answers.stderr,
      new RegExp(
        `^error: --trace ${out}: the replay runs past the 2678400000 ms \\(31 days\\) .*the longest, trace line 2, has an output of 16000000 tokens\\)\\n$`,
      ),
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("tune holds each part it replays to a replay's span, naming the trace, the part and the part's span", () => {
  const dir = mkdtempSync(join(tmpdir(), 'cfr-tune-span-'));
  try {
    // the first 3 of 5 requests (--train-fraction 0.6) span 33 days, the whole trace 35
    const early = traceFile(dir, 'early.jsonl', [0, 32, 33, 34, 35]);
    const r = cli(['tune', '--trace', early, '--trials', '1']);
    assert.equal(r.status, 2, r.stderr);
    assert.equal(
      r.stderr,
      `error: --trace ${early}: the part searched on (the first 3 of 5 requests) spans 2851200000 ms (33.0 days) at speed ×1, ${LIMIT}\n`,
    );
    // the held-out part is checked before the search too, not after its trials
    const late = traceFile(dir, 'late.jsonl', [0, 1, 2, 3, 40]);
    const held = cli(['tune', '--trace', late, '--trials', '1']);
    assert.equal(held.status, 2, held.stderr);
    assert.match(
      held.stderr,
      /: the held-out part \(the last 2 of 5 requests\) spans 3196800000 ms \(37\.0 days\) at speed ×1, more than/,
    );
    // parts within the span are replayed, however long the whole trace: 40 days, parts of 20 and 10
    const whole = traceFile(dir, 'whole.jsonl', [0, 10, 20, 30, 40]);
    const ok = cli(['tune', '--trace', whole, '--trials', '1']);
    assert.equal(ok.status, 0, ok.stderr);
    assert.match(ok.stdout, /^# cost weights tuned by contextforge-router tune on whole\.jsonl/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('answers outlasting the span in a part tune replays name the part', () => {
  const req = (index: number, outputLength: number): TraceRequest => ({
    index,
    timestamp: 0,
    inputLength: 1024,
    outputLength,
    hashIds: [2 * index, 2 * index + 1],
    blockSize: 512,
  });
  assert.throws(
    () =>
      tuneCostWeights([req(0, 16_000_000), req(1, 4)], {
        workers: 1,
        trials: 1,
        trainFraction: 0.5,
        scrapeIntervalMs: DAY,
        engine: { kvTokens: 16_777_216, maxModelLen: 16_777_216 },
      }),
    /^RangeError: the part searched on \(the first 1 of 2 requests\): the replay runs past the 2678400000 ms \(31 days\) .*trace line 1, has an output of 16000000 tokens\)$/,
  );
});
