import { randomUUID } from 'node:crypto';
import { status as GrpcStatus, type ServerDuplexStream } from '@grpc/grpc-js';
import {
  BODY_BUDGET_CODE,
  BODY_BUDGET_MESSAGE,
  BODY_BUDGET_RETRY_AFTER_S,
  type BodyBudget,
} from '../server/body-budget.js';
import { MAX_HEADER_LINES } from '../server/gateway.js';
import { answerableRequestId } from '../server/passed-headers.js';
import { MAX_TIMER_MS } from '../server/timeouts.js';
import type { BodySendMode, ProcessingRequest, ProcessingResponse } from './proto.js';
import {
  BODY_CHUNK_BYTES,
  continueResponse,
  headerBytes,
  immediateResponse,
  MAX_BODY_MESSAGES,
  MAX_REQUEST_HEADER_BYTES,
  ModelNameRestorer,
  perMessageBodyResponses,
  readHeaders,
  readResponseStatus,
  readServedEndpoint,
  readSubsetHintWithProblem,
  REQUEST_ID_HEADER,
  routingHeadersResponse,
  streamedBodyResponses,
} from './protocol.js';
import { isRefusedMessage } from './wire-limits.js';

/** What the picker is asked: one request's headers, its body and the subset hint. */
export interface PickInput {
  /** Request headers by lower-case name (a repeated one comma-joined). */
  headers: ReadonlyMap<string, string>;
  /** The headers the request repeats, with each of their values. */
  repeatedHeaders?: ReadonlyMap<string, readonly string[]>;
  /** The headers (lower-case names) whose bytes are not UTF-8: `headers` has them with U+FFFD in their place. */
  notUtf8Headers?: ReadonlySet<string>;
  /**
   * The whole request body (possibly empty), or undefined when the picker does not see it: a
   * header-only request, or a body mode in which Envoy sends the body after the header answer.
   */
  body: Buffer | undefined;
  /** The request ended with its headers (end_of_stream): it has no body at all. */
  headersOnly?: boolean;
  /** Endpoints Envoy allows (undefined: no hint, every endpoint is eligible). */
  subset: readonly string[] | undefined;
  /** What in the subset hint could not be read, as a phrase after its key (see SubsetHint.problem). */
  subsetProblem?: string;
  requestId: string;
  /**
   * false when Envoy will not send the response body as it comes (response body mode NONE,
   * Envoy's default, or BUFFERED or BUFFERED_PARTIAL): the picker does not see a streamed
   * answer's first token when the engine sends it, so its prefill is read off the engine as a
   * whole answer's is. Undefined or true: STREAMED or FULL_DUPLEX_STREAMED, or not said.
   */
  responseBodyStreamed?: boolean;
}

/** The router's accounting of one routed request, completed by the response phase. */
export interface InFlightRequest {
  /**
   * Envoy reports which endpoint served the request (it may be a fallback): the accounting
   * moves there when it differs. Returns the id of the serving worker, if known.
   */
  served(endpoint: string | undefined): string | undefined;
  /**
   * The response is an error (4xx, 5xx): the serving worker holds none of the request, and what
   * the router predicted it would hold is withdrawn. Does nothing after the first byte or the end.
   */
  refused(): void;
  /**
   * The first byte of an answer arrived: the request's prefill is done. Not called for an error
   * (4xx, 5xx), which comes back without the prefill and is no time to first byte.
   */
  firstByte(): void;
  /** The request ended (completed, failed or abandoned). Idempotent. */
  end(): void;
}

export type PickOutcome =
  | {
      ok: true;
      /** The chosen endpoint first, then ordered fallbacks (host:port). */
      endpoints: string[];
      /** The body to forward (a rewritten model, an isolation salt), or undefined to forward the original. */
      body?: Buffer;
      /** The model was renamed for the engine: the response body gets the client's name back. */
      modelRewrite?: { engine: string; client: string };
      /** Request headers set for the engine (X-data-parallel-rank naming the chosen rank). */
      headers?: Readonly<Record<string, string>>;
      /** Request headers removed before the engine (a client's X-data-parallel-rank). */
      removeHeaders?: readonly string[];
      inFlight: InFlightRequest;
    }
  | {
      ok: false;
      status: number;
      message: string;
      param?: string | null;
      retryAfterSeconds?: number;
      /** The error body's `code` (as the gateway's for the same refusal). */
      code?: string | null;
      /** Headers of the local reply besides its content type (allow: on a 405). */
      headers?: Readonly<Record<string, string>>;
    };

