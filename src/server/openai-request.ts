/**
 * Reading OpenAI requests: the JSON body parser (nesting depth checked before parsing; the raw
 * body is kept so an unchanged request is forwarded byte for byte), the translation of the body
 * plus ContextForge's metadata (the `contextforge` field or the x-* headers of docs/architecture.md §5)
 * into a RouteRequest under the limits of request-limits.ts, the tenant's cache salt, prompt
 * tokenization by the configured mode, and OpenAI-style JSON error answers.
 */
import { isUtf8 } from 'node:buffer';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { RouteRequest } from '../core/router/index.js';
import {
  UntokenizableContentError,
  type ChatTemplateRequest,
  type PromptTokenizer,
} from '../engines/chat-tokenizer.js';
import {
  TokenizeTimeoutError,
  TokenizerUnavailableError,
  type AsyncPromptTokenizer,
} from '../engines/tokenizer-pool.js';
import { CLIENT_CLOSED_REQUEST } from './metrics.js';
import { tenantCacheSalt, tenantScopedId } from './api-keys.js';
import { chatTemplateRequest } from './engine-deployments.js';
import {
  checkGenerateMedia,
  checkMediaUrl,
  MediaUrlRefusal,
  type MediaDomains,
  type MediaUrlRefusalReason,
} from './media-domains.js';
import {
  clientMessage,
  firstPromptEntry,
  jsonStringEnd,
  parseJsonBody,
  readGenerateRouteRequest,
  readRouteRequest,
  RequestLimitError,
  REMOVED_MEMBERS,
  type ForwardedFields,
  type JsonLimits,
  type ReadRequest,
  type RequestLimits,
} from './request-limits.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** The body's bytes as received: forwarded as they are when the router changes nothing in the body. */
    rawBody?: Buffer;
    /** The tenant of the request's API key (with --api-keys-file). */
    tenant?: string;
  }
}

export type OpenAiPath = '/v1/completions' | '/v1/chat/completions';

/** SGLang's native generation API, read for the endpoint picker (readGenerateRouteRequest); the gateway does not serve it. */
export const GENERATE_PATH = '/generate';

/** What the OpenAI routes use of a reply: Fastify's, or the gateway's fast path's (fast-path.ts). */
export interface ProxyReply {
  readonly raw: ServerResponse;
  /** The answer has been sent, or the route took the response over (hijack). */
  readonly sent: boolean;
  code(status: number): ProxyReply;
  header(name: string, value: string): ProxyReply;
  send(payload: unknown): ProxyReply;
  /** The route writes the response itself. */
  hijack(): unknown;
}

/** What an error answer needs of a reply: Fastify's, or the gateway's fast path's (fast-path.ts). */
export interface ErrorReply {
  code(status: number): { send(payload: unknown): unknown };
}

/** Answers with an OpenAI-style error body. */
export function openAiError<R extends ErrorReply>(
  reply: R,
  status: number,
  message: string,
  param: string | null = null,
  code: string | null = null,
): R {
  reply.code(status).send({ error: { message, type: openAiErrorType(status), param, code } });
  return reply;
}

/** The OpenAI error `type` of an answer with `status`. */
export function openAiErrorType(status: number): string {
  return status >= 500
    ? 'server_error'
    : status === 401
      ? 'authentication_error'
      : status === 429
        ? 'rate_limit_error'
        : 'invalid_request_error';
}

/** Parses a JSON request body as the OpenAI routes take it (see useJsonBodies); throws a RequestLimitError. */
export function parseRequestBody(bytes: Buffer, limits: JsonLimits): unknown {
  return bytes.length === 0 ? undefined : parseJsonBody(bytes.toString('utf8'), limits);
}

/**
 * The text of a JSON object body with its `removed` members (`contextforge`, and the KV-transfer
 * and code fields the gateway does not forward: ReadRequest.removed) removed (an `outer.inner`
 * entry of REMOVED_MEMBERS names the member `inner` of each object `outer`) and, when
 * `cacheSalt` is given, its `cache_salt` members replaced by that one (and likewise `model`, which
 * the endpoint picker may rewrite); every other member is kept as the client wrote it.
 * Re-serialising the parsed body instead would change what JSON.parse cannot hold: a 64-bit
 * `seed` rounded to a double, 1e400 turned into null. Every copy of a key goes (JSON.parse and the
 * engines take the last), escaped spellings included. `text` has been parsed already, so it is
 * valid JSON.
 */
