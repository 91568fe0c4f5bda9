import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { BlockHashes, canonicalChatText, hashString32, hashTokenBlocks, type ChatMessage } from '../core/hashing.js';
import { blockKey, EngineModel, type EngineRequest, type StepResult } from '../engine-model/engine-model.js';
import type { KvEvent } from './kv-events/decode.js';
import { KvEventPublisher } from './kv-events/publisher.js';
import type { PromptTokenizer } from './chat-tokenizer.js';

/**
 * A mock inference engine that speaks what a vLLM server speaks, so the router can be run
 * and tested end to end without a GPU: the OpenAI API (/v1/completions, /v1/chat/completions
 * with SSE streaming and the usage chunk, /v1/models), vLLM's /tokenize, /health, /metrics
 * with vLLM's metric names, and KV events over ZeroMQ (PUB + replay ROUTER). Timing and the
 * prefix cache come from the simulator's EngineModel, run in real time: one model of an
 * engine, not two. Prefill takes time in proportion to uncached tokens, so a cache hit shows
 * as a lower time to first token.
 */
export interface MockEngineOptions {
  port?: number;
  host?: string;
  model?: string;
  blockSize?: number;
  kvBlocks?: number;
  /** Longest request (prompt + max_tokens) served, vLLM's --max-model-len (default 131,072, capped by the KV). */
  maxModelLen?: number;
  /** Where the KV-event PUB socket binds (e.g. tcp://127.0.0.1:5557); none: no events. */
  events?: string;
  /** Where the replay ROUTER binds. */
  replay?: string;
  /** Prefill speed (tokens/s) and decode speed (tokens/s per request). */
  prefillTokS?: number;
  decodeTokS?: number;
  /** Largest request body accepted (bytes). */
  maxBodyBytes?: number;
  /** Seeds the engine's own block hashes (vLLM's are seeded per process too). */
  hashSeed?: number;
  /** The model's tokenizer and chat template (default: a deterministic word-level tokenizer). */
  tokenizer?: PromptTokenizer;
  /** Like vLLM's --api-key: /v1 requests need `Authorization: Bearer KEY` (401 otherwise). */
  apiKey?: string;
}

interface Pending {
  request: EngineRequest;
  res: ServerResponse;
  stream: boolean;
  includeUsage: boolean;
  chat: boolean;
  id: string;
  created: number;
  promptTokens: number;
  produced: number;
  cachedTokens: number;
  done: boolean;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param?: string,
  ) {
    super(message);
  }
}

/** Deterministic word-level tokenizer: words, punctuation and whitespace runs → ids. */
export function mockTokenize(text: string): number[] {
  const out: number[] = [];
  for (const piece of text.match(/\s+|\w+|[^\s\w]/gu) ?? []) out.push(256 + (hashString32(piece) % 100_000));
  return out;
}

/** The chat template of the mock: every message with its role, then the assistant's turn. */
export function mockChatPrompt(messages: readonly ChatMessage[]): string {
  return canonicalChatText(messages) + '<|assistant|>\n';
}

export class MockEngine {
  readonly model: string;
  readonly blockSize: number;
  private readonly engine: EngineModel;
  private readonly publisher: KvEventPublisher | undefined;
  private server: Server | undefined;
  private readonly pending = new Map<number, Pending>();
  /** Engine block hash (uint64) per cache key, with what BlockStored must carry. */
  private readonly blocks = new Map<number, { hash: bigint; parent: bigint | null; tokens: number[] }>();
  /** Requests in the engine per block key: a block's metadata outlives them only while cached. */
  private readonly liveKeys = new Map<number, number>();
  private readonly stored: number[] = [];
  private readonly removed: bigint[] = [];
  private nextId = 1;
  private stepping = false;
  private closed = false;
  private prefixQueries = 0;
  private prefixHits = 0;
  private readonly scratch = new BlockHashes(256);
  private readonly maxBodyBytes: number;
  private readonly hashSalt: string;
  private readonly modelStart = Date.now();
  port = 0;

