import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import {
  adminRequestProblem,
  AdminToken,
  MAX_ADMIN_TOKEN_FILE_BYTES,
  MAX_ADMIN_TOKEN_LENGTH,
  rereadAdminTokenFile,
  resolveAdminToken,
} from '../../src/server/admin-auth.js';
import { createGateway } from '../../src/server/gateway.js';
import { ApiKeys, loadApiKeysFile, tenantCacheSalt } from '../../src/server/api-keys.js';
import { gatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';
import {
  checkApiKeyEnv,
  checkHttpUrl,
  checkWorkerId,
  redactUrl,
  splitCredentials,
} from '../../src/server/worker-input.js';

const dir = mkdtempSync(join(tmpdir(), 'cf-auth-'));

test('the admin token matches only "Bearer <token>"', () => {
  const t = new AdminToken('s3cret-token');
  assert.equal(t.matches('Bearer s3cret-token'), true);
  assert.equal(t.matches('bearer  s3cret-token'), true);
  for (const bad of [
    undefined,
    '',
    's3cret-token',
    'Bearer s3cret-toke',
    'Bearer s3cret-token2',
    'Basic s3cret-token',
    ['Bearer s3cret-token'],
  ])
    assert.equal(t.matches(bad), false, String(bad));
  assert.throws(() => new AdminToken('short'), /at least 8/);
});

test('without a token, a random one is written to the token file (0600) and read back on the next start', () => {
  const file = join(dir, 'sub', 'admin-token');
  const first = resolveAdminToken({ tokenFile: file });
  assert.equal(first.origin, 'generated');
  assert.ok(first.token.length >= 40);
  assert.equal(statSync(file).mode & 0o777, 0o600);
  assert.equal(statSync(join(dir, 'sub')).mode & 0o777, 0o700);
  assert.equal(readFileSync(file, 'utf8').trim(), first.token);
  const again = resolveAdminToken({ tokenFile: file });
  assert.deepEqual([again.origin, again.token], ['file', first.token]);
  // a configured token wins over the file
  assert.equal(resolveAdminToken({ token: 'from-the-environment', tokenFile: file }).token, 'from-the-environment');
  // two starts never share a generated token
  assert.notEqual(resolveAdminToken({ tokenFile: join(dir, 'other') }).token, first.token);
});

test('a replaced admin token: only the new one matches; a token refused leaves the current one', async () => {
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    adminToken: 'first-admin-token',
    tokenize: 'text',
  });
  try {
    const status = async (token: string) =>
      (await gateway.app.inject({ url: '/admin/workers', headers: { authorization: `Bearer ${token}` } })).statusCode;
    gateway.replaceAdminToken('second-admin-token');
    assert.equal(gateway.adminToken, 'second-admin-token');
    assert.equal(await status('second-admin-token'), 200);
    assert.equal(await status('first-admin-token'), 401);
    assert.throws(() => gateway.replaceAdminToken('short'), RangeError);
    assert.throws(() => gateway.replaceAdminToken('has a space'), RangeError);
    assert.equal(gateway.adminToken, 'second-admin-token');
    assert.equal(await status('second-admin-token'), 200);
  } finally {
    await gateway.close();
  }
});

test('a token file read again (SIGHUP) must still hold a token: nothing is generated in place of a missing one', () => {
  const file = join(dir, 'reread');
  assert.throws(() => rereadAdminTokenFile(file), /--admin-token-file .*reread does not exist/);
  writeFileSync(file, 'reread-admin-token\n', { mode: 0o600 });
  assert.equal(rereadAdminTokenFile(file), 'reread-admin-token');
  writeFileSync(file, '');
  assert.throws(() => rereadAdminTokenFile(file), /is empty/);
});

test('a token file others can read is refused', () => {
  const file = join(dir, 'loose');
  writeFileSync(file, 'a-long-enough-token\n');
  chmodSync(file, 0o644);
  assert.throws(() => resolveAdminToken({ tokenFile: file }), /readable by others/);
  chmodSync(file, 0o600);
  assert.equal(resolveAdminToken({ tokenFile: file }).token, 'a-long-enough-token');
});