export function editedBodyText(
  text: string,
  cacheSalt?: string,
  model?: string,
  removed: readonly string[] = ['contextforge'],
): string {
  const kept: string[] = [];
  if (model !== undefined) kept.push(`"model":${JSON.stringify(model)}`);
  if (cacheSalt !== undefined) kept.push(`"cache_salt":${JSON.stringify(cacheSalt)}`);
  let i = skipSpace(text, text.indexOf('{') + 1);
  while (text.charCodeAt(i) === 0x22) {
    const keyEnd = jsonStringEnd(text, i);
    const key = JSON.parse(text.slice(i, keyEnd + 1)) as string;
    const valueStart = skipSpace(text, skipSpace(text, keyEnd + 1) + 1); // past the colon
    const valueEnd = jsonValueEnd(text, valueStart);
    const replaced =
      removed.includes(key) ||
      (cacheSalt !== undefined && key === 'cache_salt') ||
      (model !== undefined && key === 'model');
    const inner = replaced || text.charCodeAt(valueStart) !== 0x7b ? undefined : innerRemoved(key, removed);
    if (inner !== undefined)
      kept.push(
        text.slice(i, valueStart) + editedBodyText(text.slice(valueStart, valueEnd), undefined, undefined, inner),
      );
    else if (!replaced) kept.push(text.slice(i, valueEnd));
    i = skipSpace(text, valueEnd);
    if (text.charCodeAt(i) !== 0x2c) break; // the closing brace
    i = skipSpace(text, i + 1);
  }
  return `{${kept.join(',')}}`;
}

/** The members of the object `key` that `removed` names (`key.inner`, REMOVED_MEMBERS), or undefined for none. */
function innerRemoved(key: string, removed: readonly string[]): string[] | undefined {
  if (!Object.hasOwn(REMOVED_MEMBERS, key)) return undefined;
  let inner: string[] | undefined;
  for (const entry of removed)
    if (entry.length > key.length && entry.charCodeAt(key.length) === 0x2e && entry.startsWith(key))
      (inner ??= []).push(entry.slice(key.length + 1));
  return inner;
}

/** The index of the first character at or after `i` that is not JSON whitespace. */
function skipSpace(text: string, i: number): number {
  for (let c = text.charCodeAt(i); c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d; c = text.charCodeAt(++i));
  return i;
}

/** What ends a number or a literal in valid JSON. */
const SCALAR_END = /[\s,\]}]/;

/** The index just past the JSON value that starts at `i`. */
function jsonValueEnd(text: string, i: number): number {
  const c = text.charCodeAt(i);
  if (c === 0x22) return jsonStringEnd(text, i) + 1;
  if (c !== 0x5b && c !== 0x7b) {
    // a number or a literal: up to the separator, the closing bracket or whitespace
    let j = i;
    while (j < text.length && !SCALAR_END.test(text[j])) j++;
    return j;
  }
  let depth = 0;
  for (let j = i; j < text.length; j++) {
    const d = text.charCodeAt(j);
    if (d === 0x22) j = jsonStringEnd(text, j);
    else if (d === 0x5b || d === 0x7b) depth++;
    else if ((d === 0x5d || d === 0x7d) && --depth === 0) return j + 1;
  }
  return text.length;
}

/** The bytes to forward for an unchanged body: the client's own, unless they are not UTF-8. */
export function forwardableBytes(bytes: Buffer): Buffer | undefined {
  // bytes that are not UTF-8 are forwarded as read (invalid sequences replaced), as JSON.parse saw them
  return bytes.length > 0 && isUtf8(bytes) ? bytes : undefined;
}