export interface EndpointPicker {
  pick(input: PickInput): PickOutcome | Promise<PickOutcome>;
}

export interface ExtProcHandlerOptions {
  picker: EndpointPicker;
  /** Largest request body buffered (bytes); beyond it the request gets a 413. */
  bodyLimit: number;
  /**
   * Request-body bytes buffered at once over all streams (shared with the gateway in one
   * process), a stream's request headers counted with its body: headers or a body chunk that
   * do not fit get a 503 with Retry-After; a stream gives its bytes back once its body is
   * routed on, or when it ends, fails or is cancelled.
   */
  bodyBudget?: BodyBudget;
  /**
   * Time from a stream's request headers to its body's end (ms; default: none). A body that
   * has not ended by then gets a 408 and its bytes go back to the budget, as the gateway treats
   * an HTTP client that does not send its request in time.
   */
  bodyTimeoutMs?: number;
  /**
   * Time from a stream's start to its request headers (ms; default: none; at most
   * `bodyTimeoutMs`). A stream that sends none by then gets a 408, as the gateway answers an
   * HTTP client that does not send its request headers in time: otherwise a peer could hold
   * streams open, each with its memory, for as long as it likes without sending anything.
   */
  headersTimeoutMs?: number;
  /**
   * Time from a stream's routing to its first response-phase message (ms; default: none). A
   * routed request whose response has not begun by then ends its in-flight accounting (its worker
   * no longer counts it: a stream Envoy holds open without a response would otherwise raise the
   * worker's load for the connection's life) and is reported to onResponseTimeout (its outcome
   * stays `routed`); the stream stays open, and a response that comes later is processed as before.
   */
  responseTimeoutMs?: number;
  log?: (message: string) => void;
  /**
   * Called once per stream with its outcome: 'routed', the status of the local reply, the gRPC
   * status it was ended with (lowercase: `failed_precondition`, `internal`…), or `cancelled` when
   * Envoy gave up on it first.
   */
  onOutcome?: (outcome: string | number) => void;
  /** Called for each routed stream whose response did not begin within `responseTimeoutMs`. */
  onResponseTimeout?: () => void;
  /**
   * Called for each request refused (503) because its headers or a body chunk did not fit in
   * `bodyBudget` (the gateway counts it in contextforge_request_body_budget_refusals_total).
   */
  onBodyBudgetRefusal?: () => void;
}

type Phase = 'headers' | 'body' | 'routed' | 'finished';

/**
 * One ext_proc stream (one HTTP request) as the Gateway API Inference Extension runs it:
 * request headers, then the body in FULL_DUPLEX_STREAMED chunks. Nothing is answered until the
 * body's end_of_stream (or trailers): then the picker routes on the whole body, and the answers
 * go out in order — the request_headers response naming the endpoints, then the body echoed as
 * streamed_response chunks, the last one carrying end_of_stream. A header-only request is
 * routed at once. The response phase reports the serving endpoint and completes the router's
 * in-flight accounting; response bodies are echoed chunk by chunk in FULL_DUPLEX_STREAMED mode
 * (with the client's model name restored when the picker renamed it for the engine).
 */
