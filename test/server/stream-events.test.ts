/**
 * What a streamed answer's client sees of the engine's events: whole events pass, the start of
 * one whose end has not arrived is held back (up to a bound), and an engine failing mid-stream
 * ends the stream with an error event of its own, never one glued to a broken event.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { forwardTo, SlowClientResponse } from '../helpers/forward-stand-in.js';

const MiB = 1024 * 1024;

const DONE = 'data: [DONE]\n\n';

/**
 * The gateway's error event, which must be whole and the stream's last but one: `data: [DONE]`
 * follows it, as it follows vLLM's own error event.
 */
function errorBeforeDone(text: string): unknown {
  assert.ok(text.endsWith(`\n\n${DONE}`), 'the stream ends with data: [DONE], an event of its own');
  const events = text.slice(0, -2 - DONE.length).split('\n\n');
  const last = events[events.length - 1];
  assert.match(
    last,
    /^data: \{"error"/,
    `the error event starts a line of its own: …${JSON.stringify(last.slice(0, 40))}`,
  );
  return JSON.parse(last.slice('data: '.length));
}

test('an event too large to hold, then an empty chunk, then the engine fails: the error event is an event of its own', async () => {
  const res = new SlowClientResponse();
  res.full = false;
  const { h, outcome } = forwardTo(res);
  h.onData!(Buffer.from('data: {"n":0}\n\n'));
  // an event over the 1 MiB held back passes through as it comes (a huge logprobs chunk, say)
  const piece = Buffer.alloc(256 * 1024, 'x');
  h.onData!(Buffer.from('data: {"logprobs":"'));
  for (let i = 0; i < 4; i++) h.onData!(piece);
  assert.ok(res.text().length > MiB, 'the start of the large event reached the client');
  // undici delivers an empty chunk (it does at some chunk boundaries), then more of the event
  h.onData!(Buffer.alloc(0));
  h.onData!(piece);
  h.onError!(new Error('other side closed'));
  assert.equal(await outcome, 'cut');
  assert.deepEqual(errorBeforeDone(res.text()), {
    error: { message: 'the engine failed mid-stream', type: 'server_error', param: null, code: null },
  });
});

test('an empty chunk between whole events changes nothing the client sees', async () => {
  const res = new SlowClientResponse();
  res.full = false;
  const { h, outcome } = forwardTo(res);
  h.onData!(Buffer.from('data: {"n":0}\n\n'));
  h.onData!(Buffer.alloc(0));
  h.onData!(Buffer.from('data: {"n":1}\n\ndata: {"n"'));
  h.onData!(Buffer.alloc(0));
  h.onData!(Buffer.from(':2}\n\ndata: [DONE]\n\n'));
  h.onComplete!([]);
  assert.equal(await outcome, 'done');
  assert.equal(res.text(), 'data: {"n":0}\n\ndata: {"n":1}\n\ndata: {"n":2}\n\ndata: [DONE]\n\n');
});

test('[DONE] followed by spaces or tabs before its line end ends the stream, as the OpenAI SDKs read it; other trailing text does not', async () => {
  const ends = ['data: [DONE] \n\n', 'data: [DONE]  \t\r\n\r\n', 'data:[DONE]\t\r\r', 'data: [DONE]   '];
  for (const end of ends) {
    const res = new SlowClientResponse();
    res.full = false;
    const { h, outcome } = forwardTo(res);
    h.onData!(Buffer.from(`data: {"n":0}\n\n${end}`));
    h.onComplete!([]);
    assert.equal(await outcome, 'done', JSON.stringify(end));
    assert.equal(res.text(), `data: {"n":0}\n\n${end}`);
  }
  for (const end of ['data: [DONE] x\n\n', 'data: [DONE]\v\n\n']) {
    const res = new SlowClientResponse();
    res.full = false;
    const { h, outcome } = forwardTo(res);
    h.onData!(Buffer.from(`data: {"n":0}\n\n${end}`));
    h.onComplete!([]);
    assert.equal(await outcome, 'cut', JSON.stringify(end));
  }
});
