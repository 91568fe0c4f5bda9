/**
 * One attempt on one engine: forward() sends the request over one of the connections the
 * gateway keeps to the engine and passes the engine's answer to the client as it arrives (a
 * stream in whole events, a complete JSON answer gathered and written once with its length).
 * Until the answer's first byte reaches the client a failure leaves no trace there, and the
 * proxy (proxy.ts) tries another worker; after it, a failure ends the client's response. How
 * the attempt ended is its ForwardOutcome; what the engine said on the way reaches the proxy
 * through the callbacks of ForwardOptions.
 */
import type { ServerResponse } from 'node:http';
import type { Dispatcher } from 'undici';
import type { BodyBudget, BodyCharge } from './body-budget.js';
import {
  doneEventEnd,
  errorAnswer,
  errorEvent,
  firstEventData,
  holdsDataLine,
  holdsDone,
  holdsMalformedEvent,
  isDoneData,
  isEngineFailure,
} from './engine-errors.js';
import { markCutByGateway, type FailureReason } from './metrics.js';

import { answerableRequestId, keepHeaderBytes } from './passed-headers.js';
import { openAiError, type ProxyReply } from './openai-request.js';
import { wholeAnswerEvents } from './whole-answer-stream.js';
import { declaresJson, isWholeJson } from './whole-json.js';
import type { UnansweredRequest, WorkerConnection } from './worker-connections.js';

/** How one attempt on one engine ended. */
export type ForwardOutcome =
  /** answered */
  | 'done'
  /**
   * the engine failed after its answer started reaching the client (reset, stalled past the
   * inter-chunk timeout, cut short, or an error event of its own for a server error): the stream
   * was ended with an error event and data: [DONE], any other body cut; nothing to retry, but an
   * engine failure. So is a stream that held an event whose data is not JSON after its first
   * (passed on as the engine sent it: a client may skip such an event)
   */
  | 'cut'
  /** the engine failed before anything reached the client: another worker can take it */
  | 'retry'
  /** the worker left rotation before its engine started answering: another worker can take it */
  | 'worker-out'
  /**
   * every connection the gateway keeps to the engine stayed busy until the deadline: the
   * request never left the gateway, which says nothing about the engine; another worker can take it
   */
  | 'no-connection'
  /** the client went away: nothing to retry, and nothing the engine did wrong */
  | 'client-gone'
  /**
   * the gateway's shutdown grace ended with the stream under way (ShutdownCuts): it was ended
   * with an error event and data: [DONE]; nothing to retry, and nothing the engine did wrong
   */
  | 'shut-down';

export interface ForwardOptions {
  /** The attempts under way, for the gateway to end when its shutdown grace ends (ShutdownCuts). */
  streams?: ShutdownCuts;
  /** The worker's own id, for the response header. */
  workerId: string;
  /** The data-parallel rank the request ran on (the connection's headers name it to the engine), or null. */
  rank: number | null;
  /** Predicted cached tokens for the response header, when it is enabled. */
  cachedTokens: number | undefined;
  /**
   * The request's `model` field as the client sent it: a worker leaving rotation moves the request
   * only to one serving it when the move is decided.
   */
  model: unknown;
  /**
   * The workers that failed the request, and the ranks of their engines that fail with them, as
   * the next attempt would leave them out: a worker leaving rotation moves the request only to
   * another. Read while the attempt waits, not copied.
   */
  failedWorkers: ReadonlySet<string>;
  /**
   * An engine answered the request its model-not-found 404 and it was retried: a worker leaving
   * rotation moves it only to one whose engine lists the model (WorkerConnections.notListing).
   */
  listedOnly?: boolean;
  /**
   * The prompt's token count, when known, and the output tokens it asks for: a worker leaving
   * rotation moves it only to one whose engine's context takes it (WorkerConnections.withoutRoom).
   */
  promptTokens?: number;
  outputTokens?: number;
  /** No retry is left after this attempt: a worker leaving rotation keeps the request. */
  lastAttempt: boolean;
  /** The client asked for a stream. */
  streaming: boolean;
  /**
   * The client asked for a stream's usage chunk (stream_options.include_usage): a whole answer
   * made into a stream (whole-answer-stream.ts) gets one.
   */
  includeUsage?: boolean;
  /** The Via header the engine gets: the client's, with this gateway's entry appended (via.ts). */
  via: string;
  /** The client's x-request-id, traceparent and tracestate the engine gets (passed-headers.ts), when it sent any. */
  passedHeaders: Readonly<Record<string, string>> | undefined;
  /** Longest wait for the first byte of an answer (of a stream: for its first whole event). */
  firstByteTimeoutMs: number;
  /** Longest gap between two whole events of a stream; longest wait for the rest of an answer that is no stream. */
  interChunkTimeoutMs: number;
  /**
   * The answer reached the client, and its first body byte had come `seconds` after the attempt
   * began: called once, when the answer is committed to the client, and only for an answer (a
   * 2xx that is not an engine's error). An attempt that failed (retried elsewhere) never calls
   * it, whatever bytes it had received: its first byte is not the request's.
   */
  onFirstByte: (seconds: number) => void;
  /**
   * The first byte did not come within `firstByteTimeoutMs` of the request reaching the engine
   * (its connection made, the request handed to it): the engine is slow or stuck. Not called when
   * the attempt was still waiting for a connection of the gateway's own, or for its connection to
   * the engine to be made.
   */
  onFirstByteOverdue: () => void;
  /** The engine answered 429, asking to be tried again after `retryAfterS` seconds (when it said). */
  onOverloaded: (retryAfterS: number | undefined) => void;
  /**
   * The engine answered 503 with a Retry-After (seconds): it cannot serve for now (vLLM while it
   * sleeps or shuts down, a proxy in front of it during a rollout) and says when to come back.
   * Still a failed attempt and a server error answer (onServerErrorAnswer); the client is told the
   * wait if every engine says so.
   */
  onUnavailable: (retryAfterS: number) => void;
  /** The engine answered 508 Loop Detected: a gateway on the way saw the request come back. */
  onLoop: () => void;
  /**
   * The engine will not queue the request (SGLang's 503 refusal, engine-errors.ts isQueueFull: its
   * waiting queue is full, a request of higher priority took its place, or it waited too long): as a
   * 429 without a Retry-After, it is overloaded for now, and a failed attempt another worker can
   * take; unlike one, it is neither a server error answer nor a failure for the breaker: the engine
   * is serving, at the limit its operator set.
   */
  onQueueFull: () => void;
  /**
   * The engine answered the request with a server error before anything reached the client: a
   * 5xx status, or a 2xx whose error object or first error event names one. Unlike a connection
   * that failed, a timeout or a stream broken off, this is an answer the engine made to this
   * request, which may be the request's fault (an input that hits an engine bug), not the worker's.
   */
  onServerErrorAnswer: () => void;
  /**
   * The engine's complete answer, declared JSON (or of no declared type), is not a whole JSON
   * document (its Content-Length short of its body, say), or a 2xx's body is empty: the attempt
   * failed, and another worker can take it.
   */
  onIncomplete: () => void;
  /**
   * The answer is committed to the client (its headers go out): nothing is retried from here, so
   * the request's body is no longer needed.
   */
  onCommitted: () => void;
  /**
   * The bytes of complete answers gathered at once, over all requests: an answer is gathered
   * only while it can take its bytes (the whole Content-Length when its headers arrive, else
   * chunk by chunk); one it cannot take passes through as it comes, as one too large to gather
   * does. The bytes go back once the answer is written or the attempt ends any other way.
   */
  answerBudget: BodyBudget;
  /** An answer passed through ungathered because `answerBudget` could not take it. */
  onAnswerBudgetFull: () => void;
  /**
   * A streamed request the engine answered with its whole completion (a proxy in front of it
   * that does not stream), sent to the client as the stream of it: its first token came with its
   * last, so the time to it says nothing of the engine's queue.
   */
  onWholeAnswerStreamed?: () => void;
  /**
   * The engine holds none of the request: it answered with an error (4xx, 5xx; as the status,
   * as a 2xx's error object, or as a stream's first error event) or a redirect, or the
   * connection failed before any answer. Not called when the gateway gave up waiting (the
   * engine may be computing it) or on a timeout.
   */
  onRefused: () => void;
  /**
   * The connection broke (reset, or closed by the engine's side) before any of the answer, with
   * the gateway still waiting: as a connection that went stale while it was pooled does (the
   * engine restarted, something on the way closed it). Not called when the connection could not
   * be made at all (refused, timed out): a new one would not get further.
   */
  onConnectionLost: () => void;
  /**
   * The engine answered its model-not-found 404 (vLLM's `NotFoundError`, engine-errors.ts
   * isModelNotFound: no other 404), whole, before anything reached the client: true when another
   * worker is to take the request (its engine lists the model: an adapter unloaded from this
   * engine at run time is served there), and the attempt ends 'retry'; false (or unset) passes
   * the 404 on.
   */
  onModelNotFound?: () => boolean;
  /**
   * The attempt ended 'retry' (the engine failed before anything reached the client) or 'cut'
   * (it failed after): why (called once, just before the outcome is known).
   */
  onFailed?: (reason: FailureReason) => void;
}

/**
 * A 5xx or 429 answer's body is read (keeping the connection) up to this size and for up to
 * this long, then the connection is dropped: the status has said the attempt failed, and an
 * error body that trickles must not hold the request until the inter-chunk timeout.
 */
const MAX_DISCARDED_BYTES = 128 * 1024;
const MAX_DISCARD_MS = 2000;
/**
 * Once a stream's `data: [DONE]` event has reached the client (its response ended there), the
 * engine's own end of its response is waited for this long, keeping the connection for the next
 * request (vLLM and SGLang end it right after); an engine that leaves it open longer, or writes
 * anything more, has its connection dropped.
 */
const MAX_END_AFTER_DONE_MS = 2000;
/**
 * The unfinished last event of a stream's chunk is held back until its end arrives, up to this
 * size (an event larger than this passes through as it comes): an engine that fails mid-event
 * must not leave half an event for the error event to be glued to. The stream's first event is
 * held whole past it, up to MAX_EVENT_BYTES, while the answer budget can take it (holdsFirstEvent).
 */
