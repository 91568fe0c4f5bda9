/**
 * A vLLM engine put to sleep (`POST /sleep`, as RL frameworks do between rollouts): its /health
 * still answers 200 and its load gauges keep what its last step set (no step runs), idle or not, so
 * the cost policy may prefer it, yet a request sent there waits until it is woken. Its /metrics page says it sleeps
 * (`vllm:engine_sleep_state`): from the scrape that reads so the worker is out of rotation
 * (reason `sleep`), a request waiting there moves to another worker, and it comes back once the
 * page says it is awake.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gatewayOverEngines, holdingEngine } from '../helpers/holding-engine.js';
import { until } from '../helpers/wait.js';

/**
 * A stand-in vLLM engine: asleep, it holds completions until woken; its page says so (level 1)
 * once `reported` (a scrape comes at most an interval after the engine went to sleep).
 */
async function vllmEngine() {
  const flags = { asleep: false, reported: false };
  const engine = await holdingEngine({
    page: () => {
      const awake = flags.asleep && flags.reported ? 0 : 1;
      return [
        'vllm:num_requests_running{engine="0",model_name="m"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0',
        '# TYPE vllm:engine_sleep_state gauge',
        `vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} ${awake}.0`,
        `vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} ${1 - awake}.0`,
        'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} 0.0',
      ];
    },
    holding: () => flags.asleep,
  });
  const state = Object.assign(flags, { held: engine.held });
  return {
    url: engine.url,
    state,
    wake() {
      state.asleep = false;
      state.reported = false;
      engine.answerHeld();
    },
    close: engine.close,
  };
}

test('a sleeping vLLM engine leaves rotation, its waiting request moves, and it comes back when woken', async () => {
  const sleepy = await vllmEngine();
  const other = await vllmEngine();
  const { gateway, logs, complete, metric } = await gatewayOverEngines([
    { id: 'sleepy', url: sleepy.url },
    { id: 'other', url: other.url },
  ]);
  const outOfRotation = () => metric('contextforge_worker_out_of_rotation{worker="sleepy",reason="sleep"}');
  try {
    await until(async () => (await outOfRotation()) === 0, 'the sleep series at 0');
    sleepy.state.asleep = true;
    // round robin: one of two requests lands on the sleeping engine before a scrape reads it asleep
    const first = [complete('a'), complete('b')];
    await until(() => sleepy.state.held.size === 1, 'a request waiting on the sleeping engine');
    sleepy.state.reported = true;
    await until(() => gateway.health.reasons('sleepy').includes('sleep'), 'the sleeping engine out of rotation');
    for (const r of await Promise.all(first)) {
      assert.equal(r.status, 200, r.body);
      assert.equal(r.worker, 'other');
    }
    await until(() => sleepy.state.held.size === 0, 'the attempt on the sleeping engine given up');
    for (let i = 0; i < 4; i++) assert.equal((await complete(`n${i}`)).worker, 'other');
    assert.equal(await outOfRotation(), 1);
    assert.ok(
      logs.some((l) => /sleepy.*asleep \(vllm:engine_sleep_state weights_offloaded\)/.test(l)),
      logs.join('\n'),
    );

    sleepy.wake();
    await until(() => gateway.health.reasons('sleepy').length === 0, 'the engine back in rotation');
    const workers = new Set<string | null>();
    for (let i = 0; i < 4; i++) workers.add((await complete(`r${i}`)).worker);
    assert.ok(workers.has('sleepy'), 'it takes requests again');
    assert.equal(await outOfRotation(), 0);
  } finally {
    await gateway.close();
    await sleepy.close();
    await other.close();
  }
});

test('a paused engine keeping a request, its gauges still, is asleep and not stalled, and back once woken with nothing to do', async () => {
  // `POST /sleep?level=0` (or mode keep): the scheduler paused with the request it holds; no step
  // runs, so its page keeps that request running and its counters where they were
  const flags = { holding: false, reported: false, awake: true };
  const engine = await holdingEngine({
    page: () => [
      'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
      'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0',
      'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
      'vllm:generation_tokens_total{engine="0",model_name="m"} 100.0',
      `vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} ${flags.awake ? 1 : 0}.0`,
      'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} 0.0',
      'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} 0.0',
    ],
    holding: () => flags.holding,
  });
  const { gateway, complete, stalls } = await gatewayOverEngines([{ id: 'paused', url: engine.url }], {
    stallTimeoutMs: 300,
  });
  try {
    await until(async () => (await stalls('paused')) === 0, 'the stall series at 0');
    flags.holding = true;
    const kept = complete('a');
    await until(() => engine.held.size === 1, 'a request held by the paused engine');
    flags.awake = false;
    await until(() => gateway.health.reasons('paused').includes('sleep'), 'the paused engine out of rotation');
    // no other worker: the request stays kept there, well past the stall timeout
    const from = performance.now();
    await until(() => engine.scrapes.some((t) => t >= from + 1000), 'scrapes over a second');
    assert.deepEqual(gateway.health.reasons('paused'), ['sleep']);
    assert.equal(await stalls('paused'), 0);
    const refused = await complete('b');
    assert.equal(refused.status, 503, refused.body);
    assert.match(refused.body, /1 engine asleep/);

    // woken: it answers what it kept, and then has nothing to do, so its page moves no more
    flags.holding = false;
    flags.awake = true;
    engine.answerHeld();
    assert.equal((await kept).status, 200);
    await until(() => gateway.health.reasons('paused').length === 0, 'the woken engine back in rotation');
    assert.equal((await complete('c')).status, 200);
    assert.equal(await stalls('paused'), 0);
  } finally {
    await gateway.close();
    await engine.close();
  }
});
