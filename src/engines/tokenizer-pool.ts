import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import type { ChatMessage } from '../core/hashing.js';
import { UntokenizableContentError, type ChatRendering, type ChatTemplateRequest } from './chat-tokenizer.js';
import type { RouteRequest } from '../core/router/index.js';

/** A tokenizer that answers later: what `--tokenize tokenizer` uses with worker threads. */
export interface AsyncPromptTokenizer {
  readonly async: true;
  /**
   * Token ids of the request; a chat with its template options (tools, kwargs) when `chat` is
   * given; a prompt with the special tokens when `addSpecialTokens` (default true). Once `signal`
   * aborts, the promise rejects with an AbortError, and a request not yet started is never tokenized.
   */
  tokenize(
    request: RouteRequest,
    chat?: ChatTemplateRequest,
    addSpecialTokens?: boolean,
    signal?: AbortSignal,
  ): Promise<ArrayLike<number>>;
}

export interface TokenizerPoolOptions {
  /** tokenizer.json, or the model directory holding it and tokenizer_config.json. */
  path: string;
  /** A Jinja chat template replacing the tokenizer config's. */
  chatTemplate?: string;
  /** What a template that does not compile is called (ChatTokenizer's chatTemplateSource). */
  chatTemplateSource?: string;
  /** Whose rules render a chat (ChatTokenizer's rendering; default vllm). */
  rendering?: ChatRendering;
  /** Worker threads (default: defaultTokenizerThreads()). */
  threads?: number;
  /** Cached message segments per thread (ChatTokenizer's cacheEntries). */
  cacheEntries?: number;
  /** What a thread's load errors call the path (ChatTokenizer's source). */
  source?: string;
  /** Most requests waiting or being tokenized; beyond, tokenize() rejects with TokenizerBusyError (default 1024). */
  maxPending?: number;
  /**
   * Deadline of each request, counted from its tokenize() call, the wait for a thread included
   * (default DEFAULT_TOKENIZE_TIMEOUT_MS): a request not answered by then rejects with
   * TokenizeTimeoutError at once, and one still waiting is never tokenized. A thread that works
   * on one request for this long is stopped and replaced, and the requests waiting behind it go
   * to the replacement.
   */
  timeoutMs?: number;
  log?: (message: string) => void;
}

export interface TokenizerPoolStats {
  threads: number;
  pending: number;
  completed: number;
  failed: number;
  rejectedBusy: number;
  threadRestarts: number;
  /** Requests past their deadline while a thread was tokenizing them (answered with TokenizeTimeoutError). */
  timedOut: number;
  /** Requests past their deadline while they waited for a thread (answered with TokenizeTimeoutError, never tokenized). */
  timedOutWaiting: number;
  /** Requests whose client left before they were answered (those not started were never tokenized). */
  aborted: number;
}

/** What a thread is started with (see tokenizer-thread.ts). */
export interface TokenizerThreadData {
  path: string;
  chatTemplate?: string;
  chatTemplateSource?: string;
  rendering?: ChatRendering;
  cacheEntries?: number;
  source?: string;
  /** One Int32 per pending request's slot (TokenizeJob.slot): 1 once it is cancelled, and the thread skips it. */
  cancelled: SharedArrayBuffer;
}
/**
 * One request to a thread: only what tokenizing needs crosses the thread boundary, once (a chat's
 * messages are posted either parsed or as their JSON text, never both: see threadJob).
 */
export type TokenizeJob = {
  id: number;
  /** Its entry in TokenizerThreadData.cancelled. */
  slot: number;
} & (
  | {
      /** A prompt, or a chat's messages alone. */
      request: { messages?: readonly ChatMessage[]; text?: string };
      /** A prompt's `add_special_tokens`, when false (default true). */
      addSpecialTokens?: false;
      chat?: undefined;
    }
  | {
      /**
       * A chat request with what besides the messages shapes its prompt (tools, template
       * options); its `messages` are empty when `messagesJson` gives them (the thread reads them
       * from that text, which keeps the numbers of tool-call arguments as written).
       */
      chat: ChatTemplateRequest;
      request?: undefined;
    }
);
export type TokenizeReply =
  | { id: number; tokens: Uint32Array; error?: undefined }
  | { id: number; error: string; errorName?: string; tokens?: undefined };