const MAX_HELD_EVENT_BYTES = 1024 * 1024;
/**
 * The largest event of a stream (its bytes up to its blank line): generous, as an event of
 * prompt_logprobs or an echoed prompt can take tens of megabytes, but bounded, as an engine that
 * never ends an event would otherwise stream one event to the client for as long as its bytes
 * keep coming, ending no event (so putting off no deadline). A stream's first event past it fails
 * the attempt, retried elsewhere; a later one cuts the stream (the error event, data: [DONE]).
 */
const MAX_EVENT_BYTES = 64 * 1024 * 1024;
/** wholeEvents' word for an event past MAX_EVENT_BYTES. */
const OVERSIZED = Symbol('oversized');
/**
 * A complete answer is gathered (so a failure before its end can still be retried) up to this
 * size; a larger one passes through as it comes, at the pace the client reads it.
 */
const MAX_GATHERED_BYTES = 16 * 1024 * 1024;

/** The longest Retry-After passed on to a client (s): a day. */
const MAX_RETRY_AFTER_S = 86_400;

/**
 * An answer's Retry-After in whole seconds, at most a day; undefined when absent or unreadable.
 * RFC 9110 allows delay-seconds or an HTTP-date, and engines behind a proxy or a rate limiter
 * send the date form: a date is the wait until then, rounded up (0 when it has passed). Only
 * dates that name GMT are read: the obsolete asctime form has no zone, and Date.parse would
 * read it in the gateway's local time.
 */
function retryAfterSeconds(rawHeaders: Buffer[]): number | undefined {
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i];
    if (name.length !== 11 || name.toString('latin1').toLowerCase() !== 'retry-after') continue;
    const v = rawHeaders[i + 1].toString('latin1').trim();
    // any number of digits: a longer wait than a day is a day (Number reads too many as Infinity)
    if (/^\d+$/.test(v)) return Math.min(Number(v), MAX_RETRY_AFTER_S);
    if (v.length > 64 || !/ GMT$/.test(v)) return undefined;
    const at = Date.parse(v);
    if (!Number.isFinite(at)) return undefined;
    return Math.min(Math.max(Math.ceil((at - Date.now()) / 1000), 0), MAX_RETRY_AFTER_S);
  }
  return undefined;
}

/**
 * The body of a 503 without a Retry-After is kept up to this size, to read whether it is an
 * engine's queue-full refusal (SGLang's is about a hundred bytes, vLLM's admission refusal two hundred); a longer one is not.
 */
const MAX_REFUSAL_BYTES = 4096;

/** Errors of a connection that could not be made. */
const CONNECT_FAILED = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH']);

/**
 * Errors of a connection that was made and then broke: reset, or closed by the other side (an
 * UND_ERR_SOCKET for an answer undici could not read is none: unreadableAnswer).
 */
const CONNECTION_LOST = new Set(['ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET']);

/**
 * Whether `err` is undici's word for an answer that breaks HTTP/1.1, one it could not read
 * (undici 7, lib/dispatcher/client-h1.js); `answered`: the answer's headers reached the attempt.
 * - an HTTPParserError, llhttp's refusal: a reply that is not HTTP, a body without a status line,
 *   Transfer-Encoding with Content-Length, chunked framing broken (its code is HPE_… where undici
 *   names it; undici 7 leaves it unset);
 * - UND_ERR_HEADERS_OVERFLOW: headers past the size limit;
 * - the SocketErrors 'bad response' (a 100 Continue the request never asked for, as a proxy in
 *   front of an engine may send) and 'bad upgrade' (a 101 to a request that asked for none); any
 *   other SocketError is a connection that broke;
 * - UND_ERR_RES_CONTENT_LENGTH_MISMATCH before the headers: undici reports llhttp's refusal of
 *   headers that declare a Content-Length so (two different Content-Lengths); after them it is a
 *   body cut short, a connection that broke.
 * The engine got the request and answered it: no connection was lost on the way to it.
 */
function unreadableAnswer(err: Error | undefined, answered: boolean): boolean {
  const { name, code, message } = (err ?? {}) as { name?: unknown; code?: unknown; message?: unknown };
  if (name === 'HTTPParserError' || (typeof code === 'string' && code.startsWith('HPE_'))) return true;
  if (code === 'UND_ERR_HEADERS_OVERFLOW') return true;
  if (code === 'UND_ERR_SOCKET') return message === 'bad response' || message === 'bad upgrade';
  return code === 'UND_ERR_RES_CONTENT_LENGTH_MISMATCH' && !answered;
}

/** undici's timeouts: the engine may still be computing the request. */
function isTimeout(err: Error | undefined): boolean {
  const code = (err as { code?: unknown } | undefined)?.code;
  return code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT';
}

/** A Content-Type that names an event stream; media types are case-insensitive (RFC 9110 §8.3.1). */
const EVENT_STREAM = /event-stream/i;

/** A Content-Type of plain text: an answer (2xx) so labelled is read as JSON. */
const PLAIN_TEXT = /^\s*text\/plain\s*(?:[;,]|$)/i;

/**
 * Why a 2xx answer of `contentType` (undefined: none declared) is no answer to a request that
 * is `streaming` or not: 'stream' for an event stream to a request that is not streamed, 'page'
 * for a type that is neither JSON, plain text (read as JSON) nor an event stream; undefined
 * when it may be one.
 */
function wrongForm(contentType: string | undefined, streaming: boolean): 'stream' | 'page' | undefined {
  if (contentType === undefined || declaresJson(contentType) || PLAIN_TEXT.test(contentType)) return undefined;
  if (EVENT_STREAM.test(contentType)) return streaming ? undefined : 'stream';
  return 'page';
}

/** A Content-Encoding that names no coding but identity: the bytes are the answer itself. */
const IDENTITY_ONLY = /^[\s,]*(?:identity[\s,]*)*$/i;

const LF = 0x0a;
const CR = 0x0d;

/** How much of an engine's page is quoted in the error object that stands for it. */
const MAX_QUOTED_PAGE_CHARS = 200;

/**
 * The first bytes of a client error's body kept when the body is too large to pass on whole (over
 * MAX_GATHERED_BYTES, or more than the answer budget can take): enough to quote its start (a
 * page's text, tags dropped, is read up to 16 × MAX_QUOTED_PAGE_CHARS), and a whole body this
 * small is passed on as any client error is.
 */
const MAX_CLIENT_ERROR_HEAD_BYTES = 4096;

/** `text` cut to MAX_QUOTED_PAGE_CHARS (an ellipsis where it was cut). */
function quoted(text: string): string {
  return text.length > MAX_QUOTED_PAGE_CHARS ? `${text.slice(0, MAX_QUOTED_PAGE_CHARS)}…` : text;
}

/** The text of an engine's `page` (the start of a body that is not JSON), tags and runs of white space dropped, quoted. */
function pageText(page: Buffer): string {
  return quoted(
    page
      .toString('utf8', 0, Math.min(page.length, 16 * MAX_QUOTED_PAGE_CHARS))
      .replace(/<[^>]*>/g, ' ')
      .replace(/\s+/g, ' ')
      .trim(),
  );
}

/** The OpenAI error object, of a client error's status, that stands for an engine's answer the client cannot be given. */
function clientErrorObject(status: number, message: string): unknown {
  return { error: { message, type: 'invalid_request_error', param: null, code: status } };
}

/**
 * The OpenAI error object a client error of `status` gets for the engine's `page` (a body that is
 * not JSON): its text quoted (pageText).
 */
function pageError(status: number, page: Buffer): unknown {
  const text = pageText(page);
  return clientErrorObject(
    status,
    `the engine answered ${status} with a body that is not JSON${text === '' ? '' : `: ${text}`}`,
  );
}

/** The start of the first `"message"` string of a JSON body's `head` (an engine's error object), up to the end of the head. */
const MESSAGE_START = /"message"\s*:\s*"((?:[^"\\]|\\.)*)/;

/**
 * What an engine's error message starts with, read off the `head` of its JSON body (the first
 * `"message"` string, its escapes decoded, as far as the head holds it); undefined when it holds none.
 */
function messageStart(head: Buffer): string | undefined {
  const raw = MESSAGE_START.exec(head.toString('utf8'))?.[1];
  if (raw === undefined) return undefined;
  try {
    // an escape cut at the head's end is dropped
    return JSON.parse(`"${raw.replace(/\\(?:u[0-9a-fA-F]{0,3})?$/, '')}"`) as string;
  } catch {
    return raw;
  }
}

/**
 * The OpenAI error object a client error of `status` gets for a body too large to pass on whole
 * (`size`: its length, as known), of which `head` is the start (undefined: in a content coding,
 * nothing to quote): the engine's message when it is JSON holding one, else its text (pageText),
 * quoted up to MAX_QUOTED_PAGE_CHARS.
 */
function clippedError(status: number, size: string, head: Buffer | undefined): unknown {
  const message = head === undefined ? undefined : messageStart(head);
  const text =
    head === undefined ? '' : message !== undefined ? quoted(message.replace(/\s+/g, ' ').trim()) : pageText(head);
  return clientErrorObject(
    status,
    `the engine answered ${status} with a body too large to pass on (${size})${text === '' ? '' : `: ${text}`}`,
  );
}

/**
 * The events that end a stream the engine broke off after it reached the client: an error event
 * with the members of every error body of the gateway's, then `data: [DONE]`, as vLLM ends a
 * stream that fails (serving_chat.py and serving_completion.py send their error event, then
 * `data: [DONE]`): a client reading to [DONE] sees the stream end, not a connection closed early.
 */
const MID_STREAM_ERROR_EVENTS = `data: ${JSON.stringify({ error: { message: 'the engine failed mid-stream', type: 'server_error', param: null, code: null } })}\n\ndata: [DONE]\n\n`;

/** As MID_STREAM_ERROR_EVENTS, for a stream the gateway's shutdown grace ended. */
const SHUTDOWN_ERROR_EVENTS = `data: ${JSON.stringify({ error: { message: 'the gateway shut down mid-stream', type: 'server_error', param: null, code: 'gateway_shutdown' } })}\n\ndata: [DONE]\n\n`;

