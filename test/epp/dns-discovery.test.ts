import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseDiscoverySpec } from '../../src/cli/commands/epp.js';
import { DnsDiscovery } from '../../src/server/dns-discovery.js';
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