  constructor(private readonly options: MockEngineOptions = {}) {
    this.model = options.model ?? 'mock';
    this.blockSize = options.blockSize ?? 16;
    const prefill = options.prefillTokS ?? 20_000;
    const decode = options.decodeTokS ?? 200;
    if (!(prefill > 0) || !(decode > 0)) throw new RangeError('prefillTokS and decodeTokS must be > 0');
    this.engine = new EngineModel(
      {
        blockTokens: this.blockSize,
        kvTokens: (options.kvBlocks ?? 4096) * this.blockSize,
        ...(options.maxModelLen !== undefined ? { maxModelLen: options.maxModelLen } : {}),
        // a step is one decode interval, or the prefill of its tokens when that is longer
        weightReadMs: 1000 / decode,
        linearMsPerToken: 1000 / prefill,
        attentionMsPerTokenPair: 0,
        kvReadMsPerToken: 0,
      },
      (hi, lo) => this.stored.push(blockKey(hi, lo)),
      (hi, lo) => this.onRemoved(blockKey(hi, lo)),
    );
    this.publisher = options.events ? new KvEventPublisher({ endpoint: options.events, replayEndpoint: options.replay }) : undefined;
    this.maxBodyBytes = options.maxBodyBytes ?? 8 * 1024 * 1024;
    this.hashSalt = `engine-${options.hashSeed ?? Math.floor(Math.random() * 2 ** 31)}`;
  }

