/**
 * The completion routes' common case, served before Fastify: a POST of a JSON body with a
 * Content-Length within the body limit, to /v1/completions or /v1/chat/completions exactly,
 * without API keys. It runs the same handler as the Fastify route (proxy.ts) and answers
 * errors as the gateway's error handler does, but skips Fastify's per-request work (request and
 * reply objects, routing, hooks, the body parser's stream plumbing): on a small request that
 * work is a measurable share of the router's CPU. Everything else — other methods and paths,
 * query strings, chunked, compressed or oversized bodies, other content types, API keys, a
 * closing gateway — goes to Fastify unchanged.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { closedStatus, markCutByGateway } from './metrics.js';
import {
  forwardableBytes,
  parseRequestBody,
  type OpenAiPath,
  type ProxyReply,
  type RequestSource,
} from './openai-request.js';
import type { JsonLimits } from './request-limits.js';

/** application/json, with or without parameters. */
const JSON_TYPE = /^application\/json\s*(;|$)/i;

export interface FastPathOptions {
  /** The proxy handler of each path. */
  handlers: ReadonlyMap<string, (req: RequestSource, reply: ProxyReply) => Promise<unknown>>;
  bodyLimit: number;
  /** The gateway's limits on a JSON body. */
  jsonLimits: JsonLimits;
  /** Answers an error as the gateway's error handler does. */
  answerError: (err: unknown, path: OpenAiPath, reply: ProxyReply) => void;
  /** Counts the request once its response has closed (the gateway's request metric). */
  countRequest: (path: string, status: number) => void;
  /** The status a response counts with once it has closed (default: closedStatus). */
  statusOnClose?: (res: ServerResponse) => number;
  /** True once the gateway is closing: Fastify answers (503) from then on. */
  closing: () => boolean;
}

/** Returns a server-level handler: true when it took the request, false to leave it to Fastify. */
export function createFastPath(o: FastPathOptions): (req: IncomingMessage, res: ServerResponse) => boolean {
  return (req, res) => {
    if (req.method !== 'POST') return false;
    const handler = o.handlers.get(req.url ?? '');
    if (handler === undefined || o.closing()) return false;
    const h = req.headers;
    const type = h['content-type'];
    const length = h['content-length'];
    if (
      type === undefined ||
      length === undefined ||
      h['transfer-encoding'] !== undefined ||
      h['content-encoding'] !== undefined ||
      !JSON_TYPE.test(type)
    )
      return false;
    const size = Number(length);
    if (!(size <= o.bodyLimit)) return false;
    new FastRequest(req.url as OpenAiPath, req, res, handler, o);
    return true;
  };
}

/** One request on the fast path: its body read, then the route's handler with a minimal reply. */
class FastRequest implements ProxyReply {
  /** The body's chunks as read; let go of once the body is parsed (the handler holds it from there). */
  private chunks: Buffer[] | undefined = [];
  private status = 200;
  private headers: Record<string, string> | undefined;
  private hijacked = false;

  constructor(
    private readonly path: OpenAiPath,
    private readonly req: IncomingMessage,
    readonly raw: ServerResponse,
    private readonly handler: (req: RequestSource, reply: ProxyReply) => Promise<unknown>,
    private readonly o: FastPathOptions,
  ) {
    req.on('data', (chunk: Buffer) => this.chunks?.push(chunk));
    req.on('end', () => this.run());
    // a client that leaves mid-body: Node closes the socket; nothing to answer
    req.on('error', () => {});
    // counted once it closes, answered or not: a client that left first counts as 499
    raw.once('close', () => o.countRequest(path, (o.statusOnClose ?? closedStatus)(raw)));
  }

  private run(): void {
    const chunks = this.chunks ?? [];
    // this reply lives as long as the answer (a stream: minutes); the body must not live with it
    this.chunks = undefined;
    // answered while its body was arriving (cut as too slow): nothing of it goes to an engine
    if (this.raw.writableEnded) return;
    const bytes = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
    let body: unknown;
    try {
      body = parseRequestBody(bytes, this.o.jsonLimits);
    } catch (err) {
      // as Fastify answers a body its parser rejects: the connection is not reused, so what
      // the client sent after an unreadable body is not read as a request
      this.header('connection', 'close');
      return this.o.answerError(err, this.path, this);
    }
    const req = this.req;
    const source: RequestSource = { body, headers: req.headers, rawBody: forwardableBytes(bytes), raw: req };
    this.handler(source, this).catch((err: unknown) => {
      if (!this.sent && !this.raw.headersSent) this.o.answerError(err, this.path, this);
      else if (!this.raw.writableEnded) {
        markCutByGateway(this.raw);
        this.raw.destroy();
      }
    });
  }

  get sent(): boolean {
    return this.hijacked || this.raw.writableEnded;
  }

  code(status: number): this {
    this.status = status;
    return this;
  }

  header(name: string, value: string): this {
    (this.headers ??= {})[name.toLowerCase()] = value;
    return this;
  }

  /** An object answered as JSON, as Fastify serialises it. */
  send(payload: unknown): this {
    if (this.sent) return this;
    const text = JSON.stringify(payload);
    const headers = this.headers ?? {};
    headers['content-type'] = 'application/json; charset=utf-8';
    headers['content-length'] = String(Buffer.byteLength(text));
    this.raw.writeHead(this.status, headers);
    this.raw.end(text);
    return this;
  }

  hijack(): this {
    this.hijacked = true;
    return this;
  }
}
