import {
  blockSize as checkBlockSize,
  keySet,
  knownKeys,
  requiredNonNegativeInt,
  requireId,
  workerId as checkWorkerId,
} from './validate.js';

/**
 * Most workers a router holds (each data-parallel rank is one). Every block-index node keeps,
 * per row, a mask word for each 32 worker slots, and every route scores every worker: 4,096
 * slots are 128 words a row, past any fleet one router fronts and short of an index whose
 * masks outweigh its blocks.
 */
export const MAX_WORKERS = 4096;

/**
 * The most requests an engine's reported queue or batch is taken for: a larger count (an
 * exporter's 1e308) is read as this many. Far past what an engine holds (it keeps every waiting
 * request's prompt in memory), and small enough that a sum over MAX_WORKERS workers stays an
 * exact integer: the policies' and the endpoint picker's arithmetic on the counts never reaches
 * Infinity (nor, subtracting it, NaN), so a huge queue still orders below a short one.
 */
export const MAX_ENGINE_REQUESTS = 1_000_000_000;

/**
 * Most CLA groups a worker serves (registerWorker()'s `info.claGroups`, and the groups
 * updateWorkerState() adds): each is kept in the worker's set and scanned when a request names
 * a group. The gateway's worker records (`cla=` of a --worker spec, the config file, the admin
 * API) take as many (WORKER_RECORD_SCHEMA in src/server/worker-input.ts).
 */
export const MAX_WORKER_CLA_GROUPS = 1024;

/** Most models a worker is registered as serving (`info.models`), as the gateway's worker records take. */
export const MAX_WORKER_MODELS = 1024;

/** Longest model name in `info.models`, in UTF-16 code units, as the gateway's worker records take. */
export const MAX_MODEL_NAME_LENGTH = 512;

/** Longest `info.url`, in UTF-16 code units: the gateway's bound on a worker's URL. */
export const MAX_WORKER_URL_LENGTH = 2048;

/** What a caller may say about a worker when registering it. */
export interface WorkerInfo {
  /** CLA groups (KV-compatibility classes) the worker serves from the start (at most MAX_WORKER_CLA_GROUPS). */
  claGroups?: readonly number[];
  /**
   * Base URL of the engine's OpenAI API, at most MAX_WORKER_URL_LENGTH characters; used by the
   * gateway (which checks its form), ignored by the core.
   */
  url?: string;
  /** Models the engine serves: at most MAX_WORKER_MODELS names of at most MAX_MODEL_NAME_LENGTH characters. */
  models?: readonly string[];
  /** Tokens per KV block on this engine (default: the router's block size). */
  blockSize?: number;
}

/** One engine instance as the router sees it. Mutable by the registry's owner only. */
export class WorkerState {
  /** 0-1 VRAM pressure (KV-cache usage) as last reported, clamped at 1. */
  load = 0;
  /** Prompt tokens the router sent that the engine has not prefilled yet (router's own count). */
  queuedPrefillTokens = 0;
  /** KV tokens of the router's requests that are decoding (router's own count). */
  activeDecodeTokens = 0;
  /** The router's requests on this worker that have not completed. */
  inFlightRequests = 0;
  /**
   * The part of the three counts above that other router replicas reported (shared state):
   * the totals are what policies see, the local part is total − remote.
   */
  remoteQueuedPrefillTokens = 0;
  remoteActiveDecodeTokens = 0;
  remoteInFlightRequests = 0;
  /** Engine-reported queue and batch (from /metrics), when scraped. */
  waitingRequests = 0;
  runningRequests = 0;
  /** KV-cache capacity in tokens, when the engine's metrics report it (0: unknown). */
  kvCapacityTokens = 0;
  /** When the engine's metrics were last read (router clock, ms); undefined until they are. */
  metricsAt: number | undefined = undefined;
  /** Health as decided by the gateway's checks; an unhealthy worker gets no requests. */
  healthy = true;
  readonly claGroups = new Set<number>();
  /** Last workflow step reported by updateWorkerState (kept for seed parity). */
  lastUsedStep = 0;
  /** Blocks the router has recorded on this worker. */
  activeBlocks = 0;
  /** A draining worker takes no new requests. */
  draining = false;

  constructor(
    readonly id: string,
    readonly info: Readonly<WorkerInfo>,
    /** Dense index of the worker in the block index's bitmasks; reused after removal. */
    readonly slot: number,
  ) {}

  /** Registered workers that may take new requests. */
  get available(): boolean {
    return !this.draining && this.healthy;
  }
}

/**
 * The workers in registration order. Registration order matters: the seed's CLA scan and
 * least-loaded ties are resolved by it, so the registry is a Map (insertion-ordered).
 */