/** What a thread says besides replies: it starts a request now, or skipped one that was cancelled. */
export type TokenizeNotice = { started: number } | { skipped: number };

/** Default of TokenizerPoolOptions.timeoutMs (and of `serve --tokenize-timeout-ms`). */
export const DEFAULT_TOKENIZE_TIMEOUT_MS = 5000;

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
 * A request was not tokenized within the deadline (a prompt the tokenizer is very slow on, such
 * as a long run of whitespace, a chat template that loops over and over, or such prompts ahead of
 * it on its thread): the gateway routes it on its text, as it does a request it cannot tokenize.
 */
export class TokenizeTimeoutError extends Error {
  constructor(timeoutMs: number, waiting = false) {
    super(
      waiting
        ? `the request waited for a tokenizer thread longer than ${timeoutMs} ms`
        : `tokenizing the request took longer than ${timeoutMs} ms`,
    );
    this.name = 'TokenizeTimeoutError';
  }
}

/** The request's client left before it was tokenized (`signal` of tokenize()). */
function abortError(): Error {
  return new DOMException('the request was cancelled before it was tokenized', 'AbortError');
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
  /** What was posted: posted again to another thread when this one is replaced before starting it. */
  job: TokenizeJob;
  /** The thread has started it. */
  started: boolean;
  /** The promise has been settled (the client left, the deadline passed): the thread's answer is dropped. */
  settled: boolean;
  /** performance.now() past which it is answered with TokenizeTimeoutError. */
  expiresAt: number;
  /** Times it was given to another thread because its own died under it before it said it started. */
  moved: number;
  signal?: AbortSignal;
  onAbort?: () => void;
}

interface Thread {
  worker: Worker;
  pending: number;
  /** Exited, or being stopped: a message posted to it would never be answered. */
  dead: boolean;
  /** Stopped by the pool after working on one request for `timeoutMs`: the requests it had not started go elsewhere. */
  timedOut: boolean;
  /** The request it is working on, and the timer that stops the thread when it works on it too long. */
  running?: number;
  deadline?: NodeJS.Timeout;
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
 * A thread that dies is replaced; the request it was working on fails (the gateway answers 503),
 * those waiting behind it go to the replacement.
 *
 * Each request has a deadline, `timeoutMs` from its tokenize() call: whatever is ahead of it on
 * its thread, it is answered by then, with TokenizeTimeoutError if it has no ids yet (the gateway
 * routes it on its text). One still waiting for its thread is marked in a shared array the
 * threads read before starting a request, and skipped, as is one whose client left (tokenize()'s
 * `signal`). A thread that works on one request for `timeoutMs` (a prompt the tokenizer is very
 * slow on) is stopped and replaced, since the tokenizer cannot be interrupted otherwise: each
 * thread says when it starts a request (a message it posts before tokenizing, delivered while it
 * works), so that limit counts only the request's own time. A thread is not stopped merely
 * because the request it works on is past its deadline: the request may have waited most of it,
 * and under a backlog stopping threads that are nearly done would leave none tokenizing.
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
  private readonly counters = {
    completed: 0,
    failed: 0,
    rejectedBusy: 0,
    threadRestarts: 0,
    timedOut: 0,
    timedOutWaiting: 0,
    aborted: 0,
  };
  /** The requests not answered yet, in the order of their deadlines (all are `timeoutMs` from their start). */
  private readonly unanswered = new Set<Pending>();
  /** The one timer for the first of their deadlines. */
  private expiryTimer?: NodeJS.Timeout;
  private readonly timeoutMs: number;
  /** TokenizerThreadData.cancelled, and the slots in it no pending request holds. */
  private readonly cancelled: Int32Array;
  private readonly freeSlots: number[];

