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

test('an address no engine is at is refused in every spelling a resolver gives; a text that is no IP address too', () => {
  // as node's lookup writes them (IPv4-mapped with its IPv4 address dotted), uncompressed, in
  // capitals, with leading zeros; and as a URL writes a mapped address (hexadecimal)
  const unusable = {
    unspecified: ['0:0:0:0:0:0:0:0', '0000::', '::0.0.0.0', '::ffff:0.0.0.0', '0:0:0:0:0:FFFF:0:0', '::ffff:0:0'],
    '0.0.0.0/8': ['::ffff:0.1.2.3', '::FFFF:1:203'],
    broadcast: ['::ffff:255.255.255.255', '0:0:0:0:0:ffff:ffff:ffff'],
    multicast: [
      '::ffff:224.0.0.1',
      '::ffff:e000:1',
      '::FFFF:E000:0001',
      '::ffff:239.255.255.255',
      'FF02::1',
      'ff0e:0:0:0:0:0:0:1',
    ],
  };
  for (const [kind, addresses] of Object.entries(unusable))
    for (const a of addresses) {
      assert.match(unusableAddress(a) ?? '', new RegExp(kind.replaceAll('.', '\\.')), a);
      assert.throws(() => workerForAddress(spec, a), RangeError, a);
    }
  // an IPv4-compatible address is an IPv6 address to the kernel (it does not go to the IPv4
  // address): ::e000:1 is not 224.0.0.1, and ::1 is the loopback address
  for (const a of ['::e000:1', '::224.0.0.1', '::1', '0:0:0:0:0:0:0:1', 'FE80::1', '::ffff:10.0.0.1', '::FFFF:A00:1']) {
    assert.equal(unusableAddress(a), undefined, a);
    assert.ok(workerForAddress(spec, a).url.startsWith('http://['), a);
  }
  // no resolver answers these, but a URL reads each as an address: 0 is 0.0.0.0, 010.0.0.1 is 8.0.0.1
  for (const a of ['0', '4294967295', '0x7f.1', '010.0.0.1', '1.2.3', ''])
    assert.throws(() => workerForAddress(spec, a), /is not an IP address/, a);
  // a zone cannot be written in a URL
  assert.throws(() => workerForAddress(spec, 'fe80::1%eth0'), /cannot be written in a URL/);
});
