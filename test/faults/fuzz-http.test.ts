/**
 * 1,000 property-based HTTP requests (fast-check): random methods, paths, headers, content
 * types and bodies, from random bytes to near-valid OpenAI requests with hostile field values.
 * The gateway answers every one with a 2xx or 4xx — never a 5xx, never a dropped connection —
 * and afterwards it is healthy: every worker in rotation, nothing in flight, a normal request
 * answered.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import fc from 'fast-check';
import { request } from 'undici';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { post } from './harness.js';

const engines: MockEngine[] = [];
let gateway: Gateway;
let base = '';

before(async () => {
  for (let i = 0; i < 2; i++) engines.push(await new MockEngine({ decodeTokS: 20_000 }).start());
  gateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: engines.map((e, i) => ({ id: `e${i}`, url: `http://127.0.0.1:${e.port}` })),
    adminToken: 'fuzz-admin-token',
    bodyLimit: 256 * 1024,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close();
  for (const e of engines) await e.close();
});

const printable = fc.string({ unit: fc.constantFrom(...'abcxyz019 -_:;,./\\"\'{}[]éß'.split('')), maxLength: 40 });
const hostileValue = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  fc.integer(),
  fc.double(),
  fc.constantFrom(1e300, -1, 2 ** 32, 2 ** 53 + 1, ''),
  printable,
  fc.constant('x'.repeat(400)),
  fc.array(fc.oneof(fc.integer(), printable), { maxLength: 3 }),
  fc.object({ maxDepth: 2 }),
);
const contentPart = fc.oneof(
  fc.record(
    { type: fc.constantFrom('text', 'image_url', 'evil', ''), text: hostileValue, image_url: hostileValue },
    { requiredKeys: [] },
  ),
  hostileValue,
);
const message = fc.oneof(
  fc.record(
    {
      role: fc.oneof(fc.constantFrom('system', 'user', 'assistant'), hostileValue),
      content: fc.oneof(printable, fc.array(contentPart, { maxLength: 3 }), hostileValue),
      name: hostileValue,
    },
    { requiredKeys: ['role'] },
  ),
  hostileValue,
);
const metadata = fc.record(
  {
    workflowId: hostileValue,
    workflowStep: hostileValue,
    agentRole: hostileValue,
    claGroup: hostileValue,
    anchors: fc.oneof(
      fc.array(fc.oneof(printable, fc.record({ id: hostileValue, tokens: hostileValue })), { maxLength: 4 }),
      hostileValue,
    ),
    isolate: hostileValue,
    unknownField: hostileValue,
  },
  { requiredKeys: [] },
);
const openAiBody = fc.record(
  {
    model: fc.oneof(fc.constant('mock'), hostileValue),
    prompt: fc.oneof(
      printable,
      fc.array(fc.integer({ min: -5, max: 2 ** 33 }), { maxLength: 20 }),
      fc.array(printable, { maxLength: 3 }),
      fc.array(fc.array(fc.nat(100_000), { maxLength: 5 }), { maxLength: 3 }),
      hostileValue,
    ),
    messages: fc.oneof(fc.array(message, { maxLength: 4 }), hostileValue),
    max_tokens: fc.oneof(fc.integer({ min: 1, max: 4 }), hostileValue),
    stream: fc.oneof(fc.boolean(), hostileValue),
    cache_salt: hostileValue,
    contextforge: fc.oneof(metadata, hostileValue),
  },
  { requiredKeys: [] },
);
const body = fc.oneof(
  openAiBody.map((b) => JSON.stringify(b)),
  fc.json({ depthSize: 'medium' }),
  fc.string({ maxLength: 200 }),
  fc.integer({ min: 1, max: 5000 }).map((n) => '['.repeat(n) + ']'.repeat(n)),
  fc.integer({ min: 1, max: 5000 }).map((n) => '{"a":'.repeat(n)),
  fc.constant(''),
);
const headerName = fc.constantFrom(
  'x-workflow-id',
  'x-workflow-step',
  'x-agent-role',
  'x-cla-group',
  'x-anchor-ids',
  'x-kv-isolate',
  'authorization',
  'origin',
  'sec-fetch-site',
  'x-unknown',
);
const httpRequest = fc.record({
  method: fc.constantFrom('GET', 'POST', 'POST', 'POST', 'PUT', 'DELETE'),
  // mostly the gateway's own paths: a request to an unknown one stops at its 404 whatever its body
  path: fc.oneof(
    {
      weight: 4,
      arbitrary: fc.constantFrom(
        '/v1/completions',
        '/v1/chat/completions',
        '/v1/route',
        '/v1/models',
        '/admin/workers',
        '/admin/events',
        '/admin/workers/e0/drain',
        '/healthz',
        '/metrics',
        '/v1/completions?x=1',
      ),
    },
    { weight: 1, arbitrary: printable.map((s) => `/${encodeURIComponent(s)}`) },
  ),
  contentType: fc.constantFrom(
    'application/json',
    'application/json; charset=utf-8',
    'text/plain',
    'application/x-www-form-urlencoded',
    undefined,
  ),
  headers: fc.dictionary(headerName, printable, { maxKeys: 4 }),
  body,
});

test('1,000 fuzzed HTTP requests: only 2xx and 4xx, and the router stays healthy', async () => {
  const seen = new Map<number, number>();
  await fc.assert(
    fc.asyncProperty(httpRequest, async (r) => {
      const headers: Record<string, string> = { ...r.headers };
      if (r.contentType) headers['content-type'] = r.contentType;
      const withBody = r.method !== 'GET' && r.method !== 'DELETE';
      const res = await request(`${base}${r.path}`, {
        method: r.method,
        headers,
        body: withBody ? r.body : undefined,
        headersTimeout: 10_000,
        bodyTimeout: 10_000,
      });
      const text = await res.body.text();
      seen.set(res.statusCode, (seen.get(res.statusCode) ?? 0) + 1);
      assert.ok(res.statusCode >= 200 && res.statusCode < 500, `HTTP ${res.statusCode}: ${text.slice(0, 300)}`);
      if (res.statusCode >= 400) {
        const err = (JSON.parse(text) as { error: { message: string } }).error;
        assert.doesNotMatch(err.message, /Cannot read properties|call stack|is not a function|at \S+\.ts:\d+/);
      }
    }),
    { numRuns: 1000, seed: 1414 },
  );
  assert.ok((seen.get(200) ?? 0) > 20, `some requests were valid and answered: ${JSON.stringify([...seen])}`);
  assert.ok((seen.get(400) ?? 0) > 100, `and many were refused: ${JSON.stringify([...seen])}`);
  // healthy afterwards
  assert.deepEqual(
    gateway.router.listWorkers().map((w) => [w.id, w.healthy, w.draining]),
    [
      ['e0', true, false],
      ['e1', true, false],
    ],
  );
  assert.equal(gateway.router.getStats().inFlightRequests, 0);
  assert.equal((await post(base, '/v1/completions', { prompt: 'still fine?', max_tokens: 1 })).status, 200);
});
