import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { BlockHashes, hashTokenBlocks } from '../core/hashing.js';
import { VllmBlockHasher, type VllmHashAlgo } from '../core/vllm-block-hash.js';
import type { EngineRequest, StepResult } from '../engine-model/index.js';
import { MAX_DP_START_RANK } from '../server/worker-input.js';
import type { PromptTokenizer } from './chat-tokenizer.js';
import { HttpError, json, readJson } from './mock/http.js';
import { metricsText, modelList } from './mock/metrics.js';
import { chatTokens, promptTokens } from './mock/prompt.js';
import { createRankCore, flushEvents, forget, rememberBlocks, type RankCore } from './mock/rank-core.js';
import { emitTokens, sendFinal, type Pending } from './mock/responses.js';

export { mockChatPrompt, mockTokenize } from './mock/prompt.js';
export { offsetEndpointPort } from './mock/rank-core.js';

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
 *   header picks its core, otherwise the least busy one takes it. With
 *   `dataParallelStartRank` S (one node's API server under --data-parallel-hybrid-lb) the
 *   cores are the global ranks S…S+N−1: they publish on the events port + their rank, stamp
 *   it and label their /metrics series with it (engine="S"…), while the header names the i-th
 *   of them as i, as vLLM's API server takes it.
 * - `loraModules`: adapters served beside the base model; /v1/models lists each with
 *   `parent` = the base model (vLLM's ModelCard); a request naming an adapter has its blocks
 *   keyed by the adapter (`lora_name`, and extra_keys as vllm/v1/core/kv_cache_utils.py).
 *   POST /v1/unload_lora_adapter `{"lora_name"}` unloads one at run time, as vLLM's does (with
 *   VLLM_ALLOW_RUNTIME_LORA_UPDATING): /v1/models lists it no more, and a request naming it gets
 *   vLLM's 404 for a model it does not serve.
 * - `blockHash: 'vllm'`: the engine's block hashes are vLLM's, by `prefixCachingHashAlgo`
 *   (its --prefix-caching-hash-algo, default sha256_cbor as the router's) seeded from
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
  /** The cores' first global rank (vLLM's --data-parallel-start-rank; default 0). */
  dataParallelStartRank?: number;
  /** LoRA adapters served beside the base model (vLLM's --lora-modules). */
  loraModules?: readonly string[];
  /** 'vllm': block hashes are vLLM's, by `prefixCachingHashAlgo`, from `pythonHashSeed` (default: per-process seed). */
  blockHash?: 'mock' | 'vllm';
  pythonHashSeed?: string;
  /**
   * blockHash 'vllm': the hash vLLM's --prefix-caching-hash-algo names. Default sha256_cbor,
   * the router's default, not vLLM's sha256, so the two match when neither is given.
   */
  prefixCachingHashAlgo?: VllmHashAlgo;
}

/** A name a LoRA adapter may be served under: 1 to 128 letters, digits or `_ . : / -`. */
export function isAdapterName(name: string): boolean {
  return /^[\w.:/-]{1,128}$/.test(name);
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
  /** Adapters of `loraModules` unloaded at run time (/v1/unload_lora_adapter). */
  private readonly unloaded = new Set<string>();
  port = 0;

  constructor(private readonly options: MockEngineOptions = {}) {
    this.model = options.model ?? 'mock';
    this.blockSize = options.blockSize ?? 16;
    this.dataParallelSize = options.dataParallelSize ?? 1;
    if (!Number.isInteger(this.dataParallelSize) || this.dataParallelSize < 1 || this.dataParallelSize > 64)
      throw new RangeError(`dataParallelSize must be an integer from 1 to 64, got ${options.dataParallelSize}`);
    this.loraModules = [...(options.loraModules ?? [])];
    for (const name of this.loraModules) {
      if (typeof name !== 'string' || !isAdapterName(name) || name === this.model)
        throw new RangeError(`loraModules: '${String(name)}' is not a usable adapter name`);
    }
    const prefill = options.prefillTokS ?? 20_000;
    const decode = options.decodeTokS ?? 200;
    if (!(prefill > 0) || !(decode > 0)) throw new RangeError('prefillTokS and decodeTokS must be > 0');
    if (options.replay && !options.events) throw new RangeError('replay needs events');
    const startRank = options.dataParallelStartRank ?? 0;
    if (!Number.isInteger(startRank) || startRank < 0 || startRank > MAX_DP_START_RANK)
      throw new RangeError(`dataParallelStartRank must be an integer from 0 to ${MAX_DP_START_RANK}, got ${startRank}`);
    for (let i = 0; i < this.dataParallelSize; i++) {
      const core = createRankCore(
        startRank + i,
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
        { events: options.events, replay: options.replay },
      );
      this.cores.push(core);
    }
    this.maxBodyBytes = options.maxBodyBytes ?? 8 * 1024 * 1024;
    this.hashSalt = `engine-${options.hashSeed ?? Math.floor(Math.random() * 2 ** 31)}`;
    if (options.blockHash === 'vllm') {
      if (options.pythonHashSeed === undefined)
        throw new RangeError("blockHash 'vllm' needs pythonHashSeed (the engine's PYTHONHASHSEED)");
      this.vllmHasher = new VllmBlockHasher(options.pythonHashSeed, options.prefixCachingHashAlgo);
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

  /** The first core's event endpoint (rank r's: the configured port + r). */
  get eventsEndpoint(): string {
    return this.cores[0].publisher?.endpoint ?? '';
  }

  get replayEndpoint(): string {
    return this.cores[0].publisher?.replayEndpoint ?? '';
  }

  /** Every core's event endpoint, in rank order. */
  get eventsEndpoints(): string[] {
    return this.cores.map((c) => c.publisher?.endpoint ?? '');
  }

  /** Engine block hashes (decimal) of every block in a core's cache (the i-th, from 0): the engine's own listing. */
  cacheListing(i = 0): string[] {
    const core = this.cores[i];
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
        return json(
          res,
          200,
          modelList(
            this.model,
            this.loraModules.filter((name) => !this.unloaded.has(name)),
            Math.floor(this.modelStart / 1000),
            this.cores[0].engine.maxModelLen,
          ),
        );
      }
      if (req.method === 'GET' && url.pathname === '/metrics')
        return void res
          .writeHead(200, { 'content-type': 'text/plain; version=0.0.4' })
          .end(metricsText(this.model, this.cores));
      if (req.method === 'GET' && url.pathname === '/debug/cache')
        return json(res, 200, { blockHashes: this.cacheListing() });
      if (req.method !== 'POST') throw new HttpError(404, `no route ${req.method} ${url.pathname}`);
      const body = await readJson(req, this.maxBodyBytes);
      if (url.pathname === '/tokenize') return json(res, 200, this.tokenize(body));
      if (url.pathname === '/v1/unload_lora_adapter') return this.unloadAdapter(body, res);
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
            type: e.type ?? (e.status < 500 ? 'invalid_request_error' : 'server_error'),
            param: e.param ?? null,
            code: e.type === undefined ? null : e.status,
          },
        });
      else res.end();
    }
  }

  /**
   * The core a request runs on: the one its X-data-parallel-rank header names (the i-th core,
   * whatever the start rank), else the least busy.
   */
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

  /**
   * The model a request names (the base model when it names none): 400 when it is not a string,
   * as vLLM's request validation answers, 404 when it is neither the model nor an adapter
   * loaded, in vLLM's words and shape (OpenAIServing._check_model: `NotFoundError`, code 404).
   */
  private servedModel(requested: unknown): string {
    if (requested === undefined || requested === null) return this.model;
    if (typeof requested !== 'string') throw new HttpError(400, 'model must be a string', 'model');
    if (requested !== this.model && (!this.loraModules.includes(requested) || this.unloaded.has(requested)))
      throw new HttpError(404, `The model \`${requested}\` does not exist.`, 'model', 'NotFoundError');
    return requested;
  }

  /**
   * vLLM's /v1/unload_lora_adapter: the adapter named is served no more (200 with its text), 404
   * when it is not loaded, 400 without a name (OpenAIServingModels.unload_lora_adapter).
   */
  private unloadAdapter(body: Record<string, unknown>, res: ServerResponse): void {
    const name = body.lora_name;
    if (typeof name !== 'string' || name === '')
      throw new HttpError(
        400,
        "'lora_name' needs to be provided to unload a LoRA adapter.",
        undefined,
        'InvalidUserInput',
      );
    if (!this.loraModules.includes(name) || this.unloaded.has(name))
      throw new HttpError(404, `The lora adapter '${name}' cannot be found.`, undefined, 'NotFoundError');
    this.unloaded.add(name);
    res
      .writeHead(200, { 'content-type': 'text/plain; charset=utf-8' })
      .end(`Success: LoRA adapter '${name}' removed successfully.`);
  }

  /** vLLM's /tokenize: the prompt (or chat, with its tools and template options) as token ids. */
  private tokenize(body: Record<string, unknown>): { tokens: number[]; count: number; max_model_len: number } {
    this.servedModel(body.model);
    const tokens =
      body.messages !== undefined
        ? chatTokens(this.options.tokenizer, body.messages, body)
        : promptTokens(this.options.tokenizer, body.prompt, body.add_special_tokens !== false);
    return { tokens, count: tokens.length, max_model_len: this.cores[0].engine.maxModelLen };
  }

  private generate(
    body: Record<string, unknown>,
    res: ServerResponse,
    chat: boolean,
    rankHeader?: string | string[],
  ): void {
    const model = this.servedModel(body.model);
    const lora = model === this.model ? null : model;
    const core = this.coreFor(rankHeader);
    const tokens = chat
      ? chatTokens(this.options.tokenizer, body.messages, body)
      : promptTokens(this.options.tokenizer, body.prompt, body.add_special_tokens !== false);
    if (tokens.length === 0) throw new HttpError(400, 'the prompt is empty', chat ? 'messages' : 'prompt');
    const maxTokens = body.max_tokens ?? body.max_completion_tokens ?? 16;
    if (!Number.isInteger(maxTokens) || (maxTokens as number) < 1 || (maxTokens as number) > 100_000)
      throw new HttpError(400, 'max_tokens must be an integer from 1 to 100000', 'max_tokens');
    if (body.stream !== undefined && typeof body.stream !== 'boolean')
      throw new HttpError(400, 'stream must be a boolean', 'stream');
    // null is no salt, as vLLM reads it (Optional[str], checked only when not None)
    const salt = body.cache_salt ?? undefined;
    if (salt !== undefined && (typeof salt !== 'string' || salt === ''))
      throw new HttpError(400, 'cache_salt must be a non-empty string', 'cache_salt');
    const streamOptions = body.stream_options as { include_usage?: unknown } | undefined;

    // over the context limit: refused before it reaches the engine, in vLLM's words and shape
    const refused = core.engine.rejection({ inputTokens: tokens.length, outputTokens: maxTokens as number });
    if (refused !== null)
      return json(res, 400, { error: { message: refused, type: 'BadRequestError', param: null, code: 400 } });

    // the engine's own block hashes: vLLM's (by its hash algorithm), or seeded per process; keyed by the
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
    const loraId = lora === null ? null : this.loraModules.indexOf(lora) + 1;
    const keys = rememberBlocks(core, h, tokens, this.blockSize, lora, loraId, salt as string | undefined);
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
        forget(core, request);
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
    // step is scheduled now and its outputs land when it ends, so /metrics reads it in between.
    // Its KV events (the evictions and the blocks cached as it is scheduled) leave when it ends,
    // as vLLM publishes a step's events after the step
    const end = core.engine.startStep(start, start + 50);
    setTimeout(
      () => {
        core.stepping = false;
        if (this.closed) return; // shut down mid-step: its streams are gone, its events unheard
        const step = core.engine.finishStep();
        flushEvents(core, this.blockSize);
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
      emitTokens(p, 1);
    }
    for (const { request, tokens } of step.decoded) {
      const p = this.pending.get(request.id);
      if (p) emitTokens(p, tokens);
    }
    for (const request of step.finished) {
      const p = this.pending.get(request.id);
      if (p) this.finish(p);
    }
  }

  private finish(p: Pending): void {
    p.done = true;
    p.core.inFlight--;
    forget(p.core, p.request);
    this.pending.delete(p.request.id);
    sendFinal(p);
  }
}
