/**
 * Hostile clients: every probe of the hardening review, each with the answer the gateway must
 * give. Mock engines and fake engines on loopback; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { loadApiKeysFile } from '../../src/server/api-keys.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import { fakeEngine, post } from './harness.js';
import { until } from '../helpers/wait.js';

const ADMIN = 'admin-token-for-tests';
const auth = { authorization: `Bearer ${ADMIN}` };
const engines: MockEngine[] = [];
let gateway: Gateway;
let base = '';

before(async () => {
  for (let i = 0; i < 3; i++) engines.push(await new MockEngine({ decodeTokS: 50 }).start());
  gateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: engines.map((e, i) => ({ id: `e${i}`, url: `http://127.0.0.1:${e.port}` })),
    adminToken: ADMIN,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    breakerFailures: 1, // one failure would open a circuit
  });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close();
  for (const e of engines) await e.close();
});

const metric = async (name: string) => {
  const text = await (await fetch(`${base}/metrics`)).text();
  return [...text.matchAll(new RegExp(`^${name}(\\{[^}]*\\})? (\\d+)`, 'gm'))].reduce(
    (sum, m) => sum + Number(m[2]),
    0,
  );
};
const errorOf = (text: string) =>
  (JSON.parse(text) as { error: { message: string; param: string | null; type: string } }).error;

describe('hostile clients', () => {
  test('a storm of clients that disconnect: no worker leaves rotation, no failure counted, nothing retried', async () => {
    const before = {
      failures: await metric('contextforge_upstream_failures_total'),
      retries: await metric('contextforge_upstream_retries_total'),
    };
    // a storm: 90 requests of ~1 s each (50 tokens at 50 tok/s), every client gone after
    // 0-200 ms: non-streamed ones before their answer, streamed ones before or after the first chunk
    await Promise.all(
      Array.from({ length: 90 }, async (_, i) => {
        const ac = new AbortController();
        const t = setTimeout(() => ac.abort(), (i % 10) * 20);
        const res = await fetch(`${base}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ prompt: `leave ${i}`, max_tokens: 50, stream: i % 3 === 0 }),
          signal: ac.signal,
        }).catch(() => undefined);
        await res?.body
          ?.getReader()
          .read()
          .catch(() => undefined);
        await res?.body?.cancel().catch(() => undefined);
        clearTimeout(t);
      }),
    );
    await until(() => gateway.router.getStats().inFlightRequests === 0, 'every ticket released');
    assert.deepEqual(
      gateway.router.listWorkers().map((w) => [w.id, w.healthy]),
      [
        ['e0', true],
        ['e1', true],
        ['e2', true],
      ],
    );
    assert.equal(await metric('contextforge_upstream_failures_total'), before.failures);
    assert.equal(await metric('contextforge_upstream_retries_total'), before.retries);
    const res = await post(base, '/v1/completions', { prompt: 'a real request', max_tokens: 1 });
    assert.equal(res.status, 200);
  });

  test('a 1 MB workflow id (and role, anchors) is refused, and memory is not kept', async () => {
    const big = 'w'.repeat(1 << 20);
    for (const [body, headers, param] of [
      [{ prompt: 'x', contextforge: { workflowId: big } }, {}, 'contextforge.workflowId'],
      [{ prompt: 'x', contextforge: { agentRole: big } }, {}, 'contextforge.agentRole'],
      [{ prompt: 'x', contextforge: { anchors: [big] } }, {}, 'contextforge.anchors[0]'],
      [
        { prompt: 'x', contextforge: { anchors: Array.from({ length: 1000 }, (_, i) => `a${i}`) } },
        {},
        'contextforge.anchors',
      ],
      [{ prompt: 'x' }, { 'x-workflow-id': 'w'.repeat(300) }, 'x-workflow-id'],
    ] as const) {
      const res = await post(base, '/v1/completions', body, headers);
      assert.equal(res.status, 400, param);
      assert.equal(errorOf(res.text).param, param);
    }
    assert.equal(gateway.router.getStats().workflowsTracked, 0, 'no workflow recorded from a refused request');
  });

  test('malformed values: 400 naming the field, nothing internal in the body', async () => {
    const deep = '['.repeat(10_000) + ']'.repeat(10_000);
    const cases: Array<[string, unknown, Record<string, string>, string]> = [
      ['/v1/chat/completions', { messages: [{ role: 'user', content: [null] }] }, {}, 'messages[0].content[0]'],
      [
        '/v1/chat/completions',
        { messages: [{ role: 'user', content: [{ type: 'nope' }] }] },
        {},
        'messages[0].content[0].type',
      ],
      ['/v1/completions', { prompt: 'x', contextforge: { workflowId: 5 } }, {}, 'contextforge.workflowId'],
      ['/v1/completions', { prompt: 'x', contextforge: { anchors: [{ id: 5 }] } }, {}, 'contextforge.anchors[0].id'],
      ['/v1/completions', { prompt: 'x', cache_salt: '' }, {}, 'cache_salt'],
      ['/v1/completions', { prompt: [1e300] }, {}, 'prompt[0]'],
      ['/v1/completions', { prompt: [1, 'a'] }, {}, 'prompt[1]'],
      ['/v1/completions', { prompt: [[1, 2], [4294967296]] }, {}, 'prompt[1][0]'],
      ['/v1/completions', deep, {}, 'body'],
      ['/v1/completions', `{"prompt":"x","contextforge":${'{"a":'.repeat(5000)}1${'}'.repeat(5000)}}`, {}, 'body'],
      ['/v1/route', deep, auth, 'body'],
      ['/v1/completions', { prompt: 'x', contextforge: { isolate: 'yes' } }, {}, 'contextforge.isolate'],
      ['/v1/completions', { prompt: 'x' }, { 'x-workflow-step': '0x10' }, 'x-workflow-step'],
      ['/v1/completions', { prompt: 'x' }, { 'x-kv-isolate': 'yes' }, 'x-kv-isolate'],
      ['/v1/completions', { prompt: 'x' }, { 'x-cla-group': '1e1' }, 'x-cla-group'],
    ];
    for (const [path, body, headers, param] of cases) {
      const res = await post(base, path, body, headers);
      assert.equal(res.status, 400, `${path} ${param}`);
      const err = errorOf(res.text);
      assert.equal(err.param, param);
      // a token id refused: the param names the element the message names
      if (param.startsWith('prompt[')) assert.ok(err.message.startsWith(`${param} must be a token id`), err.message);
      assert.doesNotMatch(err.message, /Cannot read|call stack|undefined|null \(|at .*\.ts/);
    }
    assert.equal((await fetch(`${base}/healthz`)).status, 200);
  });

  test('admin: loopback is not trusted; forms and foreign origins are refused; the token is required', async () => {
    const form = await fetch(`${base}/admin/workers`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', origin: 'https://evil.example' },
      body: 'id=x&url=http://127.0.0.1:1',
    });
    assert.equal(form.status, 403);
    const formSameSite = await fetch(`${base}/admin/workers`, {
      method: 'POST',
      headers: { 'content-type': 'text/plain', ...auth },
      body: '{"id":"x","url":"http://127.0.0.1:1"}',
    });
    assert.equal(formSameSite.status, 415, 'even with the token, only application/json');
    const crossSite = await post(
      base,
      '/admin/workers',
      { id: 'x', url: 'http://127.0.0.1:1' },
      { ...auth, 'sec-fetch-site': 'cross-site' },
    );
    assert.equal(crossSite.status, 403);
    assert.equal(
      (await post(base, '/admin/workers', { id: 'x', url: 'http://127.0.0.1:1' })).status,
      401,
      'a loopback client without the token',
    );
    assert.equal(
      (
        await post(
          base,
          '/admin/workers',
          { id: 'x', url: 'http://127.0.0.1:1' },
          { authorization: 'Bearer wrong-token-123' },
        )
      ).status,
      401,
    );
    assert.equal((await fetch(`${base}/admin/workers`)).status, 401);
    assert.deepEqual(
      gateway.router.listWorkers().map((w) => w.id),
      ['e0', 'e1', 'e2'],
    );
  });

  test('admin input is validated and credentials in URLs are never shown', async () => {
    for (const [body, pattern, param] of [
      [{ id: '../etc', url: 'http://127.0.0.1:1' }, /worker: id must match/, 'id'],
      [{ id: 'x'.repeat(100), url: 'http://127.0.0.1:1' }, /worker: id must match/, 'id'],
      [{ id: 'ok', url: 'javascript:alert(1)' }, /worker: url must start with http/, 'url'],
      [{ id: 'ok', url: 'http://h:1/?x=1' }, /query/, 'url'],
      [{ id: 'ok', url: 'http://h:1', events: 'http://x' }, /events must be a tcp:\/\/ or ipc:\/\//, 'events'],
      [{ id: 'ok', url: 'http://h:1', claGroups: ['a'] }, /claGroups\[0\] must be an integer/, 'claGroups'],
      [{ id: 'ok', url: 'http://h:1', apiKeyEnv: 'CONTEXTFORGE_ADMIN_TOKEN' }, /may not name/, 'apiKeyEnv'],
      [{ id: 'ok', url: 'http://h:1', apiKeyEnv: 'CF_TEST_UNSET_VARIABLE' }, /--engine-key-envs/, 'apiKeyEnv'],
      [{ id: 'ok', url: 'http://h:1', color: 'red' }, /worker: color is not a known key/, 'color'],
      [{ url: 'http://h:1' }, /worker: id is required/, 'id'],
    ] as const) {
      const res = await post(base, '/admin/workers', body, auth);
      assert.equal(res.status, 400, JSON.stringify(body).slice(0, 60));
      assert.match(errorOf(res.text).message, pattern);
      assert.equal(errorOf(res.text).param, param, JSON.stringify(body).slice(0, 60));
    }
    assert.equal(
      (await post(base, '/admin/workers', { id: 'cred', url: 'http://user:hunter2@127.0.0.1:1' }, auth)).status,
      201,
    );
    const listing = await (await fetch(`${base}/admin/workers`, { headers: auth })).text();
    assert.doesNotMatch(listing, /hunter2/);
    assert.match(listing, /http:\/\/\*\*\*@127\.0\.0\.1:1/);
    assert.equal((await fetch(`${base}/admin/workers/cred`, { method: 'DELETE', headers: auth })).status, 200);
  });

  test('/v1/route needs the admin token, and the cached-tokens header is off by default', async () => {
    assert.equal((await post(base, '/v1/route', { prompt: 'x' })).status, 401);
    assert.equal((await post(base, '/v1/route', { prompt: 'x' }, auth)).status, 200);
    const res = await post(base, '/v1/completions', { prompt: 'headers', max_tokens: 1 });
    assert.match(res.headers.get('x-contextforge-worker')!, /^e[012]$/, 'which worker served stays');
    assert.equal(res.headers.get('x-contextforge-cached-tokens'), null);
  });

  test('a client that sends its body slowly is cut off by the request timeout', async () => {
    const gw = await createGateway({
      router: new KVAwareRouter(),
      workers: [{ id: 'e0', url: `http://127.0.0.1:${engines[0].port}` }],
      adminToken: ADMIN,
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      timeouts: { headersTimeoutMs: 300, requestTimeoutMs: 500 },
    });
    const url = new URL(await gw.app.listen({ host: '127.0.0.1', port: 0 }));
    assert.deepEqual(
      [
        gw.app.server.headersTimeout,
        gw.app.server.requestTimeout,
        gw.app.server.timeout,
        gw.app.server.keepAliveTimeout,
      ],
      [300, 500, 330_000, 72_000],
    );
    const socket = connect(Number(url.port), '127.0.0.1');
    let answer = '';
    socket.on('data', (d) => (answer += d.toString()));
    const closed = new Promise<void>((r) => socket.once('close', () => r()));
    socket.write(
      'POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"prompt":',
    );
    const trickle = setInterval(() => socket.write(' '), 50); // a byte every 50 ms: never idle, never done
    await until(() => socket.destroyed || answer.length > 0, 'the server to cut the slow request', { timeoutMs: 5000 });
    clearInterval(trickle);
    socket.destroy();
    await closed;
    assert.match(answer, /^HTTP\/1.1 408|^$/, 'answered 408 Request Timeout or closed');
    await gw.close();
  });
});

describe('tenants', () => {
  /** A gateway with API keys for team-a and team-b (`sk-tenant-a-…`, `sk-tenant-b-…`) in front of one mock engine. */
  async function tenantGateway(extra: Partial<GatewayOptions> = {}): Promise<{ engine: MockEngine; gw: Gateway }> {
    const dir = mkdtempSync(join(tmpdir(), 'cf-tenants-'));
    const file = join(dir, 'keys.yaml');
    writeFileSync(file, 'sk-tenant-a-0123456789: team-a\nsk-tenant-b-0123456789: team-b\n');
    chmodSync(file, 0o600);
    const engine = await new MockEngine().start();
    const gw = await createGateway({
      router: new KVAwareRouter({ blockSize: 16 }),
      workers: [{ id: 'm0', url: `http://127.0.0.1:${engine.port}` }],
      apiKeys: loadApiKeysFile(file),
      adminToken: ADMIN,
      cachedTokensHeader: true,
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      ...extra,
    });
    return { engine, gw };
  }

  test('with API keys, requests need a key, and one tenant cannot see what another has cached', async () => {
    const { engine, gw } = await tenantGateway({ publicRouteApi: true });
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    const a = { authorization: 'Bearer sk-tenant-a-0123456789' };
    const b = { authorization: 'Bearer sk-tenant-b-0123456789' };
    assert.equal((await post(url, '/v1/completions', { prompt: 'x', max_tokens: 1 })).status, 401);
    assert.equal(
      (
        await post(
          url,
          '/v1/completions',
          { prompt: 'x', max_tokens: 1 },
          { authorization: 'Bearer sk-wrong-0123456789' },
        )
      ).status,
      401,
    );
    assert.equal((await fetch(`${url}/v1/models`)).status, 401);
    const secret = 'SYSTEM: the launch code is 0000-1111-2222. ' + 'Never reveal it. '.repeat(40);
    const ask = (headers: Record<string, string>) =>
      post(url, '/v1/completions', { prompt: `${secret} question`, max_tokens: 1 }, headers);
    const first = await ask(a);
    assert.equal(first.status, 200);
    const again = await ask(a);
    assert.ok(Number(again.headers.get('x-contextforge-cached-tokens')) > 0, 'the same tenant reuses its own prefix');
    assert.ok(
      (JSON.parse(again.text) as { usage: { prompt_tokens_details?: { cached_tokens: number } } }).usage
        .prompt_tokens_details!.cached_tokens > 0,
    );
    const dry = JSON.parse((await post(url, '/v1/route', { prompt: `${secret} question` }, b)).text) as {
      cachedTokens: number;
    };
    assert.equal(dry.cachedTokens, 0, "/v1/route answers for the caller's tenant");
    const probe = await ask(b);
    assert.equal(probe.status, 200);
    assert.equal(
      probe.headers.get('x-contextforge-cached-tokens'),
      '0',
      'the router predicts nothing cached for another tenant',
    );
    assert.equal(
      (JSON.parse(probe.text) as { usage: { prompt_tokens_details?: { cached_tokens: number } } }).usage
        .prompt_tokens_details?.cached_tokens ?? 0,
      0,
      'and the engine reuses nothing',
    );
    // a client salt cannot step into another tenant's namespace
    const spoof = await post(
      url,
      '/v1/completions',
      { prompt: `${secret} question!`, max_tokens: 1, cache_salt: 'tenant/team-a' },
      b,
    );
    assert.equal(spoof.headers.get('x-contextforge-cached-tokens'), '0');
    await gw.close();
    await engine.close();
  });

  test("an operator's dry run names the tenant it routes for; clients cannot name one", async () => {
    const { engine, gw } = await tenantGateway();
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    try {
      const a = { authorization: 'Bearer sk-tenant-a-0123456789' };
      const admin = { authorization: `Bearer ${ADMIN}` };
      const prompt = 'team a keeps a long shared preamble here. '.repeat(30);
      assert.equal((await post(url, '/v1/completions', { prompt, max_tokens: 1 }, a)).status, 200);
      const route = (headers: Record<string, string>) => post(url, '/v1/route', { prompt }, headers);
      const as = async (headers: Record<string, string>) => {
        const r = await route(headers);
        assert.equal(r.status, 200, r.text);
        return (JSON.parse(r.text) as { cachedTokens: number }).cachedTokens;
      };
      assert.ok((await as({ ...admin, 'x-contextforge-tenant': 'team-a' })) > 0, "team-a's prompt, as team-a's");
      assert.equal(await as({ ...admin, 'x-contextforge-tenant': 'team-b' }), 0, "the same prompt, as team-b's");
      assert.equal(await as(admin), 0, 'no tenant named: the prompt as no client sends it');
      for (const tenant of ['team-c', 'team-a/x', '']) {
        const r = await route({ ...admin, 'x-contextforge-tenant': tenant });
        assert.equal(r.status, 400, `${JSON.stringify(tenant)}: ${r.text}`);
        assert.equal((JSON.parse(r.text) as { error: { param: string } }).error.param, 'x-contextforge-tenant');
      }
      // the header is the operator's: a tenant's own key does not reach the admin-only dry run
      assert.equal((await route({ ...a, 'x-contextforge-tenant': 'team-a' })).status, 401);
    } finally {
      await gw.close();
      await engine.close();
    }
  });

  test('the tenant header is refused without API keys, and not read on a public dry run', async () => {
    const engine = await new MockEngine().start();
    const plain = await createGateway({
      router: new KVAwareRouter({ blockSize: 16 }),
      workers: [{ id: 'm0', url: `http://127.0.0.1:${engine.port}` }],
      adminToken: ADMIN,
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
    });
    const { engine: engine2, gw } = await tenantGateway({ publicRouteApi: true });
    try {
      const plainUrl = await plain.app.listen({ host: '127.0.0.1', port: 0 });
      const r = await post(
        plainUrl,
        '/v1/route',
        { prompt: 'x' },
        {
          authorization: `Bearer ${ADMIN}`,
          'x-contextforge-tenant': 'team-a',
        },
      );
      assert.equal(r.status, 400, r.text);
      assert.equal((JSON.parse(r.text) as { error: { param: string } }).error.param, 'x-contextforge-tenant');
      const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
      const prompt = 'team a keeps a long shared preamble here. '.repeat(30);
      const a = { authorization: 'Bearer sk-tenant-a-0123456789' };
      const b = { authorization: 'Bearer sk-tenant-b-0123456789' };
      assert.equal((await post(url, '/v1/completions', { prompt, max_tokens: 1 }, a)).status, 200);
      const spoof = await post(url, '/v1/route', { prompt }, { ...b, 'x-contextforge-tenant': 'team-a' });
      assert.equal(spoof.status, 200, spoof.text);
      assert.equal(
        (JSON.parse(spoof.text) as { cachedTokens: number }).cachedTokens,
        0,
        "team-b's key routes as team-b",
      );
    } finally {
      await gw.close();
      await plain.close();
      await engine.close();
      await engine2.close();
    }
  });

  test("one tenant's content anchors and workflow ids are not another's", async () => {
    const { engine, gw } = await tenantGateway();
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    try {
      const a = { authorization: 'Bearer sk-tenant-a-0123456789' };
      const b = { authorization: 'Bearer sk-tenant-b-0123456789' };
      // the anchor's id names a document; its text is in each tenant's prompt, salted apart
      const ask = (headers: Record<string, string>, prompt: string) =>
        post(
          url,
          '/v1/completions',
          {
            prompt,
            max_tokens: 1,
            contextforge: { anchors: [{ id: 'merger-memo', tokens: 200 }], workflowId: 'wf-1' },
          },
          headers,
        );
      assert.equal((await ask(a, 'tenant a reads the memo. '.repeat(20))).status, 200);
      const own = await ask(a, 'tenant a asks again. '.repeat(20));
      assert.ok(Number(own.headers.get('x-contextforge-cached-tokens')) > 0, "a tenant's own anchor counts as cached");
      const other = await ask(b, 'tenant b guesses the name. '.repeat(20));
      assert.equal(other.status, 200);
      assert.equal(
        other.headers.get('x-contextforge-cached-tokens'),
        '0',
        "another tenant's anchor of the same id is nothing cached (and says nothing of what team-a holds)",
      );
      assert.equal(gw.router.getStats().workflowsTracked, 2, 'the same workflow id of two tenants is two workflows');
    } finally {
      await gw.close();
      await engine.close();
    }
  });

  test("an engine started with --api-key gets the worker's key as a bearer token", async () => {
    const engine = await new MockEngine({ apiKey: 'engine-secret-key' }).start();
    const worker = { id: 'k0', url: `http://127.0.0.1:${engine.port}` };
    const without = await createGateway({
      router: new KVAwareRouter(),
      workers: [worker],
      adminToken: ADMIN,
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
    });
    const u1 = await without.app.listen({ host: '127.0.0.1', port: 0 });
    // the engine refuses the gateway's missing key: no answer for the client, whose own key is not the problem
    const refused = await post(u1, '/v1/completions', { prompt: 'x', max_tokens: 1 });
    assert.equal(refused.status, 502, 'the engine refuses a request without its key');
    assert.equal(errorOf(refused.text).type, 'server_error');
    await without.close();
    const gw = await createGateway({
      router: new KVAwareRouter(),
      workers: [{ ...worker, apiKeyEnv: 'CF_TEST_ENGINE_KEY' }],
      env: { CF_TEST_ENGINE_KEY: 'engine-secret-key' },
      adminToken: ADMIN,
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
    });
    const u2 = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    const ok = await post(
      u2,
      '/v1/completions',
      { prompt: 'x', max_tokens: 1 },
      { authorization: 'Bearer a-client-key-not-for-the-engine' },
    );
    assert.equal(ok.status, 200);
    const models = (await (await fetch(`${u2}/v1/models`)).json()) as { data: Array<{ id: string }> };
    assert.deepEqual(
      models.data.map((m) => m.id),
      ['mock'],
    );
    const listing = await (await fetch(`${u2}/admin/workers`, { headers: auth })).text();
    assert.doesNotMatch(listing, /engine-secret-key/);
    await gw.close();
    await engine.close();
    // credentials in a worker URL go out as Basic authorization (HTTP clients refuse them in URLs)
    const seen: Array<string | undefined> = [];
    const basic = await fakeEngine((req, res) => {
      if (req.url === '/v1/completions') seen.push(req.headers.authorization);
      req.resume();
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices":[]}'));
    });
    const gw3 = await createGateway({
      router: new KVAwareRouter(),
      workers: [{ id: 'b0', url: basic.url.replace('http://', 'http://user:pa%24s@') }],
      adminToken: ADMIN,
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
    });
    const u3 = await gw3.app.listen({ host: '127.0.0.1', port: 0 });
    assert.equal((await post(u3, '/v1/completions', { prompt: 'x' })).status, 200);
    assert.deepEqual(seen, [`Basic ${Buffer.from('user:pa$s').toString('base64')}`]);
    await gw3.close();
    await basic.close();
  });
});
