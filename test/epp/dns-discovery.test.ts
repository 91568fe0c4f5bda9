import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseDiscoverySpec } from '../../src/cli/commands/epp.js';
import { discoveryHost } from '../../src/epp/run-picker.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { DnsDiscovery, workerForAddress } from '../../src/server/dns-discovery.js';
import { WORKER_ID, parseWorkerRecord } from '../../src/server/worker-input.js';
import type { WorkerRecord } from '../../src/state/state-store.js';

function host() {
  const workers = new Map<string, WorkerRecord>();
  const logs: string[] = [];
  return {
    workers,
    logs,
    addWorker: (w: WorkerRecord) => void workers.set(w.id, w),
    removeWorker: (id: string) => workers.delete(id),
    hasWorker: (id: string) => workers.has(id),
    log: (m: string) => void logs.push(m),
  };
}

test('addresses become workers; one missing resolution keeps a worker, two remove it; a failed lookup changes nothing', async () => {
  let answer: string[] | Error = ['10.0.0.1', '10.0.0.2'];
  const h = host();
  const d = new DnsDiscovery(parseDiscoverySpec('dns=vllm.default.svc,port=8000,events-port=5557'), h, async () => {
    if (answer instanceof Error) throw answer;
    return answer;
  });
  await d.refresh();
  assert.deepEqual([...h.workers.keys()], ['10.0.0.1:8000', '10.0.0.2:8000']);
  assert.deepEqual(h.workers.get('10.0.0.1:8000'), {
    id: '10.0.0.1:8000',
    url: 'http://10.0.0.1:8000',
    events: 'tcp://10.0.0.1:5557',
    replay: undefined,
    models: undefined,
  });
  answer = ['10.0.0.2', '10.0.0.3'];
  await d.refresh();
  assert.deepEqual(
    [...h.workers.keys()].sort(),
    ['10.0.0.1:8000', '10.0.0.2:8000', '10.0.0.3:8000'],
    'one miss is not enough',
  );
  answer = Object.assign(new Error('getaddrinfo EAI_AGAIN'), { code: 'EAI_AGAIN' });
  await d.refresh();
  assert.equal(h.workers.size, 3, 'a failed lookup removes nothing');
  assert.match(h.logs.at(-1)!, /cannot resolve vllm\.default\.svc/);
  answer = ['10.0.0.2', '10.0.0.3'];
  await d.refresh();
  assert.deepEqual([...h.workers.keys()].sort(), ['10.0.0.2:8000', '10.0.0.3:8000'], 'two misses remove it');
  d.stop();
});

test('IPv6 addresses: ids without brackets or colons, one per address; URLs bracketed; hand-added workers left alone', async () => {
  const h = host();
  // the gateway's own checks of a worker, as addWorker() runs them
  const add = h.addWorker;
  h.addWorker = (w) => add(parseWorkerRecord(w, `worker ${w.id}`));
  h.addWorker({ id: 'static', url: 'http://10.1.1.1:8000' });
  const d = new DnsDiscovery(parseDiscoverySpec('dns=vllm,port=8000,events-port=5557'), h, async () => [
    'fd00::5',
    '2001:db8:85a3::8a2e:370:7334',
    '::1',
    'fd00::',
    'FD00:0:0::6', // another spelling of fd00::6: one worker, spelled the canonical way
    'fd00::6',
    '10.0.0.5',
  ]);
  await d.refresh();
  assert.deepEqual(
    h.logs.filter((m) => m.includes('cannot add')),
    [],
    'every address is added',
  );
  assert.deepEqual([...h.workers.keys()].sort(), [
    '0--1-8000',
    '10.0.0.5:8000',
    '2001-db8-85a3--8a2e-370-7334-8000',
    'fd00--0-8000',
    'fd00--5-8000',
    'fd00--6-8000',
    'static',
  ]);
  const w = h.workers.get('fd00--5-8000')!;
  assert.equal(w.url, 'http://[fd00::5]:8000');
  assert.equal(w.events, 'tcp://[fd00::5]:5557');
  assert.equal(h.workers.get('0--1-8000')!.url, 'http://[::1]:8000');
  assert.equal(h.workers.get('fd00--0-8000')!.url, 'http://[fd00::]:8000');
  for (const id of h.workers.keys()) assert.match(id, WORKER_ID);
  const logged = h.logs.length;
  await d.refresh();
  assert.equal(h.logs.length, logged, 'a second resolution of the same addresses logs nothing');
  const empty = new DnsDiscovery(parseDiscoverySpec('dns=vllm,port=8000'), h, async () => []);
  await empty.refresh();
  await empty.refresh();
  assert.ok(h.workers.has('static'));
});

