/**
 * A body of millions of tiny arrays or objects ({"prompt": [[1], [1], …]}) is cheap to send and
 * costs seconds of JSON.parse, during which the gateway serves nobody: such a body is refused
 * before it is parsed (over --max-json-containers, 100,000 by default), on the fast path and on
 * Fastify's, and reaches no engine. So is a body with one object of very many keys
 * ({"k0": 1, "k1": 1, …}), over --max-json-object-members (4,096 by default).
 */
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, test } from 'node:test';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';

let g: GatewayOnEngine;
/** A gateway whose objects may have at most 16 members. */
let tight: GatewayOnEngine;
before(async () => {
  g = await gatewayOnEngine();
  tight = await gatewayOnEngine({ limits: { maxJsonObjectMembers: 16 } });
});
after(async () => {
  await g.close();
  await tight.close();
});

/** POSTs `body` to the gateway, with a Content-Length or chunked; resolves with the status and the parsed body. */
function post(
  path: string,
  body: string,
  chunked: boolean,
  on: GatewayOnEngine = g,
): Promise<{ status: number; json: unknown }> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port: on.port,
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

/** An object of `n` members `"k0": 1, …`. */
const members = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, 1]));

for (const chunked of [false, true]) {
  test(`a body with an object of more members than the limit is a 400 naming the body (${chunked ? 'chunked' : 'with a Content-Length'})`, async () => {
    for (const [on, max] of [
      [g, 4096],
      [tight, 16],
    ] as const) {
      const before = on.completions();
      for (const [path, body] of [
        // the body itself, an object inside it, an object inside a list
        ['/v1/completions', JSON.stringify({ prompt: 'x', ...members(max) })],
        ['/v1/completions', JSON.stringify({ prompt: 'x', logit_bias: {}, extra: members(max + 1) })],
        ['/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'a', ...members(max) }] })],
      ]) {
        const { status, json } = await post(path, body, chunked, on);
        assert.equal(status, 400, `${path} (limit ${max})`);
        const error = (json as { error: { param: string; message: string } }).error;
        assert.equal(error.param, 'body');
        assert.equal(error.message, `an object in the body has more than ${max} members`);
      }
      assert.equal(on.completions(), before, 'no engine saw them');
      // objects of exactly the limit, and a list of more elements, are served
      const ok = await post(
        '/v1/completions',
        JSON.stringify({ prompt: 'x', padding: members(max), list: Array.from({ length: max * 2 }, () => 1) }),
        chunked,
        on,
      );
      assert.equal(ok.status, 200, `limit ${max}: ${JSON.stringify(ok.json)}`);
    }
  });
}
