/**
 * Engine errors that arrive where an answer should: an error object in a 200 JSON answer, and
 * error events in an event stream. vLLM writes its errors as `{"error": {"message", "type",
 * "param", "code"}}` (0.10 and later) and SGLang (and vLLM before 0.10) as `{"object": "error",
 * "message", "type", "param", "code"}`, `code` being the HTTP status the error stands for; in a
 * stream both engines send `data: {"error": {…}}`, and a proxy in front of one may type the
 * event `event: error` or spread its JSON over several data lines. Each is read as the status
 * it names, so that the gateway treats it as it treats that status: a server error is the
 * engine's failure, a client error the engine's answer to the client. The same byte-level reading
 * finds a stream's end (`data: [DONE]`), which tells a whole answer from one cut short. One
 * error of a server error's status is no failure of the engine's: SGLang's and vLLM's refusal of
 * a request they will not queue or admit (isQueueFull), which says the engine is overloaded for
 * now, as a 429 does.
 */

import { isWholeJson, isWholeJsonIn, utf8BomLength } from './whole-json.js';

/** The longest error answer read: an engine's error is a message and a few fields; an answer longer than this is not one. */
const MAX_ERROR_ANSWER_BYTES = 64 * 1024;

const LF = 0x0a;
const CR = 0x0d;
const SPACE = 0x20;
const TAB = 0x09;
const COLON = 0x3a;
/** In an answer's or an event's JSON, the bytes `"error"` are the key, or the value `"error"` (quotes in strings are escaped). */
const QUOTED_ERROR = Buffer.from('"error"');
/** What an event that is an error holds, in its type or its JSON: a stream without it has no error event. */
const ERROR_WORD = Buffer.from('error');
const DATA_FIELD = Buffer.from('data');
const EVENT_FIELD = Buffer.from('event');
const DATA_COLON = Buffer.from('data:');
const DONE = Buffer.from('[DONE]');
const NEWLINE = Buffer.from('\n');

/** The type of an error whose code is missing or not a status, when the client caused it (vLLM's, SGLang's and OpenAI's names). */
const CLIENT_ERROR_TYPE = /invalid_request|bad_?request|not_?found/i;

/**
 * Whether an error of this status is the engine's failure, for which another worker can take the
 * request: a server error, a 429 (the engine is overloaded for now), a 401/403 (the engine
 * refused the gateway's own credentials; the client's are never forwarded), a 408 (the engine
 * gave up waiting for the request the gateway sends it whole) or a 421 (the engine does not
 * serve the authority it was reached at: RFC 9110 §15.5.20 has the request sent again over
 * another connection). Any other 4xx is the client's error, which every engine would answer alike.
 */
export function isEngineFailure(status: number): boolean {
  return status >= 500 || status === 429 || status === 401 || status === 403 || status === 408 || status === 421;
}

/**
 * The status an engine's error object stands for: its `code` when that is an HTTP error status
 * (a number, or a numeric string as some proxies write it); without one, 400 when its `type`
 * names a bad request or something not found, else 500: an error that does not say the client
 * caused it is the engine's (OpenAI's `server_error`, and this gateway's own mid-stream error,
 * carry `code: null`).
 */
function statusOf(error: unknown): number {
  if (typeof error !== 'object' || error === null) return 500;
  const { code, type } = error as { code?: unknown; type?: unknown };
  const status =
    typeof code === 'number' ? code : typeof code === 'string' && /^\d{3}$/.test(code) ? Number(code) : NaN;
  if (Number.isInteger(status) && status >= 400 && status <= 599) return status;
  return typeof type === 'string' && CLIENT_ERROR_TYPE.test(type) ? 400 : 500;
}

