/**
 * How long a health probe waits (`healthCheckTimeoutMs`, `--health-timeout-ms`): SGLang's
 * /health runs a one-token generation and looks for its answer once a second, so a healthy
 * engine answers after a second or more, longer under load. Such an engine stays in rotation
 * whatever the probe interval; an engine that does not answer within the timeout still leaves it.
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type GatewayOptions } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';

/** An engine whose /health answers 200 after `delayMs` (SGLang's with its generation check on); `answered` counts them. */
async function slowHealthEngine(delayMs: number) {
  let answered = 0;
  const timers = new Set<NodeJS.Timeout>();
  const server = createServer((req, res) => {
    req.resume();
    if (req.url !== '/health') return void res.writeHead(404).end();
    const t = setTimeout(() => {
      timers.delete(t);
      answered++;
      res.writeHead(200).end();
    }, delayMs);
    timers.add(t);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    answered: () => answered,
    close: () =>
      new Promise<void>((r) => {
        for (const t of timers) clearTimeout(t);
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/** A gateway over the engine alone, probing it every `healthCheckIntervalMs`; `changes` lists its rotation changes. */
async function gatewayOver(url: string, options: Partial<GatewayOptions>) {
  const changes: string[] = [];
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'sglang', url }],
    metricsIntervalMs: 0,
    ...options,
  });
  gateway.health.onChange((id, available, detail) => changes.push(`${id} ${available ? 'in' : 'out'} ${detail}`));
  return { gateway, changes };
}

test("an engine whose /health takes 1.2 s (SGLang's generation check) stays in rotation, probed every 200 ms with the default timeout", async () => {
  const engine = await slowHealthEngine(1200);
  const { gateway, changes } = await gatewayOver(engine.url, { healthCheckIntervalMs: 200 });
  try {
    await until(() => engine.answered() >= 3 || changes.length > 0, 'three probes answered', { timeoutMs: 30_000 });
    assert.deepEqual(changes, [], 'never out of rotation');
    assert.deepEqual(gateway.health.reasons('sglang'), []);
  } finally {
    await gateway.close();
    await engine.close();
  }
});

test('a probe still times out at the timeout set: an engine answering later leaves rotation', async () => {
  const engine = await slowHealthEngine(1200);
  const { gateway, changes } = await gatewayOver(engine.url, { healthCheckIntervalMs: 200, healthCheckTimeoutMs: 300 });
  try {
    await until(() => changes.length > 0, 'the engine out of rotation', { timeoutMs: 30_000 });
    assert.match(changes[0], /^sglang out .*time/);
    assert.deepEqual(gateway.health.reasons('sglang'), ['health-check']);
  } finally {
    await gateway.close();
    await engine.close();
  }
});

test('a health-probe timeout that is not a whole number of milliseconds from 1 up is refused, naming it', async () => {
  for (const healthCheckTimeoutMs of [0, -1, 1.5, Number.NaN, 2 ** 31]) {
    await assert.rejects(
      createGateway({
        router: new KVAwareRouter({ policy: 'round-robin' }),
        workers: [],
        metricsIntervalMs: 0,
        healthCheckTimeoutMs,
      }),
      (err: Error) => err instanceof RangeError && /healthCheckTimeoutMs/.test(err.message),
      String(healthCheckTimeoutMs),
    );
  }
});
