/**
 * A percent-encoded request path: vLLM's and SGLang's servers match their routes on the decoded
 * path (uvicorn's unquote), and Envoy passes `:path` on as the client wrote it, so the picker
 * reads the request as the engine will serve it: `/v1/%63ompletions` is a completion, checked
 * as one, not a request of no API whose body goes unchecked.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { pickerFleetWithEnvoy } from './harness.js';

const picker = pickerFleetWithEnvoy({ engines: 2 });

const prompts = (n: number) => Array.from({ length: n }, (_, i) => `prompt ${i}`);

async function refused(path: string, body: Record<string, unknown>) {
  const out = await picker.envoy.request({ headers: { ':path': path }, body: JSON.stringify(body) });
  assert.equal(out.kind, 'immediate', `${path} was routed`);
  if (out.kind !== 'immediate') throw new Error('routed');
  return { status: out.status, error: (JSON.parse(out.body) as { error: { param: string | null } }).error };
}

test('an encoded path is read as the engine decodes it, and its body checked as that API takes it', async () => {
  for (const path of ['/v1/%63ompletions', '/v1%2Fcompletions', '/v1/completion%73?x=%41']) {
    const r = await refused(path, { model: 'mock', prompt: prompts(1000) });
    assert.deepEqual([r.status, r.error.param], [400, 'prompt'], path);
  }
  // a completion's path with a chat's messages in the body: read as the completion it is served as
  const chatShaped = await refused('/v1/%63ompletions', {
    model: 'mock',
    messages: [{ role: 'user', content: 'hi' }],
    prompt: prompts(1000),
  });
  assert.deepEqual([chatShaped.status, chatShaped.error.param], [400, 'prompt']);
  const generate = await refused('/%67enerate', { text: prompts(1000) });
  assert.deepEqual([generate.status, generate.error.param], [400, 'text']);
  // the chat path encoded: its messages are checked
  const chat = await refused('/v1/chat/%63ompletions', { model: 'mock', messages: 'not a list' });
  assert.deepEqual([chat.status, chat.error.param], [400, 'messages']);
});

test('a path that stays encoded where the engine keeps it (a bad escape) names no API', async () => {
  const out = await picker.envoy.request({
    headers: { ':path': '/v1/%6completions' },
    body: JSON.stringify({ model: 'mock', prompt: 'hello' }),
  });
  // no API named: read by its body's shape (a prompt: a completion), as before
  assert.equal(out.kind, 'routed', out.kind === 'immediate' ? out.body : '');
  if (out.kind === 'routed') {
    await out.stream.respondHeaders({ served: out.endpoints[0] }, true);
    await out.stream.respondBody(['{"choices":[]}']);
    await out.stream.end();
  }
});
