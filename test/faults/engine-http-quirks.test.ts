/**
 * What deployed engines (and the proxies in front of them) send that a hand-written stub
 * rarely does: a Retry-After given as an HTTP date instead of seconds, and connections an engine
 * closes once they are idle for a few seconds without announcing it. The gateway must read them
 * as the engines mean them.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { answeringEngine } from './harness.js';

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0 };

test('a 429 whose Retry-After is an HTTP date gives the client the wait that date means, in seconds', async () => {
  // RFC 9110 §10.2.3: Retry-After = HTTP-date / delay-seconds; an hour from now, in the preferred format
  const inAnHour = new Date(Date.now() + 3600_000).toUTCString();
  const inThePast = new Date(Date.now() - 3600_000).toUTCString();
  for (const [retryAfter, low, high] of [
    [inAnHour, 3000, 3600],
    [inThePast, 1, 1],
  ] as const) {
    const engine = await answeringEngine(429, '{"error":{"message":"too many requests"}}', {
      'retry-after': retryAfter,
    });
    const gw = await createGateway({
      router: new KVAwareRouter({ policy: 'round-robin' }),
      workers: [{ id: 'busy', url: engine.url }],
      ...quiet,
    });
    try {
      const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
      const res = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: 'x' }),
      });
      await res.text();
      assert.equal(res.status, 429);
      const seconds = Number(res.headers.get('retry-after'));
      assert.ok(
        Number.isInteger(seconds) && seconds >= low && seconds <= high,
        `engine's Retry-After ${retryAfter}: the client's is ${res.headers.get('retry-after')}, not within [${low}, ${high}]`,
      );
    } finally {
      await gw.close();
      await engine.close();
    }
  }
});
