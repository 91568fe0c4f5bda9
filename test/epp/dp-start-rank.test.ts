import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { PickerStream } from './envoy-role.js';
import { pickerFleetWithEnvoy } from './harness.js';
import { until } from '../helpers/wait.js';

// Two nodes of one data-parallel engine under vLLM's hybrid load balancing: node a serves the
// global ranks 0 and 1, node b (--data-parallel-start-rank 2) the ranks 2 and 3. The picker names
// a rank to its node's API server by its index there (X-data-parallel-rank 0 or 1), and the
// router worker serving it is the global rank's (b#2, b#3).

const picker = pickerFleetWithEnvoy({
  engineOptions: { dataParallelSize: 2 },
  workers: [
    { worker: { id: 'a', dpSize: 2 } },
    { engine: { dataParallelStartRank: 2 }, worker: { id: 'b', dpSize: 2, dpStartRank: 2 } },
  ],
});
/** The gateway behind the picker. */
const gateway = () => picker.fleet.gateways[0];

let n = 0;
const body = () => JSON.stringify({ model: 'mock', prompt: `start rank prompt ${++n} `.repeat(30), max_tokens: 1 });
const inFlightOf = (id: string) =>
  gateway()
    .router.listWorkers()
    .find((w) => w.id === id)!.inFlightRequests;
const finish = async (stream: PickerStream) => {
  await stream.respondBody(['{"choices":[]}']);
  await stream.end();
};
const ALL = ['a#0', 'a#1', 'b#2', 'b#3'];

test("a node's ranks are named by their index on it; a fallback takes the same index on the other node", async () => {
  const [a, b] = picker.fleet.endpoints;
  const open: Array<{ worker: string; stream: PickerStream }> = [];
  try {
    for (let i = 0; i < 8; i++) {
      const out = await picker.envoy.request({ headers: { ':path': '/v1/completions' }, body: body(), subset: [a, b] });
      assert.equal(out.kind, 'routed', out.kind === 'immediate' ? out.body : '');
      if (out.kind !== 'routed') return;
      const header = out.setHeaders.get('x-data-parallel-rank');
      assert.ok(header === '0' || header === '1', `the index on the node: ${String(header)}`);
      assert.equal(out.endpoints.length, 2, 'the other node is the fallback');
      // served half on the chosen node, half on the fallback: the worker is the index's rank there
      const served = i % 2 === 0 ? out.endpoints[0] : out.endpoints[1];
      const worker = served === a ? `a#${header}` : `b#${2 + Number(header)}`;
      const set = await out.stream.respondHeaders({ served }, true);
      assert.equal(set.get('x-contextforge-worker'), worker);
      open.push({ worker, stream: out.stream });
    }
    const nodes = new Set(open.map((o) => o.worker[0]));
    assert.deepEqual([...nodes].sort(), ['a', 'b'], 'served on both nodes');
    for (const id of ALL)
      assert.equal(inFlightOf(id), open.filter((o) => o.worker === id).length, `${id} holds what it served`);
  } finally {
    for (const o of open) await finish(o.stream);
  }
  await until(() => ALL.every((id) => inFlightOf(id) === 0), 'the requests to end');
});
