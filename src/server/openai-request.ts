/**
 * Reading OpenAI requests: the JSON body parser (the raw body is kept so an unchanged request
 * is forwarded byte for byte), the translation of the body plus ContextForge's metadata (the
 * `contextforge` field or the x-* headers of DESIGN.md §5) into a RouteRequest, prompt
 * tokenization by the configured mode, and OpenAI-style JSON error answers.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ChatMessage } from '../core/hashing.js';
import type { RouteRequest } from '../core/router/index.js';
import { UntokenizableContentError, type ChatTemplateRequest, type PromptTokenizer } from '../engines/chat-tokenizer.js';
import { chatTemplateRequest } from './engine-deployments.js';
import { TokenizerUnavailableError, type AsyncPromptTokenizer } from '../engines/tokenizer-pool.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** The body as received: forwarded as is when the router changes nothing in it (no re-serialisation). */
    rawBody?: string;
  }
}

const METADATA_FIELD = 'contextforge';

export type OpenAiPath = '/v1/completions' | '/v1/chat/completions';

/** A malformed request: answered with `status` and the offending field as the error's `param`. */
export class RequestError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

/** Answers with an OpenAI-style error body. */
export function openAiError(reply: FastifyReply, status: number, message: string, param: string | null = null): FastifyReply {
  return reply.code(status).send({ error: { message, type: status >= 500 ? 'server_error' : 'invalid_request_error', param, code: null } });
}

/**
 * JSON bodies are parsed once and kept as received, so an unchanged body is forwarded
 * without serialising it again; clients that send JSON without saying so (curl -d) are
 * read as JSON too. JSON.parse makes "__proto__" an own key, never the prototype.
 */
export function useJsonBodies(app: FastifyInstance): void {
  app.decorateRequest('rawBody', undefined);
  const parseJson = (req: FastifyRequest, body: string | Buffer, done: (err: Error | null, body?: unknown) => void) => {
    if (body === '') return done(null, undefined);
    try {
      const parsed: unknown = JSON.parse(body as string);
      req.rawBody = body as string;
      done(null, parsed);
    } catch {
      done(Object.assign(new Error('the body is not valid JSON'), { statusCode: 400 }), undefined);
    }
  };
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, parseJson);
  app.addContentTypeParser('*', { parseAs: 'string' }, parseJson);
}

/** A request read for routing: what to route on, the body to forward, and whether that body is the one received. */
export interface ParsedRequest {
  routeRequest: RouteRequest;
  body: Record<string, unknown>;
  unchanged: boolean;
}

/** Reads the request: what to route on, and the body to forward (metadata field removed). */
/** What parseRequest reads of a request: a Fastify request, or one assembled by another front end (the endpoint picker). */
export interface RequestSource {
  body: unknown;
  headers: Readonly<Record<string, string | string[] | undefined>>;
}

export function parseRequest(path: string, req: RequestSource): ParsedRequest {
  const raw = req.body;
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new RequestError(400, 'the body must be a JSON object');
  const { [METADATA_FIELD]: meta, ...body } = raw as Record<string, unknown>;
  if (meta !== undefined && (meta === null || typeof meta !== 'object' || Array.isArray(meta))) throw new RequestError(400, `"${METADATA_FIELD}" must be an object`, METADATA_FIELD);
  const m = (meta ?? {}) as Record<string, unknown>;
  const h = req.headers;
  const header = (name: string) => (typeof h[name] === 'string' ? (h[name] as string) : undefined);
  const int = (v: unknown, name: string): number | undefined => {
    if (v === undefined) return undefined;
    const n = typeof v === 'string' ? Number(v) : v;
    if (typeof n !== 'number' || !Number.isInteger(n) || n < 0) throw new RequestError(400, `${name} must be a non-negative integer`, name);
    return n;
  };
  const anchorsRaw = m.anchors ?? header('x-anchor-ids')?.split(',').map((s) => s.trim()).filter(Boolean);
  let contentAnchors: RouteRequest['contentAnchors'];
  if (anchorsRaw !== undefined) {
    if (!Array.isArray(anchorsRaw)) throw new RequestError(400, 'anchors must be a list', 'anchors');
    contentAnchors = anchorsRaw.map((a) => {
      if (typeof a === 'string') {
        const [id, tokens] = a.split(':');
        return { id, tokens: tokens === undefined ? 0 : int(tokens, 'x-anchor-ids tokens')! };
      }
      return a as { id: string; tokens: number };
    });
  }
  const isolate = m.isolate === true || header('x-kv-isolate') === '1' || header('x-kv-isolate') === 'true';
  const routeRequest: RouteRequest = {
    workflowId: (m.workflowId as string | undefined) ?? header('x-workflow-id'),
    workflowStep: int(m.workflowStep ?? header('x-workflow-step'), 'x-workflow-step') ?? null,
    agentRole: (m.agentRole as string | undefined) ?? header('x-agent-role'),
    claGroup: int(m.claGroup ?? header('x-cla-group'), 'x-cla-group') ?? null,
    contentAnchors,
    isolate: isolate || undefined,
  };
  if (typeof body.cache_salt === 'string') routeRequest.cacheSalt = body.cache_salt;
  if (path === '/v1/chat/completions') {
    const messages = body.messages;
    if (!Array.isArray(messages) || messages.length === 0) throw new RequestError(400, 'messages must be a non-empty array', 'messages');
    messages.forEach((msg, i) => {
      if (msg === null || typeof msg !== 'object' || typeof (msg as ChatMessage).role !== 'string') throw new RequestError(400, `messages[${i}] must have a string role`, 'messages');
    });
    routeRequest.messages = messages as ChatMessage[];
  } else {
    const prompt = body.prompt;
    const first = Array.isArray(prompt) && prompt.length > 0 && (typeof prompt[0] === 'string' || Array.isArray(prompt[0])) ? prompt[0] : prompt;
    if (typeof first === 'string') routeRequest.text = first;
    else if (Array.isArray(first) && first.every((t) => Number.isInteger(t) && t >= 0)) routeRequest.tokens = first as number[];
    else throw new RequestError(400, 'prompt must be a string, a list of strings, token ids, or a list of token-id lists', 'prompt');
  }
  return { routeRequest, body, unchanged: meta === undefined };
}

