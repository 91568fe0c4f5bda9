/**
 * A worker's URL is its engine's origin: the gateway adds the paths (/v1/chat/completions,
 * /health, /metrics, /tokenize). A URL with a path, or with credentials whose percent-escapes do
 * not decode, is refused as the client's mistake (400 naming `url`), and nothing of the worker
 * stays: not in the router, not in the listing, not in the requests routed after.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { parseWorkerSpec } from '../../src/cli/commands/serve.js';
import { parseWorkerRecord } from '../../src/server/worker-input.js';
import { allServed } from '../helpers/all-served.js';

const adminToken = 'worker-url-admin';

async function withGateway(run: (g: Gateway, base: string, enginePort: number) => Promise<void>): Promise<void> {
  const engine = await new MockEngine().start();
  const gateway = await createGateway({
    adminToken,
    router: new KVAwareRouter({ blockSize: 16 }),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    workers: [{ id: 'good', url: `http://127.0.0.1:${engine.port}` }],
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    await run(gateway, base, engine.port);
  } finally {
    await gateway.close();
    await engine.close();
  }
}

const addWorker = (base: string, body: unknown) =>
  fetch(`${base}/admin/workers`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
    body: JSON.stringify(body),
  });

test('a worker URL with a path is refused with 400 naming url, and leaves nothing registered', async () => {
  await withGateway(async (gateway, base, port) => {
    for (const tail of ['/v1', '/v1/', '/é', '/x/../v1']) {
      const res = await addWorker(base, { id: 'pathy', url: `http://127.0.0.1:${port}${tail}` });
      const body = (await res.json()) as { error: { message: string; param: string | null } };
      assert.equal(res.status, 400, JSON.stringify({ tail, body }));
      assert.equal(body.error.param, 'url', tail);
      assert.match(body.error.message, /without a path/, tail);
      assert.deepEqual(
        gateway.router.listWorkers().map((w) => w.id),
        ['good'],
        `${JSON.stringify(tail)}: the refused worker is not in the router`,
      );
      assert.equal(gateway.connections.has('pathy'), false);
    }
    await allServed(base, 6);
    // the origin alone, with or without its slash, is a worker
    for (const [id, tail] of [
      ['bare', ''],
      ['slash', '/'],
    ]) {
      const res = await addWorker(base, { id, url: `http://127.0.0.1:${port}${tail}` });
      assert.equal(res.status, 201, await res.text());
    }
    await allServed(base, 6);
  });
});

/**
 * URLs that WHATWG URL() reads otherwise than written (each parses): the gateway connects to
 * the URL as URL() reads it while the record keeps, and lists, the string, and other parsers
 * may read it as another URL (`http://a\@b` is host a for URL(), b for some others).
 */
const REWRITTEN_URLS = (port: number) => [
  ` http://127.0.0.1:${port} `,
  `http://127.0.0.1:${port} `,
  `\u0000http://127.0.0.1:${port}`,
  `\u001fhttp://127.0.0.1:${port}`,
  `http://127.0.0.1:${port}\u0000`,
  `http://127.0.0.1:${String(port).slice(0, 2)}\t${String(port).slice(2)}`,
  `http://127.0.0.1:${port}\r\n`,
  `http://127.0.0.1:${port}\n`,
  `ht\ntp://127.0.0.1:${port}`,
  `http:\\\\127.0.0.1:${port}`,
  `http://127.0.0.1:${port}\\`,
  `http://u\\x@127.0.0.1:${port}`,
  `http:127.0.0.1:${port}`,
  `http:/127.0.0.1:${port}`,
  `http:///127.0.0.1:${port}`,
  `HTTP:127.0.0.1:${port}`,
  `http://127.0.0.1%2e:${port}`,
  `http://loc%61lhost:${port}`,
];

