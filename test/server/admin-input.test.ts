/**
 * The admin API names the field at fault in every refusal of its input: an unknown field of
 * `POST /admin/events` is refused (not ignored: a sender meaning something by it would be
 * misread), and an unknown worker id in a path is a 404 naming `id`, as the 400 and 409 about an
 * id do.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { adminGateway } from '../helpers/admin-call.js';

let setup: Awaited<ReturnType<typeof adminGateway>>;

before(async () => {
  setup = await adminGateway('admin-input-admin', [{ id: 'a', url: 'http://127.0.0.1:1' }]);
});
after(() => setup.close());

const call = (method: string, path: string, body?: unknown) => setup.call(method, path, body);

const stored = [
  { type: 'BlockStored', block_hashes: [1], parent_block_hash: null, token_ids: [1, 2, 3, 4], block_size: 4 },
];

test('POST /admin/events refuses a field other than worker and events with 400 naming it, and applies nothing', async () => {
  for (const [extra, field] of [
    [{ data_parallel_rank: 1 }, 'data_parallel_rank'],
    [{ ts: 1.5 }, 'ts'],
    [{ Worker: 'a' }, 'Worker'],
    [{ ['x'.repeat(100)]: 1 }, 'x'.repeat(64)],
  ] as const) {
    const r = await call('POST', '/admin/events', { worker: 'a', events: stored, ...extra });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.error?.param, field, r.text);
    assert.match(r.error!.message, /unknown field/);
  }
  const entries = async () =>
    (JSON.parse((await call('GET', '/admin/workers')).text) as { workers: Array<{ indexEntries: number }> }).workers[0]
      .indexEntries;
  assert.equal(await entries(), 0, 'nothing of the refused lists applied');
  // the body as documented applies
  const ok = await call('POST', '/admin/events', { worker: 'a', events: stored });
  assert.equal(ok.status, 200, ok.text);
  assert.equal(await entries(), 1);
});

test('an unknown worker id is a 404 naming id, whatever the route', async () => {
  for (const [method, path] of [
    ['DELETE', '/admin/workers/nope'],
    ['POST', '/admin/workers/nope/drain'],
    ['POST', '/admin/workers/nope/resume'],
  ] as const) {
    const r = await call(method, path);
    assert.equal(r.status, 404, r.text);
    assert.equal(r.error?.param, 'id', `${method} ${path}: ${r.text}`);
    assert.match(r.error!.message, /no worker 'nope'/);
  }
});
