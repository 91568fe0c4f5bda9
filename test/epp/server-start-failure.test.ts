/**
 * An endpoint picker that cannot bind its port (taken) fails its start and leaves nothing
 * running: no readiness poll of the picker goes on after the failure.
 */
import assert from 'node:assert/strict';
import { createServer, type AddressInfo } from 'node:net';
import { test } from 'node:test';
import { startEppServer } from '../../src/epp/server.js';

test('a picker whose port is taken fails to start and stops polling readiness', async () => {
  const blocker = createServer();
  await new Promise<void>((r) => blocker.listen(0, '127.0.0.1', r));
  const port = (blocker.address() as AddressInfo).port;
  let polls = 0;
  try {
    await assert.rejects(
      startEppServer({
        host: '127.0.0.1',
        port,
        bodyLimit: 1024,
        picker: { pick: () => ({ ok: false, status: 503, message: 'unused' }) },
        ready: () => {
          polls++;
          return false;
        },
        readinessIntervalMs: 5,
      }),
      /EADDRINUSE|address already in use/,
    );
    const after = polls;
    // ten of the poll's intervals, counted on an interval of the test's own
    await new Promise<void>((resolve) => {
      let ticks = 0;
      const t = setInterval(() => {
        if (++ticks < 10) return;
        clearInterval(t);
        resolve();
      }, 5);
    });
    assert.equal(polls - after, 0, 'readiness polled after the failed start');
  } finally {
    await new Promise<void>((r) => blocker.close(() => r()));
  }
});