/**
 * JSON bodies are parsed once and kept as received, so an unchanged body is forwarded
 * without serialising it again; clients that send JSON without saying so (curl -d) are
 * read as JSON too. The nesting depth, the number of arrays and objects and the members of each
 * object are checked before parsing: a 10,000-deep body is a 400, not a stack overflow, and a
 * body of a million `[1]` or an object of a million keys a 400, not seconds of JSON.parse.
 * JSON.parse makes "__proto__" an own key, never the prototype.
 */
export function useJsonBodies(app: FastifyInstance, limits: JsonLimits): void {
  app.decorateRequest('rawBody', undefined);
  app.decorateRequest('tenant', undefined);
  const parseJson = (req: FastifyRequest, body: string | Buffer, done: (err: Error | null, body?: unknown) => void) => {
    try {
      checkContentEncoding(req.headers['content-encoding']);
      const parsed = parseRequestBody(body as Buffer, limits);
      req.rawBody = forwardableBytes(body as Buffer);
      done(null, parsed);
    } catch (err) {
      done(
        err instanceof RequestLimitError
          ? err
          : Object.assign(new Error('the body is not valid JSON'), { statusCode: 400 }),
        undefined,
      );
    }
  };
  // Fastify's own text/plain parser would hand the body over as a string, never read as JSON
  app.removeContentTypeParser(['application/json', 'text/plain']);
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, parseJson);
  app.addContentTypeParser('*', { parseAs: 'buffer' }, parseJson);
}

/**
 * Throws a 415 naming content-encoding unless the body is sent as is: a compressed body is
 * not inflated (no decompression bomb to bound), and reading its bytes as JSON would only
 * say "not valid JSON".
 */
export function checkContentEncoding(encoding: string | undefined): void {
  if (encoding !== undefined && encoding !== '' && encoding.trim().toLowerCase() !== 'identity')
    throw new RequestLimitError(
      'compressed request bodies are not supported: send the body without Content-Encoding',
      'content-encoding',
      415,
    );
}

/** A request read for routing: what to route on, the body to forward, and whether that body is the one received. */
export type ParsedRequest = ReadRequest;

/** What a request parser reads: a Fastify request, or one assembled by another front end (the endpoint picker). */
export interface RequestSource {
  body: unknown;
  /** The body's bytes as received, when they can be forwarded as they are. */
  rawBody?: Buffer;
  headers: Readonly<Record<string, string | string[] | undefined>>;
  /** The client's tenant (API keys): its requests get the tenant's cache salt. */
  tenant?: string;
  /** The HTTP request, when there is one: a metadata header it repeats is refused, not read joined. */
  raw?: IncomingMessage;
}

/** The metadata headers that take one value (x-anchor-ids is a list: repeating it extends the list). */
export const SINGLE_VALUE_HEADERS: readonly string[] = [
  'x-workflow-id',
  'x-workflow-step',
  'x-agent-role',
  'x-cla-group',
  'x-kv-isolate',
];

/**
 * The request's headers for the metadata checks: Node joins a repeated header's values with
 * ", ", so a metadata header given twice would be read as one odd value; it is given as the
 * list of its values instead, which the checks refuse. Node reads header bytes as Latin-1: a
 * metadata header's bytes are read as UTF-8 instead, as the body's ids and the endpoint
 * picker's headers are (the UTF-8 of "café" would otherwise be the id "cafÃ©"); bytes that are
 * not UTF-8 throw a RequestLimitError naming the header. The headers themselves when no
 * metadata header repeats or holds more than ASCII.
 */
export function metadataHeaders(req: IncomingMessage): RequestSource['headers'] {
  const headers = req.headers;
  let out: Record<string, string | string[] | undefined> | undefined;
  for (const name of SINGLE_VALUE_HEADERS) {
    const v = headers[name];
    if (typeof v !== 'string' || !v.includes(', ')) continue;
    const values = req.headersDistinct[name];
    if (values !== undefined && values.length > 1) (out ??= { ...headers })[name] = values;
  }
  for (const name of METADATA_HEADERS) {
    const v = (out ?? headers)[name];
    if (typeof v !== 'string' || !NOT_ASCII.test(v)) continue;
    const bytes = Buffer.from(v, 'latin1');
    if (!isUtf8(bytes)) throw new RequestLimitError(`${name} is not UTF-8`, name);
    (out ??= { ...headers })[name] = bytes.toString('utf8');
  }
  return out ?? headers;
}

