import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import type { ChatMessage } from '../core/hashing.js';
import { UntokenizableContentError, type ChatTemplateRequest } from './chat-tokenizer.js';
import type { RouteRequest } from '../core/router/index.js';

/** A tokenizer that answers later: what `--tokenize tokenizer` uses with worker threads. */
export interface AsyncPromptTokenizer {
  readonly async: true;
  /**
   * Token ids of the request; a chat with its template options (tools, kwargs) when `chat` is
   * given; a prompt with the special tokens when `addSpecialTokens` (default true).
   */
  tokenize(request: RouteRequest, chat?: ChatTemplateRequest, addSpecialTokens?: boolean): Promise<ArrayLike<number>>;
}

export interface TokenizerPoolOptions {
  /** tokenizer.json, or the model directory holding it and tokenizer_config.json. */
  path: string;
  /** A Jinja chat template replacing the tokenizer config's. */
  chatTemplate?: string;
  /** What a template that does not compile is called (ChatTokenizer's chatTemplateSource). */
  chatTemplateSource?: string;
  /** Worker threads (default: defaultTokenizerThreads()). */
  threads?: number;
  /** Cached message segments per thread (ChatTokenizer's cacheEntries). */
  cacheEntries?: number;
  /** What a thread's load errors call the path (ChatTokenizer's source). */
  source?: string;
  /** Most requests waiting or being tokenized; beyond, tokenize() rejects with TokenizerBusyError (default 1024). */
  maxPending?: number;
  log?: (message: string) => void;
}

export interface TokenizerPoolStats {
  threads: number;
  pending: number;
  completed: number;
  failed: number;
  rejectedBusy: number;
  threadRestarts: number;
}

/** What a thread is started with (see tokenizer-thread.ts). */
export interface TokenizerThreadData {
  path: string;
  chatTemplate?: string;
  chatTemplateSource?: string;
  cacheEntries?: number;
  source?: string;
}
/** One request to a thread: only what tokenizing needs crosses the thread boundary. */
export interface TokenizeJob {
  id: number;
  request: { messages?: readonly ChatMessage[]; text?: string };
  /** A prompt's `add_special_tokens`, when false (default true). */
  addSpecialTokens?: false;
  /** A chat request with what besides the messages shapes its prompt (tools, template options). */
  chat?: ChatTemplateRequest;
}
export type TokenizeReply =
  | { id: number; tokens: Uint32Array; error?: undefined }
  | { id: number; error: string; errorName?: string; tokens?: undefined };

/** The tokenizer cannot take the request now (full, restarting, closed): the gateway answers 503 with retry-after. */
export class TokenizerUnavailableError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TokenizerUnavailableError';
  }
}

/** The pool is full: rather than queue without bound, the request is refused. */
export class TokenizerBusyError extends TokenizerUnavailableError {
  constructor(pending: number) {
    super(`the tokenizer has ${pending} requests waiting; try again shortly`);
    this.name = 'TokenizerBusyError';
  }
}

/**
 * Threads for one gateway process: one per core the process can count on, keeping one core
 * for the event loop, at least one. With N gateway processes on the machine each gets its share.
 */
export function defaultTokenizerThreads(processes = 1): number {
  return Math.max(1, Math.floor(availableParallelism() / Math.max(1, processes)) - 1);
}

interface Pending {
  resolve: (tokens: ArrayLike<number>) => void;
  reject: (err: Error) => void;
  thread: number;
}

interface Thread {
  worker: Worker;
  pending: number;
  /** Exited: a message posted to it would never be answered. */
  dead: boolean;
}

/** Between attempts to replace a thread that could not be started (doubling, up to the second figure). */
const RESTART_DELAY_MS = 500;
const RESTART_DELAY_MAX_MS = 30_000;

/**
 * The model's tokenizer (ChatTokenizer) on worker threads. Rendering the chat template and
 * tokenizing an agent's 30 KB conversation takes milliseconds of CPU; on the gateway's event
 * loop that time would stall every other request in flight. Here the event loop only copies
 * the messages to a thread and gets the ids back (transferred, not copied).
 *
 * Each thread keeps its own segment cache (ChatTokenizer caches what it tokenized per message),
 * so requests of one conversation go to the same thread: the thread is picked by a digest of
 * the conversation's opening, unless that thread is far busier than the least busy one.
 * A thread that dies is replaced; its requests fail (the gateway answers 503 for them).
 */