test('a token file larger than 4 KiB is refused naming the flag, without reading it whole', () => {
  // a valid token padded past the bound: refused, not trimmed
  const padded = join(dir, 'padded');
  writeFileSync(padded, `a-long-enough-token${' '.repeat(MAX_ADMIN_TOKEN_FILE_BYTES)}\n`, { mode: 0o600 });
  assert.throws(
    () => resolveAdminToken({ tokenFile: padded }),
    new RegExp(`^RangeError: --admin-token-file .*padded: is larger than ${MAX_ADMIN_TOKEN_FILE_BYTES} bytes$`),
  );
  // a huge (sparse) one is refused at once, never read into memory
  const huge = join(dir, 'huge');
  writeFileSync(huge, '', { mode: 0o600 });
  truncateSync(huge, 8 * 1024 * 1024 * 1024);
  const started = performance.now();
  assert.throws(() => resolveAdminToken({ tokenFile: huge }), /--admin-token-file .*huge: is larger than 4096 bytes/);
  assert.ok(performance.now() - started < 2000, 'refused without reading it');
  // at the bound, a token with its newline is read
  const atBound = join(dir, 'at-bound');
  writeFileSync(atBound, `${'t'.repeat(MAX_ADMIN_TOKEN_LENGTH)}\n`, { mode: 0o600 });
  assert.equal(resolveAdminToken({ tokenFile: atBound }).token, 't'.repeat(MAX_ADMIN_TOKEN_LENGTH));
});

test('a token file that is a device is refused naming the flag', () => {
  assert.throws(() => resolveAdminToken({ tokenFile: '/dev/zero' }), /^RangeError: --admin-token-file .*\/dev\/zero/);
});

test('admin requests: cross-site and non-JSON bodies are refused before the token is looked at', () => {
  const json = { 'content-type': 'application/json', 'content-length': '2', host: '127.0.0.1:8080' };
  assert.equal(adminRequestProblem('POST', json), undefined);
  assert.equal(adminRequestProblem('GET', { host: 'h' }), undefined);
  assert.equal(adminRequestProblem('POST', { ...json, 'content-type': 'application/json; charset=utf-8' }), undefined);
  assert.equal(adminRequestProblem('POST', { host: 'h' }), undefined, 'no body at all (drain, resume)');
  for (const type of [
    'application/x-www-form-urlencoded',
    'text/plain',
    'multipart/form-data; boundary=x',
    'application/jsonx',
  ]) {
    assert.equal(adminRequestProblem('POST', { ...json, 'content-type': type })?.status, 415, type);
  }
  assert.equal(adminRequestProblem('POST', { 'content-length': '5', host: 'h' })?.status, 415, 'a body without a type');
  assert.equal(adminRequestProblem('POST', { ...json, origin: 'https://evil.example' })?.status, 403);
  assert.equal(adminRequestProblem('POST', { ...json, origin: 'http://127.0.0.1:8080' }), undefined, 'same origin');
  assert.equal(adminRequestProblem('POST', { ...json, origin: 'null' })?.status, 403);
  assert.equal(adminRequestProblem('GET', { host: 'h', 'sec-fetch-site': 'cross-site' })?.status, 403);
  assert.equal(adminRequestProblem('GET', { host: 'h', 'sec-fetch-site': 'same-site' })?.status, 403);
  assert.equal(adminRequestProblem('GET', { host: 'h', 'sec-fetch-site': 'none' }), undefined);
});

test('an admin request refused before its token is looked at names the header to fix', async () => {
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    adminToken: 'admin-token-for-tests',
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const auth = { authorization: 'Bearer admin-token-for-tests' };
    for (const [headers, status, param] of [
      [{ 'sec-fetch-site': 'cross-site' }, 403, 'sec-fetch-site'],
      [{ origin: 'https://evil.example' }, 403, 'origin'],
      [{ 'content-type': 'text/plain' }, 415, 'content-type'],
    ] as const) {
      const res = await fetch(`${base}/admin/workers`, {
        method: 'POST',
        headers: { ...auth, ...headers },
        body: '{"id":"w1","url":"http://127.0.0.1:9"}',
      });
      const text = await res.text();
      assert.equal(res.status, status, text);
      assert.equal((JSON.parse(text) as { error: { param: string | null } }).error.param, param, text);
    }
  } finally {
    await gateway.close(0);
  }
});