/** Every metadata header (the endpoint picker refuses the same ones when not UTF-8). */
export const METADATA_HEADERS: readonly string[] = [...SINGLE_VALUE_HEADERS, 'x-anchor-ids'];

const NOT_ASCII = /[^\p{ASCII}]/u;

export interface RequestReaderOptions {
  /** How prompts are hashed (see GatewayOptions.tokenize). */
  tokenize: 'text' | 'tokenizer' | 'engine';
  /** In process (blocks the event loop while it works) or a TokenizerPool on worker threads. */
  promptTokenizer?: PromptTokenizer | AsyncPromptTokenizer;
  /** Token ids from an engine's /tokenize (given the request's body); undefined when none answers (text mode then). */
  tokenizeOnEngine: (r: RouteRequest, body: Record<string, unknown>) => Promise<number[] | undefined>;
  /**
   * The LoRA adapter a request's model names, if it names one (its blocks are keyed by it): an
   * adapter's own name (vLLM) or SGLang's `base:adapter` (WorkerConnections.loraOf).
   */
  loraOf?: (model: unknown) => string | undefined;
  /** Limits on what the client controls. */
  limits: RequestLimits;
  /** Forward the KV-transfer fields a client sends (request-limits.ts KV_TRANSFER_FIELDS); removed by default. */
  forwardKvTransferParams?: boolean;
  /** Forward the code fields a client sends (request-limits.ts CLIENT_CODE_FIELDS); removed by default. */
  forwardCustomLogitProcessor?: boolean;
  /**
   * The hosts a chat's media URLs, and the URLs of a /generate body's image_data, video_data and
   * audio_data, may name (media-domains.ts, normalised by mediaDomains());
   * undefined: any (the engines' own settings apply).
   */
  allowedMediaDomains?: MediaDomains;
  /** Counts a request refused for a media URL (contextforge_media_url_refusals_total), by why. */
  onMediaUrlRefusal?: (reason: MediaUrlRefusalReason) => void;
}

/** A malformed request as data: the HTTP status, the message, the offending field. */
export interface RequestRejection {
  status: number;
  message: string;
  param: string | null;
  /** Seconds after which the client may try again (the tokenizer was busy). */
  retryAfterS?: number;
}

/**
 * Returns a parser of requests into what to route on (token ids when the tokenize mode gives
 * them) and the body to forward, or a RequestRejection for a malformed request: the OpenAI
 * paths' bodies, and SGLang's `/generate` (GENERATE_PATH) for the endpoint picker. A tenant's
 * requests get the tenant's cache salt: the engine keys its cache on it, the router its block
 * hashes, so tenants never share KV; their workflow and content-anchor ids are the tenant's own.
 */
