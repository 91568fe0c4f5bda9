import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Socket } from 'zeromq';
import { Publisher } from 'zeromq';
import { bindEndpoint } from '../../src/engines/kv-events/bind.js';
import { KvEventPublisher } from '../../src/engines/kv-events/publisher.js';

/** A socket whose first `failures` binds fail with `code`; it records every endpoint bound. */
function flakySocket(failures: number, code: string): { socket: Socket; tries: string[] } {
  const tries: string[] = [];
  const socket = {
    bind: async (endpoint: string) => {
      tries.push(endpoint);
      if (tries.length <= failures) throw Object.assign(new Error(`bind failed: ${code}`), { code });
    },
  } as unknown as Socket;
  return { socket, tries };
}

test("a port of * picked where a connection's local port is: the bind tries again", async () => {
  const { socket, tries } = flakySocket(3, 'EADDRINUSE');
  await bindEndpoint(socket, 'tcp://127.0.0.1:*');
  assert.equal(tries.length, 4);
});

test('a fixed port in use, another error, or a wildcard that never binds is thrown', async () => {
  const fixed = flakySocket(1, 'EADDRINUSE');
  await assert.rejects(bindEndpoint(fixed.socket, 'tcp://127.0.0.1:5557'), { code: 'EADDRINUSE' });
  assert.equal(fixed.tries.length, 1);
  const other = flakySocket(1, 'EACCES');
  await assert.rejects(bindEndpoint(other.socket, 'tcp://127.0.0.1:*'), { code: 'EACCES' });
  assert.equal(other.tries.length, 1);
  const never = flakySocket(Infinity, 'EADDRINUSE');
  await assert.rejects(bindEndpoint(never.socket, 'tcp://127.0.0.1:*'), { code: 'EADDRINUSE' });
  assert.equal(never.tries.length, 20);
});

test('a publisher whose port is taken fails to start, and a real wildcard bind starts', async () => {
  const holder = new Publisher({ linger: 0 });
  await holder.bind('tcp://127.0.0.1:*');
  try {
    await assert.rejects(new KvEventPublisher({ endpoint: holder.lastEndpoint! }).start(), /in use/i);
    const pub = await new KvEventPublisher({
      endpoint: 'tcp://127.0.0.1:*',
      replayEndpoint: 'tcp://127.0.0.1:*',
    }).start();
    assert.match(pub.endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/);
    assert.match(pub.replayEndpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/);
    await pub.close();
  } finally {
    holder.close();
  }
});
