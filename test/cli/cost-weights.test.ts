import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { DEFAULT_COST_WEIGHTS } from '../../src/core/policies/cost.js';
import { createPolicy, resolveCostWeights } from '../../src/core/policies/index.js';
import { KVAwareRouter } from '../../src/index.js';
import { resolveServe } from '../helpers/serve-config.js';

/** The error `build` throws, as `name: message`; undefined when it throws none. */
function attempt(build: () => unknown): string | undefined {
  try {
    build();
    return undefined;
  } catch (err) {
    return `${(err as Error).name}: ${(err as Error).message}`;
  }
}

/** The error each path gives for `costWeights` (undefined: taken). */
function refusals(costWeights: unknown): Record<string, string | undefined> {
  return {
    router: attempt(() => new KVAwareRouter({ costWeights: costWeights as never })),
    createPolicy: attempt(() => createPolicy('cost', { costWeights: costWeights as never }, { random: () => 0.5 })),
    resolveCostWeights: attempt(() => resolveCostWeights(costWeights as never)),
  };
}

test('the router, createPolicy and --cost-weights take and refuse the same weights, with the same message', () => {
  const probes: unknown[] = [-1, -0, 0, 1e-9, 0.5, 0.8, 0.95, 0.99, 1, 1.5, 18_500, 1e308, Number.NaN, '1', null];
  const cases: unknown[] = [
    // not a mapping at all
    5,
    'recompute',
    [],
    [1],
    null,
    true,
    {},
    { bogus: 1 },
    { recompute: undefined },
  ];
  for (const key of Object.keys(DEFAULT_COST_WEIGHTS)) for (const v of probes) cases.push({ [key]: v });
  for (const knee of [0, 0.5, 0.9, 0.95, 1])
    for (const ceiling of [0, 0.5, 0.9, 0.95, 1]) cases.push({ pressureKnee: knee, pressureCeiling: ceiling });
  for (const weights of cases) {
    const shown = JSON.stringify(weights) ?? String(weights);
    const r = refusals(weights);
    assert.equal(r.createPolicy, r.router, `createPolicy vs the router: ${shown}`);
    assert.equal(r.resolveCostWeights, r.router, `resolveCostWeights vs the router: ${shown}`);
    // the flag takes a JSON (or YAML) mapping: what JSON can say
    const text = JSON.stringify(weights);
    if (text === undefined || typeof weights !== 'object' || weights === null || Array.isArray(weights)) continue;
    if (Object.values(weights).some((v) => typeof v === 'number' && !Number.isFinite(v))) continue;
    let flag: string | undefined;
    try {
      resolveServe(['--cost-weights', text]);
    } catch (err) {
      flag = (err as Error).message;
    }
    assert.equal(flag === undefined, r.router === undefined, `--cost-weights ${text}: ${flag} / ${r.router}`);
    if (flag !== undefined) assert.ok(flag.endsWith(r.router!.replace(/^\w+: /, '')), `${flag} / ${r.router}`);
  }
});

test('createPolicy refuses cost weights that are not a mapping, naming costWeights', () => {
  for (const weights of [5, [], true, null, 'recompute'])
    assert.throws(
      () => createPolicy('cost', { costWeights: weights as never }, { random: () => 0.5 }),
      (e: Error) => e instanceof TypeError && /^costWeights must be a mapping/.test(e.message),
      JSON.stringify(weights),
    );
});

test('a knee at or above the ceiling is refused alike by the flag, the variable, the config file and the router', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-knee-'));
  const weights = { pressureKnee: 0.9, pressureCeiling: 0.5 };
  const phrase = 'costWeights.pressureKnee must be below pressureCeiling (got pressureKnee 0.9, pressureCeiling 0.5)';
  const json = JSON.stringify(weights);
  const file = (name: string, text: string) => {
    writeFileSync(join(dir, name), text);
    return join(dir, name);
  };
  const top = file('top.yaml', `costWeights: ${json}\n`);
  const kebab = file('kebab.yaml', `cost-weights: ${json}\n`);
  const nested = file('nested.json', JSON.stringify({ router: { costWeights: weights } }));
  const cases: Array<[string[], Record<string, string>, string]> = [
    [['--cost-weights', json], {}, `--cost-weights: ${phrase}`],
    [[], { CONTEXTFORGE_COST_WEIGHTS: json }, `--cost-weights: ${phrase}`],
    [['--config', top], {}, `--config ${top}: ${phrase}`],
    [['--config', kebab], {}, `--config ${kebab}: ${phrase.replace('costWeights', 'cost-weights')}`],
    [['--config', nested], {}, `--config ${nested}: router.${phrase}`],
  ];
  for (const [args, env, message] of cases)
    assert.throws(
      () => resolveServe(args, env),
      (e: Error) => e.message.endsWith(message),
      `${args.join(' ')} ${JSON.stringify(env)}`,
    );
  assert.throws(() => new KVAwareRouter({ costWeights: weights }), { name: 'RangeError', message: phrase });
  assert.throws(() => createPolicy('cost', { costWeights: weights }, { random: () => 0.5 }), {
    name: 'RangeError',
    message: phrase,
  });
});

test('createPolicy checks costWeights for every policy, as it checks a peer option the policy does not read', () => {
  const ctx = { random: () => 0.5 };
  for (const name of ['round-robin', 'sglang', 'llmd', 'seed']) {
    for (const costWeights of [{ prefillTokensPerSecond: 0 }, { bogus: 1 }, { pressureKnee: 1 }, 5, null]) {
      const shown = `${name} ${JSON.stringify(costWeights)}`;
      const policy = attempt(() => createPolicy(name, { costWeights: costWeights as never }, ctx));
      assert.ok(policy !== undefined && /costWeights/.test(policy), `${shown}: ${policy}`);
      // the same refusal as the router's, for that policy
      const router = attempt(() => new KVAwareRouter({ policy: name, costWeights: costWeights as never }));
      assert.equal(policy, router, shown);
    }
    // valid weights are checked and left to the cost policy, like another policy's options
    assert.equal(
      attempt(() => createPolicy(name, { costWeights: { load: 2 } }, ctx)),
      undefined,
      name,
    );
    assert.equal(
      attempt(() => createPolicy(name, { dynamo: { gpuCredit: 0.5 } }, ctx)),
      undefined,
      `${name} with dynamo options`,
    );
    assert.match(attempt(() => createPolicy(name, { dynamo: { gpuCredit: 2 } }, ctx)) ?? '', /gpuCredit/);
  }
});
