/**
 * forward() (src/server/forward.ts) driven by hand: a stand-in pool hands the test undici's side
 * of the exchange (onHeaders, onData, onComplete, onError), and a stand-in client response
 * records what reached the client and stays full until the test drains it.
 */
import { EventEmitter } from 'node:events';
import type { ServerResponse } from 'node:http';
import type { Dispatcher } from 'undici';
import { BodyBudget } from '../../src/server/body-budget.js';
import { ConnectionSlots } from '../../src/server/connection-slots.js';
import { forward, type ForwardOptions, type ForwardOutcome } from '../../src/server/forward.js';
import type { ProxyReply } from '../../src/server/openai-request.js';
import type { WorkerConnection } from '../../src/server/worker-connections.js';

/** A client's response whose socket stays full until the test drains it (`full = false`: never full). */
export class SlowClientResponse extends EventEmitter {
  readonly written: Buffer[] = [];
  full = true;
  ended = false;
  destroyed = false;
  writableFinished = false;
  writeHead(): this {
    return this;
  }
  /** forward() takes the client's x-request-id (set for the gateway's own answers) off an engine's answer. */
  removeHeader(): void {}
  write(chunk: Buffer | string): boolean {
    this.written.push(Buffer.from(chunk));
    return !this.full;
  }
  end(chunk?: Buffer | string): this {
    if (chunk !== undefined) this.written.push(Buffer.from(chunk));
    this.ended = true;
    this.writableFinished = true;
    return this;
  }
  destroy(): this {
    this.destroyed = true;
    return this;
  }
  /** The client caught up. */
  drain(): void {
    this.full = false;
    this.emit('drain');
  }
  /** Everything that reached the client. */
  text(): string {
    return Buffer.concat(this.written).toString();
  }
}

/**
 * forward() of a streamed request on a stand-in pool; the engine has answered `status` (200) with
 * `contentType`. `overrides` replace the options' defaults (callbacks that do nothing).
 * Returns undici's handler, the attempt's outcome, how often the engine was resumed and why the
 * attempt aborted the engine's answer (undefined while it has not).
 */
export function forwardTo(
  res: SlowClientResponse,
  contentType = 'text/event-stream',
  overrides: Partial<ForwardOptions> = {},
  status = 200,
): {
  h: Dispatcher.DispatchHandler;
  outcome: Promise<ForwardOutcome>;
  resumed: () => number;
  aborted: () => Error | undefined;
} {
  let handler: Dispatcher.DispatchHandler | undefined;
  const connection = {
    pool: {
      dispatch: (_: unknown, h: Dispatcher.DispatchHandler) => {
        handler = h;
        return true;
      },
    },
    slots: new ConnectionSlots(1),
    headers: {},
    unanswered: new Set(),
  } as unknown as WorkerConnection;
  const reply = {
    raw: res as unknown as ServerResponse,
    sent: false,
    code: () => reply,
    header: () => reply,
    send: () => reply,
    hijack: () => {},
  } as unknown as ProxyReply;
  const options: ForwardOptions = {
    workerId: 'e0',
    rank: null,
    cachedTokens: undefined,
    model: undefined,
    failedWorkers: new Set(),
    lastAttempt: false,
    streaming: true,
    via: '1.1 contextforge-000000000000',
    passedHeaders: undefined,
    firstByteTimeoutMs: 600_000,
    interChunkTimeoutMs: 600_000,
    onFirstByte: () => {},
    onFirstByteOverdue: () => {},
    onOverloaded: () => {},
    onUnavailable: () => {},
    onLoop: () => {},
    onQueueFull: () => {},
    onServerErrorAnswer: () => {},
    onIncomplete: () => {},
    onRefused: () => {},
    onConnectionLost: () => {},
    onCommitted: () => {},
    answerBudget: new BodyBudget(Number.MAX_SAFE_INTEGER),
    onAnswerBudgetFull: () => {},
    ...overrides,
  };
  const outcome = forward(reply, connection, '/v1/completions', '{}', options);
  const h = handler!;
  let resumed = 0;
  let aborted: Error | undefined;
  h.onConnect!((err) => (aborted ??= err ?? new Error('aborted')));
  h.onHeaders!(status, [Buffer.from('content-type'), Buffer.from(contentType)], () => resumed++, 'OK');
  return { h, outcome, resumed: () => resumed, aborted: () => aborted };
}