/**
 * What an engine says when it will not queue or admit a request, each with code 503.
 *
 * SGLang's scheduler says it with HTTPStatus.SERVICE_UNAVAILABLE
 * and no Retry-After (sgl-project/sglang, python/sglang/srt/managers/scheduler.py):
 * Scheduler._abort_on_queued_limit refuses a request arriving at a full waiting queue
 * (`--max-queued-requests`), or, with `--enable-priority-scheduling`, drops a waiting one of lower
 * priority in its place; Scheduler._abort_on_waiting_timeout drops one that waited past
 * SGLANG_REQ_WAITING_TIMEOUT. TokenizerManager turns the abort into an HTTPException(503) for a
 * whole answer, which OpenAIServingBase.handle_request (entrypoints/openai/serving_base.py) writes
 * as its ErrorResponse `{"object": "error", "message", "type": "503", "param": null, "code": 503}`;
 * a stream gets `data: {"error": {"message", "type": "SERVICE_UNAVAILABLE", "code": 503}}` as its
 * first event (serving_chat.py, serving_completions.py), then `data: [DONE]`. The engine is
 * serving, at its limit: another can take the request.
 *
 * vLLM's admission control (vllm-project/vllm#49445, in v0.29.0: `--max-num-queued-reqs`,
 * `--max-num-queued-tokens`) says it with QueueOverflowError and MaxQueuedTokensError
 * (vllm/exceptions.py; GracefulHTTPError subclasses, HTTPStatus.SERVICE_UNAVAILABLE, "so that
 * load balancers and client SDKs retry the request on a different instance"), raised by
 * AsyncLLM.check_admission (vllm/v1/engine/async_llm.py) before the request reaches the engine:
 * in the serving layer's preflight, before any stream starts, and again when the request is
 * handed over. Its API server writes them as HTTP 503 with its ErrorResponse
 * `{"error": {"message", "type": "Service Unavailable", "param": null, "code": 503}}`
 * (create_error_response: the type is the status's phrase; tests/v1/engine/test_admission_control.py).
 * An earlier draft's messages ("Request queue full.", vllm-project/vllm#32332, closed unmerged)
 * were never released and are not read.
 *
 * Only these messages, whole, are read so: any other 503 (a dead engine's, a proxy's) stays the
 * engine's failure.
 */
const QUEUE_FULL_MESSAGES: ReadonlySet<string> = new Set([
  'The request queue is full.',
  'The request is aborted by a higher priority request.',
  'Request waiting timeout reached.',
  // vLLM QueueOverflowError (--max-num-queued-reqs)
  'The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.',
  // vLLM MaxQueuedTokensError (--max-num-queued-tokens)
  'The engine has reached its prefill token backlog limit. Please try again later or on a different instance.',
]);

/** Whether an engine's error object (as statusOf reads it) is SGLang's or vLLM's refusal of a request it will not queue or admit. */
function isQueueFull(error: unknown): boolean {
  if (typeof error !== 'object' || error === null) return false;
  const { message } = error as { message?: unknown };
  return typeof message === 'string' && QUEUE_FULL_MESSAGES.has(message) && statusOf(error) === 503;
}

/**
 * Whether an engine's error object (as statusOf reads it, of status 404) is vLLM's model-not-found:
 * type `NotFoundError`, the answer of OpenAIServing._check_model
 * (vllm/entrypoints/openai/engine/serving.py: "The model `…` does not exist.", HTTPStatus.NOT_FOUND,
 * param `model`; `{"error": {…}}` from 0.10, the flat `{"object": "error", …}` before, param null).
 * A 404 of any other body is not: FastAPI's `{"detail": "Not Found"}` for a route the server does
 * not serve, a proxy's. SGLang's OpenAI routes answer a name they do not serve as their own model
 * (sgl-project/sglang#7035, #31404; a 404 for it, #31419, is not merged): no 404 of its to read.
 */
function isModelNotFound(error: unknown): boolean {
  return typeof error === 'object' && error !== null && (error as { type?: unknown }).type === 'NotFoundError';
}

/**
 * An engine's error as the gateway reads it: the status it stands for, whether it is a queue-full
 * refusal (isQueueFull), and, set only when it is, vLLM's model-not-found (isModelNotFound).
 */
export interface EngineError {
  status: number;
  queueFull: boolean;
  modelNotFound?: true;
}

/** No error: what a value, an answer or events that hold none read as. */
const NO_ERROR: EngineError = Object.freeze({ status: 0, queueFull: false });

/**
 * The error in a parsed JSON value, as errorStatusOf reads it (NO_ERROR when it holds none).
 * Allocates only for an error.
 */
function errorOf(value: unknown, typedError: boolean): EngineError {
  const status = errorStatusOf(value, typedError);
  if (status === 0) return NO_ERROR;
  if (status !== 503 && status !== 404) return { status, queueFull: false };
  // a 503 or a 404 is read from an object (a typed event's data that is none reads as 500)
  const { error } = value as { error?: unknown };
  if (status === 503) return { status, queueFull: isQueueFull(error ? error : value) };
  return isModelNotFound(error ? error : value)
    ? { status, queueFull: false, modelNotFound: true }
    : { status, queueFull: false };
}