test('an address that cannot be a worker is logged once while it stays, the others are added', async () => {
  const h = host();
  let answer = ['fe80::1%eth0', '10.0.0.1'];
  const d = new DnsDiscovery(parseDiscoverySpec('dns=vllm,port=8000'), h, async () => answer);
  await d.refresh();
  await d.refresh();
  assert.deepEqual([...h.workers.keys()], ['10.0.0.1:8000']);
  assert.deepEqual(
    h.logs.filter((m) => !m.includes('added')),
    ['discovery: cannot add fe80::1%eth0: address fe80::1%eth0 cannot be written in a URL'],
  );
  answer = ['10.0.0.1'];
  await d.refresh();
  answer = ['fe80::1%eth0', '10.0.0.1'];
  await d.refresh();
  assert.equal(h.logs.filter((m) => m.includes('cannot add')).length, 2, 'logged again after it was gone');
});

test('a real lookup: localhost resolves to the loopback address', async () => {
  const h = host();
  const d = await new DnsDiscovery(parseDiscoverySpec('dns=localhost,port=8000,interval-ms=100000'), h).start();
  d.stop();
  assert.ok(
    [...h.workers.keys()].some((id) => id === '127.0.0.1:8000' || id === '0--1-8000'),
    [...h.workers.keys()].join(', '),
  );
});

test('stop() during start() leaves no resolution running afterwards', async (t) => {
  t.mock.timers.enable({ apis: ['setInterval'] });
  let calls = 0;
  let release!: () => void;
  const first = new Promise<void>((resolve) => (release = resolve));
  const h = host();
  const d = new DnsDiscovery({ ...parseDiscoverySpec('dns=vllm,port=8000'), intervalMs: 1000 }, h, async () => {
    calls++;
    if (calls === 1) await first;
    return ['10.0.0.1'];
  });
  const started = d.start();
  d.stop();
  release();
  await started;
  t.mock.timers.tick(5000);
  await Promise.resolve();
  assert.equal(calls, 1, 'no interval resolves after stop()');
  assert.equal(h.workers.size, 0, 'a resolution that ends after stop() adds nothing');
});

test("a worker the operator added under an address's id is never removed by discovery", async () => {
  const h = host();
  h.addWorker({ id: '10.0.0.4:8000', url: 'http://10.0.0.4:8000' });
  let answer = ['10.0.0.4', '10.0.0.5'];
  const d = new DnsDiscovery(parseDiscoverySpec('dns=vllm,port=8000'), h, async () => answer);
  await d.refresh();
  assert.deepEqual([...h.workers.keys()].sort(), ['10.0.0.4:8000', '10.0.0.5:8000']);
  answer = [];
  await d.refresh();
  await d.refresh();
  await d.refresh();
  assert.deepEqual([...h.workers.keys()], ['10.0.0.4:8000'], "only discovery's own worker is removed");
  assert.deepEqual(
    h.logs.filter((m) => m.includes('removed')),
    ['discovery: worker 10.0.0.5:8000 removed (gone from vllm)'],
  );
  // the operator removes it while DNS lists it: discovery adds it as its own, and removes it when it goes
  answer = ['10.0.0.4'];
  await d.refresh();
  h.removeWorker('10.0.0.4:8000');
  await d.refresh();
  assert.ok(h.workers.has('10.0.0.4:8000'));
  answer = [];
  await d.refresh();
  await d.refresh();
  assert.equal(h.workers.size, 0);
  d.stop();
});

test('a lookup that does not answer is given up at its deadline, and discovery goes on', async () => {
  const h = host();
  let hang = true;
  const hung: Array<(addresses: string[]) => void> = [];
  const d = new DnsDiscovery(
    parseDiscoverySpec('dns=vllm,port=8000'),
    h,
    async () => (hang ? new Promise<string[]>((resolve) => hung.push(resolve)) : ['10.0.0.1']),
    { lookupTimeoutMs: 20 },
  );
  await d.refresh();
  await d.refresh();
  assert.equal(h.workers.size, 0);
  assert.match(h.logs.join('\n'), /cannot resolve vllm: no answer within 20 ms/);
  // lookups left unanswered are bounded (each holds a thread of libuv's pool): past them, a
  // resolution fails at once, and waits for none
  for (let i = 0; i < 5; i++) await d.refresh();
  assert.equal(hung.length, 2, 'at most two lookups are left unanswered at once');
  hang = false;
  // a late answer is not taken (a newer lookup says what the name resolves to now)
  for (const answer of hung) answer(['10.0.0.9']);
  await new Promise((resolve) => setImmediate(resolve)); // the lookups' ends are seen
  await d.refresh();
  assert.deepEqual([...h.workers.keys()], ['10.0.0.1:8000']);
  d.stop();
});

