/**
 * A fleet that is healthy but slower than its first-byte deadlines: every engine answers each
 * stream, but only after longer than the deadline the gateway starts with. Its first-byte
 * timeouts hit every worker alike, which is the fleet's pace, not a broken worker: no circuit
 * opens, the deadlines learn that the engines take at least that long, and the fleet serves. An
 * engine that hangs while the others serve still has its circuit opened by its timeouts.
 */
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';
import { fakeEngine, post, sample } from './harness.js';

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0 };
/** The allowance past a worker's usual first byte: the whole first deadline of a worker not yet heard. */
const FIRST_BYTE_ALLOWANCE_MS = 300;
/** Every engine's time to the first event of a stream: past the first deadline, within three of them. */
const ENGINE_FIRST_BYTE_MS = 2 * FIRST_BYTE_ALLOWANCE_MS;

/** An engine that answers every stream whole, its first event after ENGINE_FIRST_BYTE_MS (its queue and prefill). */
async function slowEngine() {
  const timers = new Set<NodeJS.Timeout>();
  const engine = await fakeEngine((req, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      const t = setTimeout(() => {
        timers.delete(t);
        res
          .writeHead(200, { 'content-type': 'text/event-stream' })
          .end('data: {"choices":[{"text":"ok"}]}\n\ndata: [DONE]\n\n');
      }, ENGINE_FIRST_BYTE_MS);
      timers.add(t);
    });
  });
  const close = engine.close;
  engine.close = async () => {
    for (const t of timers) clearTimeout(t);
    await close();
  };
  return engine;
}

/** A round-robin gateway over `workers` whose circuits open after 3 failures, with the short first-byte allowance. */
async function breakerGateway(workers: Array<{ id: string; url: string }>) {
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers,
    ...quiet,
    breakerFailures: 3,
    breakerCooldownMs: 60_000,
    timeouts: { firstByteTimeoutMs: FIRST_BYTE_ALLOWANCE_MS },
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return { router, gateway, base };
}

test('a fleet whose every engine is slower than the first deadline keeps serving: no circuit opens, the deadlines learn the wait', async () => {
  const engines = await Promise.all([slowEngine(), slowEngine(), slowEngine()]);
  const { router, gateway, base } = await breakerGateway(engines.map((e, i) => ({ id: `s${i}`, url: e.url })));
  try {
    // waves of concurrent streams, as clients keep sending: the first wave's first attempts all
    // time out, on every worker alike
    const statuses: number[] = [];
    for (let wave = 0; wave < 5; wave++) {
      const answers = await Promise.all(
        Array.from({ length: 6 }, (_, i) =>
          post(base, '/v1/completions', { prompt: `w${wave} r${i}`, max_tokens: 2, stream: true }),
        ),
      );
      for (const a of answers) {
        statuses.push(a.status);
        if (a.status === 200) assert.match(a.text, /data: \[DONE\]/);
      }
    }
    assert.deepEqual(
      statuses.filter((s) => s !== 200),
      [],
      `every request answered (${statuses.filter((s) => s === 200).length} of ${statuses.length})`,
    );
    for (let i = 0; i < engines.length; i++)
      assert.deepEqual(gateway.health.reasons(`s${i}`), [], `s${i}: a slow engine that answers is not broken`);
    assert.ok(
      (await sample(gateway.metrics, 'contextforge_upstream_failures_total{worker="s0"}')) >= 1,
      'the first attempts did time out: each is a failed attempt all the same',
    );
    assert.equal(router.getStats().inFlightRequests, 0);
  } finally {
    await gateway.close();
    for (const e of engines) await e.close();
  }
});

test('an engine that hangs while the others serve still has its circuit opened by its first bytes overdue', async () => {
  // an engine whose scheduler is stuck: it takes every completion and never answers it
  let completions = 0;
  const hanging = await fakeEngine((req, res) => {
    req.resume();
    if (req.url === '/v1/completions') completions++;
    else res.writeHead(404).end();
  });
  const good = await new MockEngine().start();
  const { router, gateway, base } = await breakerGateway([
    { id: 'hang', url: hanging.url },
    { id: 'good', url: `http://127.0.0.1:${good.port}` },
  ]);
  try {
    let sent = 0;
    await until(
      async () => {
        const r = await post(base, '/v1/completions', { prompt: `h${sent++}`, max_tokens: 2, stream: true });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.headers.get('x-contextforge-worker'), 'good');
        return gateway.health.reasons('hang').includes('breaker');
      },
      "the hanging engine's circuit opening",
      { timeoutMs: 30_000, intervalMs: 1 },
    );
    // each overdue first byte came after the good engine answered: the circuit opens after 3 of
    // them, as after 3 connections refused (the first held back until the second counts)
    assert.equal(completions, 3, 'opened after its third overdue first byte');
    assert.equal(router.getStats().inFlightRequests, 0);
  } finally {
    await gateway.close();
    await hanging.close();
    await good.close();
  }
});