/**
 * The status an error in a parsed JSON value stands for, 0 when it holds none: an object whose
 * `error` member is set (truthy, as the OpenAI clients test it: `null` or `false` is no error),
 * or one whose `object` is "error". `typedError`: the value is the data of an event of type
 * `error`, an error whatever it holds.
 */
function errorStatusOf(value: unknown, typedError: boolean): number {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return typedError ? 500 : 0;
  const { error, object } = value as { error?: unknown; object?: unknown };
  if (error) return statusOf(error);
  return typedError || object === 'error' ? statusOf(value) : 0;
}

/**
 * The status a complete answer of status 200 stands for when it is an engine's error object, 0
 * when it is not one. Only an answer holding the bytes `"error"` and no longer than an error
 * answer is parsed: every other answer is passed over by one search.
 */
export function errorAnswerStatus(answer: Buffer): number {
  return errorAnswer(answer).status;
}

/**
 * The error a complete answer is, read as errorAnswerStatus reads it, with whether it is a
 * queue-full refusal (isQueueFull) or vLLM's model-not-found (isModelNotFound): of a 200, or the
 * body of an error status.
 */
export function errorAnswer(answer: Buffer): EngineError {
  if (answer.length > MAX_ERROR_ANSWER_BYTES || answer.indexOf(QUOTED_ERROR) < 0) return NO_ERROR;
  // a UTF-8 byte order mark before the object (some servers and proxies write one) is no JSON:
  // one is skipped, as a decoder reading UTF-8 would
  const text = answer.subarray(utf8BomLength(answer));
  let value: unknown;
  try {
    value = JSON.parse(text.toString('utf8'));
  } catch {
    return NO_ERROR;
  }
  return errorOf(value, false);
}

/**
 * Whether `events` (whole events, or the unterminated end of a stream) hold a line that is
 * `data: [DONE]`, the event vLLM and SGLang end every stream of the completion APIs with (after
 * an error event of their own too). It counts wherever it is among them: an engine, or a proxy
 * in front of it, may write more after it in the same write (a keep-alive comment, another
 * event), and the client has the stream's end all the same (the gateway passes on nothing after
 * that event: doneEventEnd). One search for `[DONE]` passes over
 * a chunk without it (nearly every chunk); each one found is judged by the bytes around it, with
 * no view and no copy. Spaces and tabs may follow it on its line: the OpenAI SDKs take any data
 * that starts with `[DONE]` as the end, and an engine or proxy padding the line still ended it.
 * `atStreamStart`: the bytes are the stream's first, where one UTF-8 byte order mark before the
 * first line is dropped, as a client's decoder drops it.
 */
export function holdsDone(events: Buffer, atStreamStart = false): boolean {
  return doneLineEnd(events, atStreamStart) >= 0;
}

/** doneEventEnd's answer when `events` hold a `data: [DONE]` line whose event ends past them. */
export const DONE_EVENT_UNENDED = -2;

/**
 * Where the event that holds the first `data: [DONE]` line of `events` ends (after the line end
 * of its blank line, as eventsEnd in forward.ts reads it), as holdsDone finds that line; -1 when
 * there is none, DONE_EVENT_UNENDED when the bytes end before its event does (one search either
 * way: a chunk's end and whether it holds the stream's end are read together). A comment or
 * another field after the line, before the blank line, is still of that event; what follows the
 * blank line is not.
 */
export function doneEventEnd(events: Buffer, atStreamStart = false): number {
  let at = doneLineEnd(events, atStreamStart);
  if (at < 0) return -1;
  const n = events.length;
  // `at` is at the end of a line that is not empty (the [DONE] line first)
  for (;;) {
    if (at >= n) return DONE_EVENT_UNENDED;
    at += events[at] === CR && events[at + 1] === LF ? 2 : 1;
    if (at >= n) return DONE_EVENT_UNENDED;
    // an empty line ends the event; a CR at the end of the bytes ends its line whatever comes next
    if (events[at] === LF) return at + 1;
    if (events[at] === CR) return events[at + 1] === LF ? at + 2 : at + 1;
    while (at < n && events[at] !== LF && events[at] !== CR) at++;
  }
}

