/**
 * The shapes of the fields the gateway reads or forwards to the engine as they are, checked as
 * the engines' request models check them, so that a request they would refuse is a 400 naming
 * the field before any engine sees it (the fast path and Fastify's route alike):
 *
 * - `stream_options`: absent, null or an object; its `include_usage` and `continuous_usage_stats`
 *   true, false or null (the gateway reads `include_usage: true` as a request for the usage chunk,
 *   where pydantic would read `"true"` as true); a non-empty one only with `stream: true`, as vLLM
 *   refuses it otherwise;
 * - a chat's `tools` (a list of objects) and `tool_choice` (a string or an object), and
 *   `response_format` (an object), each absent or null as well.
 *
 * What vLLM takes passes: `stream_options: {}` without a stream, a text part without its text
 * (vLLM skips it), a message without content (vLLM reads it as empty), a role of the client's own.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { bodyWith, LIMIT_PATHS, passes, refused as refusedOn } from '../helpers/limit-checks.js';

/** Refused on the fast path and on Fastify's route (a query string takes a request past the fast path). */
const refused = (setup: GatewayOnEngine, path: string, fields: object, param: string) =>
  refusedOn(setup, path, fields, param, ['', '?via=fastify']);

let setup: GatewayOnEngine;
/** A gateway on the mock engine, which streams: for the streamed requests that pass. */
let mock: { engine: MockEngine; gateway: Gateway; base: string };
before(async () => {
  setup = await gatewayOnEngine();
  const engine = await new MockEngine().start();
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  mock = { engine, gateway, base: await gateway.app.listen({ host: '127.0.0.1', port: 0 }) };
});
after(async () => {
  await setup.close();
  await mock.gateway.close(0);
  await mock.engine.close();
});

/** Asserts the streamed request with `fields` is forwarded to the mock engine and answered with its stream. */
async function streamed(path: string, fields: object): Promise<void> {
  const res = await fetch(`${mock.base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...bodyWith(path, fields), model: 'mock', max_tokens: 2 }),
  });
  const text = await res.text();
  assert.equal(res.status, 200, `${path} ${JSON.stringify(fields)}: ${text.slice(0, 200)}`);
  assert.equal(res.headers.get('x-contextforge-worker'), 'e0');
  assert.match(text, /data: \[DONE\]/u);
}

describe('stream_options', () => {
  for (const { path } of Object.values(LIMIT_PATHS)) {
    test(`anything but an object or null is refused (${path})`, async () => {
      for (const value of [5, 'x', [], [{ include_usage: true }], true]) {
        const message = await refused(setup, path, { stream: true, stream_options: value }, 'stream_options');
        assert.equal(message, 'stream_options must be an object');
      }
    });
    test(`include_usage and continuous_usage_stats are true, false or null (${path})`, async () => {
      for (const key of ['include_usage', 'continuous_usage_stats'])
        for (const value of ['true', 1, 0, {}, []]) {
          const param = `stream_options.${key}`;
          const message = await refused(setup, path, { stream: true, stream_options: { [key]: value } }, param);
          assert.equal(message, `${param} must be true or false`);
        }
      await streamed(path, {
        stream: true,
        stream_options: { include_usage: true, continuous_usage_stats: false },
      });
      await streamed(path, { stream: true, stream_options: { include_usage: null, other: 'the engine’s' } });
      await streamed(path, { stream: true, stream_options: null });
    });
    test(`a non-empty object without stream: true is refused, as vLLM refuses it (${path})`, async () => {
      for (const stream of [false, null, undefined]) {
        const message = await refused(
          setup,
          path,
          { stream, stream_options: { include_usage: false } },
          'stream_options',
        );
        assert.equal(message, 'stream_options may only be given when stream is true');
      }
      // vLLM reads an empty object, as null, as no options
      await passes(setup, path, { stream_options: {} });
      await passes(setup, path, { stream: false, stream_options: null });
    });
  }
});

describe("a chat's tools and tool_choice, and response_format", () => {
  const chat = LIMIT_PATHS.chat.path;
  const tool = { type: 'function', function: { name: 'f', parameters: { type: 'object' } } };
  test('tools: a list of objects, or null', async () => {
    for (const value of [5, 'f', { type: 'function' }]) {
      const message = await refused(setup, chat, { tools: value }, 'tools');
      assert.equal(message, 'tools must be a list');
    }
    for (const value of [5, 'f', null, [tool]]) {
      const message = await refused(setup, chat, { tools: [tool, value] }, 'tools[1]');
      assert.match(message, /^tools\[1\] must be an object/u);
    }
    await passes(setup, chat, { tools: [tool] });
    await passes(setup, chat, { tools: [] });
    await passes(setup, chat, { tools: null });
  });
  test('tool_choice: a string or an object, or null', async () => {
    for (const value of [5, true, ['auto']]) {
      const message = await refused(setup, chat, { tools: [tool], tool_choice: value }, 'tool_choice');
      assert.equal(message, 'tool_choice must be "none", "auto", "required" or an object naming a function');
    }
    for (const value of ['none', 'auto', 'required', { type: 'function', function: { name: 'f' } }, null])
      await passes(setup, chat, { tools: [tool], tool_choice: value });
  });
  test('completions take no tools (neither engine reads them there): not checked there', async () => {
    await passes(setup, LIMIT_PATHS.completions.path, { tools: 5, tool_choice: 5 });
  });
  for (const { path } of Object.values(LIMIT_PATHS))
    test(`response_format: an object, or null (${path})`, async () => {
      for (const value of [5, 'json_object', [{ type: 'json_object' }]]) {
        const message = await refused(setup, path, { response_format: value }, 'response_format');
        assert.equal(message, 'response_format must be an object ({type: …})');
      }
      await passes(setup, path, { response_format: { type: 'json_object' } });
      await passes(setup, path, { response_format: null });
    });
});

describe('messages vLLM takes pass', () => {
  const chat = LIMIT_PATHS.chat.path;
  test('a text part without its text, or with a null one (vLLM skips it)', async () => {
    await passes(setup, chat, { messages: [{ role: 'user', content: [{ type: 'text' }, 'hi'] }] });
    await passes(setup, chat, { messages: [{ role: 'user', content: [{ type: 'text', text: null }, 'hi'] }] });
  });
  test('a message without content, or with null content (vLLM reads it as empty)', async () => {
    await passes(setup, chat, { messages: [{ role: 'system' }, { role: 'user', content: 'hi' }] });
    await passes(setup, chat, { messages: [{ role: 'user', content: null }] });
    const call = { id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } };
    await passes(setup, chat, {
      messages: [
        { role: 'user', content: 'hi' },
        { role: 'assistant', tool_calls: [call] },
        { role: 'tool', tool_call_id: 'c1', content: '1' },
      ],
    });
  });
  test('a role of the client’s own (vLLM’s custom message takes any string role)', async () => {
    await passes(setup, chat, { messages: [{ role: 'ipython', content: 'hi' }] });
  });
  test('a text part whose text is not a string, an image_url part without its url, a part of an unknown type are refused', async () => {
    const at = 'messages[0].content[0]';
    const part = (p: object) => ({ messages: [{ role: 'user', content: [p] }] });
    await refused(setup, chat, part({ type: 'text', text: 5 }), `${at}.text`);
    await refused(setup, chat, part({ type: 'image_url' }), `${at}.image_url`);
    await refused(setup, chat, part({ type: 'image_url', image_url: {} }), `${at}.image_url`);
    await refused(setup, chat, part({ type: 'evil', text: 'x' }), `${at}.type`);
  });
});