/** The gateway's 500 for a whole completion to a streamed request it failed to make into a stream (onComplete). */
const STREAM_CONVERSION_ERROR = {
  error: {
    message: "the gateway failed to make the engine's whole answer into the stream asked for",
    type: 'server_error',
    param: null,
    code: null,
  },
};

/**
 * The gateway's answer to a request that reaches it while it closes (pipelined behind another, or
 * on a connection kept alive): 503 `gateway_shutdown` with `Connection: close`; nothing of it ran.
 */
export function answerClosing<R extends ProxyReply>(reply: R): R {
  reply.header('connection', 'close');
  return openAiError(reply, 503, 'the gateway is shutting down; send the request again', null, 'gateway_shutdown');
}

/**
 * The gateway's answer to a request its shutdown grace ended before any engine answered it: 503
 * `gateway_shutdown` with `Connection: close`. Nothing of an answer was written, so the client may
 * send the request again, elsewhere.
 */
export function answerShutdown<R extends ProxyReply>(reply: R): R {
  reply.header('connection', 'close');
  return openAiError(
    reply,
    503,
    'the gateway shut down before an engine answered the request; send the request again',
    null,
    'gateway_shutdown',
  );
}

/**
 * The requests the gateway has taken and not answered, for its shutdown: when its grace ends,
 * each is ended by the gateway before the connections are cut. An attempt under way (add) whose
 * stream has begun ends as an engine's failure mid-stream ends one (an error event, then data:
 * [DONE]), so a client reading to [DONE] sees the stream end rather than a connection closed
 * early; an attempt nothing has been written for yet is answered 503 (answerShutdown). Either way
 * its engine request is aborted as the gateway's own doing: no engine failure, no breaker count,
 * no retry. A request still before its attempt (wait: for a tokenizer thread, a lookup, the pause
 * before a retry) is answered 503 at once, and its handler, finding it answered once its wait
 * ends, starts nothing more.
 */
export class ShutdownCuts {
  private readonly open = new Set<{ shutDown(): void }>();
  /** The requests waiting before their engine attempt (wait). */
  private readonly waiting = new Set<ProxyReply>();
  /** The grace has ended (endAll): a request that comes to wait is answered at once. */
  private over = false;
  /** The responses ended, until written. */
  private readonly ending: Array<Promise<void>> = [];

  add(attempt: { shutDown(): void }): void {
    this.open.add(attempt);
  }

  delete(attempt: { shutDown(): void }): void {
    this.open.delete(attempt);
  }

  /**
   * A request waits before its engine attempt, until unwait(): the grace ending meanwhile answers
   * it (answerShutdown). Its handler checks `reply.sent` once the wait ends.
   */
  wait(reply: ProxyReply): void {
    if (this.over) this.answer(reply);
    else this.waiting.add(reply);
  }

  unwait(reply: ProxyReply): void {
    this.waiting.delete(reply);
  }

  get size(): number {
    return this.open.size;
  }

  /** Ends every request under way; resolves once their last bytes are written (or their clients gone). */
  endAll(): Promise<void> {
    this.over = true;
    for (const reply of [...this.waiting]) this.answer(reply);
    this.waiting.clear();
    for (const a of [...this.open]) a.shutDown();
    const ending = this.ending.splice(0);
    return Promise.all(ending).then(() => {});
  }

  /** An attempt ended by endAll(): its response is waited for. */
  ended(res: ServerResponse): void {
    if (res.writableFinished || res.destroyed) return;
    this.ending.push(
      new Promise<void>((resolve) => {
        res.once('finish', resolve);
        res.once('close', resolve);
      }),
    );
  }

  /** A waiting request, answered 503 unless it is already answered (or its client gone). */
  private answer(reply: ProxyReply): void {
    if (reply.sent || reply.raw.headersSent || reply.raw.destroyed) return;
    answerShutdown(reply);
    this.ended(reply.raw);
  }
}

/**
 * Where an event stream stands just before a chunk, for finding where the chunk's events end:
 * in the middle of a line, at the start of one (after an LF, or at the start of the stream),
 * just after a CR that ended a line (an LF next completes it: CRLF), or just after a CR that
 * ended an event (an LF next completes it too, and belongs to that event).
 */
type StreamPosition = typeof MID_LINE | typeof LINE_START | typeof AFTER_CR | typeof AFTER_EVENT_CR;
const MID_LINE = 0;
const LINE_START = 1;
const AFTER_CR = 2;
const AFTER_EVENT_CR = 3;

/**
 * Where the last whole SSE event of `chunk` ends (after the line end of its blank line); 0 when
 * none ends in it. A line ends in CRLF, LF or CR (WHATWG HTML, "Server-sent events"), so an
 * event ends at any line end that ends an empty line: `\n\n`, `\r\n\r\n`, `\r\r`, `\n\r\n`,
 * `\r\n\n`, `\r\r\n`… A CR at the end of the chunk ends its line whatever comes next: an event
 * whose blank line ends there is whole. No copy, no allocation: a search back from the end.
 */
function eventsEnd(chunk: Buffer, before: StreamPosition): number {
  const n = chunk.length;
  // engines write whole events, so a chunk usually ends one (vLLM and SGLang end events with "\n\n")
  if (n >= 2 && chunk[n - 1] === LF && chunk[n - 2] === LF) return n;
  let lf = chunk.lastIndexOf(LF);
  let cr = chunk.lastIndexOf(CR);
  while (lf >= 0 || cr >= 0) {
    const i = lf > cr ? lf : cr;
    if (i === lf) {
      // an LF after an LF ends an empty line; one after a CR completes that CR's line end (the
      // CR is looked at next), unless that CR ended an event: then it is the last of the event
      if (i > 0 ? chunk[i - 1] === LF : before === LINE_START || before === AFTER_EVENT_CR) return i + 1;
      lf = i > 0 ? chunk.lastIndexOf(LF, i - 1) : -1;
    } else {
      // a CR (alone or in a CRLF) at the start of a line ends an empty line
      if (i > 0 ? chunk[i - 1] === LF || chunk[i - 1] === CR : before !== MID_LINE)
        return chunk[i + 1] === LF ? i + 2 : i + 1;
      cr = i > 0 ? chunk.lastIndexOf(CR, i - 1) : -1;
    }
  }
  return 0;
}

/**
 * Sends the request to one engine and passes its answer to the client: a stream chunk by
 * chunk, a complete JSON answer in one write with its length. Nothing is sent to the client
 * before the engine's first body byte, so until then a failure (connection error, 5xx, first-
 * byte timeout) can be retried on another worker, and until the engine starts answering (see
 * WorkerConnection.unanswered) so can the worker leaving rotation. A failure after the first
 * byte ends an SSE stream with an OpenAI-style error event and `data: [DONE]`, and drops the
 * client's connection under any other body (it must not end like a whole answer). Exported for the
 * tests of its flow control, which drive it with a stand-in pool and response.
 */
export function forward(
  reply: ProxyReply,
  connection: WorkerConnection,
  path: string,
  body: string | Buffer,
  o: ForwardOptions,
): Promise<ForwardOutcome> {
  const bytes = typeof body === 'string' ? Buffer.from(body) : body;
  const length = bytes.length;
  return new Promise((resolve) => {
    const attempt = new Attempt(reply, connection, o, path.endsWith('/chat/completions'), resolve);
    // it waits for one of the connections the gateway keeps to the engine in the engine's slots,
    // where giving up takes it out at once (and with it these bytes), not in undici's pool queue
    attempt.withdraw = connection.slots.take(() => {
      // the withdrawal of a waiting request keeps this function, and with it the bytes: let go of it
      attempt.withdraw = NOT_WAITING;
      attempt.holdsConnection = true;
      // undici's dispatch with a handler: no response stream, iterator or promise per request
      connection.pool.dispatch(
        {
          path,
          method: 'POST',
          // undici takes an Iterable body (its Dispatcher docs), which its type definitions leave out
          body: (length > 0 ? new SentOnce(bytes) : null) as Dispatcher.DispatchOptions['body'],
          // the client's request id and trace context, what the worker's connection sends (content
          // type, the engine's key, the rank), the Via, and the body's length (undici cannot tell
          // the length of an iterable body)
          headers: { ...o.passedHeaders, ...connection.headers, via: o.via, 'content-length': String(length) },
          headersTimeout: o.streaming ? o.firstByteTimeoutMs + 1000 : o.interChunkTimeoutMs,
          bodyTimeout: o.interChunkTimeoutMs,
        },
        attempt,
      );
    }, attempt.workerRemoved);
  });
}

/**
 * A request body that lets go of its bytes once undici has taken them to write: undici keeps
 * the body it was given until the answer ends (minutes, for a stream), and a Buffer or string
 * body would stay in memory all that time, after the budget has been given it back. Iterated
 * once (undici does not retry a request itself).
 */
class SentOnce implements Iterable<Buffer> {
  constructor(private bytes: Buffer | undefined) {}

  *[Symbol.iterator](): Iterator<Buffer> {
    const bytes = this.bytes;
    this.bytes = undefined;
    if (bytes !== undefined) yield bytes;
  }
}

/**
 * Why the gateway stopped waiting for an answer: the client left, the first byte (of a stream:
 * its first whole event) was overdue, the worker left rotation, or the answer stalled (a
 * stream's next event, or the rest of a whole answer, overdue past the inter-chunk timeout).
 */
type GiveUpReason = 'client' | 'first-byte' | 'worker-out' | 'stalled' | 'shutdown';

/** A withdrawal that has nothing to withdraw: the request was handed to undici. */
const NOT_WAITING = (): boolean => false;

/**
 * One attempt on one engine, as an undici dispatch handler: the engine's answer is written to
 * the client as it arrives (a complete JSON answer of known size is gathered and written once).
 */