  private constructor(options: TokenizerPoolOptions) {
    this.maxPending = options.maxPending ?? 1024;
    if (!Number.isInteger(this.maxPending) || this.maxPending < 1)
      throw new RangeError(`maxPending must be a positive integer, got ${options.maxPending}`);
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TOKENIZE_TIMEOUT_MS;
    if (!Number.isInteger(this.timeoutMs) || this.timeoutMs < 1 || this.timeoutMs > 2 ** 31 - 1)
      throw new RangeError(`timeoutMs must be an integer from 1 to ${2 ** 31 - 1}, got ${options.timeoutMs}`);
    const cancelled = new SharedArrayBuffer(4 * this.maxPending);
    this.cancelled = new Int32Array(cancelled);
    this.freeSlots = Array.from({ length: this.maxPending }, (_, i) => this.maxPending - 1 - i);
    this.data = {
      path: options.path,
      chatTemplate: options.chatTemplate,
      chatTemplateSource: options.chatTemplateSource,
      rendering: options.rendering,
      cacheEntries: options.cacheEntries,
      source: options.source,
      cancelled,
    };
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

  tokenize(
    request: RouteRequest,
    chat?: ChatTemplateRequest,
    addSpecialTokens = true,
    signal?: AbortSignal,
  ): Promise<ArrayLike<number>> {
    if (request.tokens) return Promise.resolve(request.tokens);
    if (this.closed) return Promise.reject(new TokenizerUnavailableError('the tokenizer pool is closed'));
    if (signal?.aborted) return Promise.reject(abortError());
    // (a request whose client left stays pending until its thread skips it: it holds a slot)
    if (this.jobs.size >= this.maxPending) {
      this.counters.rejectedBusy++;
      return Promise.reject(new TokenizerBusyError(this.jobs.size));
    }
    const index = this.pick(request);
    if (index < 0) return Promise.reject(new TokenizerUnavailableError('no tokenizer thread is running'));
    const slot = this.freeSlots.pop()!;
    Atomics.store(this.cancelled, slot, 0);
    const job = threadJob(this.nextId++, slot, request, chat, addSpecialTokens);
    const expiresAt = performance.now() + this.timeoutMs;
    return new Promise<ArrayLike<number>>((resolve, reject) => {
      const pending: Pending = {
        resolve,
        reject,
        thread: index,
        job,
        started: false,
        settled: false,
        expiresAt,
        moved: 0,
      };
      if (signal) {
        pending.signal = signal;
        pending.onAbort = () => this.abort(pending);
        signal.addEventListener('abort', pending.onAbort, { once: true });
      }
      this.jobs.set(job.id, pending);
      this.unanswered.add(pending);
      if (this.expiryTimer === undefined) this.armExpiry(this.timeoutMs);
      this.post(pending, index);
    });
  }

  stats(): TokenizerPoolStats {
    return { threads: this.threads.length, pending: this.jobs.size, ...this.counters };
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const t of this.restartTimers) clearTimeout(t);
    this.restartTimers.clear();
    for (const t of this.threads) clearTimeout(t.deadline);
    clearTimeout(this.expiryTimer);
    for (const job of this.jobs.values())
      this.settle(job, new TokenizerUnavailableError('the tokenizer pool is closed'));
    await Promise.all(this.threads.map((t) => t.worker.terminate()));
  }

  // ------------------------------------------------------------------------ internals

  /** Gives `job` to thread `index`. */
  private post(job: Pending, index: number): void {
    const thread = this.threads[index];
    job.thread = index;
    thread.pending++;
    thread.worker.postMessage(job.job);
  }

  /** Takes `job` out of the pool; rejects it with `err` unless it was settled already (or resolves it with `tokens`). */
  private settle(job: Pending, err: Error | undefined, tokens?: ArrayLike<number>): void {
    this.jobs.delete(job.job.id);
    this.freeSlots.push(job.job.slot);
    if (job.settled) return;
    job.settled = true;
    this.unanswered.delete(job);
    if (job.onAbort) job.signal!.removeEventListener('abort', job.onAbort);
    if (err) job.reject(err);
    else job.resolve(tokens!);
  }