export function createRequestParser(options: RequestReaderOptions) {
  const { tokenize: tokenizeMode, promptTokenizer, tokenizeOnEngine, loraOf, limits } = options;
  // one object for every request, read by removedFieldsIn
  const forward: ForwardedFields = {
    forwardKvTransferParams: options.forwardKvTransferParams === true,
    forwardCustomLogitProcessor: options.forwardCustomLogitProcessor === true,
  };
  // one function for every request, called only for the media URLs a chat holds (a /generate
  // body's media fields are walked by checkGenerateMedia)
  const allowed = options.allowedMediaDomains;
  const onMediaUrl =
    allowed === undefined || allowed.size === 0
      ? undefined
      : (url: string, at: string, inObject: boolean) => checkMediaUrl(url, at, inObject, allowed);
  /**
   * `signal`: aborts once the client has left (createRequestReader); a request still waiting for
   * a tokenizer thread is dropped then, and the parser answers CLIENT_CLOSED_REQUEST.
   */
  return async (path: string, req: RequestSource, signal?: AbortSignal): Promise<ParsedRequest | RequestRejection> => {
    let parsed: ParsedRequest;
    try {
      const headers = req.raw === undefined ? req.headers : metadataHeaders(req.raw);
      if (path === GENERATE_PATH) {
        parsed = readGenerateRouteRequest(req.body, headers, limits, forward);
        // SGLang's image_data, video_data and audio_data: URLs it fetches, paths it reads
        if (allowed !== undefined && allowed.size > 0)
          checkGenerateMedia(req.body as Readonly<Record<string, unknown>>, allowed);
      } else parsed = readRouteRequest(path, req.body, headers, limits, forward, onMediaUrl);
    } catch (err) {
      if (err instanceof RequestLimitError) {
        if (err instanceof MediaUrlRefusal) options.onMediaUrlRefusal?.(err.reason);
        return { status: err.status, message: err.message, param: err.param };
      }
      throw err;
    }
    if (req.tenant !== undefined) {
      const tenant = req.tenant;
      const r = parsed.routeRequest;
      // the router's workflow and anchor tables are shared: each tenant's ids are its own
      if (r.workflowId !== undefined) r.workflowId = tenantScopedId(tenant, r.workflowId);
      if (r.contentAnchors !== undefined)
        r.contentAnchors = r.contentAnchors.map((a) => ({ id: tenantScopedId(tenant, a.id), tokens: a.tokens }));
      const salt = tenantCacheSalt(tenant, r.cacheSalt);
      r.cacheSalt = salt;
      parsed.body.cache_salt = salt;
      parsed.unchanged = false;
    }
    // an adapter's blocks are keyed by its name, as the engines key them (vLLM's lora_name and
    // extra_keys; SGLang's radix cache keeps each adapter's blocks apart); on SGLang's /generate
    // by its lora_path (read with the body), whatever a `model` there says
    const lora = path === GENERATE_PATH ? undefined : requestAdapter(parsed.body, loraOf);
    if (lora !== undefined) parsed.routeRequest.lora = lora;
    // a prompt given as token ids is hashed as tokens in every mode; a completion of prompt
    // embeds alone has no prompt to tokenize, and routes with nothing to hash
    const r = parsed.routeRequest;
    if (r.tokens === undefined && r.text === undefined && r.messages === undefined) return parsed;
    if (tokenizeMode === 'engine') {
      const tokens = await tokenizeOnEngine(parsed.routeRequest, parsed.body);
      if (tokens) parsed.routeRequest = { ...parsed.routeRequest, tokens, messages: undefined, text: undefined };
    } else if (tokenizeMode === 'tokenizer' && !parsed.routeRequest.tokens) {
      try {
        // a chat is tokenized with what else shapes its prompt (tools, template options), as vLLM does
        const chat = parsed.routeRequest.messages ? chatTemplateRequest(parsed.body) : undefined;
        const special = parsed.body.add_special_tokens;
        const tokens = await tokenizeWith(promptTokenizer!, parsed.routeRequest, chat, special !== false, signal);
        parsed.routeRequest = { ...parsed.routeRequest, tokens, messages: undefined, text: undefined };
      } catch (err) {
        // images and other media: the engine makes their tokens; route on the text instead
        if (err instanceof UntokenizableContentError) return parsed;
        // a prompt the tokenizer takes too long over (the pool logs and counts it): on its text too
        if (err instanceof TokenizeTimeoutError) return parsed;
        // the client left while the request waited for a thread: nobody is there to answer
        if (signal?.aborted && (err as Error).name === 'AbortError')
          return { status: CLIENT_CLOSED_REQUEST, message: 'the client closed the request', param: null };
        if (err instanceof TokenizerUnavailableError)
          return { status: 503, message: err.message, param: null, retryAfterS: 1 };
        // a template that rejects the conversation (roles out of order, say) is the client's to fix;
        // a message that starts with another chat field (tools[0] must be …) names that field
        const message = clientMessage(err, 'it raised an error');
        return {
          status: 400,
          message: `the chat template rejected the request: ${message}`,
          param: CHAT_FIELD.exec(message)?.[0] ?? 'messages',
        };
      }
    }
    return parsed;
  };
}

export type RequestParser = ReturnType<typeof createRequestParser>;