test('lookups that fail alike are logged once until the name resolves again', async () => {
  const h = host();
  let answer: string[] | Error = Object.assign(new Error('getaddrinfo ENOTFOUND vllm'), { code: 'ENOTFOUND' });
  const d = new DnsDiscovery(parseDiscoverySpec('dns=vllm,port=8000'), h, async () => {
    if (answer instanceof Error) throw answer;
    return answer;
  });
  for (let i = 0; i < 5; i++) await d.refresh();
  assert.equal(h.logs.filter((m) => m.includes('cannot resolve')).length, 1, h.logs.join('\n'));
  answer = Object.assign(new Error('getaddrinfo EAI_AGAIN vllm'), { code: 'EAI_AGAIN' });
  await d.refresh();
  await d.refresh();
  assert.equal(h.logs.filter((m) => m.includes('cannot resolve')).length, 2, 'another kind of failure is logged');
  answer = ['10.0.0.1'];
  await d.refresh();
  assert.ok(
    h.logs.some((m) => /vllm resolves again/.test(m)),
    h.logs.join('\n'),
  );
  answer = Object.assign(new Error('getaddrinfo ENOTFOUND vllm'), { code: 'ENOTFOUND' });
  await d.refresh();
  assert.equal(h.logs.filter((m) => m.includes('cannot resolve')).length, 3, 'logged again after a success');
  d.stop();
});

test('a worker drained when it left DNS comes back drained', async () => {
  const h = host();
  const draining = new Set<string>();
  const d = new DnsDiscovery(
    parseDiscoverySpec('dns=vllm,port=8000'),
    {
      ...h,
      removeWorker: (id: string) => {
        draining.delete(id);
        return h.removeWorker(id);
      },
      isDraining: (id: string) => draining.has(id),
      drainWorker: (id: string) => void draining.add(id),
    },
    async () => answer,
  );
  let answer = ['10.0.0.1', '10.0.0.2'];
  await d.refresh();
  draining.add('10.0.0.1:8000'); // the operator drains it
  answer = [];
  await d.refresh();
  await d.refresh();
  assert.equal(h.workers.size, 0);
  answer = ['10.0.0.1', '10.0.0.2'];
  await d.refresh();
  assert.deepEqual([...h.workers.keys()].sort(), ['10.0.0.1:8000', '10.0.0.2:8000']);
  assert.deepEqual([...draining], ['10.0.0.1:8000'], 'drained as it was; the other one not');
  assert.ok(
    h.logs.some((m) => /10\.0\.0\.1:8000 added drained/.test(m)),
    h.logs.join('\n'),
  );
  // resumed by the operator, it leaves and comes back in rotation
  draining.clear();
  answer = [];
  await d.refresh();
  await d.refresh();
  answer = ['10.0.0.1'];
  await d.refresh();
  assert.deepEqual([...draining], []);
  d.stop();
});

test("a worker discovery would have added, found already there (a replica's, before a restart), is discovery's to remove", async () => {
  const h = host();
  const operators = new Set<string>(['10.0.0.4:8000']);
  // the gateway's answer: the worker's record is the one discovery makes, and no operator added it here
  const claimable = (w: WorkerRecord) =>
    !operators.has(w.id) && JSON.stringify(h.workers.get(w.id)) === JSON.stringify(w);
  const spec = parseDiscoverySpec('dns=vllm,port=8000');
  h.addWorker({
    id: '10.0.0.4:8000',
    url: 'http://10.0.0.4:8000',
    events: undefined,
    replay: undefined,
    models: undefined,
  });
  // loaded from the shared state at start: another replica's discovery added them
  h.addWorker(workerForAddress(spec, '10.0.0.5'));
  h.addWorker({ ...workerForAddress(spec, '10.0.0.6'), models: ['m'] }); // not as discovery makes it
  let answer = ['10.0.0.4', '10.0.0.5', '10.0.0.6'];
  const d = new DnsDiscovery(spec, { ...h, claimable }, async () => answer);
  await d.refresh();
  answer = [];
  await d.refresh();
  await d.refresh();
  assert.deepEqual([...h.workers.keys()].sort(), ['10.0.0.4:8000', '10.0.0.6:8000']);
  d.stop();
});

test("with a gateway: the admin API's worker stays when DNS drops its address; a drained one returns drained", async () => {
  const adminToken = 'dns-discovery-admin';
  const gateway = await createGateway({
    adminToken,
    router: new KVAwareRouter({ blockSize: 16 }),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  const logs: string[] = [];
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const admin = (method: string, path: string, body?: unknown) =>
      fetch(`${base}${path}`, {
        method,
        headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    const added = await admin('POST', '/admin/workers', { id: '127.0.0.4:8000', url: 'http://127.0.0.4:8000' });
    assert.equal(added.status, 201, await added.text());
    let answer = ['127.0.0.4', '127.0.0.5'];
    const d = new DnsDiscovery(
      parseDiscoverySpec('dns=engines,port=8000'),
      discoveryHost(gateway, (m) => logs.push(m)),
      async () => answer,
    );
    await d.refresh();
    const drained = await admin('POST', '/admin/workers/127.0.0.5:8000/drain');
    assert.equal(drained.status, 200, await drained.text());
    answer = [];
    await d.refresh();
    await d.refresh();
    assert.deepEqual(
      gateway.router.listWorkers().map((w) => w.id),
      ['127.0.0.4:8000'],
      logs.join('\n'),
    );
    answer = ['127.0.0.5'];
    await d.refresh();
    const back = gateway.router.listWorkers().find((w) => w.id === '127.0.0.5:8000');
    assert.equal(back?.draining, true, logs.join('\n'));
    d.stop();
  } finally {
    await gateway.close();
  }
});