class Attempt implements Dispatcher.DispatchHandler, UnansweredRequest {
  private why: GiveUpReason | undefined;
  /** Why the attempt failed, once it did: the first cause seen (an abort that follows it is its consequence). */
  private failure: FailureReason | undefined;
  /** Takes the request out of the wait for a free connection; false once it has one. */
  withdraw: () => boolean = NOT_WAITING;
  /** undici has the request: one of the engine's connections is counted as its until undici reports its end. */
  holdsConnection = false;
  private abortUpstream: ((err?: Error) => void) | undefined;
  private timer: NodeJS.Timeout | undefined;
  /**
   * What `timer` is the deadline of once the answer has begun: a stream's next whole event
   * (refreshed as events end on their way to the client), or the rest of a whole answer. Either
   * stops while the client is slow to read (the engine waits for 'drain') and goes on, with the
   * time it had left, once the client has read.
   */
  private stallDeadline: 'event' | 'answer' | undefined;
  /** The delay `timer` was set with, and when the stall deadline falls (performance.now() ms) while it runs. */
  private timerMs = 0;
  private stallDueAt = 0;
  /** While the client is slow to read: the time the stall deadline had left when it stopped. */
  private stallLeftMs: number | undefined;
  /** The last chunk of a stream ended an event (of those sent, or held back before). */
  private eventEnded = false;
  private readonly started = performance.now();
  private readonly res: ServerResponse;
  private status = 0;
  /** The engine answered 5xx, 429, 401/403, 408/421, 3xx, 204 or 205: its body is read and dropped, then the attempt fails. */
  private discarding = false;
  private discarded = 0;
  /**
   * The body of a 503 without a Retry-After, while it may still be an engine's queue-full refusal
   * (up to MAX_REFUSAL_BYTES): read once it ends (judgeRefusal), a server error answer unless it
   * says so.
   */
  private refusal: Buffer[] | undefined;
  private headers: Record<string, string> | undefined;
  private eventStream = false;
  /** The answer declared its Content-Type. */
  private typeDeclared = false;
  /**
   * An event stream in a content coding the gateway cannot read (`encoded` in onHeaders): it passes
   * through as it comes, with no deadline for its whole (see firstByte).
   */
  private encodedEventStream = false;
  /** A complete answer (of known length, or not streamed): gathered, then written with its length. */
  private gather = false;
  private parts: Buffer[] | undefined;
  private gathered = 0;
  /** The answer's Content-Length, when it declared one. */
  private declaredLength: number | undefined;
  /** The gathered answer is declared JSON: it is passed on only if it is a whole JSON document. */
  private checkWhole = false;
  /**
   * A client error too large to pass on whole (over MAX_GATHERED_BYTES, or more than the answer
   * budget can take): the first MAX_CLIENT_ERROR_HEAD_BYTES of its body (copies, not views of the
   * engine's chunks), the rest read and dropped; it is answered as an OpenAI error object quoting
   * them (answerClipped), or as any client error when the whole body fits in them.
   */
  private head: Buffer[] | undefined;
  private headBytes = 0;
  /** What this answer holds of the answer budget (made at its first take). */
  private answerCharge: BodyCharge | undefined;
  /** Gives this answer's bytes back to the answer budget; once, however many ways the answer ends. */
  private readonly giveBackAnswer = (): void => this.answerCharge?.release();
  private firstByteSeen = false;
  /** Bytes of the answer's body received so far (of a 2xx or other answer passed on; not of one discarded). */
  private bodyBytes = 0;
  /** When the first body byte came, in seconds after the attempt began (reported once the answer is committed). */
  private firstByteS = 0;
  /**
   * The 2xx answer is an engine's error for the client (an error object, or a stream whose first
   * events are an error event, of a client error's status): passed on, but no first byte.
   */
  private errorAnswer = false;
  /** The start of a stream's event whose end has not arrived yet (not sent to the client), in the chunks it came in. */
  private held: Buffer[] | undefined;
  private heldBytes = 0;
  /** The bytes `held` takes of the answer budget: those of a first event held past MAX_HELD_EVENT_BYTES. */
  private heldCharge = 0;
  /** Bytes of the event passing through unfinished (midEvent) so far, held ones included. */
  private eventBytes = 0;
  /** Where the stream stands after what was sent and held: the line end at the start of the next chunk depends on it. */
  private position: StreamPosition = LINE_START;
  /** What reached the client of a stream ends in the middle of an event (one too large to hold). */
  private midEvent = false;
  /** Something reached the client: a failure now ends its response instead of retrying. */
  private sent = false;
  /** The stream reached the client with an engine's error event for a server error: the engine failed it. */
  private failedInStream = false;
  /**
   * The stream reached the client with an event whose data is neither JSON nor [DONE] (after its
   * first, which is judged apart): passed on as the engine sent it, but the engine's defect.
   */
  private malformedInStream = false;
  /** The stream's events so far hold `data: [DONE]`: its end, where vLLM and SGLang put it. */
  private doneSeen = false;
  /**
   * The client's response ended with the stream's `data: [DONE]` event and the attempt settled:
   * the engine's connection waits for the end of its response (MAX_END_AFTER_DONE_MS), and any
   * more of it drops the connection.
   */
  private endedAtDone = false;
  /**
   * The stream's data: [DONE] event reached the client ending in a CR at the end of a chunk:
   * an LF first in the next chunk still belongs to it (AFTER_EVENT_CR), and the client's
   * response ends once it is known whether one comes.
   */
  private doneLfDue = false;
  private settled = false;
  private readonly onClientGone: () => void;
  /** undici's resume: the engine's socket reads again. */
  private resumeUpstream: (() => void) | undefined;
  /**
   * A 'drain' listener is on the response: the engine's socket waits for it. At most one is:
   * a chunk that comes before it fires (undici may deliver data it already parsed) adds none.
   */
  private awaitingDrain = false;
  private readonly onDrain = (): void => {
    this.awaitingDrain = false;
    // the client read what it was sent: the engine is waited for again, for the time that was left
    if (this.stallDeadline !== undefined && !this.settled)
      this.stallAfter(this.stallDeadline, this.stallLeftMs ?? this.o.interChunkTimeoutMs);
    this.resumeUpstream?.();
  };

  constructor(
    private readonly reply: ProxyReply,
    private readonly connection: WorkerConnection,
    private readonly o: ForwardOptions,
    /** The request is a chat completion's (else a text completion's). */
    private readonly chat: boolean,
    private readonly resolve: (outcome: ForwardOutcome) => void,
  ) {
    const res = reply.raw;
    this.res = res;
    // the response closing before it finished means the client went away (a request's own
    // 'close' only says its body was read)
    this.onClientGone = () => {
      if (!res.writableFinished) this.giveUp('client');
    };
    res.once('close', this.onClientGone);
    // a worker leaving rotation may move it until the engine starts answering: a failure's status
    // (onHeaders) or the first body byte of an answer (firstByte); until then the first-byte
    // deadline bounds it
    connection.unanswered.add(this);
    // the gateway's shutdown grace ending ends it (shutDown), whatever it has reached by then
    o.streams?.add(this);
    // a streamed answer's first byte is due a few seconds past the worker's usual queue; a
    // non-streamed answer's first byte is the whole answer, due within the inter-chunk timeout
    // (undici's timeouts bound it too, but only from when the request is sent: one that waits
    // for a free connection to the engine is bounded by this timer alone)
    this.timer = setTimeout(() => this.giveUp('first-byte'), o.firstByteTimeoutMs);
  }

  get model(): unknown {
    return this.o.model;
  }

  get failedWorkers(): ReadonlySet<string> {
    return this.o.failedWorkers;
  }

  get promptTokens(): number | undefined {
    return this.o.promptTokens;
  }

  get outputTokens(): number | undefined {
    return this.o.outputTokens;
  }

  get listedOnly(): boolean {
    return this.o.listedOnly === true;
  }

  get lastAttempt(): boolean {
    return this.o.lastAttempt;
  }

  /** Its worker left rotation and another can take the request: given up, to be sent there. */
  workerOut(): void {
    this.giveUp('worker-out');
  }

  /**
   * The gateway's shutdown grace ended. A stream under way is ended with an error event and
   * data: [DONE], as an engine's failure mid-stream ends one (onError); any other answer begun
   * is cut, as it cannot say it failed; a request nothing was written for ends 'shut-down', and
   * the gateway answers it 503. Its engine request is aborted, or, while it waits for one of the
   * gateway's connections to the engine, withdrawn from the wait. Ended here, before the
   * connections are cut, so that neither the client's connection closing nor the engine's
   * connection going with the gateway's pools reads as a client gone or an engine failure.
   */
  shutDown(): void {
    if (this.settled || this.why !== undefined) return;
    this.why = 'shutdown';
    if (this.sent && this.eventStream) {
      if (!this.res.writableEnded) {
        // an unfinished event held back is dropped; one that passed through is ended first, so the
        // error event is an event of its own (a stream whose [DONE] reached the client only ends)
        this.res.end(this.doneSeen ? undefined : `${this.midEvent ? '\n\n' : ''}${SHUTDOWN_ERROR_EVENTS}`);
        this.o.streams?.ended(this.res);
      }
    } else if (this.sent) {
      if (!this.res.writableEnded) {
        markCutByGateway(this.res);
        this.res.destroy();
      }
    } else {
      // the gateway's 503, written once forward() returns, is waited for
      this.o.streams?.ended(this.res);
      if (!this.abortUpstream && this.withdraw()) {
        this.withdraw = NOT_WAITING;
        this.o.onRefused();
      }
    }
    // settled first: undici reports the abort (onError) at once, and finds it settled; one handed
    // to undici whose connection is still being made aborts in onConnect (why is set)
    this.settle('shut-down');
    this.abortUpstream?.(new Error('given up: shutdown'));
  }

  private giveUp(reason: GiveUpReason): void {
    if (this.why !== undefined || this.settled) return;
    this.why = reason;
    if (reason === 'first-byte' || reason === 'stalled') this.failure ??= 'timeout';
    if (this.abortUpstream) {
      // (a stream that began with an event too large to hold, which the budget could not take,
      // has its first-byte deadline run on until an event ends: past it, it is cut, no longer
      // a request waiting for an engine)
      if (reason === 'first-byte' && !this.sent) this.o.onFirstByteOverdue();
      return this.abortUpstream(new Error(`given up: ${reason}`));
    }
    if (this.withdraw()) return this.leftWait();
    // handed to undici but not sent yet (its connection to the engine is still being made: the
    // engine's doing): undici calls onConnect once it is, and the attempt aborts there; the
    // request ends now
    this.settle(this.failed());
  }