/** Where the first `data: [DONE]` line of `events` ends, before its line end (see holdsDone); -1 when none is there. */
function doneLineEnd(events: Buffer, atStreamStart: boolean): number {
  const lineStart = atStreamStart ? utf8BomLength(events) : 0;
  const n = events.length;
  for (let at = events.indexOf(DONE); at >= 0; at = events.indexOf(DONE, at + DONE.length)) {
    // the line ends after it, past any spaces or tabs (or the bytes do: the unterminated end of a stream)
    let end = at + DONE.length;
    while (end < n && (events[end] === SPACE || events[end] === TAB)) end++;
    if (end < n && events[end] !== LF && events[end] !== CR) continue;
    // the data field, its optional space, then it, from the start of a line
    const field = at - DATA_COLON.length - (at > 0 && events[at - 1] === SPACE ? 1 : 0);
    if (field < 0 || !startsWith(events, field, DATA_COLON)) continue;
    if (field === lineStart || events[field - 1] === LF || events[field - 1] === CR) return end;
  }
  return -1;
}

/**
 * Whether whole events of a stream hold a data line: whether any of them is an event a client
 * dispatches (WHATWG HTML, "Server-sent events": an event without data is not dispatched). A
 * block of comments alone (`: ping`, the keep-alives sse-starlette and TGI send while a request
 * waits) or of other fields alone (`event: ping`, `id:`, `retry:`) is none. A chunk that starts
 * with its data line (nearly every chunk) is answered at once; any other is searched for `data` at
 * the start of a line, with no copy. `atStreamStart`: the bytes are the stream's first, where one
 * UTF-8 byte order mark is dropped.
 */
export function holdsDataLine(events: Buffer, atStreamStart = false): boolean {
  const start = atStreamStart ? utf8BomLength(events) : 0;
  const n = events.length;
  for (let at = events.indexOf(DATA_FIELD, start); at >= 0; at = events.indexOf(DATA_FIELD, at + DATA_FIELD.length)) {
    if (at !== start && events[at - 1] !== LF && events[at - 1] !== CR) continue;
    const after = at + DATA_FIELD.length;
    if (after >= n || events[after] === COLON || events[after] === LF || events[after] === CR) return true;
  }
  return false;
}

/**
 * The data of the first event among whole events of a stream that a client dispatches (its data
 * lines' values joined with "\n", as eventError reads them), undefined when none of them is one.
 * Read once per stream, on the events that would be its first to reach the client.
 */
export function firstEventData(events: Buffer, atStreamStart = false): Buffer | undefined {
  const n = events.length;
  let data: number[] | undefined;
  for (let at = atStreamStart ? utf8BomLength(events) : 0; at < n;) {
    let end = at;
    while (end < n && events[end] !== LF && events[end] !== CR) end++;
    if (end === n) return undefined;
    if (end === at) {
      if (data !== undefined) {
        if (data.length === 2) return events.subarray(data[0], data[1]);
        const parts: Buffer[] = [];
        for (let i = 0; i < data.length; i += 2) {
          if (i > 0) parts.push(NEWLINE);
          parts.push(events.subarray(data[i], data[i + 1]));
        }
        return Buffer.concat(parts);
      }
    } else if (isField(events, at, end, DATA_FIELD)) {
      (data ??= []).push(dataValueStart(events, at, end), end);
    }
    at = events[end] === CR && events[end + 1] === LF ? end + 2 : end + 1;
  }
  return undefined;
}

/**
 * Whether whole events of a stream hold a dispatched event whose data (its data lines' values
 * joined with "\n", as firstEventData reads them) is neither a whole JSON object or array
 * (isWholeJson) nor `[DONE]`: text a proxy wrote into the stream, JSON cut short. The OpenAI SDKs
 * parse every event's data as JSON and fail on such an event. An event the bytes end before its
 * blank line is not judged. Lines are found with indexOf, and an event of one data line (nearly
 * every one) is judged on its bytes, with no copy. `atStreamStart`: the bytes are the stream's
 * first, where one UTF-8 byte order mark is dropped.
 */