test('API keys map to tenants; the file must be a private mapping', () => {
  const keys = new ApiKeys({ 'sk-aaaaaaaaaaaaaaaa': 'team-a', 'sk-bbbbbbbbbbbbbbbb': 'team-b' });
  assert.equal(keys.tenantOf('Bearer sk-aaaaaaaaaaaaaaaa'), 'team-a');
  assert.equal(keys.tenantOf('Bearer sk-bbbbbbbbbbbbbbbb'), 'team-b');
  for (const bad of [undefined, 'sk-aaaaaaaaaaaaaaaa', 'Bearer sk-aaaaaaaaaaaaaaa', 'Bearer '])
    assert.equal(keys.tenantOf(bad), undefined);
  assert.throws(() => new ApiKeys({ short: 'a' }), /shorter than 16/);
  assert.throws(() => new ApiKeys({ 'sk-cccccccccccccccc': 'a/b' }), /tenant 'a\/b'/);
  assert.throws(() => new ApiKeys({}), /no keys/);
  const file = join(dir, 'keys.yaml');
  writeFileSync(file, 'sk-aaaaaaaaaaaaaaaa: team-a\n"sk-bbbbbbbbbbbbbbbb": team-b\n', { mode: 0o600 });
  assert.equal(loadApiKeysFile(file).tenantOf('Bearer sk-bbbbbbbbbbbbbbbb'), 'team-b');
  chmodSync(file, 0o640);
  assert.throws(() => loadApiKeysFile(file), /--api-keys-file .*readable by others/);
  // no client salt makes one tenant's salt another's
  for (const clientSalt of [undefined, 'x', '/team-a', '../team-a', 'team-a/'])
    assert.equal(tenantCacheSalt('team-b', clientSalt).split('/')[1], 'team-b');
  assert.notEqual(tenantCacheSalt('team-a', undefined), tenantCacheSalt('team-b', undefined));
});