  /**
   * It waited for a connection of the gateway's own and left the wait: it never reached the
   * engine, which holds none of it.
   */
  private leftWait(): void {
    this.withdraw = NOT_WAITING;
    this.o.onRefused();
    this.settle(this.why === 'first-byte' ? 'no-connection' : this.failed());
  }

  /** Its worker was removed while it waited for a connection (its slots withdrew it): another worker can take it. */
  readonly workerRemoved = (): void => {
    if (this.why !== undefined || this.settled) return;
    this.why = 'worker-out';
    this.leftWait();
  };

  private failed(): ForwardOutcome {
    return this.why === 'client' ? 'client-gone' : this.why === 'worker-out' ? 'worker-out' : 'retry';
  }

  private settle(outcome: ForwardOutcome): void {
    if (this.settled) return;
    this.settled = true;
    // an answer written gives its bytes back once they are (onComplete, stopGathering); any other
    // end drops what was gathered
    if (outcome !== 'done') this.giveBackAnswer();
    this.releaseHeld();
    if (outcome === 'retry' || outcome === 'cut') this.o.onFailed?.(this.failure ?? 'reset');
    if (this.timer) clearTimeout(this.timer);
    this.res.off('close', this.onClientGone);
    if (this.awaitingDrain) {
      this.awaitingDrain = false;
      this.res.off('drain', this.onDrain);
    }
    this.connection.unanswered.delete(this);
    this.o.streams?.delete(this);
    this.resolve(outcome);
  }

  onConnect(abort: (err?: Error) => void): void {
    this.abortUpstream = abort;
    if (this.why !== undefined) abort(new Error(`given up: ${this.why}`));
  }

  onHeaders(statusCode: number, rawHeaders: Buffer[], resume: () => void): boolean {
    if (statusCode < 200) return true; // informational
    this.status = statusCode;
    // a 4xx (passed to the client, or a 429/401/403/408/421 tried elsewhere) or a redirect means the
    // engine computed nothing; a 5xx that it failed the request (when vLLM's engine core fails,
    // its KV is gone with it): what the router predicted it would hold is withdrawn
    // (so does a 204 or 205: a completion endpoint answering no content is a broken engine)
    const noContent = statusCode === 204 || statusCode === 205;
    if (statusCode >= 300 || noContent) this.o.onRefused();
    // an engine's failure, its refusal for now (429: it is overloaded), a 401/403: the engine
    // refused the gateway's own credentials (the client's are never forwarded), or a redirect
    // (a worker URL that is not the engine's: http behind an ingress that wants https, say; it
    // is not followed, the request would reach an engine the router did not choose), or a 204
    // or 205 (no answer at all, where an answer is all the client asked for): none is an answer for
    // the client, and another worker can take the request
    const redirect = statusCode >= 300 && statusCode < 400;
    if (isEngineFailure(statusCode) || redirect || noContent) {
      this.discarding = true;
      this.failure ??= 'status';
      // the first-byte deadline no longer applies: the engine answered, with a failure, and the
      // attempt ends as that failure whatever the rotation does meanwhile (a worker leaving it
      // must not turn the engine's server error into a move, which the breaker does not count)
      this.connection.unanswered.delete(this);
      if (this.timer) clearTimeout(this.timer);
      this.timer = setTimeout(() => this.abortUpstream?.(new Error('discarded')), MAX_DISCARD_MS);
      const retryAfterS = statusCode === 429 || statusCode === 503 ? retryAfterSeconds(rawHeaders) : undefined;
      // a 503 without a Retry-After may be SGLang refusing a request it will not queue, which its
      // body says (engine-errors.ts isQueueFull): it is judged once the body has come
      if (statusCode === 503 && retryAfterS === undefined) this.refusal = [];
      else if (statusCode >= 500) this.o.onServerErrorAnswer();
      if (statusCode === 429) this.o.onOverloaded(retryAfterS);
      else if (statusCode === 503 && retryAfterS !== undefined) this.o.onUnavailable(retryAfterS);
      else if (statusCode === 508) this.o.onLoop();
      return true;
    }
    let contentType: string | undefined;
    let length: number | undefined;
    let contentEncoding: string | undefined;
    let requestId: string | undefined;
    for (let i = 0; i < rawHeaders.length; i += 2) {
      const name = rawHeaders[i];
      // content-type and x-request-id are both 12 bytes long
      const name12 = name.length === 12 ? name.toString('latin1').toLowerCase() : undefined;
      if (name12 === 'content-type') {
        const v = rawHeaders[i + 1].toString('latin1');
        contentType = contentType === undefined ? v : `${contentType},${v}`;
      } else if (name12 === 'x-request-id') requestId ??= rawHeaders[i + 1].toString('latin1');
      else if (name.length === 14 && name.toString('latin1').toLowerCase() === 'content-length')
        length = Number(rawHeaders[i + 1].toString('latin1'));
      else if (name.length === 16 && name.toString('latin1').toLowerCase() === 'content-encoding') {
        const v = rawHeaders[i + 1].toString('latin1');
        contentEncoding = contentEncoding === undefined ? v : `${contentEncoding},${v}`;
      }
    }
    // an answer (2xx) in a form the request did not ask for is none: an event stream to a request
    // that is not streamed (its client reads one JSON object), or a body of a type that is neither
    // JSON nor an event stream (an HTML sign-in page of a proxy in front of the engine). text/plain
    // is read as JSON (checkWhole, below): a whole JSON answer passes. Another worker can take it
    const form = this.status < 300 ? wrongForm(contentType, this.o.streaming) : undefined;
    if (form !== undefined) {
      this.discarding = true;
      this.failure ??= 'malformed';
      this.connection.unanswered.delete(this);
      if (this.timer) clearTimeout(this.timer);
      // a page is read and dropped, keeping the connection, as an error body is; a stream would
      // go on for the whole generation: dropped at once
      const keepFor = form === 'page' ? MAX_DISCARD_MS : 0;
      this.timer = setTimeout(() => this.abortUpstream?.(new Error('not an answer')), keepFor);
      // as a 204 or a redirect: nothing of it is kept, and what was predicted of it is withdrawn
      this.o.onRefused();
      return true;
    }
    // the gateway asks for answers without a content coding (accept-encoding: identity); one
    // compressed anyway passes on as it came, its coding with it (the client's HTTP stack decodes
    // it): its bytes are neither JSON nor events the gateway can read, so it is not checked as
    // JSON, not cut into events, and when it fails after it reached the client it is cut, never
    // followed by a plain error event the client would decode as more of it
    const encoded = contentEncoding !== undefined && !IDENTITY_ONLY.test(contentEncoding);
    // an engine that declares JSON is held to it, and so is an answer (2xx) that declares nothing:
    // the client gets it labelled JSON (below), and an error page or an empty body labelled so is
    // no answer. A client error of no declared type is the engine's word on the request, passed on
    this.checkWhole =
      (contentType === undefined
        ? this.status < 300
        : declaresJson(contentType) || (this.status < 300 && PLAIN_TEXT.test(contentType))) && !encoded;
    this.typeDeclared = contentType !== undefined;
    contentType ??= 'application/json';
    const eventStream = EVENT_STREAM.test(contentType);
    this.eventStream = eventStream && !encoded;
    this.encodedEventStream = eventStream && encoded;
    const o = this.o;
    const headers: Record<string, string> = { 'content-type': contentType, 'x-contextforge-worker': o.workerId };
    if (encoded) headers['content-encoding'] = contentEncoding!;
    if (o.rank !== null) headers['x-contextforge-rank'] = String(o.rank);
    if (o.cachedTokens !== undefined) headers['x-contextforge-cached-tokens'] = String(Math.round(o.cachedTokens));
    if (eventStream) headers['cache-control'] = 'no-cache';
    // the engine's id of the request (vLLM's, with --enable-request-id-headers: the client's
    // x-request-id when it sent one), when it is one a response header can carry as it is
    if (answerableRequestId(requestId)) headers['x-request-id'] = requestId;
    this.headers = headers;
    // a whole answer is gathered, so one cut short is retried, unless it is too large to hold;
    // one to a streamed request too (JSON instead of events, chunked or of a declared length): it
    // is checked as a whole answer is, an error object or JSON cut short never passed as success,
    // and a completion is made into the stream the client asked for (onComplete)
    this.gather = !eventStream && (length === undefined || length <= MAX_GATHERED_BYTES);
    this.declaredLength = length;
    // an answer of declared length takes all of it from the budget at once, or is not gathered
    if (this.gather && length !== undefined && !this.takeAnswer(length)) {
      this.gather = false;
      o.onAnswerBudgetFull();
    }
    this.checkWhole &&= this.gather;
    // a client error that cannot be gathered is never passed through raw (a page of many megabytes,
    // or an endless one, the client's SDK cannot read): its start is kept to quote
    if (!this.gather && this.status >= 400 && !eventStream) this.head = [];
    this.resumeUpstream = resume;
    return true;
  }

  /**
   * The first body byte (or the end of an empty body): the engine answered. Its time is the
   * request's time to first byte only if this answer reaches the client (startResponse): the
   * attempt may yet fail and be retried elsewhere.
   */
  private firstByte(): void {
    this.firstByteSeen = true;
    this.firstByteS = (performance.now() - this.started) / 1000;
    // a stream has answered once its first whole event reaches the client: the first-byte
    // deadline holds until then (an engine that trickles bytes that never make an event has not
    // answered, and each byte would reset undici's body timeout); the rest of any other answer
    // (a whole answer, gathered or passed through, an error page, whether the request was
    // streamed or not) is due within the inter-chunk timeout (an engine writes a whole answer at
    // once, and one that trickles it must not hold the request for ever). Either way the engine
    // is sending its answer: a worker leaving rotation no longer moves the request (what it
    // computed would be thrown away and computed again elsewhere, a stream's prefill with it); an
    // engine that dies now leaves the rest overdue, and the attempt fails then, as any other,
    // retried while nothing reached the client
    this.connection.unanswered.delete(this);
    if (!this.eventStream) {
      // except a compressed event stream to a streamed request: the gateway cannot tell its events
      // apart, so it has neither a deadline per event nor one for its whole (that would cut every
      // generation longer than the inter-chunk timeout); only undici's body timeout bounds it, the
      // gap between two of its bytes, and an engine trickling bytes of it can hold it for as long
      // as it keeps them coming
      if (!this.o.streaming || !this.encodedEventStream) this.stallAfter('answer');
      else if (this.timer) {
        clearTimeout(this.timer);
        this.timer = undefined;
      }
    }
  }

