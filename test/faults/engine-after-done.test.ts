/**
 * A stream ends at its `data: [DONE]` event. vLLM and SGLang end their response right after it;
 * an engine (or a proxy in front of it) that leaves the response open, or writes more after it,
 * must not hold the client, the worker's in-flight slot or the engine's connection until the
 * inter-chunk timeout: the client's stream ends with the [DONE] event, nothing after it reaches
 * the client, the request is released as answered, and the engine's connection is closed.
 */
import assert from 'node:assert/strict';
import { request, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { test } from 'node:test';
import { until } from '../helpers/wait.js';
import { badFirstGateway, fakeEngine, type BadFirstGateway, type FakeEngine } from './harness.js';

const first = 'data: {"choices":[{"text":"a"}]}\n\n';
const DONE = 'data: [DONE]\n\n';
/** Far past every deadline of these tests: only the stream's end can end a response in time. */
const UPSTREAM_TIMEOUT_MS = 120_000;
const END_DEADLINE = { timeoutMs: 20_000 };

interface StreamEngine extends FakeEngine {
  /** The response of the last completion request, once the request was read. */
  res: ServerResponse | undefined;
  /** Connections that carried completions to the engine, and those of them that closed. */
  connections: number;
  closed: number;
}

/**
 * An engine that answers each completion (POST) with an event stream's headers, then `answer`;
 * the response stays open unless `answer` ends it.
 */
async function streamEngine(answer: (res: ServerResponse) => void): Promise<StreamEngine> {
  const seen = new WeakSet<Socket>();
  const counts = { connections: 0, closed: 0 };
  let last: ServerResponse | undefined;
  const engine = await fakeEngine((req, res) => {
    // (the gateway's GET /v1/models goes over connections of its own)
    if (req.method !== 'POST') return void req.resume().on('end', () => res.writeHead(404).end());
    if (!seen.has(req.socket)) {
      seen.add(req.socket);
      counts.connections++;
      req.socket.once('close', () => counts.closed++);
    }
    req.resume();
    req.on('end', () => {
      last = res;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      answer(res);
    });
  });
  return Object.defineProperties(engine, {
    res: { get: () => last },
    connections: { get: () => counts.connections },
    closed: { get: () => counts.closed },
  }) as StreamEngine;
}

interface Streamed {
  status: number;
  text: string;
  ended: boolean;
}

/** A streamed completion through the gateway at `base`, read as it comes. */
function streamFrom(base: string): Streamed {
  const s: Streamed = { status: 0, text: '', ended: false };
  const req = request(
    `${base}/v1/completions`,
    { method: 'POST', agent: false, headers: { 'content-type': 'application/json' } },
    (res) => {
      s.status = res.statusCode ?? 0;
      res.setEncoding('utf8');
      res.on('data', (d: string) => (s.text += d));
      res.on('end', () => (s.ended = true));
    },
  );
  req.on('error', () => {});
  req.end(JSON.stringify({ prompt: 'p', max_tokens: 2, stream: true }));
  return s;
}

/** The gateway's in-flight gauge for worker `bad` (it must be there). */
async function inFlight(g: BadFirstGateway): Promise<number> {
  const text = await g.gateway.metrics.metrics();
  const line = text.split('\n').find((l) => l.startsWith('contextforge_worker_in_flight{worker="bad"} '));
  assert.ok(line !== undefined, 'the in-flight gauge names worker bad');
  return Number(line.split(' ')[1]);
}

/**
 * A gateway in front of `engine` alone (one failure would open its circuit), handed to `run`;
 * closed after, the engine first (a stream it still holds open would hold the gateway's close).
 */
async function through(engine: StreamEngine, run: (g: BadFirstGateway) => Promise<void>): Promise<void> {
  const g = await badFirstGateway(engine.url, false, { upstreamTimeoutMs: UPSTREAM_TIMEOUT_MS, breakerFailures: 1 });
  try {
    await run(g);
  } finally {
    await engine.close();
    await g.close();
  }
}

/** The stream ended as a whole answer with `expected`: request released, no strike, the engine's connection closed. */
async function endedAtDone(g: BadFirstGateway, engine: StreamEngine, s: Streamed, expected: string): Promise<void> {
  await until(() => s.ended, "the client's response to end", END_DEADLINE);
  assert.equal(s.status, 200);
  assert.equal(s.text, expected, 'the stream up to its [DONE] event, nothing after it');
  await until(async () => (await inFlight(g)) === 0, 'the worker to have nothing in flight', END_DEADLINE);
  assert.equal(g.router.getStats().inFlightRequests, 0);
  await until(() => engine.closed === engine.connections, "the engine's connection to close", END_DEADLINE);
  assert.deepEqual(g.gateway.health.reasons('bad'), [], 'an answer, not a failure');
}

test('a stream the engine leaves open after data: [DONE] ends there, and its engine connection is closed', async () => {
  const engine = await streamEngine((res) => {
    res.write(first);
    res.write(DONE);
  });
  await through(engine, async (g) => {
    const s = streamFrom(g.base);
    await endedAtDone(g, engine, s, first + DONE);
  });
});

test('nothing the engine writes after data: [DONE] reaches the client', async () => {
  const answers: Array<(res: ServerResponse) => void> = [
    // in the same write
    (res) => void res.write(`${first}${DONE}data: {"choices":[{"text":"after"}]}\n\n`),
    // in writes of their own
    (res) => {
      res.write(first + DONE);
      res.write(': ping\n\n');
      res.write('data: {"choices":[{"text":"after"}]}\n\n');
    },
    // events that keep coming
    (res) => {
      res.write(first);
      res.write(DONE);
      const more = setInterval(() => res.write('data: {"choices":[{"text":"after"}]}\n\n'), 5);
      res.once('close', () => clearInterval(more));
    },
  ];
  for (const answer of answers) {
    const engine = await streamEngine(answer);
    await through(engine, async (g) => {
      const s = streamFrom(g.base);
      await endedAtDone(g, engine, s, first + DONE);
    });
  }
});

test('a data: [DONE] event split across writes ends the stream only once it is whole', async () => {
  for (const [start, rest] of [
    ['data: [DO', 'NE]\n\n'],
    ['data: [DONE]\n', '\n'],
    ['data: [DONE]\r', '\n\r\n'],
    // a comment line is still part of the [DONE] event
    ['data: [DONE]\n', ': the end\n\n'],
  ]) {
    const engine = await streamEngine((res) => void res.write(first + start));
    await through(engine, async (g) => {
      const s = streamFrom(g.base);
      // the first event reached the client: the start of the [DONE] event is held at the gateway
      await until(() => s.text === first, 'the first event to reach the client', END_DEADLINE);
      engine.res!.write(rest);
      await endedAtDone(g, engine, s, first + start + rest);
    });
  }
});

test('an engine that ends its response right after data: [DONE] keeps its connection for the next request', async () => {
  for (const answer of [
    (res: ServerResponse) => void res.end(first + DONE),
    (res: ServerResponse) => void res.write(first + DONE, () => res.end()),
  ]) {
    const engine = await streamEngine(answer);
    await through(engine, async (g) => {
      for (let i = 0; i < 3; i++) {
        const s = streamFrom(g.base);
        await until(() => s.ended, "the client's response to end", END_DEADLINE);
        assert.equal(s.text, first + DONE);
      }
      await until(async () => (await inFlight(g)) === 0, 'the worker to have nothing in flight');
      assert.equal(engine.connections, 1, 'one connection to the engine, reused');
      assert.equal(engine.closed, 0, 'the connection stays open');
      assert.deepEqual(g.gateway.health.reasons('bad'), []);
    });
  }
});

test('a data: [DONE] event ending in a CR at the end of a write takes the LF that may follow, and ends without one too', async () => {
  // a CR ends the event's blank line whatever comes next; an LF right after it is part of that line end
  const start = 'data: [DONE]\r\n\r';
  for (const rest of ['\n', '\n: ping\n\n', ': ping\r\r', '']) {
    const engine = await streamEngine((res) => void res.write(first + start));
    await through(engine, async (g) => {
      const s = streamFrom(g.base);
      await until(() => s.text === first + start, 'the [DONE] event to reach the client', END_DEADLINE);
      if (rest !== '') engine.res!.write(rest);
      await endedAtDone(g, engine, s, first + start + (rest.startsWith('\n') ? '\n' : ''));
    });
  }
});