  async start(): Promise<this> {
    await this.publisher?.start();
    this.server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject);
      this.server!.listen(this.options.port ?? 0, this.options.host ?? '127.0.0.1', () => resolve());
    });
    this.port = (this.server.address() as AddressInfo).port;
    return this;
  }

  get eventsEndpoint(): string {
    return this.publisher?.endpoint ?? '';
  }

  get replayEndpoint(): string {
    return this.publisher?.replayEndpoint ?? '';
  }

  /** Engine block hashes (decimal) of every block in the cache: the engine's own listing. */
  cacheListing(): string[] {
    return this.engine.cachedKeys().map((k) => this.blocks.get(k)!.hash.toString());
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const p of this.pending.values()) p.res.destroy();
    // close() waits for every connection to end, and clients keep idle ones alive: end them
    const closed = new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
    this.server?.closeAllConnections();
    await closed;
    await this.publisher?.close();
  }

  // ------------------------------------------------------------------------ HTTP

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      const url = new URL(req.url ?? '/', 'http://mock');
      if (req.method === 'GET' && url.pathname === '/health') return void res.writeHead(200).end();
      if (this.options.apiKey !== undefined && url.pathname.startsWith('/v1') && req.headers.authorization !== `Bearer ${this.options.apiKey}`) {
        return json(res, 401, { error: 'Unauthorized' });
      }
      if (req.method === 'GET' && url.pathname === '/v1/models') {
        return json(res, 200, { object: 'list', data: [{ id: this.model, object: 'model', created: Math.floor(this.modelStart / 1000), owned_by: 'contextforge-mock' }] });
      }
      if (req.method === 'GET' && url.pathname === '/metrics') return void res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(this.metricsText());
      if (req.method === 'GET' && url.pathname === '/debug/cache') return json(res, 200, { blockHashes: this.cacheListing() });
      if (req.method !== 'POST') throw new HttpError(404, `no route ${req.method} ${url.pathname}`);
      const body = await readJson(req, this.maxBodyBytes);
      if (url.pathname === '/tokenize') return json(res, 200, this.tokenize(body));
      if (url.pathname === '/v1/completions') return this.generate(body, res, false);
      if (url.pathname === '/v1/chat/completions') return this.generate(body, res, true);
      throw new HttpError(404, `no route POST ${url.pathname}`);
    } catch (err) {
      const e = err instanceof HttpError ? err : new HttpError(500, (err as Error).message);
      if (!res.headersSent) json(res, e.status, { error: { message: e.message, type: e.status < 500 ? 'invalid_request_error' : 'server_error', param: e.param ?? null, code: null } });
      else res.end();
    }
  }

  private tokenize(body: Record<string, unknown>): { tokens: number[]; count: number; max_model_len: number } {
    const tokens = body.messages !== undefined ? this.chatTokens(body.messages) : this.promptTokens(body.prompt);
    return { tokens, count: tokens.length, max_model_len: this.engine.maxModelLen };
  }

  private chatTokens(messages: unknown): number[] {
    const checked = checkMessages(messages);
    if (!this.options.tokenizer) return mockTokenize(mockChatPrompt(checked));
    try {
      return this.options.tokenizer.tokenize({ messages: checked });
    } catch (err) {
      throw new HttpError(400, `the chat template rejected the messages: ${(err as Error).message}`, 'messages');
    }
  }

  private promptTokens(prompt: unknown): number[] {
    if (typeof prompt === 'string') return this.options.tokenizer ? this.options.tokenizer.tokenize({ text: prompt }) : mockTokenize(prompt);
    if (Array.isArray(prompt) && prompt.every((t) => Number.isInteger(t) && t >= 0 && t < 2 ** 32)) return prompt as number[];
    if (Array.isArray(prompt) && prompt.length === 1) return this.promptTokens(prompt[0]);
    throw new HttpError(400, 'prompt must be a string, a list of token ids, or a list with one of those', 'prompt');
  }

  private generate(body: Record<string, unknown>, res: ServerResponse, chat: boolean): void {
    if (body.model !== undefined && body.model !== this.model) throw new HttpError(404, `model '${String(body.model)}' does not exist`, 'model');
    const tokens = chat ? this.chatTokens(body.messages) : this.promptTokens(body.prompt);
    if (tokens.length === 0) throw new HttpError(400, 'the prompt is empty', chat ? 'messages' : 'prompt');
    const maxTokens = body.max_tokens ?? body.max_completion_tokens ?? 16;
    if (!Number.isInteger(maxTokens) || (maxTokens as number) < 1 || (maxTokens as number) > 100_000) throw new HttpError(400, 'max_tokens must be an integer from 1 to 100000', 'max_tokens');
    if (body.stream !== undefined && typeof body.stream !== 'boolean') throw new HttpError(400, 'stream must be a boolean', 'stream');
    const salt = body.cache_salt;
    if (salt !== undefined && (typeof salt !== 'string' || salt === '')) throw new HttpError(400, 'cache_salt must be a non-empty string', 'cache_salt');
    const streamOptions = body.stream_options as { include_usage?: unknown } | undefined;

    // over the context limit: refused before it reaches the engine, in vLLM's words and shape
    const refused = this.engine.rejection({ inputTokens: tokens.length, outputTokens: maxTokens as number });
    if (refused !== null) return json(res, 400, { error: { message: refused, type: 'BadRequestError', param: null, code: 400 } });

    // the engine's own block hashes: seeded per process, keyed by cache_salt, as vLLM's
    const h = hashTokenBlocks(tokens, this.blockSize, { cacheSalt: `${this.hashSalt}/${(salt as string | undefined) ?? ''}` }, this.scratch);
    const keys = new Float64Array(h.length);
    let parent: bigint | null = null;
    for (let i = 0; i < h.length; i++) {
      keys[i] = blockKey(h.hi[i], h.lo[i]);
      const hash = (BigInt(h.hi[i]) << 32n) | BigInt(h.lo[i]);
      if (!this.blocks.has(keys[i])) this.blocks.set(keys[i], { hash, parent, tokens: tokens.slice(i * this.blockSize, (i + 1) * this.blockSize) });
      parent = hash;
    }
    const id = this.nextId++;
    const request: EngineRequest = { id, keys, hashHi: h.hi.slice(0, h.length), hashLo: h.lo.slice(0, h.length), inputTokens: tokens.length, outputTokens: maxTokens as number };
    const p: Pending = {
      request, res, chat, stream: body.stream === true, includeUsage: streamOptions?.include_usage === true,
      id: `${chat ? 'chatcmpl' : 'cmpl'}-mock-${id}`, created: Math.floor(Date.now() / 1000), promptTokens: tokens.length,
      produced: 0, cachedTokens: 0, done: false,
    };
    this.pending.set(id, p);
    this.prefixQueries += tokens.length;
    if (p.stream) res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
    // a client that goes away takes its request out of the engine
    res.on('close', () => {
      if (!p.done) {
        p.done = true;
        this.pending.delete(id);
        this.engine.cancel(id);
        this.forget(request);
      }
    });
    for (const key of keys) this.liveKeys.set(key, (this.liveKeys.get(key) ?? 0) + 1);
    this.engine.enqueue(request);
    this.pump();
  }

  // ------------------------------------------------------------------- engine loop

  private pump(): void {
    if (this.stepping || this.closed || this.engine.idle) return;
    this.stepping = true;
    const start = Date.now() - this.modelStart;
    // runs of decode steps are cut at 50 ms so streams flow and new requests join soon; the
    // step is scheduled now and its outputs land when it ends, so /metrics reads it in between
    const end = this.engine.startStep(start, start + 50);
    this.flushEvents();
    setTimeout(() => {
      this.stepping = false;
      const step = this.engine.finishStep();
      this.flushEvents();
      this.finishStep(step);
      this.pump();
    }, Math.max(0, end - start));
  }

  private finishStep(step: StepResult): void {
    for (const { request, cachedTokens } of step.firstTokens) {
      const p = this.pending.get(request.id);
      if (!p) continue;
      p.cachedTokens = cachedTokens;
      this.prefixHits += cachedTokens;
      this.emitTokens(p, 1);
    }
    for (const { request, tokens } of step.decoded) {
      const p = this.pending.get(request.id);
      if (p) this.emitTokens(p, tokens);
    }
    for (const request of step.finished) {
      const p = this.pending.get(request.id);
      if (p) this.finish(p);
    }
  }

  private emitTokens(p: Pending, n: number): void {
    const text = Array.from({ length: n }, (_, k) => `tok${(p.produced + k) % 1000} `).join('');
    p.produced += n;
    if (!p.stream) return;
    const choice = p.chat
      ? { index: 0, delta: p.produced === n ? { role: 'assistant', content: text } : { content: text }, finish_reason: null }
      : { index: 0, text, finish_reason: null };
    sse(p.res, { id: p.id, object: p.chat ? 'chat.completion.chunk' : 'text_completion', created: p.created, model: this.model, choices: [choice] });
  }

  /**
   * A request left the engine: the metadata of blocks no other request in the engine shares
   * and the engine does not cache (never computed, or computed twice) goes too. Blocks the
   * engine caches keep theirs until BlockRemoved.
   */
  private forget(request: EngineRequest): void {
    for (const key of request.keys) {
      const n = (this.liveKeys.get(key) ?? 1) - 1;
      if (n > 0) {
        this.liveKeys.set(key, n);
        continue;
      }
      this.liveKeys.delete(key);
      if (!this.engine.holds(key)) this.blocks.delete(key);
    }
  }

  private finish(p: Pending): void {
    p.done = true;
    this.pending.delete(p.request.id);
    this.forget(p.request);
    const usage = {
      prompt_tokens: p.promptTokens,
      completion_tokens: p.produced,
      total_tokens: p.promptTokens + p.produced,
      prompt_tokens_details: { cached_tokens: p.cachedTokens },
    };
    if (p.stream) {
      const last = p.chat ? { index: 0, delta: {}, finish_reason: 'length' } : { index: 0, text: '', finish_reason: 'length' };
      sse(p.res, { id: p.id, object: p.chat ? 'chat.completion.chunk' : 'text_completion', created: p.created, model: this.model, choices: [last] });
      if (p.includeUsage) sse(p.res, { id: p.id, object: p.chat ? 'chat.completion.chunk' : 'text_completion', created: p.created, model: this.model, choices: [], usage });
      p.res.end('data: [DONE]\n\n');
      return;
    }
    const text = Array.from({ length: p.produced }, (_, k) => `tok${k % 1000} `).join('');
    json(p.res, 200, {
      id: p.id,
      object: p.chat ? 'chat.completion' : 'text_completion',
      created: p.created,
      model: this.model,
      choices: [p.chat ? { index: 0, message: { role: 'assistant', content: text }, finish_reason: 'length' } : { index: 0, text, finish_reason: 'length' }],
      usage,
    });
  }

  // ---------------------------------------------------------------------- events

  private onRemoved(key: number): void {
    const b = this.blocks.get(key);
    if (b) this.removed.push(b.hash);
    // a request still in the engine may compute the block again and must announce it then
    if (!this.liveKeys.has(key)) this.blocks.delete(key);
  }

  /** One batch per step: consecutive stored blocks of a chain in one BlockStored, then removals. */
  private flushEvents(): void {
    const events: KvEvent[] = [];
    let current: Extract<KvEvent, { type: 'BlockStored' }> | undefined;
    for (const key of this.stored) {
      const b = this.blocks.get(key);
      if (!b) continue;
      const last = current?.blockHashes[current.blockHashes.length - 1];
      if (current && b.parent === last) {
        current.blockHashes.push(b.hash);
        current.tokenIds.push(...b.tokens);
      } else {
        current = { type: 'BlockStored', blockHashes: [b.hash], parentBlockHash: b.parent, tokenIds: [...b.tokens], blockSize: this.blockSize, loraId: null, medium: 'GPU', loraName: null, groupIdx: null };
        events.push(current);
      }
    }
    if (this.removed.length > 0) events.push({ type: 'BlockRemoved', blockHashes: [...this.removed], medium: 'GPU', groupIdx: null });
    this.stored.length = 0;
    this.removed.length = 0;
    if (events.length > 0 && this.publisher) void this.publisher.publish({ ts: Date.now() / 1000, events, dataParallelRank: 0 });
  }

  private metricsText(): string {
    const label = `{model_name="${this.model}",engine="0"}`;
    return [
      '# HELP vllm:num_requests_running Number of requests in model execution batches.',
      '# TYPE vllm:num_requests_running gauge',
      `vllm:num_requests_running${label} ${this.engine.runningCount}`,
      '# HELP vllm:num_requests_waiting Number of requests waiting to be processed.',
      '# TYPE vllm:num_requests_waiting gauge',
      `vllm:num_requests_waiting${label} ${this.engine.waitingCount}`,
      '# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.',
      '# TYPE vllm:kv_cache_usage_perc gauge',
      `vllm:kv_cache_usage_perc${label} ${this.engine.kvUsage}`,
      '# TYPE vllm:prefix_cache_queries counter',
      `vllm:prefix_cache_queries_total${label} ${this.prefixQueries}`,
      '# TYPE vllm:prefix_cache_hits counter',
      `vllm:prefix_cache_hits_total${label} ${this.prefixHits}`,
      '',
    ].join('\n');
  }
}

function checkMessages(messages: unknown): ChatMessage[] {
  if (!Array.isArray(messages) || messages.length === 0) throw new HttpError(400, 'messages must be a non-empty array', 'messages');
  messages.forEach((m, i) => {
    if (m === null || typeof m !== 'object' || typeof (m as ChatMessage).role !== 'string') throw new HttpError(400, `messages[${i}] must have a string role`, 'messages');
  });
  return messages as ChatMessage[];
}

async function readJson(req: IncomingMessage, limit: number): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > limit) throw new HttpError(413, `request body over ${limit} bytes`);
    chunks.push(chunk as Buffer);
  }
  let body: unknown;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch {
    throw new HttpError(400, 'the body is not valid JSON');
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) throw new HttpError(400, 'the body must be a JSON object');
  return body as Record<string, unknown>;
}

function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function sse(res: ServerResponse, body: unknown): void {
  res.write(`data: ${JSON.stringify(body)}\n\n`);
}