export class WorkerRegistry {
  private readonly workers = new Map<string, WorkerState>();
  private readonly bySlot: Array<WorkerState | undefined> = [];

  /**
   * Registers a worker; a known id is left as it is. Returns the worker's state. The id and
   * the info are checked whether or not the id is known: a call refused for a new id is
   * refused for a known one too.
   */
  register(workerId: string, info: WorkerInfo = {}): WorkerState {
    checkWorkerId(workerId, 'workerId');
    const checked = checkInfo(info);
    const existing = this.workers.get(workerId);
    if (existing) return existing;
    if (this.workers.size >= MAX_WORKERS)
      throw new RangeError(`worker '${workerId}' not registered: the router holds at most ${MAX_WORKERS} workers`);
    let slot = this.bySlot.indexOf(undefined);
    if (slot < 0) slot = this.bySlot.length;
    const state = new WorkerState(workerId, checked, slot);
    for (const g of state.info.claGroups ?? []) state.claGroups.add(g);
    this.workers.set(workerId, state);
    this.bySlot[slot] = state;
    return state;
  }

  /** Removes a worker; returns its state (its slot is free again) or undefined. */
  remove(workerId: string): WorkerState | undefined {
    const state = this.workers.get(workerId);
    if (!state) return undefined;
    this.workers.delete(workerId);
    this.bySlot[state.slot] = undefined;
    return state;
  }

  atSlot(slot: number): WorkerState | undefined {
    return this.bySlot[slot];
  }

  /** One past the highest slot in use. */
  get slotCount(): number {
    return this.bySlot.length;
  }

  get(workerId: string): WorkerState | undefined {
    return this.workers.get(workerId);
  }

  has(workerId: string): boolean {
    return this.workers.has(workerId);
  }

  get size(): number {
    return this.workers.size;
  }

  /** Workers in registration order. */
  values(): IterableIterator<WorkerState> {
    return this.workers.values();
  }
}

/** The keys of WorkerInfo: any other is refused (a misspelt `blocksize` would be ignored). */
const WORKER_INFO_KEYS = keySet<WorkerInfo>({ claGroups: true, url: true, models: true, blockSize: true });

function checkInfo(info: unknown): WorkerInfo {
  if (info === undefined || info === null) return {};
  if (typeof info !== 'object' || Array.isArray(info)) {
    throw new TypeError('info must be an object');
  }
  knownKeys(info, WORKER_INFO_KEYS, 'info');
  const { claGroups, url, models, blockSize } = info as WorkerInfo;
  if (blockSize !== undefined) checkBlockSize(blockSize, 'info.blockSize');
  const checked: WorkerInfo = { ...(info as WorkerInfo) };
  // each element read once, checked and copied: a hole (`[, 1]`) is refused as the undefined
  // it reads as, and a later change to the caller's list does not show in the worker's info
  if (claGroups !== undefined) {
    if (!Array.isArray(claGroups)) throw new TypeError('info.claGroups must be an array of integers');
    // the elements up to the bound, then the length: a list of millions is refused without
    // reading past the bound (it was read and copied until the engine's own bound on a Set,
    // about 16.7 million, threw, naming nothing)
    const groups: number[] = [];
    for (let i = 0; i < Math.min(claGroups.length, MAX_WORKER_CLA_GROUPS); i++)
      groups.push(requiredNonNegativeInt(claGroups[i], `info.claGroups[${i}]`));
    if (claGroups.length > MAX_WORKER_CLA_GROUPS)
      throw new RangeError(
        `info.claGroups must list at most ${MAX_WORKER_CLA_GROUPS} CLA groups, got ${claGroups.length}`,
      );
    checked.claGroups = groups;
  }
  if (url !== undefined && requireId(url, 'info.url').length > MAX_WORKER_URL_LENGTH)
    throw new RangeError(`info.url must be at most ${MAX_WORKER_URL_LENGTH} characters, got ${url.length}`);
  if (models !== undefined) {
    if (!Array.isArray(models)) throw new TypeError('info.models must be an array of strings');
    const names: string[] = [];
    for (let i = 0; i < Math.min(models.length, MAX_WORKER_MODELS); i++) {
      const name = requireId(models[i], `info.models[${i}]`);
      if (name.length > MAX_MODEL_NAME_LENGTH)
        throw new RangeError(
          `info.models[${i}] must be at most ${MAX_MODEL_NAME_LENGTH} characters, got ${name.length}`,
        );
      names.push(name);
    }
    if (models.length > MAX_WORKER_MODELS)
      throw new RangeError(`info.models must list at most ${MAX_WORKER_MODELS} models, got ${models.length}`);
    checked.models = names;
  }
  return checked;
}