  /**
   * Rejects `job` before its thread is done with it: a request not started is skipped by its
   * thread; it stays in `jobs` (and holds its slot) until its thread has answered or skipped it.
   */
  private answerEarly(job: Pending, err: Error): void {
    job.settled = true;
    this.unanswered.delete(job);
    if (job.onAbort) {
      job.signal!.removeEventListener('abort', job.onAbort);
      job.onAbort = undefined;
    }
    if (!job.started) Atomics.store(this.cancelled, job.job.slot, 1);
    job.reject(err);
  }

  /** The client left: the promise rejects now; a request not started is skipped by its thread. */
  private abort(job: Pending): void {
    if (job.settled) return;
    this.counters.aborted++;
    this.answerEarly(job, abortError());
  }

  /** `job` is past its deadline: it rejects now with TokenizeTimeoutError (the gateway routes it on its text). */
  private late(job: Pending): void {
    if (job.started) this.counters.timedOut++;
    else this.counters.timedOutWaiting++;
    this.answerEarly(job, new TokenizeTimeoutError(this.timeoutMs, !job.started));
  }

  /** The timer for the first deadline of `unanswered`, `ms` from now. */
  private armExpiry(ms: number): void {
    this.expiryTimer = setTimeout(this.onExpiryTimer, Math.max(1, Math.ceil(ms)));
    this.expiryTimer.unref();
  }

  // (judged after the messages already waiting are read, as a thread's deadline: see jobStarted)
  private readonly onExpiryTimer = (): void => void setImmediate(this.expire);

  /** Answers the requests past their deadline, and sets the timer for the next one. */
  private readonly expire = (): void => {
    this.expiryTimer = undefined;
    if (this.closed) return;
    const now = performance.now();
    for (const job of this.unanswered) {
      if (job.expiresAt > now) return this.armExpiry(job.expiresAt - now);
      this.late(job);
    }
  };

  /** Thread `index` started request `id`: the time the thread may spend on it runs from now. */
  private jobStarted(thread: Thread, index: number, id: number): void {
    const job = this.jobs.get(id);
    if (!job || thread.dead) return;
    job.started = true;
    thread.running = id;
    clearTimeout(thread.deadline);
    // judged after the messages already waiting are read: Node runs due timers before it hands
    // over a worker's messages, and after a stall of the event loop (a large body parsed, a
    // garbage collection) the answer may be waiting while the deadline fires
    thread.deadline = setTimeout(() => setImmediate(() => this.timedOut(thread, index, id)), this.timeoutMs);
    thread.deadline.unref();
  }

  /**
   * `thread` has worked on request `id` for `timeoutMs`: the thread is stopped, and replaced when
   * it exits (the request was answered at its deadline, which came first, unless the timers ran
   * out of order).
   */
  private timedOut(thread: Thread, index: number, id: number): void {
    thread.deadline = undefined;
    const job = this.jobs.get(id);
    if (thread.dead || thread.running !== id || !job) return;
    thread.dead = true;
    thread.timedOut = true;
    thread.pending--;
    this.log(
      `tokenizer thread ${index} took longer than ${this.timeoutMs} ms over one request: restarting it (the request is routed on its text)`,
    );
    if (!job.settled) this.late(job);
    this.settle(job, undefined);
    void thread.worker.terminate();
  }

  /** The least busy running thread, -1 when none runs. */
  private leastBusy(): number {
    let least = -1;
    for (let i = 0; i < this.threads.length; i++)
      if (!this.threads[i].dead && (least < 0 || this.threads[i].pending < this.threads[least].pending)) least = i;
    return least;
  }

