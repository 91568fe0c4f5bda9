/**
 * The pause between a failed attempt and the next one (25 ms × attempt) is for another worker:
 * when no other worker is left to try, the failure is answered at once. The gateway's
 * setTimeout is a fake clock the test advances by hand, so a pause is seen as the clock it
 * needed, never as wall time.
 */
import assert from 'node:assert/strict';
import { createServer, request, type IncomingMessage } from 'node:http';
import { mock, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { listening } from '../helpers/listening.js';

/**
 * Polls `cond` on a real interval (setTimeout is the fake clock here) until it holds, calling
 * `step` before each look; throws naming `what` after the deadline.
 */
function untilReal(cond: () => boolean, what: string, step: () => void = () => {}, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  return new Promise<void>((resolve, reject) => {
    const look = setInterval(() => {
      step();
      if (cond()) {
        clearInterval(look);
        resolve();
      } else if (Date.now() > deadline) {
        clearInterval(look);
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`));
      }
    }, 5);
  });
}

test('a failed attempt with another worker left pauses before it; with none left, the failure is answered without a pause', async (t) => {
  // every engine fails; `asked` records which was asked at which reading of the fake clock
  let fakeMs = 0;
  const asked: { id: string; atMs: number }[] = [];
  const failing = (id: string) =>
    listening(
      createServer((req, res) => {
        req.resume();
        // what the gateway asks on its own (the served models) is not an attempt
        if (req.url !== '/v1/completions') return void res.writeHead(404).end();
        asked.push({ id, atMs: fakeMs });
        res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":"down"}');
      }),
    );
  const engines = [await failing('a'), await failing('b')];
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: engines.map((e, i) => ({ id: i === 0 ? 'a' : 'b', url: e.url })),
    maxRetries: 2,
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const port = (gateway.app.server.address() as { port: number }).port;
  mock.timers.enable({ apis: ['setTimeout'] });
  t.after(async () => {
    mock.timers.reset();
    await gateway.close(0);
    for (const e of engines) await e.close();
  });

  let answer: { status: number; body: string } | undefined;
  const body = JSON.stringify({ model: 'm', prompt: 'hello' });
  const req = request(
    {
      port,
      host: '127.0.0.1',
      method: 'POST',
      path: '/v1/completions',
      headers: { 'content-type': 'application/json' },
    },
    (res: IncomingMessage) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d.toString()));
      res.on('end', () => (answer = { status: res.statusCode ?? 0, body: text }));
    },
  );
  req.on('error', () => {});
  req.end(body);

  // the first worker fails; the clock is moved 1 ms at a time until the second is asked
  await untilReal(() => asked.length >= 1, 'the first attempt');
  await untilReal(
    () => asked.length >= 2,
    'the second attempt',
    () => {
      if (asked.length < 2) {
        fakeMs += 1;
        mock.timers.tick(1);
      }
    },
  );
  assert.notEqual(asked[0].id, asked[1].id);
  assert.ok(asked[1].atMs - asked[0].atMs >= 25, `the retry waited its pause (${asked[1].atMs - asked[0].atMs} ms)`);

  // no worker is left: the answer comes with the clock standing still
  await untilReal(() => answer !== undefined, 'the answer, with no clock advanced after the last attempt');
  assert.equal(answer!.status, 502);
  assert.equal(asked.length, 2);
  assert.match(answer!.body, /the engines failed to answer/);
});