  /**
   * Bytes of a stream go to the client: when they end an event (`ended`), the next event is due
   * within the inter-chunk timeout from now (the gap undici's body timeout bounds is between two
   * bytes, and an engine that trickles bytes that never end an event would hold the client for
   * ever); bytes of an event too large to hold back that does not end leave the deadline where it
   * was, however many of them come. A client that reads slowly stops the clock: while the engine
   * waits for 'drain', nothing is due from it.
   */
  private nextEventDue(ended: boolean): void {
    if (this.awaitingDrain) {
      if (ended) {
        this.stallLeftMs = this.o.interChunkTimeoutMs;
        // the first whole event reached the client: the first-byte deadline is met, and the next
        // event's goes on once the client has read (onDrain)
        if (this.stallDeadline === undefined) {
          clearTimeout(this.timer);
          this.timer = undefined;
          this.stallDeadline = 'event';
        }
      }
      return;
    }
    // the start of a first event that passed through unfinished (the answer budget could not
    // hold it) is no answer yet: the first-byte deadline runs on until an event ends
    if (this.stallDeadline === undefined && !ended) return;
    if (this.stallDeadline === 'event' && this.timer) {
      if (!ended) return;
      if (this.timerMs === this.o.interChunkTimeoutMs) {
        this.timer.refresh();
        this.stallDueAt = performance.now() + this.timerMs;
        return;
      }
    }
    this.stallAfter('event');
  }

  /**
   * The engine's `kind` (its next event, or the rest of its answer) is due within `ms` from now:
   * the inter-chunk timeout, or what was left of it when the client became slow to read.
   */
  private stallAfter(kind: 'event' | 'answer', ms = this.o.interChunkTimeoutMs): void {
    if (this.timer) clearTimeout(this.timer);
    this.stallDeadline = kind;
    this.stallLeftMs = undefined;
    this.timerMs = ms;
    this.stallDueAt = performance.now() + ms;
    this.timer = setTimeout(() => this.giveUp('stalled'), ms);
  }

  /** From here on the answer belongs to the client: headers out, no retry, no give-up on worker-out. */
  private startResponse(extra?: number): void {
    this.connection.unanswered.delete(this);
    this.reply.hijack();
    this.sent = true;
    // an error (a 4xx passed on, an engine's error object) is answered at once, without the
    // request's prefill: it would make the worker look fast
    if (this.status < 300 && !this.errorAnswer) this.o.onFirstByte(this.firstByteS);
    this.o.onCommitted();
    const headers = this.headers!;
    if (extra !== undefined) headers['content-length'] = String(extra);
    // the answer is the engine's: the client's x-request-id set for the gateway's own answers
    // (carryRequestId) does not stand in for an engine that gave none
    const requestId = headers['x-request-id'];
    if (requestId === undefined) this.res.removeHeader('x-request-id');
    // its bytes over 0x7f go back as they came, whatever is written first
    else keepHeaderBytes(this.res, requestId);
    this.res.writeHead(this.status, headers);
  }

  onData(chunk: Buffer): boolean {
    if (this.endedAtDone) {
      // the engine writes after its stream's end: the rest goes nowhere, and the connection,
      // somewhere in the middle of a response, cannot take another request
      if (chunk.length > 0) this.abortUpstream?.(new Error('more after data: [DONE]'));
      return true;
    }
    if (this.doneLfDue) {
      if (chunk.length === 0) return true;
      const lf = chunk[0] === LF ? 1 : 0;
      return this.endAtDone(lf === 1 ? chunk.subarray(0, 1) : undefined, chunk.length > lf);
    }
    // cut (an event past its bound), the abort under way
    if (this.settled) return false;
    if (this.discarding) {
      this.discarded += chunk.length;
      if (this.refusal !== undefined) {
        if (this.discarded <= MAX_REFUSAL_BYTES) this.refusal.push(chunk);
        else this.judgeRefusal(false);
      }
      if (this.discarded > MAX_DISCARDED_BYTES) this.abortUpstream?.(new Error('discarded'));
      return true;
    }
    // given up (the abort is under way): nothing more goes anywhere
    if (this.why !== undefined && !this.sent) return false;
    /** Where the stream's data: [DONE] event ends in `chunk`, when it does. */
    let doneEnd = -1;
    /** That event ends the chunk in a CR: an LF may still come for it. */
    let doneLfDue = false;
    this.bodyBytes += chunk.length;
    // a stream's first byte is that of its first event (below): keep-alives before it are no answer
    if (!this.firstByteSeen && !this.eventStream) this.firstByte();
    if (this.head !== undefined) return this.clipped(chunk);
    if (this.gather) {
      this.gathered += chunk.length;
      const fits = this.gathered <= MAX_GATHERED_BYTES;
      // an answer of undeclared length takes its bytes from the budget as they come
      const charged = fits && (this.declaredLength !== undefined || this.takeAnswer(chunk.length));
      if (charged) {
        (this.parts ??= []).push(chunk);
        // the last byte its Content-Length declares: checked now, while the connection can still
        // be dropped (bytes past the declared length would be left on it, read as the next answer)
        if (this.gathered === this.declaredLength && this.checkWhole) {
          this.checkWhole = false;
          if (!isWholeJson(this.gatheredPayload())) {
            this.failure ??= 'malformed';
            this.o.onIncomplete();
            this.abortUpstream?.(new Error('incomplete JSON answer'));
            return false;
          }
        }
        return true;
      }
      // an answer of unknown length grew too large to hold, or larger than the budget could
      // take: it passes through from here (a client error: its start is kept to quote)
      if (fits) this.o.onAnswerBudgetFull();
      if (this.status >= 400) {
        this.clip();
        return this.clipped(chunk);
      }
      this.stopGathering();
    }
    /** The chunk holds an event the client dispatches (one with data), or passes through mid-event. */
    let dispatched = true;
    if (this.eventStream) {
      // the rest of an event too large to hold, passed through as it came, is of that event
      const continued = this.midEvent;
      const whole = this.wholeEvents(chunk);
      if (whole === OVERSIZED) return this.oversized();
      if (whole === undefined) {
        // the start of an event: the engine is answering (a worker leaving rotation no longer
        // moves the request), though its first event is not due until the event ends
        if (!this.firstByteSeen && chunk.length > 0) this.firstByte();
        return true;
      }
      chunk = whole;
      // blocks without a data line (keep-alive comments, `event: ping`) are no events: before
      // the first event they are dropped and the attempt goes on waiting for it (its deadline
      // unchanged: an engine that sends only keep-alives has not answered); after it they pass on
      // to the client (keep-alives on its connection) but do not make the next event less due
      dispatched = continued || this.midEvent || holdsDataLine(chunk, !this.sent);
      if (!dispatched && !this.sent) {
        if (this.held !== undefined && !this.firstByteSeen) this.firstByte();
        return true;
      }
      if (!this.firstByteSeen) this.firstByte();
      // the stream's end: its data: [DONE] event is the last the client gets (unless the gateway
      // has given up, the abort under way); one whose end has not come (in an event too large to
      // hold back) is only recorded
      const done = doneEventEnd(chunk, !this.sent);
      if (done !== -1) this.doneSeen = true;
      if (done >= 0 && this.why === undefined) {
        doneEnd = done;
        if (doneEnd < chunk.length) chunk = chunk.subarray(0, doneEnd);
        else doneLfDue = chunk[doneEnd - 1] === CR;
      }
      // until something is sent, these events are the stream's first (what was held back comes first)
      const error = this.failedInStream ? undefined : errorEvent(chunk, !this.sent);
      const errorStatus = error?.status ?? 0;
      if (isEngineFailure(errorStatus)) {
        // the engine failed the request before anything reached the client: it holds none of it
        // (as when it answers a 5xx), and another worker can take it
        if (!this.sent) {
          this.failure ??= 'status';
          this.o.onRefused();
          // an engine overloaded says so in its first event as in a 429 answer (no Retry-After there)
          if (errorStatus === 429) this.o.onOverloaded(undefined);
          // SGLang refuses a stream it will not queue with an error event of its own (isQueueFull)
          if (error!.queueFull) this.o.onQueueFull();
          else if (errorStatus >= 500) this.o.onServerErrorAnswer();
          this.abortUpstream?.(new Error('the engine failed the stream before its first event'));
          return false;
        }
        // the client has part of the answer: it gets the rest as the engine sent it, and the engine's
        // failure counts as a stream it broke off
        this.failedInStream = true;
        this.failure ??= 'status';
      } else if (errorStatus !== 0 && !this.sent && errorEvent(chunk, true, true).status !== 0) {
        // the engine's answer to the client's error, before any of the answer: it computed none
        // of the request, as when it answers with that status (once: the response starts below).
        // A client's error after events of the answer is no refusal: the engine computed the prefill
        this.o.onRefused();
        this.errorAnswer = true;
      }
      // the stream's first event is read as JSON (an OpenAI chunk) or its end: anything else (an
      // engine or a proxy writing text, JSON cut short) is no answer, and another worker can take it
      if (!this.sent && !this.midEvent && !this.errorAnswer) {
        const first = firstEventData(chunk, true);
        if (first !== undefined && !isWholeJson(first) && !isDoneData(first)) {
          this.failure ??= 'malformed';
          this.o.onIncomplete();
          this.abortUpstream?.(new Error('the first event of the stream is not JSON'));
          return false;
        }
      }
      // any later event whose data is neither JSON nor [DONE] (text a proxy wrote into the stream,
      // JSON cut short) fails the OpenAI SDKs, which parse each event's data: the engine's defect,
      // counted once as a stream it broke (contextforge_stream_failures_total, the breaker). The
      // stream goes on as the engine sent it: a client that skips such an event keeps its answer.
      // A chunk that starts inside an event too large to hold is not judged (its start passed on)
      if (!this.malformedInStream && !continued && holdsMalformedEvent(chunk, !this.sent)) {
        this.malformedInStream = true;
        this.failure ??= 'malformed';
      }
    }
    if (!this.sent) this.startResponse();
    if (doneLfDue) return this.awaitDoneLf(chunk);
    if (doneEnd >= 0) return this.endAtDone(chunk);
    if (this.eventStream) this.nextEventDue(this.eventEnded && dispatched);
    if (this.res.write(chunk)) return true;
    // the client reads slower than the engine writes: the engine's socket waits for 'drain'
    // (one listener, however many chunks arrive before it fires)
    if (!this.awaitingDrain) {
      this.awaitingDrain = true;
      this.res.once('drain', this.onDrain);
      if (this.stallDeadline !== undefined && this.timer) {
        // what is left of the deadline goes on once the client has read (at least 1 ms: a timer of 0 is due at once)
        this.stallLeftMs = Math.max(1, this.stallDueAt - performance.now());
        clearTimeout(this.timer);
        this.timer = undefined;
      }
    }
    return false;
  }

