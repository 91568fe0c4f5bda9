/**
 * A Redis that requires a password, or an ACL user without the commands the shared state
 * uses: the replica's start fails with one clear error (the CLI: one line, exit 2) naming
 * Redis's refusal and never the password, rather than routing on while retrying in silence
 * (a refused password) or restarting its synchronisation every second (a refused command).
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';
import { Redis } from 'ioredis';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { RedisProcess } from './harness.js';
import { serveExit } from '../helpers/serve-exit.js';
import { fixedWorkersHost } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

const PASSWORD = 'cf-auth-secret-7f3a';
const redis = new RedisProcess(['--requirepass', PASSWORD]);

before(async () => {
  await redis.start();
  const admin = new Redis({ port: redis.port, password: PASSWORD, lazyConnect: true, maxRetriesPerRequest: 0 });
  await admin.connect();
  // may connect, and read one key, and nothing else
  await admin.acl('SETUSER', 'getter', 'on', '>getter-pw-91c2', '~*', '&*', '-@all', '+@connection', '+info', '+get');
  // the ACL docs/state.md gave before it granted STRLEN, for the prefix cf-acl:
  await admin.acl(
    'SETUSER',
    'older',
    'on',
    '>older-pw-5d1e',
    'resetkeys',
    '~cf-acl:*',
    'resetchannels',
    '&cf-acl:events*',
    '-@all',
    '+@connection',
    ...'+info +publish +subscribe +get +set +mget +del +eval +hset +hsetnx +hdel +hgetall +zadd +zrem +zremrangebyscore +zrange +pexpire +scan +multi +exec'.split(
      ' ',
    ),
  );
  admin.disconnect();
});
after(() => redis.kill());

/** Starts a gateway on `url`; resolves to what its start threw. */
async function startFailure(url: string): Promise<unknown> {
  const state = new RedisStateStore({ url, prefix: 'cf-auth:' });
  const logs: string[] = [];
  try {
    const gateway = await createGateway({
      router: new KVAwareRouter({ blockSize: 16 }),
      state,
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      log: (m) => logs.push(m),
      workers: [{ id: 'e0', url: 'http://127.0.0.1:1' }],
    });
    await gateway.close();
    return new Error(`started; logged: ${logs.join(' | ')}`);
  } catch (err) {
    return err;
  }
}

test('a wrong password, or none: the start fails with a RangeError naming the refusal, never the password', async () => {
  for (const [url, refusal] of [
    [`redis://:wrong-${PASSWORD}@127.0.0.1:${redis.port}`, /WRONGPASS/],
    [`redis://nobody:${PASSWORD}@127.0.0.1:${redis.port}`, /WRONGPASS/],
    [`redis://127.0.0.1:${redis.port}`, /NOAUTH/],
  ] as const) {
    const err = await startFailure(url);
    assert.ok(err instanceof RangeError, String(err));
    assert.match(err.message, refusal);
    assert.match(err.message, new RegExp(`127\\.0\\.0\\.1:${redis.port}`));
    assert.doesNotMatch(err.message, new RegExp(PASSWORD));
  }
});

test('an ACL user without the commands the state needs: the start fails with a RangeError naming NOPERM', async () => {
  const err = await startFailure(`redis://getter:getter-pw-91c2@127.0.0.1:${redis.port}`);
  assert.ok(err instanceof RangeError, String(err));
  assert.match(err.message, /NOPERM/);
  assert.doesNotMatch(err.message, /getter-pw-91c2/);
});

test('a gateway whose start Redis refused stops polling its workers', async () => {
  // the worker counts the requests it gets per gateway (each names itself in Via)
  const seen = new Map<string, number>();
  const worker = createServer((req, res) => {
    const via = String(req.headers.via ?? '');
    seen.set(via, (seen.get(via) ?? 0) + 1);
    res.setHeader('content-type', 'text/plain');
    res.end(req.url === '/metrics' ? '' : 'ok');
  });
  await new Promise<void>((r) => worker.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(worker.address() as AddressInfo).port}`;
  const polling = { metricsIntervalMs: 20, healthCheckIntervalMs: 20, workers: [{ id: 'e0', url }] };
  // a gateway that starts, polling at the same pace: its count is the test's clock
  const control = await createGateway({ router: new KVAwareRouter({ blockSize: 16 }), ...polling });
  try {
    await until(() => seen.size === 1, 'the control gateway to poll');
    const controlVia = [...seen.keys()][0];
    await assert.rejects(
      createGateway({
        router: new KVAwareRouter({ blockSize: 16 }),
        state: new RedisStateStore({ url: `redis://:wrong@127.0.0.1:${redis.port}`, prefix: 'cf-auth:' }),
        ...polling,
      }),
      RangeError,
    );
    const failedVia = () => [...seen.keys()].filter((v) => v !== controlVia);
    const controlPolls = seen.get(controlVia)!;
    // a poll already on its way when the start failed has landed by then
    await until(() => seen.get(controlVia)! >= controlPolls + 5, 'the control gateway to poll 5 more times');
    const after = new Map(failedVia().map((v) => [v, seen.get(v)!]));
    await until(() => seen.get(controlVia)! >= controlPolls + 25, 'the control gateway to poll 20 more times');
    for (const v of failedVia()) assert.equal(seen.get(v), after.get(v) ?? 0, `polls by ${v} after its failed start`);
  } finally {
    await control.close();
    await new Promise((r) => worker.close(r));
  }
});

test('serve with a wrong Redis password exits 2 with one line that does not echo it', async () => {
  const engine = await new MockEngine().start();
  const { code, stderr } = await serveExit([
    '--port',
    '0',
    '--admin-token',
    'cf-auth-admin',
    '--worker',
    `id=e0,url=http://127.0.0.1:${engine.port}`,
    '--state',
    `redis://:wrong-${PASSWORD}@127.0.0.1:${redis.port}`,
  ]);
  assert.equal(code, 2, stderr);
  const lines = stderr.trim().split('\n');
  assert.equal(lines.length, 1, stderr);
  assert.match(lines[0], /^error: state: .*WRONGPASS/);
  assert.doesNotMatch(stderr, new RegExp(PASSWORD));
  await engine.close();
});

test('an ACL user without STRLEN still has block entries read, an oversize one measured in the script', async () => {
  const admin = new Redis({ port: redis.port, password: PASSWORD, lazyConnect: true, maxRetriesPerRequest: 0 });
  await admin.connect();
  try {
    // one entry past the 8 MiB a decision message may hold with the defaults, one a replica wrote
    const big = JSON.stringify({ r: 'X', k: 'd', w: 'e0', h: Buffer.alloc(7 * 1024 * 1024, 7).toString('base64') });
    await admin.set('cf-acl:chain:e0:big', big, 'PX', 60_000);
    const h = Buffer.alloc(64, 7).toString('base64');
    await admin.set('cf-acl:chain:e0:good', JSON.stringify({ r: 'X', k: 'd', w: 'e0', h }), 'PX', 60_000);
    const store = new RedisStateStore({
      url: `redis://older:older-pw-5d1e@127.0.0.1:${redis.port}`,
      prefix: 'cf-acl:',
      replicaId: 'O',
    });
    const { host, logs } = fixedWorkersHost(new KVAwareRouter({ blockSize: 16 }), ['e0']);
    try {
      await store.attach(host);
      assert.equal(store.stats().connected, true, logs.join('\n'));
      assert.deepEqual([store.stats().decisionsApplied, store.stats().chainsOversize], [1, 1], logs.join('\n'));
    } finally {
      await store.close();
    }
  } finally {
    admin.disconnect();
  }
});
