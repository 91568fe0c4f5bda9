/**
 * Metadata headers carrying UTF-8: Node reads header bytes as Latin-1, so `x-workflow-id: café`
 * would arrive as "cafÃ©", another workflow than the body's (and the endpoint picker's, which
 * reads Envoy's header bytes as UTF-8) "café". The gateway reads them as UTF-8; bytes that are
 * not UTF-8 are a 400 naming the header.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

let g: GatewayOnEngine;
before(async () => {
  g = await gatewayOnEngine();
});
after(async () => {
  await g.close();
});

/** Sends a completion whose `name` header has the bytes `value`; resolves with the whole answer (Latin-1). */
async function send(name: string, value: Buffer): Promise<string> {
  const c = await rawClient(g.port);
  const body = '{"prompt":"hello"}';
  c.socket.write(
    Buffer.concat([
      Buffer.from(`POST /v1/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n${name}: `),
      value,
      Buffer.from(`\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`),
    ]),
  );
  await until(() => c.closed(), 'the answer');
  return c.received();
}

test('a UTF-8 workflow id in a header is the same workflow as in the body', async () => {
  const answer = await send('x-workflow-id', Buffer.from('café-1', 'utf8'));
  assert.match(answer, /^HTTP\/1\.1 200 /);
  assert.ok(g.gateway.router.workflowAffinity('café-1'), 'recorded as café-1');
  assert.equal(g.gateway.router.workflowAffinity(Buffer.from('café-1', 'utf8').toString('latin1')), undefined);
});

test('header bytes that are not UTF-8 are a 400 naming the header', async () => {
  for (const name of ['x-workflow-id', 'x-agent-role', 'x-anchor-ids']) {
    const answer = await send(name, Buffer.from([0x63, 0x61, 0x66, 0xe9])); // "café" in Latin-1
    assert.match(answer, /^HTTP\/1\.1 400 /, name);
    const error = (JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as { error: { param: string } }).error;
    assert.equal(error.param, name);
  }
});

test('an x-anchor-ids token count that is not decimal digits is a 400 naming the header', async () => {
  for (const value of ['a:0x10', 'a:1e3', 'a: 7', 'a:-1', 'a:']) {
    const answer = await send('x-anchor-ids', Buffer.from(value));
    assert.match(answer, /^HTTP\/1\.1 400 /, value);
    const error = (
      JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as { error: { param: string; message: string } }
    ).error;
    assert.equal(error.param, 'x-anchor-ids', value);
    assert.match(error.message, /token count a non-negative decimal integer/, value);
  }
  assert.match(await send('x-anchor-ids', Buffer.from('urn:doc, a:7')), /^HTTP\/1\.1 200 /, 'ids holding ":" pass');
});
