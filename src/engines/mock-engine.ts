import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { BlockHashes, canonicalChatText, hashString32, hashTokenBlocks, type ChatMessage } from '../core/hashing.js';
import { checkChatMessages } from '../core/chat-messages.js';
import { blockKey, EngineModel, type EngineRequest, type StepResult } from '../engine-model/engine-model.js';
import { VllmBlockHasher } from '../core/vllm-block-hash.js';
import type { BlockStoredEvent, KvEvent } from './kv-events/decode.js';
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
 *
 * Deployment shapes, as vLLM has them:
 * - `dataParallelSize` N: N engine cores behind one HTTP port, each with its own KV cache,
 *   publishing its events on the events port + rank (vllm/distributed/kv_events.py
 *   offset_endpoint_port) with `data_parallel_rank` set; a request's `X-data-parallel-rank`
 *   header picks its core, otherwise the least busy one takes it.
 * - `loraModules`: adapters served beside the base model; /v1/models lists each with
 *   `parent` = the base model (vLLM's ModelCard); a request naming an adapter has its blocks
 *   keyed by the adapter (`lora_name`, and extra_keys as vllm/v1/core/kv_cache_utils.py).
 * - `blockHash: 'vllm'`: the engine's block hashes are vLLM's sha256_cbor hashes seeded from
 *   `pythonHashSeed` (as PYTHONHASHSEED), published as 64-bit ints
 *   (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES); otherwise they are seeded per process, unknowable.
 */
export interface MockEngineOptions {
  port?: number;
  host?: string;
  model?: string;
  blockSize?: number;
  kvBlocks?: number;
  /** Where the KV-event PUB socket binds (e.g. tcp://127.0.0.1:5557); none: no events. */
  events?: string;
  /** Where the replay ROUTER binds. */
  replay?: string;
  /** Prefill speed (tokens/s) and decode speed (tokens/s per request). */
  prefillTokS?: number;
  decodeTokS?: number;
  /** Longest request (prompt + max_tokens) served, vLLM's --max-model-len (default 131,072, capped by the KV). */
  maxModelLen?: number;
  /** Largest request body accepted (bytes). */
  maxBodyBytes?: number;
  /** Seeds the engine's own block hashes (vLLM's are seeded per process too). */
  hashSeed?: number;
  /** The model's tokenizer and chat template (default: a deterministic word-level tokenizer). */
  tokenizer?: PromptTokenizer;
  /** Like vLLM's --api-key: /v1 requests need `Authorization: Bearer KEY` (401 otherwise). */
  apiKey?: string;
  /** Engine cores (vLLM's --data-parallel-size), each its own KV cache and event port (default 1). */
  dataParallelSize?: number;
  /** LoRA adapters served beside the base model (vLLM's --lora-modules). */
  loraModules?: readonly string[];
  /** 'vllm': block hashes are vLLM's sha256_cbor ones from `pythonHashSeed` (default: per-process seed). */
  blockHash?: 'mock' | 'vllm';
  pythonHashSeed?: string;
}

/** One engine core (a data-parallel rank): its KV cache, its event stream. */
interface RankCore {
  rank: number;
  engine: EngineModel;
  publisher: KvEventPublisher | undefined;
  /** Engine block hash (uint64) per cache key, with what BlockStored must carry. */
  blocks: Map<number, EngineBlock>;
  /** Requests in the core per block key: a block's metadata outlives them only while cached. */
  liveKeys: Map<number, number>;
  stored: number[];
  removed: bigint[];
  stepping: boolean;
  prefixQueries: number;
  prefixHits: number;
  inFlight: number;
}

interface EngineBlock {
  hash: bigint;
  parent: bigint | null;
  tokens: number[];
  lora: string | null;
  loraId: number | null;
  /** vLLM's extra_keys of the block (LoRA name, the salt on a prompt's first block). */
  extraKeys: string[] | null;
}

interface Pending {
  request: EngineRequest;
  res: ServerResponse;
  stream: boolean;
  includeUsage: boolean;
  chat: boolean;
  core: RankCore;
  model: string;
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
  readonly dataParallelSize: number;
  readonly loraModules: readonly string[];
  private readonly cores: RankCore[] = [];
  private server: Server | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private closed = false;
  private readonly scratch = new BlockHashes(256);
  private readonly maxBodyBytes: number;
  private readonly hashSalt: string;
  private readonly vllmHasher: VllmBlockHasher | undefined;
  private readonly modelStart = Date.now();
  port = 0;

  constructor(private readonly options: MockEngineOptions = {}) {
    this.model = options.model ?? 'mock';
    this.blockSize = options.blockSize ?? 16;
    this.dataParallelSize = options.dataParallelSize ?? 1;
    if (!Number.isInteger(this.dataParallelSize) || this.dataParallelSize < 1 || this.dataParallelSize > 64)
      throw new RangeError(`dataParallelSize must be an integer from 1 to 64, got ${options.dataParallelSize}`);
    this.loraModules = [...(options.loraModules ?? [])];
    for (const name of this.loraModules) {
      if (typeof name !== 'string' || !/^[\w.:/-]{1,128}$/.test(name) || name === this.model)
        throw new RangeError(`loraModules: '${String(name)}' is not a usable adapter name`);
    }
    const prefill = options.prefillTokS ?? 20_000;
    const decode = options.decodeTokS ?? 200;
    if (!(prefill > 0) || !(decode > 0)) throw new RangeError('prefillTokS and decodeTokS must be > 0');
    if (options.replay && !options.events) throw new RangeError('replay needs events');
    for (let rank = 0; rank < this.dataParallelSize; rank++) {
      const core: RankCore = {
        rank,
        engine: undefined as unknown as EngineModel,
        publisher: undefined,
        blocks: new Map(),
        liveKeys: new Map(),
        stored: [],
        removed: [],
        stepping: false,
        prefixQueries: 0,
        prefixHits: 0,
        inFlight: 0,
      };
      core.engine = new EngineModel(
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
        (hi, lo) => core.stored.push(blockKey(hi, lo)),
        (hi, lo) => this.onRemoved(core, blockKey(hi, lo)),
      );
      if (options.events) {
        core.publisher = new KvEventPublisher({
          endpoint: offsetEndpointPort(options.events, rank),
          replayEndpoint: options.replay ? offsetEndpointPort(options.replay, rank) : undefined,
        });
      }
      this.cores.push(core);
    }
    this.maxBodyBytes = options.maxBodyBytes ?? 8 * 1024 * 1024;
    this.hashSalt = `engine-${options.hashSeed ?? Math.floor(Math.random() * 2 ** 31)}`;
    if (options.blockHash === 'vllm') {
      if (options.pythonHashSeed === undefined)
        throw new RangeError("blockHash 'vllm' needs pythonHashSeed (the engine's PYTHONHASHSEED)");
      this.vllmHasher = new VllmBlockHasher(options.pythonHashSeed);
    }
  }

  async start(): Promise<this> {
    try {
      for (const core of this.cores) await core.publisher?.start();
      this.server = createServer((req, res) => void this.handle(req, res));
      await new Promise<void>((resolve, reject) => {
        this.server!.once('error', reject);
        this.server!.listen(this.options.port ?? 0, this.options.host ?? '127.0.0.1', () => resolve());
      });
    } catch (err) {
      // a taken port: release what did start (a rank's sockets would keep the process alive)
      await this.close().catch(() => {});
      throw err;
    }
    this.port = (this.server.address() as AddressInfo).port;
    return this;
  }

  /** Rank 0's event endpoint (rank r's: the port + r). */
  get eventsEndpoint(): string {
    return this.cores[0].publisher?.endpoint ?? '';
  }

  get replayEndpoint(): string {
    return this.cores[0].publisher?.replayEndpoint ?? '';
  }

  /** Every rank's event endpoint, in rank order. */
  get eventsEndpoints(): string[] {
    return this.cores.map((c) => c.publisher?.endpoint ?? '');
  }

  /** Engine block hashes (decimal) of every block in a rank's cache: the engine's own listing. */
  cacheListing(rank = 0): string[] {
    const core = this.cores[rank];
    return core.engine.cachedKeys().map((k) => core.blocks.get(k)!.hash.toString());
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const p of this.pending.values()) p.res.destroy();
    // close() waits for every connection to end, and clients keep idle ones alive: end them
    const closed = new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
    this.server?.closeAllConnections();
    await closed;
    for (const core of this.cores) await core.publisher?.close();
  }

  // ------------------------------------------------------------------------ HTTP

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      const url = new URL(req.url ?? '/', 'http://mock');
      if (req.method === 'GET' && url.pathname === '/health') return void res.writeHead(200).end();
      if (
        this.options.apiKey !== undefined &&
        url.pathname.startsWith('/v1') &&
        req.headers.authorization !== `Bearer ${this.options.apiKey}`
      ) {
        return json(res, 401, { error: 'Unauthorized' });
      }
      if (req.method === 'GET' && url.pathname === '/v1/models') {
        return json(res, 200, this.modelList());
      }
      if (req.method === 'GET' && url.pathname === '/metrics')
        return void res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(this.metricsText());
      if (req.method === 'GET' && url.pathname === '/debug/cache')
        return json(res, 200, { blockHashes: this.cacheListing() });
      if (req.method !== 'POST') throw new HttpError(404, `no route ${req.method} ${url.pathname}`);
      const body = await readJson(req, this.maxBodyBytes);
      if (url.pathname === '/tokenize') return json(res, 200, this.tokenize(body));
      if (url.pathname === '/v1/completions')
        return this.generate(body, res, false, req.headers['x-data-parallel-rank']);
      if (url.pathname === '/v1/chat/completions')
        return this.generate(body, res, true, req.headers['x-data-parallel-rank']);
      throw new HttpError(404, `no route POST ${url.pathname}`);
    } catch (err) {
      const e = err instanceof HttpError ? err : new HttpError(500, (err as Error).message);
      if (!res.headersSent)
        json(res, e.status, {
          error: {
            message: e.message,
            type: e.status < 500 ? 'invalid_request_error' : 'server_error',
            param: e.param ?? null,
            code: null,
          },
        });
      else res.end();
    }
  }

  /** /v1/models as vLLM lists it: the base model, then each adapter with its parent. */
  private modelList(): unknown {
    const created = Math.floor(this.modelStart / 1000);
    const card = (id: string, root: string, parent: string | null) => ({
      id,
      object: 'model',
      created,
      owned_by: 'vllm',
      root,
      parent,
      max_model_len: this.cores[0].engine.maxModelLen,
      permission: [],
    });
    return {
      object: 'list',
      data: [
        card(this.model, this.model, null),
        ...this.loraModules.map((name) => card(name, `/adapters/${name}`, this.model)),
      ],
    };
  }

  /** The core a request runs on: the one its X-data-parallel-rank header names, else the least busy. */
  private coreFor(header: string | string[] | undefined): RankCore {
    if (header !== undefined) {
      const v = Array.isArray(header) ? header[0] : header;
      const rank = /^\d{1,3}$/.test(v) ? Number(v) : NaN;
      if (!(rank < this.dataParallelSize))
        throw new HttpError(
          400,
          `X-data-parallel-rank must be an integer from 0 to ${this.dataParallelSize - 1}, got '${v}'`,
          'X-data-parallel-rank',
        );
      return this.cores[rank];
    }
    let best = this.cores[0];
    for (const c of this.cores) if (c.inFlight < best.inFlight) best = c;
    return best;
  }

  /** vLLM's /tokenize: the prompt (or chat, with its tools and template options) as token ids. */
  private tokenize(body: Record<string, unknown>): { tokens: number[]; count: number; max_model_len: number } {
    if (body.model !== undefined && body.model !== this.model && !this.loraModules.includes(body.model as string))
      throw new HttpError(404, `model '${String(body.model)}' does not exist`, 'model');
    const tokens = body.messages !== undefined ? this.chatTokens(body.messages, body) : this.promptTokens(body.prompt);
    return { tokens, count: tokens.length, max_model_len: this.cores[0].engine.maxModelLen };
  }

  /** A chat's prompt tokens: the model's template, with the request's tools and template options. */
  private chatTokens(messages: unknown, body: Record<string, unknown> = {}): number[] {
    const checked = checkMessages(messages);
    const tools = body.tools;
    if (tools !== undefined && tools !== null && !Array.isArray(tools))
      throw new HttpError(400, 'tools must be an array', 'tools');
    const kwargs = body.chat_template_kwargs;
    if (kwargs !== undefined && kwargs !== null && (typeof kwargs !== 'object' || Array.isArray(kwargs)))
      throw new HttpError(400, 'chat_template_kwargs must be an object', 'chat_template_kwargs');
    const tokenizer = this.options.tokenizer;
    if (!tokenizer) {
      // the mock template: the tools' and template options' JSON ahead of the messages
      const head =
        (tools ? `<|tools|>${JSON.stringify(tools)}\n` : '') + (kwargs ? `<|kwargs|>${JSON.stringify(kwargs)}\n` : '');
      return mockTokenize(head + mockChatPrompt(checked));
    }
    try {
      if (tokenizer.tokenizeChatRequest) {
        return tokenizer.tokenizeChatRequest({
          messages: checked,
          tools: tools as unknown[] | undefined,
          chat_template_kwargs: kwargs as Record<string, unknown> | undefined,
          add_generation_prompt: body.add_generation_prompt as boolean | undefined,
          continue_final_message: body.continue_final_message as boolean | undefined,
        });
      }
      return tokenizer.tokenize({ messages: checked });
    } catch (err) {
      throw new HttpError(400, `the chat template rejected the messages: ${(err as Error).message}`, 'messages');
    }
  }

  private promptTokens(prompt: unknown): number[] {
    if (typeof prompt === 'string')
      return this.options.tokenizer ? this.options.tokenizer.tokenize({ text: prompt }) : mockTokenize(prompt);
    if (Array.isArray(prompt) && prompt.every((t) => Number.isInteger(t) && t >= 0 && t < 2 ** 32))
      return prompt as number[];
    if (Array.isArray(prompt) && prompt.length === 1) return this.promptTokens(prompt[0]);
    throw new HttpError(400, 'prompt must be a string, a list of token ids, or a list with one of those', 'prompt');
  }

  private generate(
    body: Record<string, unknown>,
    res: ServerResponse,
    chat: boolean,
    rankHeader?: string | string[],
  ): void {
    const model = body.model === undefined ? this.model : body.model;
    if (typeof model !== 'string' || (model !== this.model && !this.loraModules.includes(model)))
      throw new HttpError(404, `model '${String(body.model)}' does not exist`, 'model');
    const lora = model === this.model ? null : model;
    const core = this.coreFor(rankHeader);
    const tokens = chat ? this.chatTokens(body.messages, body) : this.promptTokens(body.prompt);
    if (tokens.length === 0) throw new HttpError(400, 'the prompt is empty', chat ? 'messages' : 'prompt');
    const maxTokens = body.max_tokens ?? body.max_completion_tokens ?? 16;
    if (!Number.isInteger(maxTokens) || (maxTokens as number) < 1 || (maxTokens as number) > 100_000)
      throw new HttpError(400, 'max_tokens must be an integer from 1 to 100000', 'max_tokens');
    if (body.stream !== undefined && typeof body.stream !== 'boolean')
      throw new HttpError(400, 'stream must be a boolean', 'stream');
    const salt = body.cache_salt;
    if (salt !== undefined && (typeof salt !== 'string' || salt === ''))
      throw new HttpError(400, 'cache_salt must be a non-empty string', 'cache_salt');
    const streamOptions = body.stream_options as { include_usage?: unknown } | undefined;

    // over the context limit: refused before it reaches the engine, in vLLM's words and shape
    const refused = core.engine.rejection({ inputTokens: tokens.length, outputTokens: maxTokens as number });
    if (refused !== null)
      return json(res, 400, { error: { message: refused, type: 'BadRequestError', param: null, code: 400 } });

    // the engine's own block hashes: vLLM's sha256_cbor, or seeded per process; keyed by the
    // adapter and cache_salt either way, as vLLM's
    const h = this.vllmHasher
      ? this.vllmHasher.hashBlocks(
          tokens,
          this.blockSize,
          { lora, cacheSalt: salt as string | undefined },
          this.scratch,
        )
      : hashTokenBlocks(
          tokens,
          this.blockSize,
          { lora, cacheSalt: `${this.hashSalt}/${(salt as string | undefined) ?? ''}` },
          this.scratch,
        );
    const keys = new Float64Array(h.length);
    let parent: bigint | null = null;
    const loraId = lora === null ? null : this.loraModules.indexOf(lora) + 1;
    for (let i = 0; i < h.length; i++) {
      keys[i] = blockKey(h.hi[i], h.lo[i]);
      const hash = (BigInt(h.hi[i]) << 32n) | BigInt(h.lo[i]);
      const extra = [...(lora ? [lora] : []), ...(i === 0 && typeof salt === 'string' ? [salt] : [])];
      if (!core.blocks.has(keys[i]))
        core.blocks.set(keys[i], {
          hash,
          parent,
          tokens: tokens.slice(i * this.blockSize, (i + 1) * this.blockSize),
          lora,
          loraId,
          extraKeys: extra.length > 0 ? extra : null,
        });
      parent = hash;
    }
    const id = this.nextId++;
    const request: EngineRequest = {
      id,
      keys,
      hashHi: h.hi.slice(0, h.length),
      hashLo: h.lo.slice(0, h.length),
      inputTokens: tokens.length,
      outputTokens: maxTokens as number,
    };
    const p: Pending = {
      request,
      res,
      chat,
      core,
      model,
      stream: body.stream === true,
      includeUsage: streamOptions?.include_usage === true,
      id: `${chat ? 'chatcmpl' : 'cmpl'}-mock-${id}`,
      created: Math.floor(Date.now() / 1000),
      promptTokens: tokens.length,
      produced: 0,
      cachedTokens: 0,
      done: false,
    };
    this.pending.set(id, p);
    core.inFlight++;
    core.prefixQueries += tokens.length;
    if (p.stream)
      res.writeHead(200, {
        'content-type': 'text/event-stream',
        'cache-control': 'no-cache',
        connection: 'keep-alive',
      });
    // a client that goes away takes its request out of the engine
    res.on('close', () => {
      if (!p.done) {
        p.done = true;
        core.inFlight--;
        this.pending.delete(id);
        core.engine.cancel(id);
        this.forget(core, request);
      }
    });
    for (const key of keys) core.liveKeys.set(key, (core.liveKeys.get(key) ?? 0) + 1);
    core.engine.enqueue(request);
    this.pump(core);
  }

  // ------------------------------------------------------------------- engine loop

  private pump(core: RankCore): void {
    if (core.stepping || this.closed || core.engine.idle) return;
    core.stepping = true;
    const start = Date.now() - this.modelStart;
    // runs of decode steps are cut at 50 ms so streams flow and new requests join soon; the
    // step is scheduled now and its outputs land when it ends, so /metrics reads it in between
    const end = core.engine.startStep(start, start + 50);
    this.flushEvents(core);
    setTimeout(
      () => {
        core.stepping = false;
        const step = core.engine.finishStep();
        this.flushEvents(core);
        this.finishStep(core, step);
        this.pump(core);
      },
      Math.max(0, end - start),
    );
  }

  private finishStep(core: RankCore, step: StepResult): void {
    for (const { request, cachedTokens } of step.firstTokens) {
      const p = this.pending.get(request.id);
      if (!p) continue;
      p.cachedTokens = cachedTokens;
      core.prefixHits += cachedTokens;
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
      ? {
          index: 0,
          delta: p.produced === n ? { role: 'assistant', content: text } : { content: text },
          finish_reason: null,
        }
      : { index: 0, text, finish_reason: null };
    sse(p.res, {
      id: p.id,
      object: p.chat ? 'chat.completion.chunk' : 'text_completion',
      created: p.created,
      model: p.model,
      choices: [choice],
    });
  }

  /**
   * A request left a core: the metadata of blocks no other request there shares and the core
   * does not cache (never computed, or computed twice) goes too. Blocks the core caches keep
   * theirs until BlockRemoved.
   */
  private forget(core: RankCore, request: EngineRequest): void {
    for (const key of request.keys) {
      const n = (core.liveKeys.get(key) ?? 1) - 1;
      if (n > 0) {
        core.liveKeys.set(key, n);
        continue;
      }
      core.liveKeys.delete(key);
      if (!core.engine.holds(key)) core.blocks.delete(key);
    }
  }

  private finish(p: Pending): void {
    p.done = true;
    p.core.inFlight--;
    this.forget(p.core, p.request);
    this.pending.delete(p.request.id);
    const usage = {
      prompt_tokens: p.promptTokens,
      completion_tokens: p.produced,
      total_tokens: p.promptTokens + p.produced,
      prompt_tokens_details: { cached_tokens: p.cachedTokens },
    };
    if (p.stream) {
      const last = p.chat
        ? { index: 0, delta: {}, finish_reason: 'length' }
        : { index: 0, text: '', finish_reason: 'length' };
      sse(p.res, {
        id: p.id,
        object: p.chat ? 'chat.completion.chunk' : 'text_completion',
        created: p.created,
        model: p.model,
        choices: [last],
      });
      if (p.includeUsage)
        sse(p.res, {
          id: p.id,
          object: p.chat ? 'chat.completion.chunk' : 'text_completion',
          created: p.created,
          model: p.model,
          choices: [],
          usage,
        });
      p.res.end('data: [DONE]\n\n');
      return;
    }
    const text = Array.from({ length: p.produced }, (_, k) => `tok${k % 1000} `).join('');
    json(p.res, 200, {
      id: p.id,
      object: p.chat ? 'chat.completion' : 'text_completion',
      created: p.created,
      model: p.model,
      choices: [
        p.chat
          ? { index: 0, message: { role: 'assistant', content: text }, finish_reason: 'length' }
          : { index: 0, text, finish_reason: 'length' },
      ],
      usage,
    });
  }

  // ---------------------------------------------------------------------- events

  private onRemoved(core: RankCore, key: number): void {
    const b = core.blocks.get(key);
    if (b) core.removed.push(b.hash);
    // a request still in the core may compute the block again and must announce it then
    if (!core.liveKeys.has(key)) core.blocks.delete(key);
  }

  /** One batch per step: consecutive stored blocks of a chain in one BlockStored, then removals. */
  private flushEvents(core: RankCore): void {
    const events: KvEvent[] = [];
    let current: BlockStoredEvent | undefined;
    for (const key of core.stored) {
      const b = core.blocks.get(key);
      if (!b) continue;
      const last = current?.blockHashes[current.blockHashes.length - 1];
      if (current && b.parent === last && current.loraName === b.lora) {
        current.blockHashes.push(b.hash);
        current.tokenIds.push(...b.tokens);
        current.extraKeys!.push(b.extraKeys);
      } else {
        current = {
          type: 'BlockStored',
          blockHashes: [b.hash],
          parentBlockHash: b.parent,
          tokenIds: [...b.tokens],
          blockSize: this.blockSize,
          loraId: b.loraId,
          medium: 'GPU',
          loraName: b.lora,
          extraKeys: [b.extraKeys],
          groupIdx: 0,
          kvCacheSpecKind: 'full_attention',
          kvCacheSpecSlidingWindow: null,
        };
        events.push(current);
      }
    }
    for (const e of events) if (e.type === 'BlockStored' && e.extraKeys!.every((k) => k === null)) e.extraKeys = null;
    if (core.removed.length > 0)
      events.push({ type: 'BlockRemoved', blockHashes: [...core.removed], medium: 'GPU', groupIdx: 0 });
    core.stored.length = 0;
    core.removed.length = 0;
    if (events.length > 0 && core.publisher)
      void core.publisher.publish({ ts: Date.now() / 1000, events, dataParallelRank: core.rank });
  }

  private metricsText(): string {
    const lines: string[] = [];
    const metric = (name: string, type: string, help: string, value: (c: RankCore) => number) => {
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
      for (const c of this.cores)
        lines.push(
          `${name}${type === 'counter' ? '_total' : ''}{model_name="${this.model}",engine="${c.rank}"} ${value(c)}`,
        );
    };
    metric(
      'vllm:num_requests_running',
      'gauge',
      'Number of requests in model execution batches.',
      (c) => c.engine.runningCount,
    );
    metric(
      'vllm:num_requests_waiting',
      'gauge',
      'Number of requests waiting to be processed.',
      (c) => c.engine.waitingCount,
    );
    metric('vllm:kv_cache_usage_perc', 'gauge', 'KV-cache usage. 1 means 100 percent usage.', (c) => c.engine.kvUsage);
    metric(
      'vllm:prefix_cache_queries',
      'counter',
      'Prefix cache queries, in terms of number of queried tokens.',
      (c) => c.prefixQueries,
    );
    metric(
      'vllm:prefix_cache_hits',
      'counter',
      'Prefix cache hits, in terms of number of cached tokens.',
      (c) => c.prefixHits,
    );
    lines.push('');
    return lines.join('\n');
  }
}

/**
 * Rank r's endpoint: the port + r (`*` stays `*`), as vLLM's ZmqEventPublisher.offset_endpoint_port.
 */
export function offsetEndpointPort(endpoint: string, rank: number): string {
  if (rank === 0) return endpoint;
  if (endpoint.startsWith('inproc')) return `${endpoint}_dp${rank}`;
  const m = /^(tcp:\/\/.+):(\d+|\*)$/.exec(endpoint);
  if (!m) throw new RangeError(`endpoint '${endpoint}' must be tcp://host:port or inproc://name`);
  return m[2] === '*' ? endpoint : `${m[1]}:${Number(m[2]) + rank}`;
}

function checkMessages(messages: unknown): ChatMessage[] {
  return checkChatMessages(messages, (message, field) => new HttpError(400, message, field));
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
  if (body === null || typeof body !== 'object' || Array.isArray(body))
    throw new HttpError(400, 'the body must be a JSON object');
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