export class TokenizerPool implements AsyncPromptTokenizer {
  private readonly threads: Thread[] = [];
  private readonly jobs = new Map<number, Pending>();
  private readonly maxPending: number;
  private readonly data: TokenizerThreadData;
  private readonly log: (message: string) => void;
  private nextId = 1;
  private closed = false;
  /** Every thread of start() came up: from then on a thread that fails to start is retried. */
  private started = false;
  /** Pending attempts to replace threads whose last replacement failed to start. */
  private readonly restartTimers = new Set<NodeJS.Timeout>();
  private readonly counters = { completed: 0, failed: 0, rejectedBusy: 0, threadRestarts: 0 };

  private constructor(options: TokenizerPoolOptions) {
    this.data = {
      path: options.path,
      chatTemplate: options.chatTemplate,
      chatTemplateSource: options.chatTemplateSource,
      cacheEntries: options.cacheEntries,
      source: options.source,
    };
    this.maxPending = options.maxPending ?? 1024;
    if (!Number.isInteger(this.maxPending) || this.maxPending < 1)
      throw new RangeError(`maxPending must be a positive integer, got ${options.maxPending}`);
    this.log = options.log ?? (() => {});
  }

  /** Starts the threads and resolves once every one has loaded the tokenizer. */
  static async start(options: TokenizerPoolOptions): Promise<TokenizerPool> {
    const n = options.threads ?? defaultTokenizerThreads();
    if (!Number.isInteger(n) || n < 1 || n > 256)
      throw new RangeError(`threads must be an integer from 1 to 256, got ${n}`);
    const pool = new TokenizerPool(options);
    try {
      await Promise.all(Array.from({ length: n }, (_, i) => pool.spawn(i)));
      pool.started = true;
    } catch (err) {
      await pool.close();
      throw err;
    }
    return pool;
  }

  get size(): number {
    return this.threads.length;
  }

  readonly async = true as const;

  tokenize(request: RouteRequest, chat?: ChatTemplateRequest, addSpecialTokens = true): Promise<ArrayLike<number>> {
    if (request.tokens) return Promise.resolve(request.tokens);
    if (this.closed) return Promise.reject(new TokenizerUnavailableError('the tokenizer pool is closed'));
    if (this.jobs.size >= this.maxPending) {
      this.counters.rejectedBusy++;
      return Promise.reject(new TokenizerBusyError(this.jobs.size));
    }
    const job: TokenizeJob = {
      id: this.nextId++,
      request: request.messages ? { messages: request.messages } : { text: request.text ?? '' },
      chat,
    };
    if (!addSpecialTokens) job.addSpecialTokens = false;
    const index = this.pick(request);
    if (index < 0) return Promise.reject(new TokenizerUnavailableError('no tokenizer thread is running'));
    const thread = this.threads[index];
    return new Promise<ArrayLike<number>>((resolve, reject) => {
      this.jobs.set(job.id, { resolve, reject, thread: index });
      thread.pending++;
      thread.worker.postMessage(job);
    });
  }

