/**
 * What a streamed answer's client sees of the engine's events: whole events pass, the start of
 * one whose end has not arrived is held back (up to a bound), and an engine failing mid-stream
 * ends the stream with an error event of its own, never one glued to a broken event.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ShutdownCuts } from '../../src/server/forward.js';
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

/** `bytes` bytes of hex counters (8 digits and a space each), as text of one unfinished event. */
function counters(from: number, bytes: number): Buffer {
  const out = Buffer.alloc(bytes);
  for (let i = 0, at = 0; at < bytes; i++, at += 9) out.write(`${(from + i).toString(16).padStart(8, '0')} `, at);
  return out;
}

/** `text` starts with `start` (compared without quoting megabytes on failure). */
function startsWith(text: string, start: string, what: string): void {
  assert.ok(
    text.startsWith(start),
    `${what} (${text.length} bytes reached the client, ${start.length} expected first)`,
  );
}

test('past the held-back limit, the rest of an event passes at once, chunk by chunk: an engine failing then loses none of it', async () => {
  const res = new SlowClientResponse();
  res.full = false;
  const { h, outcome } = forwardTo(res);
  const sent: Buffer[] = [
    Buffer.from('data: {"n":0}\n\n'),
    Buffer.from('data: {"choices":[{"index":0,"delta":{"content":"'),
  ];
  for (const chunk of sent) h.onData!(chunk);
  // 3 MiB of the same event in 128 KiB writes: once past the limit, each reaches the client as it comes
  let total = sent[0].length + sent[1].length;
  let passed = 0;
  for (let i = 0; i < 24; i++) {
    const piece = counters(i * 16384, 128 * 1024);
    sent.push(piece);
    h.onData!(piece);
    total += piece.length;
    if (total - sent[0].length > MiB) {
      assert.equal(res.text().length, total, `write ${i}: every byte the engine sent has reached the client`);
      passed++;
    }
  }
  assert.ok(passed > 12, 'most writes came past the limit');
  h.onError!(new Error('other side closed'));
  assert.equal(await outcome, 'cut');
  const text = res.text();
  const body = Buffer.concat(sent).toString();
  startsWith(text, body, 'the client has every byte the engine sent, in order');
  assert.deepEqual(errorBeforeDone(text.slice(body.length)), {
    error: { message: 'the engine failed mid-stream', type: 'server_error', param: null, code: null },
  });
});

test('an event past the held-back limit ends inside a chunk: up to its end passes, the start of the next is held back as usual', async () => {
  for (const fail of ['engine', 'shutdown'] as const) {
    const res = new SlowClientResponse();
    res.full = false;
    const streams = new ShutdownCuts();
    const { h, outcome } = forwardTo(res, undefined, { streams });
    let sent = 'data: {"n":0}\n\ndata: {"logprobs":"';
    h.onData!(Buffer.from('data: {"n":0}\n\n'));
    h.onData!(Buffer.from('data: {"logprobs":"'));
    for (let i = 0; i < 12; i++) {
      const piece = counters(i * 16384, 128 * 1024);
      h.onData!(piece);
      sent += piece.toString();
    }
    assert.equal(res.text().length, sent.length, `${fail}: the start of the large event reached the client`);
    // its end, then the start of the next event, in one chunk
    h.onData!(Buffer.from('"}\n\ndata: {"n":2,"half'));
    sent += '"}\n\n';
    assert.equal(
      res.text().length,
      sent.length,
      `${fail}: the large event's end passed, the next event's start is held`,
    );
    // the next event, whole: it passes, and the start of the one after it is held again
    h.onData!(Buffer.from('":1}\n\ndata: {"n":3'));
    sent += 'data: {"n":2,"half":1}\n\n';
    assert.equal(res.text().length, sent.length, `${fail}: the next event passed whole`);
    if (fail === 'engine') h.onError!(new Error('other side closed'));
    else void streams.endAll();
    assert.equal(await outcome, fail === 'engine' ? 'cut' : 'shut-down');
    const text = res.text();
    startsWith(text, `${sent}data: {"error"`, `${fail}: the held start dropped, the error event on a line of its own`);
  }
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