/** Sends `head` (the request line and headers, without the blank line) and `body` on a connection of its own; the status and the error's param. */
async function askRaw(
  port: number,
  head: string,
  body = '',
): Promise<{ status: number; param: unknown; text: string }> {
  const client = await rawClient(port);
  try {
    client.socket.write(`${head}\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    const whole = () => {
      const r = client.received();
      const end = r.indexOf('\r\n\r\n');
      const length = end === -1 ? null : /^content-length: *(\d+)/im.exec(r.slice(0, end));
      return length !== null && r.length >= end + 4 + Number(length[1]);
    };
    await until(whole, `a whole answer to ${head.split('\r\n')[0]}`);
    const received = client.received();
    const status = Number(/^HTTP\/1\.1 (\d{3}) /.exec(received)?.[1]);
    const text = received.slice(received.indexOf('\r\n\r\n') + 4);
    const param = status >= 400 ? (JSON.parse(text) as { error: { param: unknown } }).error.param : undefined;
    return { status, param, text };
  } finally {
    client.socket.destroy();
  }
}

test('a request with two Authorization header lines is refused 400 naming authorization, whichever of them is valid', async () => {
  // Node keeps the first Authorization line and drops the others: a proxy in front may have
  // read (and checked, or logged) another one
  const key = 'sk-aaaaaaaaaaaaaaaa';
  const other = 'sk-bbbbbbbbbbbbbbbb';
  const token = 'admin-token-for-tests';
  const setup = await gatewayOnEngine({
    apiKeys: new ApiKeys({ [key]: 'team-a', [other]: 'team-b' }),
    adminToken: token,
  });
  try {
    const body = '{"model":"m","prompt":"x","max_tokens":1}';
    const completion = (auth: string) =>
      askRaw(setup.port, `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${auth}`, body);
    // one line: served, as before
    assert.equal((await completion(`Authorization: Bearer ${key}`)).status, 200);
    const served = setup.completions();
    for (const auth of [
      `Authorization: Bearer ${key}\r\nAuthorization: Bearer ${other}`,
      `Authorization: Bearer ${key}\r\nauthorization: Bearer not-a-key`,
      `Authorization: Bearer ${key}\r\nAUTHORIZATION: Bearer ${key}`,
      `Authorization: Bearer not-a-key\r\nAuthorization: Bearer ${key}`,
      `Authorization: Bearer ${key}\r\nAuthorization: `,
    ]) {
      const r = await completion(auth);
      assert.equal(r.status, 400, `${JSON.stringify(auth)}: ${r.text}`);
      assert.equal(r.param, 'authorization', JSON.stringify(auth));
    }
    assert.equal(setup.completions(), served, 'no refused request reached the engine');
    // the other routes that read a key
    const models = await askRaw(
      setup.port,
      `GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nAuthorization: Bearer ${other}`,
    );
    assert.deepEqual([models.status, models.param], [400, 'authorization'], models.text);
    // the admin token's routes: the token first, and the token second
    for (const auth of [
      `Authorization: Bearer ${token}\r\nAuthorization: Bearer wrong-token`,
      `Authorization: Bearer wrong-token\r\nAuthorization: Bearer ${token}`,
    ]) {
      const admin = await askRaw(setup.port, `GET /admin/workers HTTP/1.1\r\nHost: x\r\n${auth}`);
      assert.deepEqual([admin.status, admin.param], [400, 'authorization'], admin.text);
    }
    const one = await askRaw(setup.port, `GET /admin/workers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token}`);
    assert.equal(one.status, 200, one.text);
  } finally {
    await setup.close();
  }
});

test('credentials are read the same through the in-process API (app.inject): one Authorization line served, two refused', async () => {
  const key = 'sk-aaaaaaaaaaaaaaaa';
  const token = 'admin-token-for-tests';
  const setup = await gatewayOnEngine({ apiKeys: new ApiKeys({ [key]: 'team-a' }), adminToken: token });
  try {
    const { app } = setup.gateway;
    const admin = await app.inject({
      method: 'GET',
      url: '/admin/workers',
      headers: { authorization: `Bearer ${token}` },
    });
    assert.equal(admin.statusCode, 200, admin.body);
    const models = await app.inject({ method: 'GET', url: '/v1/models', headers: { authorization: `Bearer ${key}` } });
    // the key is taken: the list is asked of the engine, whose stand-in answers it with no list
    assert.equal(models.statusCode, 502, models.body);
    assert.equal((JSON.parse(models.body) as { error: { code: string } }).error.code, 'engine_models_failed');
    const two = await app.inject({
      method: 'GET',
      url: '/v1/models',
      headers: { authorization: [`Bearer ${key}`, 'Bearer other'] as unknown as string },
    });
    assert.equal(two.statusCode, 400, two.body);
    assert.equal((JSON.parse(two.body) as { error: { param: string } }).error.param, 'authorization');
  } finally {
    await setup.close();
  }
});

test('worker input: ids, URLs and key variables are checked; credentials are never shown', () => {
  assert.equal(checkWorkerId('w-1.a:0'), 'w-1.a:0');
  for (const bad of ['', 'a b', '../x', 'x'.repeat(65), 5, '<script>'])
    assert.throws(() => checkWorkerId(bad), RangeError);
  assert.equal(checkHttpUrl('http://10.0.0.5:8000', 'url'), 'http://10.0.0.5:8000');
  for (const bad of ['ftp://x', 'http//x', 'http://x/?a=1', 'http://x/#f', 'x'.repeat(3000), null])
    assert.throws(() => checkHttpUrl(bad, 'url'), RangeError);
  assert.equal(redactUrl('http://user:pa55@10.0.0.5:8000/v1'), 'http://***@10.0.0.5:8000/v1');
  assert.equal(redactUrl('http://10.0.0.5:8000'), 'http://10.0.0.5:8000');
  assert.ok(!redactUrl('http://user:pa55@h').includes('pa55'));
  assert.deepEqual(splitCredentials('http://us%40r:p%3Ass@10.0.0.5:8000/v1'), {
    url: 'http://10.0.0.5:8000/v1',
    authorization: `Basic ${Buffer.from('us@r:p:ss').toString('base64')}`,
  });
  assert.deepEqual(splitCredentials('http://10.0.0.5:8000'), { url: 'http://10.0.0.5:8000' });
  assert.equal(checkApiKeyEnv('VLLM_API_KEY'), 'VLLM_API_KEY');
  assert.throws(() => checkApiKeyEnv('CONTEXTFORGE_ADMIN_TOKEN'), /may not/);
  assert.throws(() => checkApiKeyEnv('A-B'), /variable name/);
});