  stats(): TokenizerPoolStats {
    return { threads: this.threads.length, pending: this.jobs.size, ...this.counters };
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const t of this.restartTimers) clearTimeout(t);
    this.restartTimers.clear();
    for (const [id, job] of this.jobs) {
      this.jobs.delete(id);
      job.reject(new TokenizerUnavailableError('the tokenizer pool is closed'));
    }
    await Promise.all(this.threads.map((t) => t.worker.terminate()));
  }

  // ------------------------------------------------------------------------ internals

  /** The conversation's thread, unless it is far busier than the least busy one (or not running); -1: none runs. */
  private pick(request: RouteRequest): number {
    const n = this.threads.length;
    let least = -1;
    for (let i = 0; i < n; i++)
      if (!this.threads[i].dead && (least < 0 || this.threads[i].pending < this.threads[least].pending)) least = i;
    if (least < 0 || n === 1) return least;
    const preferred = conversationKey(request) % n;
    const p = this.threads[preferred];
    return p.dead || p.pending > this.threads[least].pending + 2 ? least : preferred;
  }

  /** Replaces a thread whose replacement failed to start, later: what it needs may come back (a remounted volume). */
  private retrySpawn(index: number, delayMs: number): void {
    const t = setTimeout(() => {
      this.restartTimers.delete(t);
      if (this.closed) return;
      this.spawn(index, delayMs).then(
        () => this.log(`tokenizer thread ${index} restarted`),
        (err: Error) => this.log(`tokenizer thread ${index} could not be restarted: ${err.message}`),
      );
    }, delayMs);
    t.unref();
    this.restartTimers.add(t);
  }

  /** `failedDelayMs`: the wait before this attempt, when it replaces a thread that failed to start. */
  private spawn(index: number, failedDelayMs = 0): Promise<void> {
    const worker = startThread(this.data);
    const thread: Thread = { worker, pending: 0, dead: false };
    this.threads[index] = thread;
    return new Promise<void>((resolve, reject) => {
      let ready = false;
      worker.on('message', (m: TokenizeReply | { ready: boolean; error?: string }) => {
        if ('ready' in m) {
          ready = m.ready;
          if (m.ready) resolve();
          else reject(new RangeError(m.error ?? 'the tokenizer thread failed to start'));
          return;
        }
        const job = this.jobs.get(m.id);
        if (!job) return;
        this.jobs.delete(m.id);
        thread.pending--;
        if (m.error !== undefined) {
          this.counters.failed++;
          // media parts keep their kind across the thread boundary: the gateway routes them on text
          job.reject(
            m.errorName === 'UntokenizableContentError'
              ? new UntokenizableContentError(m.error)
              : new RangeError(m.error),
          );
        } else {
          this.counters.completed++;
          job.resolve(m.tokens);
        }
      });
      worker.on('error', (err) => {
        if (!ready) reject(err);
        else this.log(`tokenizer thread ${index} failed: ${err.message}`);
      });
      worker.on('exit', () => {
        thread.dead = true;
        // a thread that exits before it is ready has not said why (the 'ready' message and
        // 'error' settle this first when it did)
        reject(new Error('the tokenizer thread stopped before it was ready'));
        // its requests cannot be answered any more; a replacement takes the next ones
        for (const [id, job] of this.jobs) {
          if (job.thread !== index) continue;
          this.jobs.delete(id);
          this.counters.failed++;
          job.reject(new TokenizerUnavailableError('the tokenizer thread stopped'));
        }
        if (this.closed || this.threads[index] !== thread) return;
        // start() fails on a thread that never started; a replacement that never started is tried again later
        if (!ready) {
          if (this.started)
            this.retrySpawn(index, Math.min(RESTART_DELAY_MAX_MS, 2 * failedDelayMs || RESTART_DELAY_MS));
          return;
        }
        this.counters.threadRestarts++;
        this.spawn(index).catch((err: Error) =>
          this.log(`tokenizer thread ${index} could not be restarted: ${err.message}`),
        );
      });
    });
  }
}

/** Starts tokenizer-thread: the compiled .js next to this file, or the .ts source under tsx. */
function startThread(data: TokenizerThreadData): Worker {
  const source = import.meta.url.endsWith('.ts');
  const url = new URL(source ? './tokenizer-thread.ts' : './tokenizer-thread.js', import.meta.url);
  if (!source) return new Worker(url, { workerData: data });
  // worker threads do not inherit the parent's module hooks: register tsx's first
  const code = `import('tsx/esm/api').then((tsx) => { tsx.register(); return import(${JSON.stringify(url.href)}); })`;
  return new Worker(code, { eval: true, workerData: data });
}

/** A number for the conversation's opening (system prompt and first user turn), cheap to compute. */
function conversationKey(request: RouteRequest): number {
  let h = 0x811c9dc5;
  const mix = (s: string) => {
    // the first and last 256 characters: long prompts that share an opening still differ by their end
    const n = s.length;
    for (let i = 0; i < Math.min(n, 256); i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
    for (let i = Math.max(256, n - 256); i < n; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
    h = Math.imul(h ^ n, 0x01000193);
  };
  if (request.messages) {
    for (let i = 0; i < Math.min(2, request.messages.length); i++) {
      const c = request.messages[i].content;
      mix(typeof c === 'string' ? c : JSON.stringify(c ?? ''));
    }
  } else mix(request.text ?? '');
  return h >>> 0;
}