test('a worker URL that URL() reads otherwise than written is refused with 400 naming url, and leaves nothing registered', async () => {
  await withGateway(async (gateway, base, port) => {
    for (const url of REWRITTEN_URLS(port)) {
      assert.doesNotThrow(() => new URL(url), `${JSON.stringify(url)} parses`);
      const res = await addWorker(base, { id: 'odd', url });
      const body = (await res.json()) as { error: { message: string; param: string | null } };
      assert.equal(res.status, 400, JSON.stringify({ url, body }));
      assert.equal(body.error.param, 'url', JSON.stringify(url));
      assert.equal(gateway.connections.has('odd'), false);
    }
    const listed = (await (
      await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${adminToken}` } })
    ).json()) as { workers: Array<{ id: string }> };
    assert.deepEqual(
      listed.workers.map((w) => w.id),
      ['good'],
    );
    await allServed(base, 6);
    // upper-case schemes, an international name and credentials with escapes are URLs as written
    for (const [id, url] of [
      ['caps', `HTTP://127.0.0.1:${port}`],
      ['idn', 'http://exämple.com:80'],
      ['creds', `http://u:p%40ss@127.0.0.1:${port}`],
    ]) {
      const res = await addWorker(base, { id, url });
      assert.equal(res.status, 201, await res.text());
    }
  });
});

test('a --worker spec, a config entry and a metrics URL are held to the same URL checks', () => {
  for (const url of REWRITTEN_URLS(8000)) {
    assert.throws(
      () => parseWorkerRecord({ id: 'a', url }, 'w'),
      (err: Error & { field?: string }) => err.field === 'url',
      JSON.stringify(url),
    );
    assert.throws(
      () => parseWorkerRecord({ id: 'a', url: 'http://h:1', metrics: url }, 'w'),
      (err: Error & { field?: string }) => err.field === 'metrics',
      JSON.stringify(url),
    );
  }
  // a SPEC is split at its commas and = signs: the URLs here have neither
  assert.throws(() => parseWorkerSpec('id=a,url=http:127.0.0.1:8000'), /url must have exactly \/\/ after its scheme/);
  assert.throws(() => parseWorkerSpec('id=a,url=http://127.0.0.1:80\t00'), /url must not hold spaces, control/);
});

test('credentials with a malformed percent-escape are refused with 400 naming url', async () => {
  await withGateway(async (gateway, base, port) => {
    for (const userinfo of ['user:pa%ss', 'u:p%', '%ff:p', '%:p']) {
      const res = await addWorker(base, { id: 'creds', url: `http://${userinfo}@127.0.0.1:${port}` });
      const body = (await res.json()) as { error: { message: string; param: string | null } };
      assert.equal(res.status, 400, JSON.stringify({ userinfo, body }));
      assert.equal(body.error.param, 'url', userinfo);
      assert.match(body.error.message, /percent-escape/, userinfo);
      // the password is not repeated
      assert.doesNotMatch(body.error.message, /pa%ss|p%@/);
      assert.equal(gateway.connections.has('creds'), false);
    }
    // a well-formed escape is a worker
    const ok = await addWorker(base, { id: 'creds', url: `http://u:p%40ss@127.0.0.1:${port}` });
    assert.equal(ok.status, 201, await ok.text());
    await allServed(base, 6);
  });
});

test('a metrics URL keeps its path, and is refused with a malformed escape in its credentials', () => {
  assert.equal(
    parseWorkerRecord({ id: 'a', url: 'http://h:1', metrics: 'http://h:1/metrics' }, 'w').metrics,
    'http://h:1/metrics',
  );
  assert.throws(
    () => parseWorkerRecord({ id: 'a', url: 'http://h:1', metrics: 'http://u:%zz@h:1/metrics' }, 'w'),
    (err: Error & { field?: string }) => err.field === 'metrics' && /percent-escape/.test(err.message),
  );
});

test('a worker whose start fails after its registration leaves nothing behind', async () => {
  await withGateway(async (gateway, base, port) => {
    // the health check is the last thing a worker starts
    const connections = gateway.connections as unknown as {
      checker?: { add: (id: string, base: string) => void; remove: (id: string) => void };
    };
    const fail = () => {
      throw new TypeError('refused by the test');
    };
    const checker = connections.checker;
    // the gateway above runs none: a stand-in that refuses
    connections.checker = { add: fail, remove: () => {} };
    try {
      assert.throws(() => gateway.addWorker({ id: 'late', url: `http://127.0.0.1:${port}` }), /refused by the test/);
    } finally {
      connections.checker = checker;
    }
    assert.deepEqual(
      gateway.router.listWorkers().map((w) => w.id),
      ['good'],
    );
    assert.equal(gateway.connections.has('late'), false);
    assert.equal(gateway.connections.get('late'), undefined);
    await allServed(base, 6);
    // and it can be added again
    const res = await addWorker(base, { id: 'late', url: `http://127.0.0.1:${port}` });
    assert.equal(res.status, 201, await res.text());
    await allServed(base, 6);
  });
});
