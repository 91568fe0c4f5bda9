/**
 * An engine publishes one KV-event stream: two workers subscribed to it would both be credited
 * with its blocks. serve refuses such workers, naming both; the admin API answers 409 naming the
 * field. Data-parallel ranks (port + rank) are compared rank by rank.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { hasRank, sharedEndpoint, workerRanks } from '../../src/server/engine-deployments.js';
import { resolveServe } from '../helpers/serve-config.js';
import { adminGateway } from '../helpers/admin-call.js';

let setup: Awaited<ReturnType<typeof adminGateway>>;

before(async () => {
  setup = await adminGateway('shared-endpoints-admin', [
    { id: 'a', url: 'http://127.0.0.1:1', events: 'tcp://127.0.0.1:45557', replay: 'tcp://127.0.0.1:45600' },
    { id: 'dp', url: 'http://127.0.0.1:2', events: 'tcp://127.0.0.1:45700', dpSize: 4 },
  ]);
});
after(() => setup.close());

const call = (method: string, path: string, body?: unknown) => setup.call(method, path, body);

const ids = async () =>
  (JSON.parse((await call('GET', '/admin/workers')).text) as { workers: Array<{ id: string }> }).workers.map(
    (w) => w.id,
  );

test('the admin API refuses a worker on another worker’s events or replay endpoint with 409 naming the field', async () => {
  const before = await ids();
  for (const [worker, field, other] of [
    [{ id: 'b', url: 'http://127.0.0.1:3', events: 'tcp://127.0.0.1:45557' }, 'events', 'a'],
    [
      { id: 'b', url: 'http://127.0.0.1:3', events: 'tcp://127.0.0.1:45558', replay: 'tcp://127.0.0.1:45600' },
      'replay',
      'a',
    ],
    // rank 2 of 'dp' publishes on 45702
    [{ id: 'b', url: 'http://127.0.0.1:3', events: 'tcp://127.0.0.1:45702' }, 'events', 'dp'],
    // this one's rank 1 is 'a''s port
    [{ id: 'b', url: 'http://127.0.0.1:3', events: 'tcp://127.0.0.1:45556', dpSize: 2 }, 'events', 'a'],
  ] as const) {
    const r = await call('POST', '/admin/workers', worker);
    assert.equal(r.status, 409, r.text);
    assert.equal(r.error?.param, field, r.text);
    assert.match(r.error!.message, new RegExp(`workers '${other}' and 'b' have the same ${field} endpoint`), r.text);
  }
  assert.deepEqual(await ids(), before);
  // the port past the last rank is another engine's
  const ok = await call('POST', '/admin/workers', {
    id: 'c',
    url: 'http://127.0.0.1:4',
    events: 'tcp://127.0.0.1:45704',
  });
  assert.equal(ok.status, 201, ok.text);
  assert.equal((await call('DELETE', '/admin/workers/c')).status, 200);
});

test('serve refuses two workers on one events or replay endpoint, naming both', () => {
  assert.throws(
    () =>
      resolveServe([
        '--worker',
        'id=w1,url=http://127.0.0.1:8000,events=tcp://127.0.0.1:5557',
        '--worker',
        'id=w2,url=http://127.0.0.1:8001,events=tcp://127.0.0.1:5557',
      ]),
    /^RangeError: --worker: workers 'w1' and 'w2' have the same events endpoint tcp:\/\/127\.0\.0\.1:5557/,
  );
  assert.throws(
    () =>
      resolveServe([
        '--worker',
        'id=w1,url=http://127.0.0.1:8000,events=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5600',
        '--worker',
        'id=w2,url=http://127.0.0.1:8001,events=tcp://127.0.0.1:5558,replay=tcp://127.0.0.1:5600',
      ]),
    /workers 'w1' and 'w2' have the same replay endpoint/,
  );
  assert.throws(
    () =>
      resolveServe([
        '--worker',
        'id=w1,url=http://127.0.0.1:8000,events=tcp://127.0.0.1:5557,dp-size=2',
        '--worker',
        'id=w2,url=http://127.0.0.1:8001,events=tcp://127.0.0.1:5558',
      ]),
    /workers 'w1' and 'w2' have the same events endpoint tcp:\/\/127\.0\.0\.1:5558/,
  );
  // ranks served on their own (external load balancing): one worker per rank, each on its port
  const { config } = resolveServe([
    '--worker',
    'id=r0,url=http://127.0.0.1:8000,events=tcp://127.0.0.1:5557',
    '--worker',
    'id=r1,url=http://127.0.0.1:8001,events=tcp://127.0.0.1:5558',
  ]);
  assert.equal(config.workers.length, 2);
});

test('sharedEndpoint compares ranks, skips the worker itself and workers without events', () => {
  const w = { id: 'x', events: 'tcp://h:5557', dpSize: 2 };
  assert.equal(sharedEndpoint(w, [{ id: 'x', events: 'tcp://h:5557' }]), undefined);
  assert.equal(sharedEndpoint(w, [{ id: 'y' }, { id: 'z', events: 'tcp://h:5559' }]), undefined);
  assert.deepEqual(sharedEndpoint(w, [{ id: 'y', events: 'tcp://h:5558' }]), {
    field: 'events',
    endpoint: 'tcp://h:5558',
    worker: 'x',
    other: 'y',
  });
  assert.equal(sharedEndpoint({ id: 'i', events: 'ipc:///tmp/a' }, [{ id: 'j', events: 'ipc:///tmp/b' }]), undefined);
  assert.equal(sharedEndpoint({ id: 'i', events: 'ipc:///tmp/a' }, [{ id: 'j', events: 'ipc:///tmp/a' }])?.other, 'j');
});

test('dp-start-rank: the ranks are global (ids, ports), the header their index', () => {
  assert.deepEqual(workerRanks({ id: 'n', dpSize: 2, dpStartRank: 4 }), [
    { id: 'n#4', rank: 4, header: 0, portOffset: 4 },
    { id: 'n#5', rank: 5, header: 1, portOffset: 5 },
  ]);
  assert.deepEqual(workerRanks({ id: 'n', dpSize: 2 }), [
    { id: 'n#0', rank: 0, header: 0, portOffset: 0 },
    { id: 'n#1', rank: 1, header: 1, portOffset: 1 },
  ]);
  assert.deepEqual(workerRanks({ id: 'n' }), [{ id: 'n', rank: null, header: null, portOffset: 0 }]);
  assert.deepEqual(
    ['3', '4', '5', '6', '04', 'x'].map((r) => hasRank({ dpSize: 2, dpStartRank: 4 }, r)),
    [false, true, true, false, false, false],
  );
  assert.equal(hasRank({ dpSize: 1, dpStartRank: 4 }, '4'), false);
  // nodes of one engine on one host, the configured port the same: ports 5557+0…3 and 5557+4…7
  const node0 = { id: 'a', events: 'tcp://h:5557', dpSize: 4 };
  const node1 = { id: 'b', events: 'tcp://h:5557', dpSize: 4, dpStartRank: 4 };
  assert.equal(sharedEndpoint(node1, [node0]), undefined);
  assert.deepEqual(sharedEndpoint(node1, [{ id: 'c', events: 'tcp://h:5562' }]), {
    field: 'events',
    endpoint: 'tcp://h:5562',
    worker: 'b',
    other: 'c',
  });
});