  /**
   * The conversation's thread, unless it is far busier than the least busy one (or not running);
   * while none runs, one stopped past a deadline and not yet replaced (its requests go to the
   * replacement when it exits); -1: none at all.
   */
  private pick(request: RouteRequest): number {
    const n = this.threads.length;
    const least = this.leastBusy();
    if (least < 0) return this.closed ? -1 : this.threads.findIndex((t) => t.timedOut);
    if (n === 1) return least;
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
    const thread: Thread = { worker, pending: 0, dead: false, timedOut: false };
    this.threads[index] = thread;
    return new Promise<void>((resolve, reject) => {
      let ready = false;
      worker.on('message', (m: TokenizeReply | TokenizeNotice | { ready: boolean; error?: string }) => {
        if ('started' in m) return this.jobStarted(thread, index, m.started);
        if ('ready' in m) {
          ready = m.ready;
          if (m.ready) resolve();
          else reject(new RangeError(m.error ?? 'the tokenizer thread failed to start'));
          return;
        }
        if (thread.dead) return;
        if ('skipped' in m) {
          const job = this.jobs.get(m.skipped);
          if (!job) return;
          thread.pending--;
          this.settle(job, abortError());
          return;
        }
        const job = this.jobs.get(m.id);
        if (!job) return;
        thread.pending--;
        if (thread.running === m.id) {
          clearTimeout(thread.deadline);
          thread.deadline = undefined;
          thread.running = undefined;
        }
        // answered already (its client left, or its deadline passed while it was tokenized): dropped
        if (job.settled) this.settle(job, undefined);
        else if (m.error !== undefined) {
          this.counters.failed++;
          // media parts keep their kind across the thread boundary: the gateway routes them on text
          this.settle(
            job,
            m.errorName === 'UntokenizableContentError'
              ? new UntokenizableContentError(m.error)
              : new RangeError(m.error),
          );
        } else {
          this.counters.completed++;
          this.settle(job, undefined, m.tokens);
        }
      });
      worker.on('error', (err) => {
        if (!ready) reject(err);
        else this.log(`tokenizer thread ${index} failed: ${err.message}`);
      });
      worker.on('exit', () => {
        thread.dead = true;
        clearTimeout(thread.deadline);
        // a thread that exits before it is ready has not said why (the 'ready' message and
        // 'error' settle this first when it did)
        reject(new Error('the tokenizer thread stopped before it was ready'));
        // its requests cannot be answered here any more: the one it was working on when it died
        // fails (it may be what killed it); those it had not started (and, once the pool stopped
        // it past a deadline, every one) go to the replacement or another thread
        const orphans: Pending[] = [];
        for (const job of this.threads[index] === thread ? this.jobs.values() : []) {
          if (job.thread !== index) continue;
          if (job.settled) this.settle(job, undefined);
          // (a request that keeps killing threads before its start is seen fails too)
          else if ((job.started && !thread.timedOut) || job.moved >= 2) {
            this.counters.failed++;
            this.settle(job, new TokenizerUnavailableError('the tokenizer thread stopped'));
          } else orphans.push(job);
        }
        const replace = !this.closed && this.threads[index] === thread;
        // start() fails on a thread that never started; a replacement that never started is tried again later
        if (replace && !ready) {
          if (this.started)
            this.retrySpawn(index, Math.min(RESTART_DELAY_MAX_MS, 2 * failedDelayMs || RESTART_DELAY_MS));
        } else if (replace) {
          this.counters.threadRestarts++;
          this.spawn(index).catch((err: Error) =>
            this.log(`tokenizer thread ${index} could not be restarted: ${err.message}`),
          );
        }
        for (const job of orphans) {
          const to = this.closed ? -1 : this.leastBusy();
          if (to < 0) {
            this.counters.failed++;
            this.settle(job, new TokenizerUnavailableError('the tokenizer thread stopped'));
            continue;
          }
          job.started = false;
          if (!thread.timedOut) job.moved++;
          this.post(job, to);
        }
      });
    });
  }
}

/**
 * What a thread is posted for a request: a chat request alone when `chat` is given (the thread
 * reads nothing else), without its parsed messages when it holds their JSON text (messagesJson,
 * which the thread parses again: a chat with a tool call's 1 MB argument object posts 1 MB, not
 * that text and the same messages parsed besides); else the prompt or the messages.
 */
function threadJob(
  id: number,
  slot: number,
  request: RouteRequest,
  chat: ChatTemplateRequest | undefined,
  addSpecialTokens: boolean,
): TokenizeJob {
  if (chat) return { id, slot, chat: chat.messagesJson === undefined ? chat : { ...chat, messages: [] } };
  const job: TokenizeJob = {
    id,
    slot,
    request: request.messages ? { messages: request.messages } : { text: request.text ?? '' },
  };
  if (!addSpecialTokens) job.addSpecialTokens = false;
  return job;
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