export function holdsMalformedEvent(events: Buffer, atStreamStart = false): boolean {
  const n = events.length;
  // the first data value's [start, end) of the event being read, -1 before one; a further value
  // (rare) puts every one of the event in `more`, so that the common event allocates nothing
  let first = -1;
  let firstEnd = -1;
  let more: number[] | undefined;
  const breaks = lineBreaks.of(events);
  for (let at = atStreamStart ? utf8BomLength(events) : 0; at < n;) {
    const end = breaks.lineEnd(at);
    if (end === n) return false;
    if (end === at) {
      if (more !== undefined) {
        if (!isJsonOrDone(events, more)) return true;
      } else if (first >= 0 && !isWholeJsonIn(events, first, firstEnd) && !isDoneIn(events, first, firstEnd))
        return true;
      first = firstEnd = -1;
      more = undefined;
    } else if (isField(events, at, end, DATA_FIELD)) {
      const valueStart = dataValueStart(events, at, end);
      if (first < 0) {
        first = valueStart;
        firstEnd = end;
      } else (more ??= [first, firstEnd]).push(valueStart, end);
    }
    at = events[end] === CR && events[end + 1] === LF ? end + 2 : end + 1;
  }
  return false;
}

/** Whether the data of one event of several data lines (their values' [start, end) in `events`) is whole JSON or `[DONE]`. */
function isJsonOrDone(events: Buffer, data: readonly number[]): boolean {
  const parts: Buffer[] = [];
  for (let i = 0; i < data.length; i += 2) {
    if (i > 0) parts.push(NEWLINE);
    parts.push(events.subarray(data[i], data[i + 1]));
  }
  const value = Buffer.concat(parts);
  return isWholeJson(value) || isDoneData(value);
}

/** Whether an event's data is `[DONE]` (spaces or tabs after it allowed, as holdsDone reads it). */
export function isDoneData(data: Buffer): boolean {
  return isDoneIn(data, 0, data.length);
}

/** isDoneData of `bytes[start, end)`, read in place. */
function isDoneIn(bytes: Buffer, start: number, end: number): boolean {
  if (end - start < DONE.length || !startsWith(bytes, start, DONE)) return false;
  for (let i = start + DONE.length; i < end; i++) if (bytes[i] !== SPACE && bytes[i] !== TAB) return false;
  return true;
}

/** Whether `bytes` hold `word` at `at` (a look at the bytes: no view, no copy). */
function startsWith(bytes: Buffer, at: number, word: Buffer): boolean {
  for (let i = 0; i < word.length; i++) if (bytes[at + i] !== word[i]) return false;
  return true;
}

/** Whether the line `bytes[at, end)` is of the SSE field `name`: the name, then its colon or the line's end. */
function isField(bytes: Buffer, at: number, end: number, name: Buffer): boolean {
  const after = at + name.length;
  return after <= end && (after === end || bytes[after] === COLON) && startsWith(bytes, at, name);
}

/**
 * The status of the error events among whole events of a stream, 0 when none is one: the first
 * that is the engine's failure (isEngineFailure), else the first client's error. Read as the SSE
 * format has it (WHATWG HTML, "Server-sent events"): a line ends in CRLF, LF or CR; a blank line
 * ends an event; a line starting with a colon is a comment; a field's value follows its colon and
 * one optional space; an event's data lines join with "\n", and an event without one is not
 * dispatched. An event is an error when its type (its `event` field) is `error`, or when its data
 * is a JSON object whose `error` member is set (as the OpenAI clients read a stream) or an
 * engine's ErrorResponse as it is (`"object": "error"`); its status is its error's (statusOf).
 * A chunk without the bytes `error` (nearly every chunk) is passed over by one search; one with
 * them is read line by line, each position searched for once, and only an event that may be an
 * error has its data decoded and parsed. An event the bytes end before its blank line is not judged.
 * `atStreamStart`: the bytes are the stream's first, where one UTF-8 byte order mark is dropped
 * (elsewhere it is part of its line, as a client's decoder reads it). `firstEventOnly`: only the
 * first dispatched event is judged (an event the client reads before it is no error of the request's).
 */
export function errorEventStatus(events: Buffer, atStreamStart = false, firstEventOnly = false): number {
  return errorEvent(events, atStreamStart, firstEventOnly).status;
}

/**
 * The error among whole events of a stream, read as errorEventStatus reads it, with whether it
 * is a queue-full refusal (isQueueFull).
 */