export function createProcessHandler(
  options: ExtProcHandlerOptions,
): (call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => void {
  const log = options.log ?? (() => {});
  const { bodyTimeoutMs } = options;
  for (const [name, ms] of [
    ['bodyTimeoutMs', bodyTimeoutMs],
    ['headersTimeoutMs', options.headersTimeoutMs],
    ['responseTimeoutMs', options.responseTimeoutMs],
  ] as const)
    if (ms !== undefined && !(Number.isInteger(ms) && ms >= 1 && ms <= MAX_TIMER_MS))
      throw new RangeError(`${name} must be an integer from 1 to ${MAX_TIMER_MS}, got ${ms}`);
  // as the gateway's HTTP side: the headers' time is within the whole request's
  const headersTimeoutMs =
    options.headersTimeoutMs === undefined || bodyTimeoutMs === undefined
      ? (options.headersTimeoutMs ?? bodyTimeoutMs)
      : Math.min(options.headersTimeoutMs, bodyTimeoutMs);
  return (call) => {
    let phase: Phase = 'headers';
    let headers = new Map<string, string>();
    const repeatedHeaders = new Map<string, string[]>();
    const notUtf8Headers = new Set<string>();
    let subset: string[] | undefined;
    let subsetProblem: string | undefined;
    let requestId = '';
    let requestIdGenerated = false;
    let headersOnly = false;
    const received = new BodyBuffer();
    /** This stream's share of the body budget: what it buffered of its request body. */
    const charge = options.bodyBudget?.charge();
    let bodyMessages = 0;
    let requestBodyMode: BodySendMode | undefined;
    let responseBodyMode: BodySendMode | undefined;
    let inFlight: InFlightRequest | undefined;
    let restorer: ModelNameRestorer | undefined;
    let firstByteSeen = false;
    /** The response's headers arrived (its body and trailers follow them, once). */
    let responseHeadersSeen = false;
    /** The response is an error (4xx, 5xx): its first byte is not the request's. */
    let errorAnswer = false;
    /** The request body's end (end_of_stream or trailers) arrived. */
    let bodyEnded = false;
    let closed = false;
    /** Ends a stream whose headers, or a body that is still arriving, are not in when the time for them is up. */
    let bodyTimer: NodeJS.Timeout | undefined;
    const stopBodyTimer = () => {
      clearTimeout(bodyTimer);
      bodyTimer = undefined;
    };
    // messages are handled one at a time, in arrival order, even while a pick awaits
    let queue: Promise<void> = Promise.resolve();
    /** Answers 408 when the time for `waitingIn` is up and the stream is still in it. */
    const startTimer = (ms: number, waitingIn: Phase, message: string) => {
      bodyTimer = setTimeout(() => {
        // in line with the messages: one already queued is handled first
        queue = queue
          .then(() => {
            if (phase === waitingIn && !closed) return reject(408, message);
          })
          .catch((err: unknown) => fail(GrpcStatus.INTERNAL, `internal error: ${(err as Error).message}`));
      }, ms);
      // a stream's own timer does not keep the process alive
      bodyTimer.unref();
    };

    /** Ends the in-flight accounting of a routed request whose response does not begin in time. */
    let responseTimer: NodeJS.Timeout | undefined;
    const responseBegan = () => {
      clearTimeout(responseTimer);
      responseTimer = undefined;
    };
    const finish = () => {
      stopBodyTimer();
      responseBegan();
      charge?.release();
      inFlight?.end();
      phase = 'finished';
    };
    const send = async (msg: ProcessingResponse) => {
      if (closed || call.write(msg) || call.destroyed) return;
      // no more messages are read while the peer does not read the answers: what it goes on
      // sending (a response body it streams without reading the echo) waits in gRPC's flow
      // control, not queued in this process without bound
      call.pause();
      // both listeners go as soon as either fires: a long response through a slow Envoy meets
      // backpressure on many answers, and listeners left behind would pile up on the call
      await new Promise<void>((resolve) => {
        const done = () => {
          call.off('drain', done);
          call.off('close', done);
          resolve();
        };
        call.on('drain', done);
        call.on('close', done);
      });
      call.resume();
    };
    /** The stream's outcome was counted (onOutcome): once per stream, whatever follows. */
    let counted = false;
    const count = (outcome: string | number) => {
      if (counted) return;
      counted = true;
      options.onOutcome?.(outcome);
    };
    const fail = (code: GrpcStatus, message: string) => {
      if (closed) return;
      closed = true;
      count(GrpcStatus[code].toLowerCase());
      finish();
      log(`ext_proc stream ${requestId || '-'}: ${message}`);
      // grpc-js ends a server stream with an error's status when the error is emitted on it;
      // destroy() would only tear the stream down, and the peer would wait for a status forever
      call.emit('error', Object.assign(new Error(message), { code, details: message }));
    };
    const reject = async (
      status: number,
      message: string,
      param: string | null = null,
      retryAfterSeconds?: number,
      code: string | null = null,
      headers: Readonly<Record<string, string>> = {},
    ) => {
      count(status);
      const extra: Record<string, string> = { ...headers };
      if (retryAfterSeconds) extra['retry-after'] = String(retryAfterSeconds);
      // the client's own request id comes back, so it can find the request in the picker's log
      if (requestId && !requestIdGenerated) extra[REQUEST_ID_HEADER] = requestId;
      await send(immediateResponse(status, message, param, extra, code));
      finish();
      // the local reply ends this request's processing: close the stream cleanly
      if (!closed) {
        closed = true;
        call.end();
      }
    };

    /** The request's headers or a body chunk do not fit in the body budget. */
    const refuseForBudget = () => {
      options.onBodyBudgetRefusal?.();
      return reject(503, BODY_BUDGET_MESSAGE, null, BODY_BUDGET_RETRY_AFTER_S, BODY_BUDGET_CODE);
    };

    /**
     * Routes on the body and echoes it; then the headers and body are no longer held, and their
     * bytes go back to the budget.
     */
    const route = async (body: Buffer | undefined, endOfStream: boolean) => {
      try {
        await routeOn(body, endOfStream);
      } finally {
        headers = new Map();
        repeatedHeaders.clear();
        notUtf8Headers.clear();
        charge?.release();
      }
    };
    const routeOn = async (body: Buffer | undefined, endOfStream: boolean) => {
      stopBodyTimer();
      phase = 'routed';
      let outcome: PickOutcome;
      try {
        const responseBodyStreamed =
          responseBodyMode === undefined ||
          responseBodyMode === 'STREAMED' ||
          responseBodyMode === 'FULL_DUPLEX_STREAMED';
        outcome = await options.picker.pick({
          headers,
          repeatedHeaders,
          notUtf8Headers,
          body,
          headersOnly,
          subset,
          subsetProblem,
          requestId,
          responseBodyStreamed,
        });
      } catch (err) {
        log(`ext_proc ${requestId}: picking failed: ${(err as Error).stack ?? String(err)}`);
        return reject(500, 'the endpoint picker failed');
      }
      if (!outcome.ok)
        return reject(
          outcome.status,
          outcome.message,
          outcome.param ?? null,
          outcome.retryAfterSeconds,
          outcome.code ?? null,
          outcome.headers,
        );
      if (closed) {
        // Envoy gave up while the picker worked: nothing will be served
        outcome.inFlight.end();
        return;
      }
      inFlight = outcome.inFlight;
      if (outcome.modelRewrite)
        restorer = new ModelNameRestorer(outcome.modelRewrite.engine, outcome.modelRewrite.client);
      count('routed');
      if (options.responseTimeoutMs !== undefined) {
        const ms = options.responseTimeoutMs;
        responseTimer = setTimeout(() => {
          responseTimer = undefined;
          if (closed || phase === 'finished') return;
          // the worker no longer counts a request that may never be answered through this stream
          inFlight?.end();
          options.onResponseTimeout?.();
          log(
            `ext_proc stream ${requestId}: no response began within ${ms} ms of routing; its worker no longer counts it`,
          );
        }, ms);
        responseTimer.unref();
      }
      const forwarded = body === undefined ? undefined : (outcome.body ?? body);
      // Envoy drops content-length in FULL_DUPLEX_STREAMED mode; the engine gets it back, exact
      const extra: Record<string, string> = { ...outcome.headers };
      if (forwarded !== undefined) extra['content-length'] = String(forwarded.length);
      // the engine logs the same id as the picker (vLLM reads x-request-id)
      if (requestIdGenerated) extra[REQUEST_ID_HEADER] = requestId;
      await send(routingHeadersResponse(outcome.endpoints, extra, outcome.removeHeaders));
      if (forwarded !== undefined) {
        if (requestBodyMode !== undefined && requestBodyMode !== 'FULL_DUPLEX_STREAMED') {
          // the other modes expect one answer per body message: Envoy forwards what they say, so
          // a body the picker changed (a rewritten model, its metadata removed) goes in them, and
          // the content-length above holds for it
          for (const m of perMessageBodyResponses(bodyMessages, outcome.body)) await send(m);
        } else {
          for (const m of streamedBodyResponses('request_body', forwarded, endOfStream)) await send(m);
        }
      }
    };

    const handle = async (req: ProcessingRequest) => {
      if (closed) return;
      // a message over the wire limits (or not decodable) was not decoded: the stream ends naming why
      if (isRefusedMessage(req)) return fail(req.code, req.message);
      // the response ended (its end_of_stream, or trailers): nothing of this request may follow
      if (phase === 'finished' && req.request !== undefined)
        return fail(GrpcStatus.FAILED_PRECONDITION, `${req.request} arrived after the response ended`);
      if (req.protocol_config) {
        // proto3 leaves a zero enum off the wire: an absent mode inside protocol_config is NONE
        requestBodyMode = bodyMode(req.protocol_config.request_body_mode ?? 0);
        responseBodyMode = bodyMode(req.protocol_config.response_body_mode ?? 0);
      }
      switch (req.request) {
        case 'request_headers': {
          if (phase !== 'headers') return fail(GrpcStatus.FAILED_PRECONDITION, 'request_headers arrived twice');
          // bounded as the gateway bounds an HTTP request's, and held (until the body is routed
          // on) out of the same budget as a body
          const list = req.request_headers?.headers?.headers ?? [];
          if (list.length > MAX_HEADER_LINES)
            return reject(431, `the request has more than ${MAX_HEADER_LINES} headers`, 'headers');
          const bytes = headerBytes(list);
          if (bytes > MAX_REQUEST_HEADER_BYTES)
            return reject(431, `the request headers are larger than ${MAX_REQUEST_HEADER_BYTES} bytes`, 'headers');
          stopBodyTimer();
          if (charge && !charge.take(bytes)) return refuseForBudget();
          headers = readHeaders(req.request_headers, repeatedHeaders, notUtf8Headers);
          requestId = headers.get(REQUEST_ID_HEADER) ?? '';
          // one that could not go back in a header as it is (CR, LF, NUL…) is replaced, as a missing one
          if (requestId === '' || requestId.length > 256 || !answerableRequestId(requestId)) {
            requestId = randomUUID();
            requestIdGenerated = true;
          }
          const hint = readSubsetHintWithProblem(req);
          subset = hint?.endpoints;
          subsetProblem = hint?.problem;
          headersOnly = req.request_headers?.end_of_stream === true;
          // no body follows (end_of_stream), or Envoy will not send it before our answer
          const bodyComing = !headersOnly && requestBodyMode !== 'NONE';
          const waitsForAnswer =
            requestBodyMode !== undefined &&
            requestBodyMode !== 'FULL_DUPLEX_STREAMED' &&
            req.protocol_config?.send_body_without_waiting_for_header_response !== true;
          if (!bodyComing || waitsForAnswer) return route(undefined, true);
          phase = 'body';
          if (bodyTimeoutMs !== undefined) startTimer(bodyTimeoutMs, 'body', 'the request did not arrive in time');
          return;
        }
        case 'request_body': {
          if (phase === 'routed') {
            // the body was routed on and echoed: nothing of it may follow
            if (bodyEnded) return fail(GrpcStatus.FAILED_PRECONDITION, 'request_body arrived after the body ended');
            if (headersOnly)
              return fail(
                GrpcStatus.FAILED_PRECONDITION,
                'request_body arrived after the request ended with its headers',
              );
            // a mode where the body follows our header answer: it passes unchanged, up to its end
            if (req.request_body?.end_of_stream) bodyEnded = true;
            return send(continueResponse('request_body'));
          }
          if (phase !== 'body')
            return fail(GrpcStatus.FAILED_PRECONDITION, 'request_body arrived before request_headers');
          const chunk = req.request_body?.body;
          // every message counts, an empty one too: each is owed an answer in the modes that
          // answer every message, and none of the body's limits would bound empty ones
          if (++bodyMessages > MAX_BODY_MESSAGES)
            return reject(413, `request body too large: in over ${MAX_BODY_MESSAGES} messages`, 'body');
          if (chunk && chunk.length > 0) {
            if (received.length + chunk.length > options.bodyLimit)
              return reject(413, `request body too large: over ${options.bodyLimit} bytes`);
            if (charge && !charge.take(chunk.length)) return refuseForBudget();
            received.append(chunk);
          }
          if (req.request_body?.end_of_stream) {
            bodyEnded = true;
            return route(received.take(), true);
          }
          return; // buffered: answering a chunk before the end would route on half a body
        }
        case 'request_trailers': {
          if (phase === 'headers')
            return fail(GrpcStatus.FAILED_PRECONDITION, 'request_trailers arrived before request_headers');
          // trailers end a body still coming; after its end (or headers that ended the request) none follow
          if (phase === 'routed' && (bodyEnded || headersOnly))
            return fail(GrpcStatus.FAILED_PRECONDITION, 'request_trailers arrived after the body ended');
          // trailers end the body instead of an end_of_stream chunk (also one that follows our header answer)
          bodyEnded = true;
          if (phase === 'body') await route(received.take(), false);
          if (!closed) await send({ request_trailers: {} });
          return;
        }
        case 'response_headers': {
          responseBegan();
          if (phase !== 'routed')
            return fail(GrpcStatus.FAILED_PRECONDITION, 'response_headers arrived before the request was routed');
          if (responseHeadersSeen) return fail(GrpcStatus.FAILED_PRECONDITION, 'response_headers arrived twice');
          responseHeadersSeen = true;
          const worker = inFlight?.served(readServedEndpoint(req));
          // after served(): a fallback's error is refused on the worker that answered, and
          // before the body, whose first byte would take the predictions as computed. Envoy's
          // own local replies (a route timeout's 504, while the engine may still be computing)
          // never get here: ext_proc's onLocalReply() marks processing complete and skips them
          const status = readResponseStatus(req);
          errorAnswer = status !== undefined && status >= 400;
          if (errorAnswer) inFlight?.refused();
          const set = worker
            ? [
                {
                  header: { key: 'x-contextforge-worker', raw_value: Buffer.from(worker) },
                  append_action: 'OVERWRITE_IF_EXISTS_OR_ADD' as const,
                },
              ]
            : undefined;
          // the restored model name changes the body's length: the engine's content-length no longer holds
          const restoring =
            restorer !== undefined && (responseBodyMode === undefined || responseBodyMode === 'FULL_DUPLEX_STREAMED');
          const mutation = restoring
            ? { set_headers: set, remove_headers: ['content-length'] }
            : set
              ? { set_headers: set }
              : undefined;
          await send({ response_headers: { response: mutation ? { header_mutation: mutation } : {} } });
          if (req.response_headers?.end_of_stream) finish();
          return;
        }
        case 'response_body': {
          responseBegan();
          if (phase !== 'routed')
            return fail(GrpcStatus.FAILED_PRECONDITION, 'response_body arrived before the request was routed');
          if (!responseHeadersSeen)
            return fail(GrpcStatus.FAILED_PRECONDITION, 'response_body arrived before response_headers');
          const chunk = req.response_body?.body;
          const eos = req.response_body?.end_of_stream === true;
          if (!firstByteSeen && chunk && chunk.length > 0) {
            firstByteSeen = true;
            if (!errorAnswer) inFlight?.firstByte();
          }
          if (responseBodyMode === undefined || responseBodyMode === 'FULL_DUPLEX_STREAMED') {
            const body = chunk ? Buffer.from(chunk.buffer, chunk.byteOffset, chunk.length) : Buffer.alloc(0);
            // a piece of the chunk at a time, each sent before the next is restored: the client's
            // model name may be many times the engine's, and a body of nothing but model fields
            // (from a hostile engine or gateway) would otherwise grow whole in memory first
            let start = 0;
            do {
              const end = Math.min(body.length, start + BODY_CHUNK_BYTES);
              const last = eos && end === body.length;
              const piece = body.subarray(start, end);
              const answer = restorer ? restorer.push(piece, last) : piece;
              for (const m of streamedBodyResponses('response_body', answer, last)) await send(m);
              start = end;
            } while (start < body.length);
          } else {
            await send(continueResponse('response_body'));
          }
          if (eos) finish();
          return;
        }
        case 'response_trailers': {
          responseBegan();
          if (phase !== 'routed')
            return fail(GrpcStatus.FAILED_PRECONDITION, 'response_trailers arrived before the request was routed');
          if (!responseHeadersSeen)
            return fail(GrpcStatus.FAILED_PRECONDITION, 'response_trailers arrived before response_headers');
          // trailers end the body: what the model-name restorer held back goes out before them
          const rest = restorer?.push(Buffer.alloc(0), true);
          if (rest && rest.length > 0)
            for (const m of streamedBodyResponses('response_body', rest, false)) await send(m);
          await send({ response_trailers: {} });
          finish();
          return;
        }
        default:
          return fail(GrpcStatus.INVALID_ARGUMENT, 'a ProcessingRequest without a request');
      }
    };

    call.on('data', (req: ProcessingRequest) => {
      queue = queue
        .then(() => handle(req))
        .catch((err: unknown) => fail(GrpcStatus.INTERNAL, `internal error: ${(err as Error).message}`));
    });
    // Envoy sends nothing more: a request it had not sent whole is refused, not left unanswered
    call.on('end', () => {
      queue = queue
        .then(async () => {
          // Envoy gives up on a stream by ending it and resetting it at once: the reset, read with
          // the end, closes the HTTP/2 stream only once the I/O already read is handled (a turn of
          // the event loop); a request cut short is answered after that, not before. Reset, the
          // stream was counted cancelled (the 'cancelled' handler) and there is nobody to answer
          if (!closed && (phase === 'headers' || phase === 'body'))
            await new Promise<void>((resolve) => setImmediate(resolve));
          if (closed) return finish();
          if (phase === 'headers')
            return fail(GrpcStatus.FAILED_PRECONDITION, 'the stream ended before request_headers');
          if (phase === 'body') return reject(400, 'the request ended before its body did', 'body');
          finish();
          closed = true;
          call.end();
        })
        .catch((err: unknown) => fail(GrpcStatus.INTERNAL, `internal error: ${(err as Error).message}`));
    });
    if (headersTimeoutMs !== undefined)
      startTimer(headersTimeoutMs, 'headers', 'the request headers did not arrive in time');
    // the peer gone: its body's bytes go back to the budget at once, not after the queue drains
    call.on('cancelled', () => {
      // grpc-js ends a stream itself (a message over the receive limit, one it cannot read) with a
      // status the handler never sees but as a cancellation: it is counted under that status
      const status = statusSentByGrpc(call);
      if (status !== undefined && !counted)
        log(`ext_proc stream ${requestId || '-'}: ended by gRPC with ${GrpcStatus[status.code]}: ${status.details}`);
      count(status === undefined ? 'cancelled' : (GrpcStatus[status.code]?.toLowerCase() ?? String(status.code)));
      closed = true;
      stopBodyTimer();
      charge?.release();
      void queue.then(finish);
    });
    call.on('error', () => {
      closed = true;
      stopBodyTimer();
      charge?.release();
      void queue.then(finish);
    });
  };
}

/**
 * The status grpc-js sent on the call's HTTP/2 stream, if it sent one: undefined when the peer
 * cancelled the stream, or when grpc-js keeps the stream otherwise than this reads it (a release
 * that changed it; the stream then counts as cancelled, as before). The stream is private to
 * grpc-js: a server call holds its intercepting call, which, with no interceptors, holds it.
 */
function statusSentByGrpc(call: object): { code: number; details: string } | undefined {
  const stream = (call as { call?: { stream?: unknown } }).call?.stream as
    { sentHeaders?: Record<string, unknown>; sentTrailers?: Record<string, unknown> } | undefined;
  if (!stream) return undefined;
  const sent = stream.sentTrailers?.['grpc-status'] !== undefined ? stream.sentTrailers : stream.sentHeaders;
  const code = Number(sent?.['grpc-status']);
  if (sent?.['grpc-status'] === undefined || !Number.isInteger(code)) return undefined;
  let details = String(sent['grpc-message'] ?? '');
  try {
    details = decodeURI(details);
  } catch {
    // as sent
  }
  return { code, details };
}

/**
 * The request body as its chunks arrive, copied into one buffer that grows by doubling. A chunk
 * is a view into the gRPC message it came in: kept as it is, a 1-byte chunk of a message padded
 * to megabytes would hold the whole message, and a body in a million 1-byte chunks would be a
 * million buffers; either way far more memory than the body limit counts.
 */
class BodyBuffer {
  private buf: Buffer = Buffer.alloc(0);
  length = 0;

  append(chunk: Uint8Array): void {
    const needed = this.length + chunk.length;
    if (needed > this.buf.length) {
      // the first chunk is taken at its size: a body in one message is copied once
      const grown = Buffer.allocUnsafe(this.length === 0 ? needed : Math.max(needed, 2 * this.buf.length));
      this.buf.copy(grown, 0, 0, this.length);
      this.buf = grown;
    }
    this.buf.set(chunk, this.length);
    this.length = needed;
  }

  /** The body so far; the buffer is released (routing needs the body once). */
  take(): Buffer {
    const out = this.buf.subarray(0, this.length);
    this.buf = Buffer.alloc(0);
    this.length = 0;
    return out;
  }
}

const BODY_MODES: readonly BodySendMode[] = [
  'NONE',
  'STREAMED',
  'BUFFERED',
  'BUFFERED_PARTIAL',
  'FULL_DUPLEX_STREAMED',
];

function bodyMode(v: BodySendMode | number | undefined): BodySendMode | undefined {
  if (v === undefined) return undefined;
  if (typeof v === 'number') return BODY_MODES[v];
  return BODY_MODES.includes(v) ? v : undefined;
}
