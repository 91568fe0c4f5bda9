import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DnsDiscovery, unusableAddress, workerForAddress } from '../../src/server/dns-discovery.js';
import type { WorkerRecord } from '../../src/state/state-store.js';

const spec = { dns: 'vllm.default.svc', port: 8000, intervalMs: 5000 };

test('a sinkhole answer (0.0.0.0, ::) and broadcast or multicast addresses become no worker, logged once each', async () => {
  const workers = new Map<string, WorkerRecord>();
  const logs: string[] = [];
  const d = new DnsDiscovery(
    spec,
    {
      addWorker: (w) => void workers.set(w.id, w),
      removeWorker: (id) => workers.delete(id),
      hasWorker: (id) => workers.has(id),
      log: (m) => void logs.push(m),
    },
    async () => [
      '0.0.0.0',
      '::',
      '::ffff:0.0.0.0',
      '0.1.2.3',
      '255.255.255.255',
      '224.0.0.1',
      'ff02::1',
      '10.0.0.1',
      'fd00::5',
    ],
  );
  await d.refresh();
  assert.deepEqual([...workers.keys()], ['10.0.0.1:8000', 'fd00--5-8000']);
  const skipped = logs.filter((m) => m.startsWith('discovery: cannot add'));
  assert.equal(skipped.length, 7, logs.join('\n'));
  assert.ok(
    skipped.some((m) => /cannot add 0\.0\.0\.0: .*unspecified/.test(m)),
    logs.join('\n'),
  );
  assert.ok(
    skipped.some((m) => /cannot add ::: .*unspecified/.test(m)),
    logs.join('\n'),
  );
  // the same answer again says nothing new
  const before = logs.length;
  await d.refresh();
  assert.deepEqual([...workers.keys()], ['10.0.0.1:8000', 'fd00--5-8000']);
  assert.deepEqual(logs.slice(before), []);
  d.stop();
});

test('workerForAddress refuses the addresses no engine is at, and takes ordinary ones', () => {
  for (const a of ['0.0.0.0', '::', '0::0', '::ffff:0.0.0.0', '255.255.255.255', '239.1.2.3', 'ff05::2'])
    assert.throws(() => workerForAddress(spec, a), RangeError, a);
  for (const a of [
    '10.0.0.1',
    '127.0.0.1',
    '1.0.0.0',
    '223.255.255.255',
    '240.0.0.1',
    '::1',
    'fe80::1',
    '::ffff:10.0.0.1',
  ])
    assert.equal(
      unusableAddress(new URL(`http://${a.includes(':') ? `[${a}]` : a}/`).hostname.replace(/^\[|\]$/g, '')),
      undefined,
      a,
    );
  assert.equal(workerForAddress(spec, '10.0.0.1').url, 'http://10.0.0.1:8000');
});
