/**
 * The ids the gateway hands the router are longer than its --max-id-bytes (a LoRA name, a
 * tenant's ids, /generate's salt with an extra_key): routerIdBytes() is the router's bound
 * `serve` passes for them, and a router built with it takes the longest of each.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { DEFAULT_REQUEST_LIMITS, readGenerateRouteRequest, routerIdBytes } from '../../src/server/request-limits.js';

test("the gateway's longest routed ids fit the router's bound serve passes (routerIdBytes)", () => {
  for (const maxIdBytes of [1, DEFAULT_REQUEST_LIMITS.maxIdBytes, 4096]) {
    const limits = { ...DEFAULT_REQUEST_LIMITS, maxIdBytes };
    // the longest /generate salt: an extra_key and a cache_salt of control characters, each escaped to 6 bytes
    const body = { text: 'hello', extra_key: '\u0001'.repeat(4 * maxIdBytes), cache_salt: '\u0001'.repeat(maxIdBytes) };
    const { routeRequest } = readGenerateRouteRequest(body, {}, limits);
    const bytes = Buffer.byteLength(routeRequest.cacheSalt!);
    assert.ok(bytes > maxIdBytes);
    assert.ok(bytes <= routerIdBytes(maxIdBytes), `${bytes} > ${routerIdBytes(maxIdBytes)}`);
    const router = new KVAwareRouter({ maxIdBytes: routerIdBytes(maxIdBytes) });
    router.registerWorker('a');
    assert.equal(router.route(routeRequest).workerId, 'a');
    // a tenant's ids: `tenant/<64 characters>/` before the client's; a LoRA name as long as a model's
    const tenantId = `tenant/${'t'.repeat(64)}/${'i'.repeat(maxIdBytes)}`;
    const r = router.route({
      text: 'x',
      workflowId: tenantId,
      contentAnchors: [{ id: tenantId, tokens: 1 }],
      cacheSalt: tenantId,
      lora: 'm'.repeat(4 * maxIdBytes),
    });
    assert.equal(r.workerId, 'a');
  }
});

test("a router's default bound takes what the gateway's default limits let through but /generate's longest salts", () => {
  const router = new KVAwareRouter();
  router.registerWorker('a');
  const max = DEFAULT_REQUEST_LIMITS.maxIdBytes;
  const tenantId = `tenant/${'t'.repeat(64)}/${'€'.repeat(Math.floor(max / 3))}`;
  router.route({ text: 'x', workflowId: tenantId, cacheSalt: tenantId, lora: 'm'.repeat(4 * max) });
  assert.ok(routerIdBytes(max) > router.maxIdBytes);
});
