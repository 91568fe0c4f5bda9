/**
 * A prompt past maxPromptTokens through the gateway: refused 400 with the OpenAI error naming
 * the prompt's field and the limit, before anything is recorded or sent, whether it is far past
 * the limit (a body of megabytes) or one byte past it; one at the limit is served as sent. The
 * text estimate is 4 UTF-8 bytes a token, so text that is not ASCII counts by its bytes.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { fakeEngine } from '../faults/harness.js';

interface Answer {
  status: number;
  text: string;
}

test('a prompt past maxPromptTokens is refused naming its field; one at the limit is served as sent', async () => {
  const received: Buffer[] = [];
  const engine = await fakeEngine((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.method === 'POST') received.push(Buffer.concat(chunks));
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices":[{"text":"ok"}]}');
    });
  });
  // 64-byte text chunks of 16 tokens, half a chunk for the tail: 399,999 bytes of prompt are
  // 6,249 chunks, 99,992 tokens; 400,000 bytes 6,250 chunks, 100,008 tokens
  const gw = await createGateway({
    router: new KVAwareRouter({ blockSize: 16, maxPromptTokens: 100_000 }),
    workers: [{ id: 'e0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    const post = async (path: string, body: Buffer | string): Promise<Answer> => {
      const res = await fetch(`${url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
      });
      return { status: res.status, text: await res.text() };
    };
    const refusal = (tokens: number, param: string) =>
      JSON.stringify({
        error: {
          message: `the prompt has ${tokens} tokens, more than the 100000 this router takes (maxPromptTokens)`,
          type: 'invalid_request_error',
          param,
          code: null,
        },
      });
    // a chat's canonical text adds "<|user|>\n" and "\n" to its content: 10 bytes
    const content = '漢字かな'.repeat(33_332) + 'zzzzz'; // 399,989 bytes of UTF-8
    const chat = (text: string) =>
      JSON.stringify({ model: 'm', max_tokens: 1, messages: [{ role: 'user', content: text }] });
    const atLimit = Buffer.from(chat(content));
    const served = await post('/v1/chat/completions', atLimit);
    assert.equal(served.status, 200, served.text);
    assert.equal(received.length, 1);
    assert.ok(received[0].equals(atLimit), 'the engine gets the body as sent');
    const over = await post('/v1/chat/completions', chat(content + 'z'));
    assert.deepEqual(over, { status: 400, text: refusal(100_008, 'messages') });
    // megabytes past it: spaces, many messages, a completion's text prompt
    const spaces = await post('/v1/chat/completions', chat(' '.repeat(8_000_000)));
    assert.deepEqual(spaces, { status: 400, text: refusal(2_000_008, 'messages') });
    const messages = Array.from({ length: 20_000 }, (_, i) => ({
      role: i % 2 ? 'assistant' : 'user',
      content: 'é'.repeat(150),
    }));
    const many = await post('/v1/chat/completions', JSON.stringify({ model: 'm', messages }));
    assert.equal(many.status, 400, many.text);
    assert.equal((JSON.parse(many.text) as { error: { param: string } }).error.param, 'messages');
    assert.match(many.text, /more than the 100000 this router takes \(maxPromptTokens\)/);
    const prompt = await post('/v1/completions', JSON.stringify({ model: 'm', prompt: '😀'.repeat(1_000_000) }));
    assert.deepEqual(prompt, { status: 400, text: refusal(1_000_008, 'prompt') });
    // nothing of them was recorded or sent, and the gateway still answers
    assert.equal(received.length, 1);
    assert.equal(gw.router.localLoad('e0').inFlightRequests, 0);
    const health = await fetch(`${url}/healthz`);
    assert.equal(health.status, 200);
    await health.text();
  } finally {
    await gw.close(0);
    await engine.close();
  }
});