export function errorEvent(events: Buffer, atStreamStart = false, firstEventOnly = false): EngineError {
  if (events.indexOf(ERROR_WORD) < 0) return NO_ERROR;
  const n = events.length;
  const start = atStreamStart ? utf8BomLength(events) : 0;
  let clientError = NO_ERROR;
  // the event being read: its type is `error`, its data may hold an error object, its data values' [start, end)
  let typedError = false;
  let mayHoldError = false;
  let data: number[] | undefined;
  // the next `"error"` at or after the line being read (n: none), searched for once, as the line
  // breaks are (LineBreaks)
  const breaks = lineBreaks.of(events);
  let nextQuoted = -1;
  for (let at = start; at < n;) {
    const end = breaks.lineEnd(at);
    // a line the bytes end before its end: its event is not whole
    if (end === n) break;
    if (end === at) {
      // a blank line: the event is dispatched
      if (data !== undefined && (typedError || mayHoldError)) {
        const error = eventError(events, data, typedError);
        if (isEngineFailure(error.status)) return error;
        if (error.status !== 0 && clientError.status === 0) clientError = error;
      }
      if (data !== undefined && firstEventOnly) return clientError;
      typedError = false;
      mayHoldError = false;
      data = undefined;
    } else if (isField(events, at, end, DATA_FIELD)) {
      const value = dataValueStart(events, at, end);
      (data ??= []).push(value, end);
      if (!mayHoldError) {
        if (nextQuoted < value) {
          nextQuoted = events.indexOf(QUOTED_ERROR, value);
          if (nextQuoted < 0) nextQuoted = n;
        }
        mayHoldError = nextQuoted + QUOTED_ERROR.length <= end;
      }
    } else if (isField(events, at, end, EVENT_FIELD)) {
      let value = at + EVENT_FIELD.length + 1;
      if (value < end && events[value] === SPACE) value++;
      typedError = end - value === ERROR_WORD.length && startsWith(events, value, ERROR_WORD);
    }
    // comments, other fields: nothing to read
    at = events[end] === CR && events[end + 1] === LF ? end + 2 : end + 1;
  }
  return clientError;
}

/** The error of one dispatched event (its data values' [start, end) in `events`); NO_ERROR when it is not one. */
function eventError(events: Buffer, data: readonly number[], typedError: boolean): EngineError {
  let text = events.toString('utf8', data[0], data[1]);
  for (let i = 2; i < data.length; i += 2) text += '\n' + events.toString('utf8', data[i], data[i + 1]);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    // an error event whose data is not JSON (plain text, say) is the engine's failure all the same
    return typedError ? { status: 500, queueFull: false } : NO_ERROR;
  }
  return errorOf(value, typedError);
}

/**
 * The end of each line of an SSE text, read in order: the next LF and the next CR at or after
 * the line being read are each searched for once (indexOf) and kept until a line passes them,
 * so a chunk of many short lines is not searched again for every line. One reader serves every
 * scan (`lineBreaks.of`): the scans run on every chunk of every streamed answer, are synchronous
 * and never nest, so none allocates one.
 */
class LineBreaks {
  private events: Buffer = Buffer.alloc(0);
  private nextLf = -1;
  private nextCr = -1;

  /** This reader, set to read `events` from their start. */
  of(events: Buffer): this {
    this.events = events;
    this.nextLf = -1;
    this.nextCr = -1;
    return this;
  }

  /** Where the line starting at `at` ends (its LF or CR), or the text's length when it does not end. */
  lineEnd(at: number): number {
    const events = this.events;
    if (this.nextLf < at) {
      this.nextLf = events.indexOf(LF, at);
      if (this.nextLf < 0) this.nextLf = events.length;
    }
    if (this.nextCr < at) {
      this.nextCr = events.indexOf(CR, at);
      if (this.nextCr < 0) this.nextCr = events.length;
    }
    return this.nextLf < this.nextCr ? this.nextLf : this.nextCr;
  }
}

const lineBreaks = new LineBreaks();

/** Where the value of the data line `events[at, end)` starts: after `data:` and one space, if any. */
function dataValueStart(events: Buffer, at: number, end: number): number {
  let value = at + DATA_FIELD.length + 1;
  if (value < end && events[value] === SPACE) value++;
  return value > end ? end : value;
}
