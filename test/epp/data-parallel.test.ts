import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { PickerStream } from './envoy-role.js';
import { pickerFleetWithEnvoy } from './harness.js';
import { until } from '../helpers/wait.js';

// A worker with data-parallel ranks (dpSize 2) is two router workers behind one endpoint: the
// picker names the rank it chose in X-data-parallel-rank, and Envoy's report that the request
// was served on that endpoint leaves the decision (and its rank) as it was.

const picker = pickerFleetWithEnvoy({
  workers: [
    { engine: { dataParallelSize: 2 }, worker: { id: 'dp', dpSize: 2 } },
    { engine: { dataParallelSize: 2 }, worker: { id: 'dp2', dpSize: 2 } },
    { worker: { id: 'solo' } },
  ],
});
/** The gateway behind the picker. */
const gateway = () => picker.fleet.gateways[0];

let n = 0;
/** A completion of a prompt no other request shares. */
const body = () => JSON.stringify({ model: 'mock', prompt: `distinct prompt ${++n} `.repeat(30), max_tokens: 1 });
const inFlightOf = (id: string) =>
  gateway()
    .router.listWorkers()
    .find((w) => w.id === id)!.inFlightRequests;
const fallbacks = async () => {
  const line = (await gateway().metrics.metrics())
    .split('\n')
    .find((l) => l.startsWith('contextforge_epp_served_by_fallback_total '));
  return line === undefined ? 0 : Number(line.split(' ')[1]);
};
const finish = async (stream: PickerStream) => {
  await stream.respondBody(['{"choices":[]}']);
  await stream.end();
};

test('served on the decided endpoint: each rank keeps its decision, named in X-data-parallel-rank', async () => {
  const [dp] = picker.fleet.endpoints;
  const before = await fallbacks();
  const open: Array<{ rank: string | undefined; worker: string | undefined; stream: PickerStream }> = [];
  for (let i = 0; i < 4; i++) {
    const out = await picker.envoy.request({ headers: { ':path': '/v1/completions' }, body: body(), subset: [dp] });
    assert.equal(out.kind, 'routed', out.kind === 'immediate' ? out.body : '');
    if (out.kind !== 'routed') return;
    assert.deepEqual(out.endpoints, [dp]);
    const rank = out.setHeaders.get('x-data-parallel-rank');
    // Envoy reports the host:port it sent the request to, which both ranks share
    const set = await out.stream.respondHeaders({ served: dp }, true);
    open.push({ rank, worker: set.get('x-contextforge-worker'), stream: out.stream });
  }
  const workers = open.map((o) => o.worker);
  assert.ok(workers.includes('dp#0') && workers.includes('dp#1'), `both ranks serve: ${workers.join(' ')}`);
  for (const o of open) assert.equal(`dp#${String(o.rank)}`, o.worker, 'the rank named is the worker that serves');
  const onRank = (r: string) => open.filter((o) => o.rank === r).length;
  assert.equal(inFlightOf('dp#0'), onRank('0'));
  assert.equal(inFlightOf('dp#1'), onRank('1'));
  assert.equal(await fallbacks(), before, 'no request counts as served by a fallback');
  for (const o of open) await finish(o.stream);
  await until(() => inFlightOf('dp#0') + inFlightOf('dp#1') === 0, 'the requests to be released');
});

test("a rank's fallbacks are endpoints where that rank exists; a client's rank header never reaches a worker without ranks", async () => {
  const [dp, dp2, solo] = picker.fleet.endpoints;
  const open: PickerStream[] = [];
  const seen = new Set<string>();
  try {
    for (let i = 0; i < 15 && seen.size < 3; i++) {
      const out = await picker.envoy.request({
        headers: { ':path': '/v1/completions', 'x-data-parallel-rank': '1' },
        body: body(),
      });
      assert.equal(out.kind, 'routed', out.kind === 'immediate' ? out.body : '');
      if (out.kind !== 'routed') return;
      open.push(out.stream);
      const rank = out.setHeaders.get('x-data-parallel-rank');
      if (out.endpoints[0] === solo) {
        seen.add('solo');
        assert.equal(rank, undefined, 'no rank is set for a worker without ranks');
        assert.ok(out.removedHeaders.includes('x-data-parallel-rank'), "the client's rank header is removed");
      } else {
        assert.ok(rank === '0' || rank === '1', `the rank is named: ${String(rank)}`);
        seen.add(`rank ${rank}`);
        // rank 1 does not exist on the engine without ranks: it would refuse the request
        const others = new Set(out.endpoints.slice(1));
        const expected = new Set([dp, dp2, solo].filter((e) => e !== out.endpoints[0] && (rank === '0' || e !== solo)));
        assert.deepEqual(others, expected, `the fallbacks of rank ${rank}`);
      }
    }
    assert.deepEqual([...seen].sort(), ['rank 0', 'rank 1', 'solo']);
  } finally {
    for (const s of open) {
      await s.respondHeaders({}, true);
      await finish(s);
    }
  }
});

test('served on a fallback endpoint: the accounting moves to the same rank there', async () => {
  const [dp, dp2] = picker.fleet.endpoints;
  const before = await fallbacks();
  const open: Array<{ worker: string; stream: PickerStream }> = [];
  const ranks = new Set<string>();
  try {
    for (let i = 0; i < 8 && ranks.size < 2; i++) {
      const out = await picker.envoy.request({
        headers: { ':path': '/v1/completions' },
        body: body(),
        subset: [dp, dp2],
      });
      assert.equal(out.kind, 'routed', out.kind === 'immediate' ? out.body : '');
      if (out.kind !== 'routed') return;
      const rank = String(out.setHeaders.get('x-data-parallel-rank'));
      ranks.add(rank);
      assert.equal(out.endpoints.length, 2, 'the other engine is the fallback');
      const fallback = out.endpoints[1];
      const set = await out.stream.respondHeaders({ served: fallback }, true);
      const worker = `${fallback === dp ? 'dp' : 'dp2'}#${rank}`;
      open.push({ worker, stream: out.stream });
      assert.equal(set.get('x-contextforge-worker'), worker);
    }
    assert.deepEqual([...ranks].sort(), ['0', '1'], 'both ranks were chosen');
    for (const id of ['dp#0', 'dp#1', 'dp2#0', 'dp2#1'])
      assert.equal(inFlightOf(id), open.filter((o) => o.worker === id).length, `${id} holds what it served`);
    assert.equal(await fallbacks(), before + open.length);
  } finally {
    for (const o of open) await finish(o.stream);
  }
  await until(() => ['dp#0', 'dp#1', 'dp2#0', 'dp2#1'].every((id) => inFlightOf(id) === 0), 'the requests to end');
});