/**
 * The adapter an OpenAI-route request runs under, as the engine that serves it reads it: the one
 * its `model` names (an adapter's own name, vLLM's form; or SGLang's `base:adapter`), else
 * SGLang's `lora_path` (a name, or a list of one per prompt: the first prompt's keys the chain).
 * SGLang takes the adapter in `model` first, then `lora_path`
 * (python/sglang/srt/entrypoints/openai/serving_base.py, _resolve_lora_path). vLLM ignores a
 * `lora_path` and runs the base model: the router cannot know which engine will serve the request
 * when it hashes it, and keys it by the adapter, since a request that sends `lora_path` is meant
 * for SGLang, and keyed as the base model it would count the base model's blocks as cached on an
 * SGLang worker, which holds none for it (a false hit); on vLLM it only misses (docs/engines.md).
 */
function requestAdapter(
  body: Readonly<Record<string, unknown>>,
  loraOf: ((model: unknown) => string | undefined) | undefined,
): string | undefined {
  return loraOf?.(body.model) ?? firstPromptEntry(body.lora_path);
}

/** The chat fields besides messages that shape a prompt, as the start of a check's message (with an index). */
const CHAT_FIELD =
  /^(?:tools|documents|chat_template_kwargs|add_generation_prompt|continue_final_message)\b(?:\[\d+\])?/;

/**
 * Returns a reader of requests for the HTTP API: it answers a 4xx and returns undefined when
 * the request is malformed.
 */
export function createRequestReader(options: RequestReaderOptions) {
  const parse = createRequestParser(options);
  // a client that leaves while its request waits for a tokenizer thread frees its place
  const cancellable =
    options.tokenize === 'tokenizer' &&
    options.promptTokenizer !== undefined &&
    isAsyncTokenizer(options.promptTokenizer);
  return async (path: string, req: RequestSource, reply: ProxyReply): Promise<ParsedRequest | undefined> => {
    let parsed: ParsedRequest | RequestRejection;
    if (!cancellable) parsed = await parse(path, req);
    else {
      const res = reply.raw;
      const client = new AbortController();
      // the response closes unfinished when the client leaves (closedStatus counts it as 499)
      const onClose = () => {
        if (!res.writableFinished) client.abort();
      };
      if (res.destroyed) client.abort();
      else res.once('close', onClose);
      try {
        parsed = await parse(path, req, client.signal);
      } finally {
        res.off('close', onClose);
      }
    }
    // answered while it waited (a tokenizer thread, an engine's /tokenize): the gateway's shutdown
    // grace ended (ShutdownCuts.wait), and nothing more is done for it
    if (reply.sent) return undefined;
    if ('status' in parsed) {
      if (parsed.status === CLIENT_CLOSED_REQUEST) {
        // nothing is written: the response's close counts the request as its client's leaving
        reply.hijack();
        return undefined;
      }
      if (parsed.retryAfterS !== undefined) reply.header('retry-after', String(parsed.retryAfterS));
      void openAiError(reply, parsed.status, parsed.message, parsed.param);
      return undefined;
    }
    return parsed;
  };
}

export type RequestReader = ReturnType<typeof createRequestReader>;

/**
 * Token ids from an in-process tokenizer or a thread pool, for a chat (with its options, its
 * add_special_tokens among them) or a plain prompt (with the special tokens when `addSpecialTokens`).
 */
function tokenizeWith(
  tokenizer: PromptTokenizer | AsyncPromptTokenizer,
  request: RouteRequest,
  chat: ChatTemplateRequest | undefined,
  addSpecialTokens: boolean,
  signal: AbortSignal | undefined,
): ArrayLike<number> | Promise<ArrayLike<number>> {
  if (isAsyncTokenizer(tokenizer)) return tokenizer.tokenize(request, chat, addSpecialTokens, signal);
  return chat && tokenizer.tokenizeChatRequest
    ? tokenizer.tokenizeChatRequest(chat)
    : tokenizer.tokenize(request, addSpecialTokens);
}

function isAsyncTokenizer(t: PromptTokenizer | AsyncPromptTokenizer): t is AsyncPromptTokenizer {
  return (t as AsyncPromptTokenizer).async === true;
}