  /**
   * The stream's data: [DONE] event ends `last`: the client's response ends with it, as when the
   * engine ends its response there, and the attempt is settled as such (the request released,
   * answered, or broken off by an error event of the engine's before). The engine's connection
   * is kept if the engine ends its response soon (onComplete), else dropped.
   */
  private endAtDone(last?: Buffer, more = false): boolean {
    const paused = this.awaitingDrain;
    this.doneLfDue = false;
    this.res.end(last);
    this.settle(this.failedInStream || this.malformedInStream ? 'cut' : 'done');
    this.endedAtDone = true;
    if (more) {
      this.abortUpstream?.(new Error('more after data: [DONE]'));
      return true;
    }
    this.timer = setTimeout(() => this.abortUpstream?.(new Error('no end after data: [DONE]')), MAX_END_AFTER_DONE_MS);
    this.timer.unref();
    // the engine's socket, stopped for a client slow to read, reads on to the response's end
    // (not from within undici's parser, which is delivering this chunk)
    if (paused) setImmediate(() => this.resumeUpstream?.());
    return true;
  }

  /**
   * The stream's data: [DONE] event ends `chunk` with a CR, whose LF may come first in the next
   * chunk (onData) or not at all: `chunk` goes to the client, whose response ends with what comes
   * next, or with the engine's end of its response (onComplete, onError), or after
   * MAX_END_AFTER_DONE_MS without either.
   */
  private awaitDoneLf(chunk: Buffer): boolean {
    this.res.write(chunk);
    this.doneLfDue = true;
    // no next event is due, only the end
    this.stallDeadline = undefined;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => this.endAtDone(undefined, true), MAX_END_AFTER_DONE_MS);
    return true;
  }

  /**
   * The whole events of a stream's chunk, with what was held back before them; the start of
   * an event whose end has not arrived is held back (undefined: nothing whole to send yet).
   */
  private wholeEvents(chunk: Buffer): Buffer | undefined | typeof OVERSIZED {
    // an empty chunk (undici delivers some) ends nothing: whether the client's stream stands
    // in the middle of an event is as it was
    const n = chunk.length;
    if (n === 0) return undefined;
    const end = eventsEnd(chunk, this.position);
    this.eventEnded = end > 0;
    const last = chunk[n - 1];
    this.position = last === LF ? LINE_START : last === CR ? (end === n ? AFTER_EVENT_CR : AFTER_CR) : MID_LINE;
    // more of an event already passing through (nothing is held meanwhile): it passes on as it
    // comes, until its end, or until it grows past the bound of an event
    if (end === 0 && this.midEvent) {
      this.eventBytes += n;
      return this.eventBytes > MAX_EVENT_BYTES ? OVERSIZED : chunk;
    }
    const tail = end === 0 ? this.heldBytes + n : n - end;
    /** Bytes `tail` takes of the answer budget, held as the stream's first event. */
    let charge = 0;
    if (tail > MAX_HELD_EVENT_BYTES) {
      const first = this.holdsFirstEvent(tail, end === 0 ? tail - this.heldCharge : tail);
      if (first === OVERSIZED) return OVERSIZED;
      if (first === undefined) {
        // too large to hold: it passes through as it comes
        this.midEvent = true;
        this.eventBytes = tail;
        return tail > MAX_EVENT_BYTES ? OVERSIZED : this.takeHeld(chunk);
      }
      charge = first;
    }
    if (end === 0) {
      (this.held ??= []).push(chunk);
      this.heldBytes += n;
      this.heldCharge += charge;
      return undefined;
    }
    this.midEvent = false;
    if (end === n) return this.takeHeld(chunk);
    const whole = this.takeHeld(chunk.subarray(0, end));
    this.held = [chunk.subarray(end)];
    this.heldBytes = tail;
    this.heldCharge = charge;
    return whole;
  }

  /**
   * The unfinished event `tail` bytes long, past MAX_HELD_EVENT_BYTES, may be the stream's first:
   * with nothing sent to the client yet, it is held whole still (so it can be judged as the first
   * event is, and the attempt retried if the engine fails before its end), its bytes drawn from
   * the answer budget (`more` of them now): the bytes taken; undefined when it passes through
   * (something was sent, or the budget cannot take them); OVERSIZED past MAX_EVENT_BYTES, an
   * engine's failure like a first event that is not JSON (oversized).
   */
  private holdsFirstEvent(tail: number, more: number): number | undefined | typeof OVERSIZED {
    if (this.sent) return undefined;
    if (tail > MAX_EVENT_BYTES) return OVERSIZED;
    if (this.o.answerBudget.take(more)) return more;
    this.o.onAnswerBudgetFull();
    return undefined;
  }

  /**
   * The stream's event grew past MAX_EVENT_BYTES without ending. With nothing sent to the client
   * yet (its first event) the engine failed the attempt, as with a first event that is not JSON:
   * nothing is sent, and another worker can take the request. After that, the stream is cut as
   * when the engine fails mid-stream (the error event, then data: [DONE]), and its request aborted.
   */
  private oversized(): boolean {
    this.failure ??= 'malformed';
    this.held = undefined;
    this.heldBytes = 0;
    this.releaseHeld();
    if (!this.sent) {
      this.o.onIncomplete();
      this.abortUpstream?.(new Error('the first event of the stream grew past its size bound'));
      return false;
    }
    // what passed through ends mid-event: the error event starts an event of its own
    if (!this.res.writableEnded) this.res.end(this.doneSeen ? undefined : `\n\n${MID_STREAM_ERROR_EVENTS}`);
    // settled first: the abort's onError finds it settled
    this.settle('cut');
    this.abortUpstream?.(new Error('an event of the stream grew past its size bound'));
    return false;
  }

  /** What was held back, followed by `rest` (`rest` itself when nothing was); nothing is held after. */
  private takeHeld(rest: Buffer): Buffer {
    const held = this.held;
    if (held === undefined) return rest;
    held.push(rest);
    const out = Buffer.concat(held, this.heldBytes + rest.length);
    this.held = undefined;
    this.heldBytes = 0;
    this.releaseHeld();
    return out;
  }

  /** Gives back what the held event took of the answer budget (it is sent, dropped, or the attempt ended). */
  private releaseHeld(): void {
    if (this.heldCharge === 0) return;
    this.o.answerBudget.give(this.heldCharge);
    this.heldCharge = 0;
  }

  /** Takes `bytes` more of the answer budget for this answer; false (nothing taken) when they do not fit. */
  private takeAnswer(bytes: number): boolean {
    return (this.answerCharge ??= this.o.answerBudget.charge()).take(bytes);
  }

  /**
   * An answer being gathered passes through from here: what was gathered goes to the client,
   * and its bytes go back to the budget once written (or when the response closes: a write to a
   * client gone never calls back).
   */
  private stopGathering(): void {
    this.gather = false;
    this.checkWhole = false;
    // it passes through from here, its rest still due by the deadline of the whole answer (less
    // the time the client takes to read)
    this.startResponse();
    const parts = this.parts ?? [];
    this.parts = undefined;
    const last = parts.length - 1;
    for (let i = 0; i < last; i++) this.res.write(parts[i]);
    if (last >= 0) this.res.write(parts[last], this.giveBackAnswer);
    else this.giveBackAnswer();
    this.res.once('close', this.giveBackAnswer);
  }

  /**
   * A client error being gathered grew too large for it: what was gathered gives its bytes back
   * to the budget, its start kept to quote.
   */
  private clip(): void {
    const parts = this.parts ?? [];
    this.parts = undefined;
    this.gather = false;
    this.checkWhole = false;
    this.head = [];
    for (const part of parts) this.keepHead(part);
    this.giveBackAnswer();
  }

  /** Keeps what `chunk` adds to the start of a client error's body (a copy: a view would hold the chunk's whole buffer). */
  private keepHead(chunk: Buffer): void {
    const room = MAX_CLIENT_ERROR_HEAD_BYTES - this.headBytes;
    if (room <= 0 || chunk.length === 0) return;
    this.head!.push(Buffer.from(chunk.subarray(0, room)));
    this.headBytes += Math.min(room, chunk.length);
  }

  /**
   * A chunk of a client error too large to pass on whole: its start is kept, the rest dropped.
   * Once the body is known to be larger than MAX_GATHERED_BYTES (its Content-Length says so, or
   * that many bytes came) and its start is kept, the client is answered and the engine's rest not
   * waited for (its connection is dropped): an engine sending an endless body must not hold the
   * request. A smaller one is read to its end (onComplete), keeping the connection.
   */
  private clipped(chunk: Buffer): boolean {
    this.keepHead(chunk);
    const size = this.declaredLength ?? this.bodyBytes;
    if (size <= MAX_GATHERED_BYTES || this.headBytes < Math.min(MAX_CLIENT_ERROR_HEAD_BYTES, size)) return true;
    this.answerClipped(false);
    this.abortUpstream?.(new Error('a client error too large to pass on'));
    return false;
  }

  /**
   * Answers a client error too large to pass on whole, from its start (`complete`: its whole body
   * has come): as an OpenAI error object of its status quoting the engine's message or text. A 404
   * page of a declared type that is not JSON is a failed attempt, as when it is gathered.
   */
  private answerClipped(complete: boolean): void {
    const head = Buffer.concat(this.head!, this.headBytes);
    this.head = undefined;
    const headers = this.headers!;
    if (this.status === 404 && this.typeDeclared && !declaresJson(headers['content-type'])) {
      this.failure ??= 'status';
      return this.settle('retry');
    }
    const size =
      this.declaredLength !== undefined || complete
        ? `${this.declaredLength ?? this.bodyBytes} bytes`
        : `over ${MAX_GATHERED_BYTES} bytes`;
    // a body in a content coding cannot be quoted
    const encoded = headers['content-encoding'] !== undefined;
    const payload = Buffer.from(JSON.stringify(clippedError(this.status, size, encoded ? undefined : head)));
    delete headers['content-encoding'];
    headers['content-type'] = 'application/json';
    this.startResponse(payload.length);
    this.res.end(payload);
    this.settle('done');
  }

  /** The gathered answer as one buffer (kept as the only part from then on). */
  private gatheredPayload(): Buffer {
    const parts = this.parts;
    if (parts === undefined) return Buffer.alloc(0);
    if (parts.length > 1) this.parts = [Buffer.concat(parts, this.gathered)];
    return this.parts![0];
  }

  /**
   * The body of a 503 without a Retry-After was read (`whole`), or grew too long or never ended:
   * the engine refused the request as overloaded when the body is its queue-full refusal, else
   * it answered with a server error.
   */
  private judgeRefusal(whole: boolean): void {
    const parts = this.refusal!;
    this.refusal = undefined;
    if (whole && errorAnswer(Buffer.concat(parts)).queueFull) this.o.onQueueFull();
    else this.o.onServerErrorAnswer();
  }

  /** undici is done with the request (it completed or failed): its connection is free for the next. */
  private releaseConnection(): void {
    if (!this.holdsConnection) return;
    this.holdsConnection = false;
    this.connection.slots.release();
  }

  onComplete(): void {
    this.releaseConnection();
    if (this.endedAtDone) return clearTimeout(this.timer);
    if (this.refusal !== undefined) this.judgeRefusal(true);
    if (this.discarding) return this.settle(this.failed());
    if (this.why !== undefined && !this.sent) return this.settle(this.failed());
    // the start of an event whose end never came (it goes as it was sent, or, when it is all
    // that is missing of a stream, not at all)
    const rest = this.eventStream && this.held !== undefined ? this.takeHeld(Buffer.alloc(0)) : undefined;
    if (
      this.eventStream &&
      this.status < 300 &&
      !this.failedInStream &&
      !this.doneSeen &&
      !(rest !== undefined && holdsDone(rest, !this.sent))
    ) {
      // a stream that ends without its data: [DONE] was cut short on its way (vLLM and SGLang
      // end every stream with it): before anything reached the client another worker can take
      // the request; after, the client is told as when the engine breaks off, and the engine
      // did not answer
      if (!this.sent) {
        this.failure ??= 'malformed';
        return this.settle('retry');
      }
      this.failure ??= 'malformed';
      this.res.end(`${this.midEvent ? '\n\n' : ''}${MID_STREAM_ERROR_EVENTS}`);
      return this.settle('cut');
    }
    // a 2xx without a byte of body, of any type, is no answer to a completion (as a 204 is not):
    // with nothing sent to the client yet, another worker can take the request
    if (this.status < 300 && this.bodyBytes === 0 && !this.sent) {
      this.failure ??= 'malformed';
      this.o.onIncomplete();
      return this.settle('retry');
    }
    if (!this.firstByteSeen) this.firstByte();
    if (this.head !== undefined) {
      // a client error whose whole body fits in what was kept of it is answered as one gathered
      if (this.headBytes < this.bodyBytes) return this.answerClipped(true);
      this.parts = this.head;
      this.gathered = this.headBytes;
      this.head = undefined;
      this.gather = true;
    }
    if (this.gather) {
      let payload = this.gatheredPayload();
      // an answer without a Content-Length (or an empty one) is checked at its end
      if (this.checkWhole && !isWholeJson(payload)) {
        this.failure ??= 'malformed';
        this.o.onIncomplete();
        return this.settle('retry');
      }
      // a 2xx whose body is the engine's error object is handled as the status its code names
      const error = this.status < 300 ? errorAnswer(payload) : undefined;
      const errorStatus = error?.status ?? 0;
      if (errorStatus !== 0) {
        // the engine computed none of the request, as when it answers with that status
        this.o.onRefused();
        if (isEngineFailure(errorStatus)) {
          if (errorStatus === 429) this.o.onOverloaded(undefined);
          if (error!.queueFull) this.o.onQueueFull();
          else if (errorStatus >= 500) this.o.onServerErrorAnswer();
          this.failure ??= 'status';
          return this.settle('retry');
        }
        // the client's error: it gets it as the engine wrote it, with the status it names
        this.status = errorStatus;
        this.errorAnswer = true;
      }
      if (
        this.o.streaming &&
        this.status < 300 &&
        !this.errorAnswer &&
        this.headers!['content-encoding'] === undefined
      ) {
        // a whole completion to a streamed request (a proxy in front of the engine that does not
        // stream): the client reads events only, and gets the stream of it; JSON that is no
        // completion is no answer, and another worker can take the request
        let events: Buffer | undefined;
        let unconverted = false;
        try {
          events = wholeAnswerEvents(payload, this.chat, this.o.includeUsage === true);
        } catch {
          unconverted = true;
        }
        if (unconverted) {
          // the engine answered: a completion, read whole, that the gateway failed to make into a
          // stream (a value nested deeper than JSON.stringify recurses, memory). No failure reason
          // fits (each names what the engine did wrong), and another worker's answer would fare
          // alike: the client gets the gateway's own 500, and the attempt ends answered, so
          // neither the worker's breaker nor the failure metrics count it against the engine
          this.status = 500;
          this.errorAnswer = true;
          payload = Buffer.from(JSON.stringify(STREAM_CONVERSION_ERROR));
          this.headers!['content-type'] = 'application/json';
        } else if (events === undefined) {
          this.failure ??= 'malformed';
          return this.settle('retry');
        } else {
          payload = events;
          this.headers!['content-type'] = 'text/event-stream';
          this.headers!['cache-control'] = 'no-cache';
          this.o.onWholeAnswerStreamed?.();
        }
      }
      if (this.status >= 400 && this.headers!['content-encoding'] === undefined) {
        if (!isWholeJson(payload)) {
          // a client error that is no JSON: a page of something in front of the engine (nginx's
          // 413, a text/plain 400). A 404 page of a declared type (text/html, text/plain) is no
          // engine's word on the request (vLLM's model-not-found is JSON) but a URL that leads to
          // another service: a failed attempt, as a redirect is. Any other (a 404 of no declared
          // type too) reaches the client as an OpenAI error object, which its SDK can read
          if (this.status === 404 && this.typeDeclared) {
            this.failure ??= 'status';
            return this.settle('retry');
          }
          payload = Buffer.from(JSON.stringify(pageError(this.status, payload)));
          this.headers!['content-type'] = 'application/json';
        } else if (
          this.status === 404 &&
          this.o.onModelNotFound !== undefined &&
          // its body read once: here, or above when it came as a 200's error object
          (error ?? errorAnswer(payload)).modelNotFound === true &&
          this.o.onModelNotFound()
        ) {
          // vLLM's model-not-found (no other 404: FastAPI's `{"detail": "Not Found"}` is a route
          // the engine does not serve, which another engine would answer alike), where another
          // worker's engine lists the model: tried there
          this.failure ??= 'status';
          return this.settle('retry');
        }
      }
      this.startResponse(payload.length);
      this.parts = undefined;
      // its bytes go back once written, or when the response closes (a client gone meanwhile)
      this.res.once('close', this.giveBackAnswer);
      this.res.end(payload, this.giveBackAnswer);
    } else {
      if (!this.sent) this.startResponse();
      // the engine ended its stream: what it held back goes as it was sent
      this.res.end(rest);
    }
    this.settle(this.failedInStream || this.malformedInStream ? 'cut' : 'done');
  }

  onError(err?: Error): void {
    this.releaseConnection();
    if (this.endedAtDone) clearTimeout(this.timer);
    if (this.settled) return;
    // a 503's body cut short, or dropped as too long or too slow: no refusal the engine finished saying
    if (this.refusal !== undefined) this.judgeRefusal(false);
    const code = String((err as { code?: unknown } | undefined)?.code);
    // an answer that broke HTTP/1.1 (not when the gateway gave up: its own abort is the error)
    const unreadable = this.why === undefined && unreadableAnswer(err, this.status !== 0);
    this.failure ??=
      isTimeout(err) || code === 'UND_ERR_CONNECT_TIMEOUT'
        ? 'timeout'
        : CONNECT_FAILED.has(code)
          ? 'refused'
          : unreadable
            ? 'malformed'
            : 'reset';
    // no answer at all, and not because the gateway stopped waiting: the request never
    // reached the engine (connection refused, reset) or the engine died with it. An answer
    // undici could not read is none of these: the engine got the request (it may hold it, as
    // when its JSON is cut short), and the connection was not lost on the way to it
    if (this.status === 0 && this.why === undefined && !isTimeout(err) && !unreadable) {
      this.o.onRefused();
      if (CONNECTION_LOST.has(code)) this.o.onConnectionLost();
    }
    if (!this.sent) return this.settle(this.failed());
    // the stream's last event (data: [DONE]) reached the client: it has the whole answer, and a
    // failure after it (a connection closed short of its declared length, a stream never ended)
    // loses nothing: no error event after the end, and the engine answered
    if (this.eventStream && this.doneSeen && this.why !== 'client') {
      this.res.end();
      return this.settle(this.malformedInStream ? 'cut' : 'done');
    }
    // after the first byte: end the stream cleanly; the cause stays out of the client's view
    if (this.why !== 'client' && this.eventStream) {
      // an unfinished event held back is dropped; one that passed through is ended first, so
      // the error event is an event of its own
      this.res.write(`${this.midEvent ? '\n\n' : ''}${MID_STREAM_ERROR_EVENTS}`);
    }
    // an answer that is not a stream cannot say it failed: it is cut, never ended as if whole
    if (this.eventStream || this.why === 'client') this.res.end();
    else {
      markCutByGateway(this.res);
      this.res.destroy();
    }
    this.settle(this.why === 'client' ? 'client-gone' : 'cut');
  }
}
