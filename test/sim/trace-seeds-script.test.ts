import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { benchScript, inTempDir } from '../helpers/bench-script.js';

/** bench/trace-seeds.ts with the given arguments, from the repository's root. */
const traceSeeds = (...args: string[]) => benchScript('bench/trace-seeds.ts', ...args);

describe('bench:trace-seeds', () => {
  test('--policies other than the defaults, or --only, without --out is refused before any run', () => {
    for (const args of [
      ['--policies', 'cost,dynamo'],
      ['--only', 'tenants'],
    ]) {
      const r = traceSeeds(...args);
      assert.equal(r.status, 2, r.stderr);
      assert.match(r.stderr, /^error: --policies other than the defaults .*, --only and --cost-weights need --out/);
      assert.equal(r.stdout, '');
    }
  });

  test('an unknown flag, a flag without its value and a stray argument are refused, before any run', () => {
    for (const [args, message] of [
      [['--polices', 'cost'], /^error: unknown flag --polices/],
      [['--out'], /^error: --out needs a value/],
      [['stray'], /^error: unexpected argument 'stray'/],
    ] as const) {
      const r = traceSeeds(...args);
      assert.equal(r.status, 2, r.stderr);
      assert.match(r.stderr, message);
      assert.equal(r.stdout, '');
    }
  });

  test('--cost-weights: without --out, not JSON, or a weight the router refuses, refused before any run', () =>
    inTempDir('trace-seeds-', (dir) => {
      const out = join(dir, 'seeds.json');
      for (const [args, message] of [
        [['--cost-weights', '{"pressure":2}'], /^error: .*--cost-weights need --out/],
        [['--cost-weights', 'pressure=2', '--out', out], /^error: --cost-weights must be a JSON object/],
        [['--cost-weights', '[2]', '--out', out], /^error: --cost-weights must be a JSON object/],
        [['--cost-weights', '{"pressure":-1}', '--out', out], /^error: --cost-weights: .*pressure/],
        [['--cost-weights', '{"presure":2}', '--out', out], /^error: --cost-weights: .*presure/],
      ] as const) {
        const r = traceSeeds(...args);
        assert.equal(r.status, 2, `${args.join(' ')}: ${r.stderr}`);
        assert.match(r.stderr, message);
        assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack trace');
        assert.equal(r.stdout, '');
      }
      // and bench:sim, which takes the same flag
      const sim = benchScript('bench/sim.ts', '--cost-weights', '{"pressure":2}');
      assert.equal(sim.status, 2, sim.stderr);
      assert.match(sim.stderr, /^error: --cost-weights needs --out/);
      const badSim = benchScript('bench/sim.ts', '--cost-weights', '{"pressure":', '--out', dir);
      assert.equal(badSim.status, 2, badSim.stderr);
      assert.match(badSim.stderr, /^error: --cost-weights must be a JSON object/);
      assert.doesNotMatch(badSim.stderr, /\n\s+at /, 'no stack trace');
    }));

  test('bench:sim --engine: without --out, not JSON, an unknown setting or a bad value, refused before any run', () =>
    inTempDir('sim-engine-', (dir) => {
      for (const [args, message] of [
        [['--engine', '{"kvTokens":190000}'], /^error: --engine needs --out/],
        [['--engine', 'kvTokens=190000', '--out', dir], /^error: --engine must be a JSON object/],
        [['--engine', '[1]', '--out', dir], /^error: --engine must be a JSON object/],
        [
          ['--engine', '{"kvTokenz":1}', '--out', dir],
          /^error: --engine: unknown setting 'kvTokenz' \(known: kvTokens, /,
        ],
        [['--engine', '{"blockTokens":16}', '--out', dir], /^error: --engine: unknown setting 'blockTokens'/],
        [
          ['--engine', '{"kvTokens":-1}', '--out', dir],
          /^error: --engine: engine kvTokens must be a finite number >= 0/,
        ],
        [
          ['--engine', '{"blendRecompute":2}', '--out', dir],
          /^error: --engine: engine blendRecompute must be in \[0, 1\]/,
        ],
        [['--engine', '{"linearMsPerToken":0}', '--out', dir], /^error: --engine: linearMsPerToken must be > 0/],
        [
          ['--engine', '{"maxRunning":0}', '--out', dir],
          /^error: --engine: engine maxBatchTokens and maxRunning must be >= 1/,
        ],
        // past simulate's bound on one engine's KV (a run that size would not end)
        [['--engine', '{"kvTokens":1e12}', '--out', dir], /^error: --engine: kvTokens must be at most 16777216/],
      ] as const) {
        const r = benchScript('bench/sim.ts', ...args);
        assert.equal(r.status, 2, `${args.join(' ')}: ${r.stderr}`);
        assert.match(r.stderr, message, args.join(' '));
        assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack trace');
        assert.equal(r.stdout, '');
      }
    }));

  test('an unknown policy or shape is named, before any run', () =>
    inTempDir('trace-seeds-', (dir) => {
      const out = join(dir, 'seeds.json');
      let r = traceSeeds('--policies', 'cost,nope', '--out', out);
      assert.equal(r.status, 2);
      assert.match(r.stderr, /^error: --policies must name some of cost, seed/);
      r = traceSeeds('--policies', 'cost', '--out', out, '--only', 'no-such-shape');
      assert.equal(r.status, 2);
      assert.match(r.stderr, /^error: --only: no shape 'no-such-shape' \(agent-loops, tenants, hot-prefixes\)/);
      assert.equal(r.stdout, '');
    }));
});
