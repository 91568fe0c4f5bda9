/**
 * An engine whose loop hangs (a GPU or NCCL stall) while its HTTP server still answers /health
 * and /metrics (`stallTimeoutMs`, `--stall-timeout-ms`): with requests of the gateway waiting on
 * it, requests running by its own count and its counters still for the stall timeout, it leaves
 * rotation (the request waiting there moves to another worker), is counted in
 * contextforge_worker_stalls_total, and comes back as soon as its counters move. An engine the
 * gateway has nothing on, or one exporting none of the counters, is never taken for stalled.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { gatewayOverEngines, holdingEngine } from '../helpers/holding-engine.js';
import { until } from '../helpers/wait.js';

const STALL_MS = 300;

/**
 * A stand-in vLLM engine. While `hung`, completions are held unanswered and its page stands
 * still, as vLLM's does when its engine core hangs (its API server still answers /health and
 * /metrics, but every gauge and counter comes from the engine core): it reports `running` requests
 * of its batch all along, whatever arrives or leaves meanwhile. `counters: false` leaves the token
 * counters out of its page (only the running and waiting counts and KV usage). `scrapes` lists
 * when each /metrics was answered (performance.now()).
 */
async function standInEngine(options: { counters?: boolean; running?: number } = {}) {
  const counts = { hung: false, tokens: 0, running: options.running ?? 0 };
  const engine = await holdingEngine({
    page: () => [
      `vllm:num_requests_running{model_name="m"} ${counts.running}`,
      'vllm:num_requests_waiting{model_name="m"} 0',
      'vllm:kv_cache_usage_perc{model_name="m"} 0.25',
      ...(options.counters === false
        ? []
        : [
            `vllm:generation_tokens_total{model_name="m"} ${counts.tokens}`,
            'vllm:prompt_tokens_total{model_name="m"} 7',
            `vllm:iteration_tokens_total_count{model_name="m"} ${counts.tokens}`,
          ]),
    ],
    holding: () => counts.hung,
    onAnswer: () => counts.tokens++,
  });
  const state = Object.assign(counts, { held: engine.held });
  return {
    url: engine.url,
    state,
    scrapes: engine.scrapes,
    /** The loop runs again: its counters move, and what it held is answered. */
    resume() {
      state.hung = false;
      state.tokens++;
      engine.answerHeld();
    },
    close: engine.close,
  };
}

/** The gateway over `workers`, with the stall timeout of these tests. */
const gatewayOver = (workers: Array<{ id: string; url: string }>) =>
  gatewayOverEngines(workers, { stallTimeoutMs: STALL_MS });

/** Waits until the engine has been scraped for `ms` past now: every judgement over that span was made. */
async function scrapedFor(engine: { scrapes: number[] }, ms: number): Promise<void> {
  const from = performance.now();
  await until(() => engine.scrapes.some((t) => t >= from + ms), `scrapes over ${ms} ms`, { timeoutMs: 20_000 });
}

test('a hung engine that answers /health and /metrics leaves rotation within the stall timeout, its waiting request moves, and it comes back when its counters move', async () => {
  const stuck = await standInEngine({ running: 2 });
  const good = await standInEngine();
  const { gateway, logs, complete, inFlight, stalls } = await gatewayOver([
    { id: 'stuck', url: stuck.url },
    { id: 'good', url: good.url },
  ]);
  try {
    await until(async () => (await stalls('stuck')) === 0, 'the stall series at 0');
    stuck.state.hung = true;
    // round robin: one of two requests lands on the hung engine and waits there
    const first = [complete('a'), complete('b')];
    await until(() => inFlight('stuck') >= 1, 'a request waiting on the hung engine');
    const started = performance.now();
    await until(() => gateway.health.reasons('stuck').includes('stall'), 'the hung engine out of rotation', {
      timeoutMs: 20_000,
    });
    const outAfter = performance.now() - started;
    assert.ok(outAfter >= STALL_MS - 60, `not before the stall timeout (${Math.round(outAfter)} ms)`);
    // the request that waited there had received nothing: it moved to the other worker
    for (const r of await Promise.all(first)) {
      assert.equal(r.status, 200, r.body);
      assert.equal(r.worker, 'good');
    }
    assert.equal(stuck.state.held.size, 0, 'the attempt on the hung engine was given up');
    // new requests go elsewhere, and it stays out though nothing of the gateway waits there any more
    for (let i = 0; i < 4; i++) assert.equal((await complete(`n${i}`)).worker, 'good');
    assert.deepEqual(gateway.health.reasons('stuck'), ['stall']);
    assert.equal(await stalls('stuck'), 1);
    assert.equal(await stalls('good'), 0);
    assert.equal(
      logs.filter((l) => /^stuck: its engine shows no progress for \d+ s/.test(l)).length,
      1,
      logs.join('\n'),
    );
    // its loop runs again: back in rotation at the next scrape
    stuck.resume();
    await until(() => gateway.health.reasons('stuck').length === 0, 'the engine back in rotation');
    const workers = new Set<string | null>();
    for (let i = 0; i < 4; i++) workers.add((await complete(`r${i}`)).worker);
    assert.ok(workers.has('stuck'), 'it takes requests again');
    assert.equal(await stalls('stuck'), 1, 'counted once');
  } finally {
    await gateway.close();
    await stuck.close();
    await good.close();
  }
});

test('an engine running requests of its own with still counters, the gateway having none on it, is not stalled', async () => {
  const engine = await standInEngine({ running: 3 });
  const { gateway, stalls } = await gatewayOver([{ id: 'busy', url: engine.url }]);
  try {
    engine.state.hung = true;
    await scrapedFor(engine, 3 * STALL_MS);
    assert.deepEqual(gateway.health.reasons('busy'), []);
    assert.equal(await stalls('busy'), 0);
  } finally {
    await gateway.close();
    await engine.close();
  }
});

test('an engine exporting none of the progress counters is never taken for stalled', async () => {
  const engine = await standInEngine({ counters: false, running: 1 });
  const { gateway, complete, inFlight, stalls } = await gatewayOver([{ id: 'plain', url: engine.url }]);
  try {
    engine.state.hung = true;
    const waiting = complete('x');
    await until(() => inFlight('plain') >= 1, 'a request waiting on the engine');
    await scrapedFor(engine, 3 * STALL_MS);
    assert.deepEqual(gateway.health.reasons('plain'), []);
    assert.equal(await stalls('plain'), 0);
    engine.resume();
    assert.equal((await waiting).status, 200);
  } finally {
    await gateway.close();
    await engine.close();
  }
});

test('a stall timeout that is not a whole number of milliseconds from 0 up is refused, naming it', async () => {
  for (const stallTimeoutMs of [-1, 1.5, Number.NaN, 2 ** 31]) {
    await assert.rejects(
      createGateway({
        router: new KVAwareRouter({ policy: 'round-robin' }),
        workers: [],
        metricsIntervalMs: 0,
        stallTimeoutMs,
      }),
      (err: Error) => err instanceof RangeError && /stallTimeoutMs/.test(err.message),
      String(stallTimeoutMs),
    );
  }
});
