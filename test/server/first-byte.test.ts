/**
 * Which attempt's first byte is the request's: the one whose answer reaches the client. An
 * attempt that fails before anything reached the client (cut mid-event, an error event of the
 * engine's, JSON that is not whole, an error object in a 200) is retried elsewhere, and its first
 * byte must not feed the time-to-first-byte histogram nor the worker's first-byte estimate.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { forwardTo, SlowClientResponse } from '../helpers/forward-stand-in.js';

/** A client that reads as fast as it is written to, and the first-byte times the attempt reports. */
function attempt(contentType = 'text/event-stream', streaming = true, status = 200) {
  const res = new SlowClientResponse();
  res.full = false;
  const firstBytes: number[] = [];
  const run = forwardTo(res, contentType, { streaming, onFirstByte: (s) => firstBytes.push(s) }, status);
  return { res, firstBytes, ...run };
}

test('a stream cut in its first event before anything reached the client reports no first byte', async () => {
  const { h, outcome, firstBytes, res } = attempt();
  h.onData!(Buffer.from('data: {"choices":[{"te'));
  h.onError!(new Error('other side closed'));
  assert.equal(await outcome, 'retry');
  assert.equal(res.text(), '', 'nothing reached the client');
  assert.deepEqual(firstBytes, [], 'the failed attempt is not a first byte');
});

test("a stream whose first event is the engine's server error reports no first byte", async () => {
  const { h, outcome, firstBytes } = attempt();
  h.onData!(
    Buffer.from(
      'data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}\n\n',
    ),
  );
  // the attempt aborted the engine's request: undici reports it as an error
  h.onError!(new Error('the engine failed the stream before its first event'));
  assert.equal(await outcome, 'retry');
  assert.deepEqual(firstBytes, []);
});

test('a whole answer that is not whole JSON reports no first byte', async () => {
  const { h, outcome, firstBytes } = attempt('application/json', false);
  h.onData!(Buffer.from('{"choices":[{"text":"a"'));
  h.onComplete!([]);
  assert.equal(await outcome, 'retry');
  assert.deepEqual(firstBytes, []);
});

test('the answer the client gets reports its first byte once, when it is committed', async () => {
  const { h, outcome, firstBytes, res } = attempt();
  h.onData!(Buffer.from('data: {"choices":[{"te'));
  assert.deepEqual(firstBytes, [], 'nothing reported while the first event is held back');
  h.onData!(Buffer.from('xt":"a"}]}\n\n'));
  assert.equal(firstBytes.length, 1, 'reported once the first event reached the client');
  assert.ok(firstBytes[0] >= 0);
  h.onData!(Buffer.from('data: [DONE]\n\n'));
  h.onComplete!([]);
  assert.equal(await outcome, 'done');
  assert.equal(firstBytes.length, 1, 'once per answer');
  assert.equal(res.text(), 'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n');
});

test('a whole answer reports its first byte when it is written', async () => {
  const { h, outcome, firstBytes, res } = attempt('application/json', false);
  h.onData!(Buffer.from('{"choices":[{"text":"a"}]}'));
  assert.deepEqual(firstBytes, [], 'nothing reported while the answer is gathered');
  h.onComplete!([]);
  assert.equal(await outcome, 'done');
  assert.equal(firstBytes.length, 1);
  assert.equal(res.text(), '{"choices":[{"text":"a"}]}');
});

test("an engine's client error (4xx) reaches the client but reports no first byte: it came without the prefill", async () => {
  const body =
    '{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}}';
  const { h, outcome, firstBytes, res } = attempt('application/json', false, 400);
  h.onData!(Buffer.from(body));
  h.onComplete!([]);
  assert.equal(await outcome, 'done');
  assert.equal(res.text(), body);
  assert.deepEqual(firstBytes, []);
});
