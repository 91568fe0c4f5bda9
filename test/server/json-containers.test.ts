/**
 * A body of millions of tiny arrays or objects ({"prompt": [[1], [1], …]}) is cheap to send and
 * costs seconds of JSON.parse, during which the gateway serves nobody: such a body is refused
 * before it is parsed (over --max-json-containers, 100,000 by default), on the fast path and on
 * Fastify's, and reaches no engine.
 */
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, test } from 'node:test';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';

let g: GatewayOnEngine;
before(async () => {
  g = await gatewayOnEngine();
});
after(async () => {
  await g.close();
});

/** POSTs `body` to the gateway, with a Content-Length or chunked; resolves with the status and the parsed body. */
function post(path: string, body: string, chunked: boolean): Promise<{ status: number; json: unknown }> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port: g.port,
        method: 'POST',
        path,
        headers: chunked
          ? { 'content-type': 'application/json', 'transfer-encoding': 'chunked' }
          : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (text += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, json: JSON.parse(text) as unknown }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

for (const chunked of [false, true]) {
  test(`a body of more arrays and objects than the limit is a 400 naming the body (${chunked ? 'chunked' : 'with a Content-Length'})`, async () => {
    const before = g.completions();
    const prompts = JSON.stringify({ prompt: Array.from({ length: 100_000 }, () => [1]) });
    const messages = JSON.stringify({
      messages: Array.from({ length: 100_000 }, () => ({ role: 'user', content: 'a' })),
    });
    for (const [path, body] of [
      ['/v1/completions', prompts],
      ['/v1/chat/completions', messages],
    ]) {
      const { status, json } = await post(path, body, chunked);
      assert.equal(status, 400, path);
      const error = (json as { error: { param: string; message: string } }).error;
      assert.equal(error.param, 'body');
      assert.match(error.message, /more than 100000 arrays and objects/);
    }
    assert.equal(g.completions(), before, 'no engine saw them');
    // a body within the limit is served (its arrays in a field the gateway passes on unread: a
    // prompt of that many would be over --max-prompts)
    const ok = await post(
      '/v1/completions',
      JSON.stringify({ prompt: 'x', padding: Array.from({ length: 50_000 }, () => [1]) }),
      chunked,
    );
    assert.equal(ok.status, 200);
  });
}