export interface RequestReaderOptions {
  /** How prompts are hashed (see GatewayOptions.tokenize). */
  tokenize: 'text' | 'tokenizer' | 'engine';
  /** In process (blocks the event loop while it works) or a TokenizerPool on worker threads. */
  promptTokenizer?: PromptTokenizer | AsyncPromptTokenizer;
  /** Token ids from an engine's /tokenize (given the request's body); undefined when none answers (text mode then). */
  tokenizeOnEngine: (r: RouteRequest, body: Record<string, unknown>) => Promise<number[] | undefined>;
  /** The LoRA adapter a request's model names, if it names one (its blocks are keyed by it). */
  loraOf?: (model: unknown) => string | undefined;
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
 * them) and the body to forward, or a RequestRejection for a malformed request.
 */
export function createRequestParser(options: RequestReaderOptions) {
  const { tokenize: tokenizeMode, promptTokenizer, tokenizeOnEngine, loraOf } = options;
  return async (path: string, req: RequestSource): Promise<ParsedRequest | RequestRejection> => {
    let parsed: ParsedRequest;
    try {
      parsed = parseRequest(path, req);
    } catch (err) {
      if (err instanceof RequestError || err instanceof RangeError || err instanceof TypeError) {
        return { status: err instanceof RequestError ? err.status : 400, message: err.message, param: err instanceof RequestError ? err.param : null };
      }
      throw err;
    }
    // an adapter's blocks are keyed by its name, as vLLM keys them (lora_name, extra_keys)
    const lora = loraOf?.(parsed.body.model);
    if (lora !== undefined) parsed.routeRequest.lora = lora;
    // a prompt given as token ids is hashed as tokens in every mode
    if (tokenizeMode === 'engine') {
      const tokens = await tokenizeOnEngine(parsed.routeRequest, parsed.body);
      if (tokens) parsed.routeRequest = { ...parsed.routeRequest, tokens, messages: undefined, text: undefined };
    } else if (tokenizeMode === 'tokenizer' && !parsed.routeRequest.tokens) {
      try {
        // a chat is tokenized with what else shapes its prompt (tools, template options), as vLLM does
        const chat = parsed.routeRequest.messages ? chatTemplateRequest(parsed.body) : undefined;
        const tokens = await tokenizeWith(promptTokenizer!, parsed.routeRequest, chat);
        parsed.routeRequest = { ...parsed.routeRequest, tokens, messages: undefined, text: undefined };
      } catch (err) {
        // images and other media: the engine makes their tokens; route on the text instead
        if (err instanceof UntokenizableContentError) return parsed;
        if (err instanceof TokenizerUnavailableError) return { status: 503, message: err.message, param: null, retryAfterS: 1 };
        // a template that rejects the conversation (roles out of order, say) is the client's to fix
        return { status: 400, message: `the chat template rejected the request: ${(err as Error).message}`, param: 'messages' };
      }
    }
    return parsed;
  };
}

export type RequestParser = ReturnType<typeof createRequestParser>;

/**
 * Returns a reader of requests for the HTTP API: it answers a 4xx and returns undefined when
 * the request is malformed.
 */
export function createRequestReader(options: RequestReaderOptions) {
  const parse = createRequestParser(options);
  return async (path: string, req: FastifyRequest, reply: FastifyReply): Promise<ParsedRequest | undefined> => {
    const parsed = await parse(path, req);
    if ('status' in parsed) {
      if (parsed.retryAfterS !== undefined) reply.header('retry-after', String(parsed.retryAfterS));
      void openAiError(reply, parsed.status, parsed.message, parsed.param);
      return undefined;
    }
    return parsed;
  };
}

export type RequestReader = ReturnType<typeof createRequestReader>;

/** Token ids from an in-process tokenizer or a thread pool, for a chat (with its options) or a plain prompt. */
function tokenizeWith(
  tokenizer: PromptTokenizer | AsyncPromptTokenizer,
  request: RouteRequest,
  chat: ChatTemplateRequest | undefined,
): ArrayLike<number> | Promise<ArrayLike<number>> {
  if (isAsyncTokenizer(tokenizer)) return tokenizer.tokenize(request, chat);
  return chat && tokenizer.tokenizeChatRequest ? tokenizer.tokenizeChatRequest(chat) : tokenizer.tokenize(request);
}

function isAsyncTokenizer(t: PromptTokenizer | AsyncPromptTokenizer): t is AsyncPromptTokenizer {
  return (t as AsyncPromptTokenizer).async === true;
}
