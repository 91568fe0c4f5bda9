import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import type { RouteRequest, RouteOptions, RouteResult } from '../../src/core/router/index.js';
import { createGateway } from '../../src/server/gateway.js';

/** A router whose route() throws what the test says, as a bug or an unforeseen input would. */
class ThrowingRouter extends KVAwareRouter {
  error: Error | undefined;
  override route(request: RouteRequest, options?: RouteOptions): RouteResult {
    if (this.error) throw this.error;
    return super.route(request, options);
  }
}

test('route-time TypeError/RangeError are 400 (never 500); other errors are a 500 that shows nothing internal', async () => {
  const router = new ThrowingRouter();
  const logs: string[] = [];
  const gw = await createGateway({
    router,
    workers: [{ id: 'w', url: 'http://127.0.0.1:1' }],
    adminToken: 'route-errors-admin',
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    log: (m) => logs.push(m),
  });
  const base = await gw.app.listen({ host: '127.0.0.1', port: 0 });
  const ask = async (path: string) => {
    const res = await fetch(`${base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer route-errors-admin' },
      body: JSON.stringify({ prompt: 'x' }),
    });
    return { status: res.status, error: ((await res.json()) as { error: { message: string } }).error };
  };
  for (const path of ['/v1/completions', '/v1/route']) {
    router.error = new RangeError('workflowId must be a non-empty string');
    assert.deepEqual(await ask(path), {
      status: 400,
      error: {
        message: 'workflowId must be a non-empty string',
        type: 'invalid_request_error',
        param: null,
        code: null,
      },
    });
    router.error = new TypeError("Cannot read properties of undefined (reading 'slot')");
    const internal = await ask(path);
    assert.equal(internal.status, 400);
    assert.equal(internal.error.message, 'the request could not be routed');
    router.error = new Error('ECONNRESET at /srv/contextforge/secret-path.ts:12');
    const bug = await ask(path);
    assert.equal(bug.status, 500);
    assert.deepEqual(bug.error, { message: 'internal error', type: 'server_error', param: null, code: null });
  }
  assert.ok(
    logs.some((l) => /secret-path/.test(l)),
    'the cause goes to the log',
  );
  await gw.close();
});
