import { PendingPrefixes } from './pending-prefixes.js';
import { pickMaxScore, TIE_EPSILON } from './pick.js';
import { PrefixSharers } from './prefix-sharers.js';
import { resized } from '../typed-arrays.js';
import type { WorkerState } from '../worker-registry.js';
import { NO_CHOICE, type Candidate, type PolicyChoice, type RouteFeatures, type RoutingPolicy } from './types.js';

/**
 * The `cost` policy estimates, for every candidate worker, what sending the request there
 * costs the fleet in prefill time, and picks the cheapest. Every term is measured in
 * prefill-token equivalents (÷ `prefillTokensPerSecond` gives seconds, which `explain` shows):
 *
 *   C      = max(cachedTokens, pending)               what the worker holds or is about to hold:
 *                                                    the index's count, or the prefix of an
 *                                                    unfinished request routed there (its KV is
 *                                                    reported only once computed, after its queue)
 *   W(u)   = u · (1 + attention · (P − u/2))         this request's prefill: u = P − C uncached
 *                                                    tokens, each attending to the cached context
 *   slow   = 1 + decode · activeDecodeTokens          decode steps interleaved with prefill chunks
 *   queue  = queuedPrefillTokens + A                 the worker's queued prefill, A the attention
 *                                                    work (W(u) − u) of this router's requests
 *                                                    still in prefill there (until their first token)
 *   late   = how far past the router's own estimate   a worker running behind what the model
 *            of its TTFT the oldest request this      says (a queue whose requests recompute
 *            router queued on the worker is (when     what the others evicted): its backlog
 *            no in-flight request shares the prefix)  beyond the queue, measured, not modelled
 *   wait   = (queue + W(u)) · slow + late            estimated TTFT on this worker
 *   kvWait = max(0, K + P − H − (1 − kvUsage) · kvCapacity)  KV the request must wait for
 *                                                    (capacity known): its prompt, after the cached
 *                                                    prefixes (K) of this router's requests queued
 *                                                    there before it, which each takes out of the
 *                                                    free KV when admitted (first come, first
 *                                                    served; a prefix several of them share counts
 *                                                    once); H, of the prefix this router's in-flight
 *                                                    requests there hold or bring, what is counted
 *                                                    with them already: all of it when the one
 *                                                    holding its deepest block runs (in the KV
 *                                                    usage), its cached part when that one is still
 *                                                    in prefill (in K; the rest it computes when
 *                                                    admitted takes free KV once, with this one)
 *   atRisk = W(u + e) − W(u),                        the recompute of the cached prefix it may lose
 *            e = min((C − Hq) / (1 + hot), kvWait)   while it waits: vLLM counts a prefix no running
 *                                                    request holds as free KV (H too, once the
 *                                                    requests holding it end), and the requests
 *                                                    admitted before it take what it lacks out of
 *                                                    the free blocks; at most that much of its share
 *                                                    of the prefix goes, recomputed at the end of its
 *                                                    context. Hq, brought by a request still in
 *                                                    prefill there, is held when this one is
 *                                                    admitted. A bound, not an estimate: not in its
 *                                                    estimated TTFT
 *   σ      = mean queued prefill / mean request work  fleet saturation: requests queued per worker
 *            (0 while another worker is idle:        (the best-cached worker's own queue left out),
 *            nothing queued and free KV for the      none while idle capacity absorbs the extra
 *            mean prompt) + share of workers with    prefill; the busy share: the chance a
 *            requests in flight                      recompute delays an arrival below saturation
 *   ρ      = h / (1 − h), h the smoothed hit rate     reuses of a cached token (what a copy displaces)
 *   full   = the worker's cached tokens / its KV capacity (else / the fullest worker's)
 *   recompute = recompute · σ · (W(u) − W(u_best)) / (1 + hot) + ρ · full · u
 *                                                    the extra prefill (over the best-cached worker)
 *                                                    delays the σ requests queued behind it, shared
 *                                                    by the `hot` in-flight requests that will reuse
 *                                                    a replica of a hot prefix; and every new token
 *                                                    evicts, where the cache is full, a cached one
 *                                                    worth ρ recomputes
 *   F      = u + C / (1 + hot)                        the KV the request holds on the worker: its
 *                                                    uncached tokens and its share of the cached
 *                                                    prefix, held with the `hot` in-flight requests
 *                                                    that reuse it
 *   guard  = P · (load · kvUsage − cla · servesCla − workflow · continuity)
 *            + pressure · overKnee · W_F, W_F = F · (1 + attention · (P − F/2))
 *                                                    (the affinity bonuses only for prompts without
 *                                                    blocks, the seed API: otherwise cachedTokens
 *                                                    already counts what they stand for)
 *   arrivalDelay = W · Σ λ_M · E[min(U, M)]          the requests the worker receives during this
 *                  (W = W(u) · slow)                 prefill (λ_M: the rate this router sent it
 *                                                    requests that held M there beyond what every
 *                                                    worker holds) wait what is left of it (U), or
 *                                                    leave when recomputing M elsewhere costs less
 *   cost   = wait + kvWait + atRisk + recompute + guard + arrivalDelay
 *
 * A new session (no worker holds more of it than every worker does) has no worker of its own:
 * it considers only the workers where its estimated TTFT (wait + kvWait) is within
 * `newSessionSlack` of its lowest, and among them takes the one whose own sessions it delays
 * least, unless its workflow step's previous worker or a worker serving its CLA group costs
 * within that share more (preferredWithinBound). Unbounded, the arrival delay would send a long new prompt to the worker receiving the
 * fewest requests, often the one with the longest queue; ignored, the prompt lands on a worker
 * whose sessions' next turns then wait behind it, or leave and recompute their history.
 *
 * At light load σ ≈ 0 and the policy minimises the request's own TTFT (spread); at saturation
 * σ grows and a recompute is charged for every request it delays (keep prefixes together).
 * A prompt longer than a worker's KV capacity cannot run there at all: that worker is left
 * out unless no worker can take it. Workers at or above `pressureCeiling` KV usage are left
 * out unless every candidate is (when the capacity is unknown). docs/routing.md derives each
 * term and works an example per regime.
 */
export interface CostWeights {
  /** Prefill throughput of one worker (tokens/s): converts token equivalents to the seconds `explain` shows, and a worker's measured lateness back. */
  prefillTokensPerSecond: number;
  /** Prefill cost of one new token per context token it attends to, relative to its linear layers. */
  attention: number;
  /** Prefill slowdown per KV token of requests decoding on the worker. */
  decode: number;
  /** Multiplier of the saturation term (1: as derived). */
  recompute: number;
  /** Linear penalty per unit of KV usage, in units of the request's prompt. */
  load: number;
  /**
   * Extra penalty beyond the knee (VRAM pressure), scaled to 1 at full KV usage: how many times the
   * recompute of what the request holds on the worker (its footprint, at the end of its context) it is charged.
   */
  pressure: number;
  /** KV usage at which the pressure penalty starts. */
  pressureKnee: number;
  /** KV usage at or above which a worker is excluded while any other is below it. */
  pressureCeiling: number;
  /** Reward for serving the request's CLA group, in units of the request's prompt (seed API only). */
  cla: number;
  /** Reward for the worker that ran the workflow's previous step, in units of the request's prompt (seed API only). */
  workflow: number;
  /** KV capacity of a worker in tokens (a whole number) when its metrics do not say (0: unknown). */
  kvCapacityTokens: number;
  /**
   * Share of its lowest estimated TTFT a new session may give up to spare the sessions of the
   * worker it lands on; and of its lowest cost, to stay with its workflow step's previous worker
   * or its CLA group's.
   */
  newSessionSlack: number;
  /** How far past the router's estimate (token equivalents) a first token may come before its worker counts as late. */
  lateGraceTokens: number;
}

/**
 * The physical constants describe Qwen3-32B fp8 on one H100 SXM, from the same hardware
 * figures as the simulator's engine model (ENGINE_DEFAULTS in src/engine-model/config.ts):
 * - prefillTokensPerSecond: an 8,192-token chunk is compute-bound at 0.054 ms per token
 *   (2 FLOP per parameter at 60% of the dense fp8 peak) = 442 ms ≈ 18,500 tokens/s;
 * - attention: 2.1 MFLOP per (query, key) pair at the attention rate (3.5e-6 ms) over the
 *   linear layers' 0.054 ms per token ≈ 6.5e-5;
 * - decode: reading one KV token per step (4.9e-5 ms at 80% of HBM bandwidth) over one
 *   chunk's 442 ms ≈ 1.1e-7.
 * The guard weights (load, knee, ceiling) and bonuses (cla, workflow) are set by hand, not
 * derived; the bonuses count only for prompts without blocks (the seed API, which gives no
 * prompt and no queue counts). The pressure prices what the request holds past the knee at its
 * recompute; how many times is not derived: 3 was chosen on the training split and the seeds
 * the prefix at risk was chosen on (1 to 6 tried, docs/routing.md §7, "The pressure priced at
 * the recompute of what a request holds"). newSessionSlack is a bound on a new session's own TTFT
 * (and on what it pays to keep its workflow's or CLA group's worker), not a derived quantity: 0.1 was chosen on the training split (0, 0.1 and 0.25 tried,
 * docs/routing.md §7).
 * - lateGraceTokens: what an engine adds to every first token beyond the queue the router
 *   models: the step in progress when the request arrives (at most one step's token budget,
 *   vLLM's max_num_batched_tokens, 8,192 when an H100 serves it), the step's own floor, and the
 *   HTTP and tokenization around it. A worker whose oldest queued request is late by less
 *   than one full step (8,192 token equivalents, 0.44 s) is not running late, only stepping.
 */
export const DEFAULT_COST_WEIGHTS: Readonly<CostWeights> = Object.freeze({
  prefillTokensPerSecond: 18_500,
  attention: 6.5e-5,
  decode: 1.1e-7,
  recompute: 1,
  load: 0.5,
  pressure: 3,
  pressureKnee: 0.8,
  pressureCeiling: 0.95,
  cla: 0.3,
  workflow: 0.6,
  kvCapacityTokens: 0,
  newSessionSlack: 0.1,
  lateGraceTokens: 8_192,
});

/**
 * What is wrong with the knee given the ceiling of `w` (the weights with the defaults filled
 * in), as the phrase after `pressureKnee`, or undefined when they go together. With the knee at
 * or above the ceiling a worker is left out before the pressure term ever counts against it.
 */
export function kneeCeilingProblem(w: Pick<CostWeights, 'pressureKnee' | 'pressureCeiling'>): string | undefined {
  return w.pressureKnee < w.pressureCeiling
    ? undefined
    : `must be below pressureCeiling (got pressureKnee ${w.pressureKnee}, pressureCeiling ${w.pressureCeiling})`;
}

/** Prompt length assumed when the request does not say (seed API without tokenLength). */
export const REFERENCE_PROMPT_TOKENS = 4096;

/** Decisions over which a prefix's share of the traffic is averaged (hotness). */
export const HOT_WINDOW_DECISIONS = 256;
/** Slots of the hotness table (a power of two; colliding prefixes share a slot). */
const HOT_SLOTS = 4096;
/** The displaced tokens are the least recently used: their reuse is capped at a 75% hit rate's (3). */
const MAX_REUSE_HIT = 0.75;
/**
 * Time over which the rate of requests sent to each worker is measured: a minute spans the
 * gaps between a session's turns (tool calls and a user's replies take seconds to tens of
 * seconds), so a worker whose sessions are between turns still counts them, and still
 * follows sessions that end or move.
 */
export const ARRIVAL_WINDOW_MS = 60_000;

/**
 * What is left of a worker's decayed count `elapsed` ms after it was last counted. A time before
 * that (a clock set back, a caller's `now` on another clock) counts as no time passed: the
 * count would otherwise grow without bound, to Infinity, and keep its worker from every decision.
 */
function decayOver(elapsed: number): number {
  return elapsed > 0 ? Math.exp(-elapsed / ARRIVAL_WINDOW_MS) : 1;
}
/** Slots of the table of queued requests' attention work, by ticket (a power of two; tickets are sequential). */
const QUEUED_TICKETS = 65_536;
/**
 * Queued requests per worker whose estimated first-token times are kept, oldest first, for the
 * lateness (a power of two): past it the oldest are forgotten, which can only understate it.
 */
const LATE_RING = 1024;
/** Smoothing of the mean work per request (decisions). */
const WORK_SMOOTHING = 64;

/** Prefill work (token equivalents) of `uncached` new tokens at the end of a `prompt`-token context. */
export function prefillWork(uncached: number, prompt: number, attention: number): number {
  return uncached * (1 + attention * (prompt - uncached / 2));
}

/** The fleet-wide quantities every candidate's cost depends on, computed once per decision. */
export interface FleetView {
  /** Requests queued per worker: mean queued prefill over the mean work a request adds. */
  queuedPerWorker: number;
  /** Idle workers (idleFor) other than the best-cached one, whose queue is left out. */
  idleWorkers: number;
  /** The slot of the idle worker when there is only one (-1 otherwise): it alone sees no other. */
  soleIdleSlot: number;
  /** Share of the workers with requests in flight. */
  busyShare: number;
  /** Reuses of a cached token, h/(1−h) for the smoothed hit rate h: what an evicted token loses. */
  reuse: number;
  /** Most block-index entries any candidate has (the cache fullness reference when capacity is unknown). */
  mostEntries: number;
  /** In-flight requests expected to share this request's cached prefix. */
  hotness: number;
  /** Most cached tokens any candidate holds, and that candidate's prefill work. */
  bestCachedTokens: number;
  bestWork: number;
  /** Fewest cached tokens any candidate holds (what every worker holds, e.g. a shared system prompt). */
  leastCachedTokens: number;
  /** Some candidate is below the pressure ceiling (unknown capacity) / can fit the prompt. */
  anyBelowCeiling: boolean;
  anyFits: boolean;
  /**
   * A new session: no candidate holds a block more of the prompt than every candidate does
   * (and, for a prompt without blocks, none ran its workflow's previous step or serves its CLA group).
   */
  newSession: boolean;
  /** Highest estimated TTFT (token equivalents) a new session considers; Infinity otherwise. */
  ttftBound: number;
}

/** Per-candidate terms of the cost, in prefill-token equivalents. */
class Terms {
  // the inputs computeTerms() reads besides the candidate: fields, not arguments, because a
  // fractional number passed to a function that is not inlined is boxed (16 bytes a call)
  /** What the worker holds or is about to hold of the prompt (see CostPolicy.cachedOn). */
  cached = 0;
  /**
   * The requests this router sent the worker lately, by what leaving it would cost each (see
   * CostPolicy.countRouted): decayed counts and sums of that work per bucket, the worker's
   * buckets from `stuckBase`, and the factor their decay since last counted leaves.
   */
  stuckCounts: Float64Array = EMPTY;
  stuckSums: Float64Array = EMPTY;
  stuckBase = -1;
  stuckDecay = 0;
  /** Attention work of this router's requests queued on the worker (see CostPolicy.queuedAttention). */
  queuedAttention = 0;
  /** Cached prompt tokens of this router's requests queued on the worker (see CostPolicy.queuedCached). */
  queuedCached = 0;
  /**
   * How late the worker runs past this router's estimates, in token equivalents (see
   * CostPolicy.lateness); 0 for a prefix the requests in flight share (see termsOf).
   */
  late = 0;
  /** In-flight requests this router sent the worker that share the request's prefix (see PrefixSharers). */
  sharersHere = 0;

  prompt = 0;
  uncached = 0;
  work = 0;
  slowdown = 1;
  queue = 0;
  wait = 0;
  kvCapacity = 0;
  kvWait = 0;
  /** The cached prefix the request may lose while it waits for KV (tokens), and its recompute (token equivalents). */
  prefixAtRiskTokens = 0;
  prefixAtRisk = 0;
  /** The prefix this router's in-flight requests on the worker hold or bring (see PendingPrefixes). */
  pendingTokens = 0;
  /** Of it, the prefix a request still in prefill there brings: admitted before this one, it holds it then. */
  pinnedAhead = 0;
  /** Of it, what the KV usage or K counts already (H in the KV wait). */
  heldElsewhere = 0;
  fits = true;
  saturation = 0;
  fullness = 0;
  recompute = 0;
  kvFootprint = 0;
  /** The guard's part past the knee (token equivalents). */
  pressure = 0;
  guard = 0;
  arrivalDelay = 0;
  cost = 0;
}

const EMPTY = new Float64Array(0);
/** Buckets of the work a request would recompute elsewhere: [0, 1), then [2^(b−1), 2^b) token equivalents. */
const STUCK_BUCKETS = 32;

/** The bucket of a request whose move elsewhere would cost `work` token equivalents. */
function stuckBucket(work: number): number {
  return work < 1 ? 0 : Math.min(STUCK_BUCKETS - 1, 1 + Math.floor(Math.log2(work)));
}

/**
 * The wait per token-equivalent of this prefill that the requests arriving at the worker while
 * it runs (at the rates this router sent it requests lately) suffer: an arrival at a uniform
 * time of a `prefill`-long run would wait U, uniform on [0, prefill], but leaves for another
 * worker when that costs it less: recomputing what it holds here, M. E[min(U, M)] is
 * M·(1 − M/(2·prefill)) below `prefill`, prefill/2 above it. A request that holds nothing here
 * (a new session) goes elsewhere at no cost and waits for nothing. The requests of a bucket are
 * taken at their mean M.
 */
function stuckWait(t: Terms, prefill: number, w: Readonly<CostWeights>): number {
  if (t.stuckBase < 0 || prefill <= 0) return 0;
  const perTokenEquivalent = (t.stuckDecay / ARRIVAL_WINDOW_MS) * (1000 / w.prefillTokensPerSecond);
  let sum = 0;
  for (let b = 0; b < STUCK_BUCKETS; b++) {
    const count = t.stuckCounts[t.stuckBase + b];
    if (count <= 0) continue;
    const m = t.stuckSums[t.stuckBase + b] / count;
    sum += count * (m < prefill ? m * (1 - m / (2 * prefill)) : prefill / 2);
  }
  return sum * perTokenEquivalent;
}

/**
 * Whether a worker is idle capacity for the fleet's arrivals: nothing queued, and free KV for a
 * typical prompt (`arrivalPrompt`, the smoothed prompt of a routed request). A worker whose queue
 * is empty but whose KV its running requests fill admits an arrival only once some of them end:
 * counted idle, it made every recompute look free while the rest of the fleet was saturated
 * (docs/routing.md §7, "Idle capacity that can take an arrival"). With the KV capacity unknown,
 * or no prompt seen yet, an empty queue is enough.
 */
function idleFor(worker: WorkerState, w: Readonly<CostWeights>, arrivalPrompt: number): boolean {
  if (worker.queuedPrefillTokens !== 0) return false;
  const capacity = worker.kvCapacityTokens > 0 ? worker.kvCapacityTokens : w.kvCapacityTokens;
  return capacity <= 0 || (1 - worker.load) * capacity >= arrivalPrompt;
}

/** Fills `t` with candidate `c`'s terms from the inputs already in `t`; allocates nothing. */
function computeTerms(t: Terms, c: Candidate, r: RouteFeatures, w: Readonly<CostWeights>, fleet: FleetView): Terms {
  const cached = t.cached;
  const queuedAttention = t.queuedAttention;
  const known = r.promptTokens > 0;
  const prompt = known ? r.promptTokens : REFERENCE_PROMPT_TOKENS;
  const uncached = known ? Math.max(0, prompt - cached) : (1 - c.cachedFraction) * prompt;
  const worker = c.worker;
  const work = prefillWork(uncached, prompt, w.attention);
  const slowdown = 1 + w.decode * worker.activeDecodeTokens;
  const capacity = worker.kvCapacityTokens > 0 ? worker.kvCapacityTokens : w.kvCapacityTokens;
  // vLLM counts cached-but-idle blocks as free: the whole prompt must fit in the free part, and
  // the requests queued before it take their cached prefixes out of it first when admitted. A
  // prefix this router's in-flight requests there hold (running: in the KV usage) or reuse
  // (queued: in K) takes no free KV for the request again: counted twice, a sibling of a hot
  // prompt, or a turn sent while its previous turn still answers, waited for KV its prefix
  // already had. What a queued one computes is in neither, and takes free KV once
  const kvWait =
    capacity > 0
      ? Math.max(0, t.queuedCached + prompt - Math.min(prompt, t.heldElsewhere) - (1 - worker.load) * capacity)
      : 0;
  const kv = worker.load;
  const overKnee = kv > w.pressureKnee ? (kv - w.pressureKnee) / (1 - w.pressureKnee) : 0;
  t.prompt = prompt;
  t.uncached = uncached;
  t.work = work;
  t.slowdown = slowdown;
  // the queue is its tokens plus, for the requests this router queued there, the attention
  // over their context: a 100,000-token context recomputed takes ~4× its token count
  t.queue = worker.queuedPrefillTokens + queuedAttention;
  // a worker running behind the router's own estimates (its oldest queued request past its
  // estimated first token) will keep a new request waiting that much more: what the model
  // missed there (turns recomputing the histories other sessions' turns evicted) is measured
  t.wait = (t.queue + work) * slowdown + t.late;
  t.kvCapacity = capacity;
  t.kvWait = kvWait;
  // vLLM counts a cached prefix that no running request holds as free KV (the prefix in-flight
  // requests hold, too, once they end: a session's previous turn still answering), and a
  // request short of free KV waits while the requests admitted before it take their blocks out
  // of the free ones, least recently used first: up to what it lacks of its own prefix may go,
  // and be recomputed at the end of its context (the end of a 100,000-token history ~7× its
  // tokens). A prefix that a request still in prefill there brings is held when this one is
  // admitted (that one is admitted first), and the in-flight requests reusing it there keep it:
  // only the rest of the request's share is at risk. Those on other workers keep their own
  // copies, not this one: counted fleet-wide, a hot prefix's siblings waited on a worker where
  // none of them ran, and lost the prefix while they waited (docs/routing.md §7, "A prefix kept
  // by the requests that share it there"). It is a bound: such turns lose a
  // fraction of it, since the free blocks hold older ones. But by the time they lose more, the
  // worker's sessions have outgrown its KV and its turns evict one another's histories in turn,
  // and a worker found running late is left too late; charged the bound, a session leaves a
  // holder whose KV runs short sooner (docs/routing.md §7, "The prefix at risk while a turn waits")
  const atRiskTokens =
    kvWait > 0 ? Math.min(Math.max(0, prompt - uncached - t.pinnedAhead) / (1 + t.sharersHere), kvWait) : 0;
  t.prefixAtRiskTokens = atRiskTokens;
  t.prefixAtRisk = atRiskTokens > 0 ? prefillWork(uncached + atRiskTokens, prompt, w.attention) - work : 0;
  t.fits = capacity <= 0 || prompt <= capacity;
  // a copy displaces cached KV only where the cache is full: an empty worker loses nothing
  const held = c.indexEntries * r.blockSize;
  const fullness =
    capacity > 0 ? Math.min(1, held / capacity) : fleet.mostEntries > 0 ? c.indexEntries / fleet.mostEntries : 0;
  t.fullness = fullness;
  // extra prefill delays queued requests only when no idle capacity absorbs it: while another
  // worker is idle (idleFor), arrivals go there and a recompute here delays none of them, so
  // an idle worker takes a long session a full holder cannot serve instead of being charged as
  // if the fleet were saturated; once every other worker has a queue, the fleet is (σ as derived)
  const anotherIdle = fleet.idleWorkers > 1 || (fleet.idleWorkers === 1 && worker.slot !== fleet.soleIdleSlot);
  t.saturation = (anotherIdle ? 0 : fleet.queuedPerWorker) + fleet.busyShare;
  t.recompute =
    (w.recompute * t.saturation * Math.max(0, work - fleet.bestWork)) / (1 + fleet.hotness) +
    fleet.reuse * fullness * uncached;
  // CLA and workflow affinity stand in for the cached KV when the prompt is not hashed (the
  // seed API); with blocks, cachedTokens already counts it and a bonus would count it twice
  const affinity = r.requestBlocks > 0 ? 0 : (c.servesCla ? w.cla : 0) + (c.continuity ? w.workflow : 0);
  // past the knee, a worker's KV is short: what the request holds there is what it takes from
  // the running requests' room to grow, which they win back by preempting one another. A
  // session's history is held by its turn alone, all of it (a long turn on a full holder waits
  // for answers to end); a hot prefix is held once by all the in-flight requests that reuse it,
  // and each sibling a full holder serves takes little more than its own tokens. Charged for the
  // whole prompt, a full holder of a hot prefix looked as costly as any full worker: on small
  // workers the siblings spread until each served several hot prefixes at once, whose KV left
  // their answers no room (docs/routing.md §7, "Hot prefixes on full workers"). When blocks run
  // out, vLLM preempts the newest running request first, the one admitted last onto the full
  // worker, and it recomputes what it held at the end of its context: a token of a 100,000-token
  // history costs ~3.5× a chat's to win back. Counted in tokens, a chat's was charged as much as a
  // long session's: the chats of many tenants left their full holders, copying their prompts
  // onto every small worker, while a long session stayed on a worker its sessions had outgrown
  // (docs/routing.md §7, "The pressure priced at the recompute of what a request holds")
  const footprint = uncached + (prompt - uncached) / (1 + fleet.hotness);
  t.kvFootprint = footprint;
  t.pressure = overKnee > 0 ? w.pressure * overKnee * prefillWork(footprint, prompt, w.attention) : 0;
  t.guard = prompt * (w.load * kv - affinity) + t.pressure;
  // the requests the worker receives while this prefill runs wait behind it (λ·W arrivals, what
  // is left of it each, W/2 on average) or leave for another worker, when recomputing what they
  // hold there costs less: its sessions' next turns wait, a chat holding a few thousand tokens
  // there leaves, a new session holds nothing there. An idle worker that receives nothing costs
  // nobody anything; an idle one whose sessions are between turns is not free. A new session
  // weighs it only among the workers within its TTFT bound (fleet.ttftBound, applied by the
  // caller). A prompt without blocks that has a workflow or CLA worker (the seed API) is held
  // nowhere more than everywhere and is no new session: its affinity bonus, not its arrivals,
  // decides
  const prefill = work * slowdown;
  const ownWorker = fleet.bestCachedTokens - fleet.leastCachedTokens >= r.blockSize;
  t.arrivalDelay = ownWorker || fleet.newSession ? prefill * stuckWait(t, prefill, w) : 0;
  t.cost = t.wait + kvWait + t.prefixAtRisk + t.recompute + t.guard + t.arrivalDelay;
  return t;
}

/**
 * A new session's own worker: among the candidates its TTFT bound leaves (scores not NaN) and
 * whose cost is within `slack` of the cheapest's, the cheapest that ran its workflow's previous
 * step (a pipeline's step, `pipelineStep`: a session's turn that names no step follows its KV,
 * and where nothing of it is held anywhere it holds no worker either), else the cheapest serving
 * its CLA group; -1 when none. Nothing of a new session's prompt is held anywhere more than
 * everywhere, so the cost's cache terms cannot stand for them: a workflow's next step on prompts
 * of its own, or a CLA group's requests, spread over the fleet by differences of a fraction of a
 * percent in the other terms, though the seed prefers those workers (docs/architecture.md §1). The slack is the share a new session gives up to spare
 * other sessions (newSessionSlack), of its whole cost: a step leaves a worker that costs more
 * than that (a queue, KV past the knee).
 */
function preferredWithinBound(
  candidates: readonly Candidate[],
  scores: Float64Array,
  slack: number,
  pipelineStep: boolean,
): number {
  let best = -Infinity;
  for (let i = 0; i < candidates.length; i++) if (scores[i] > best) best = scores[i];
  // scores are −cost: within the slack of the cheapest's cost
  const floor = best - slack * Math.abs(best);
  let continuity = -1;
  let serving = -1;
  for (let i = 0; i < candidates.length; i++) {
    const s = scores[i];
    // NaN (outside the TTFT bound, or excluded) fails the comparison
    if (!(s >= floor)) continue;
    const c = candidates[i];
    if (pipelineStep && c.continuity && (continuity < 0 || s > scores[continuity])) continuity = i;
    if (c.servesCla && (serving < 0 || s > scores[serving])) serving = i;
  }
  return continuity >= 0 ? continuity : serving;
}

/**
 * Among the candidates whose score ties the picked one's, the worker that ran the workflow's
 * previous step, else one serving the request's CLA group, else the one picked (the rotation).
 * With blocks the cost counts neither (the cache they stand for is in `cachedTokens`); at equal
 * cost they still decide, as the seed prefers them: a workflow's next step on other tokens, or a
 * group's first request on an idle fleet, no longer goes wherever the rotation points.
 */
function preferredAmongTies(candidates: readonly Candidate[], scores: Float64Array, picked: number): number {
  const c = candidates[picked];
  if (c.continuity) return picked;
  const tied = scores[picked] - TIE_EPSILON;
  let serving = c.servesCla ? picked : -1;
  for (let i = 0; i < candidates.length; i++) {
    const s = scores[i];
    // NaN (an excluded worker) fails the comparison
    if (!(s >= tied)) continue;
    if (candidates[i].continuity) return i;
    if (serving < 0 && candidates[i].servesCla) serving = i;
  }
  return serving >= 0 ? serving : picked;
}

/**
 * The default policy (see CostWeights). Ties go to the workflow's previous worker or the CLA
 * group's (preferredAmongTies), else rotate among the tied workers instead of always going to
 * the first registered one, which would skew a fleet of equally idle workers.
 */
export class CostPolicy implements RoutingPolicy {
  readonly name = 'cost';
  readonly readsBlocks = true; // pending prefixes: every block of every request
  // the pending prefixes hold a tracked request's whole prompt until it ends, which precise
  // mode's speculative stretch (16 blocks past what the worker holds, for 5 s) only repeats
  readonly speculative = 'untracked';
  private readonly tieBreak = { cursor: 0 };
  private readonly scratch: number[] = [];
  /** Each candidate's score (−cost; NaN: excluded), by index, for the pick. */
  private scores = new Float64Array(16);
  private readonly terms = new Terms();
  /** A new session's candidates' costs and estimated TTFTs (NaN: excluded), by index, computed once for its bound. */
  private boundedCosts = new Float64Array(16);
  private boundedTtfts = new Float64Array(16);
  // the fleet view and the scoring closure are made once; choose() sets what they read
  private readonly fleet: FleetView = {
    queuedPerWorker: 0,
    idleWorkers: 0,
    soleIdleSlot: -1,
    busyShare: 0,
    reuse: 0,
    mostEntries: 0,
    hotness: 0,
    bestCachedTokens: 0,
    bestWork: 0,
    leastCachedTokens: 0,
    anyBelowCeiling: true,
    anyFits: true,
    newSession: false,
    ttftBound: Infinity,
  };
  private request: RouteFeatures | undefined;
  /** Smoothed uncached tokens a routed request adds to its worker's queue (0 before the first). */
  private meanWork = 0;
  /** Smoothed prompt tokens of a routed request (0 before the first, and while prompts are unknown). */
  private meanPrompt = 0;
  /** Smoothed fraction of the routed prompts found cached on the chosen worker. */
  private meanHit = 0;
  /** The last choice's uncached tokens and cached share, for onRouted(). */
  private chosenUncached = 0;
  /** The prefix of the last choice that requests this router sent the same worker were bringing or holding. */
  private chosenPending = 0;
  /** The tokens of the last choice's content anchors held on the chosen worker (tracked apart from its blocks). */
  private chosenAnchorTokens = 0;
  private chosenHit = 0;
  private chosenWork = 0;
  private chosenMoveWork = 0;
  /** The last choice's estimated TTFT without its lateness (token equivalents). */
  private chosenEstimate = 0;
  /** This router's requests still in prefill, by ticket: the worker slot (+1; 0 none), their attention work and cached tokens. */
  private readonly queuedTicket = new Float64Array(QUEUED_TICKETS);
  private readonly queuedSlot = new Int32Array(QUEUED_TICKETS);
  private readonly queuedWork = new Float64Array(QUEUED_TICKETS);
  private readonly queuedCachedTokens = new Float64Array(QUEUED_TICKETS);
  /** Of those cached tokens, the ones of content anchors (not index entries: not bounded by them). */
  private readonly queuedCachedAnchorTokens = new Float64Array(QUEUED_TICKETS);
  /** When the router expected each one's first token (ms, on the clock of its `now`), from its estimated TTFT. */
  private readonly queuedDue = new Float64Array(QUEUED_TICKETS);
  /**
   * Per worker slot, its queued tickets in the order they were routed (LATE_RING each): the
   * oldest still queued is the one that tells how late the worker runs. `lateHead`/`lateTail`
   * count the tickets taken out and put in.
   */
  private lateRing = new Float64Array(0);
  private lateHead = new Float64Array(0);
  private lateTail = new Float64Array(0);
  /** Whether each queued ticket was put in its worker's ring (its first token will be reported). */
  private readonly queuedTimed = new Uint8Array(QUEUED_TICKETS);
  /**
   * Per worker slot, the latest-routed timed ticket that has had its first token: a ticket routed
   * before it and still without one is held back by something of its own, not by the queue.
   */
  private firstTokenTicket = new Float64Array(0);
  /** Decayed count of recent decisions per shared-prefix key, and when each slot was last decayed. */
  private readonly hotKeys = new Int32Array(HOT_SLOTS);
  private readonly hotCounts = new Float64Array(HOT_SLOTS);
  private readonly hotSeen = new Float64Array(HOT_SLOTS);
  private decisions = 0;
  /** The shared-prefix key of the request being chosen for (counted in onRouted()). */
  private prefixKey = 0;
  /** Prefixes of this router's in-flight requests: what a worker is about to hold. */
  private readonly pending = new PendingPrefixes();
  /** This router's in-flight requests per (prefix, worker): the requests that keep a worker's copy of a prefix. */
  private readonly sharers = new PrefixSharers();
  /**
   * Requests routed to each worker slot, by what leaving would have cost each (STUCK_BUCKETS per
   * slot): decayed counts and sums of that work; when each slot was last counted; the last
   * decision's time (ms).
   */
  private stuckCounts = new Float64Array(0);
  private stuckSums = new Float64Array(0);
  private routedAt = new Float64Array(0);
  /** Attention work (W(u) − u) of this router's requests not yet past prefill, per worker slot. */
  private attentionQueued = new Float64Array(0);
  /** Cached prompt tokens of this router's requests not yet past prefill, per worker slot. */
  private cachedQueued = new Float64Array(0);
  /** Of those, the tokens of content anchors, per worker slot. */
  private anchorsQueued = new Float64Array(0);
  private lastNow = 0;

  constructor(readonly weights: Readonly<CostWeights> = DEFAULT_COST_WEIGHTS) {}

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    if (candidates.length === 0) return NO_CHOICE;
    this.request = request;
    // rates are read at this decision's time: after a quiet spell the last one's would overstate them
    // (route() checks its times; one that is no finite number, given some other way, is ignored)
    const now = request.now;
    if (now !== undefined && Number.isFinite(now) && now > this.lastNow) this.lastNow = now;
    let mostCached = 0;
    for (const c of candidates) if (c.cachedTokens > mostCached) mostCached = c.cachedTokens;
    this.pending.lookup(candidates, request.blocks, Math.ceil(mostCached / request.blockSize));
    this.observeFleet(candidates, request);
    if (this.fleet.newSession) this.boundNewSession(candidates, request);
    const scores = this.scoreAll(candidates, request);
    // a new session's workflow step or CLA group names a worker of its own, which it takes within
    // its bounds (preferredWithinBound); otherwise the cheapest, with the rotation where costs tie
    let index = this.fleet.newSession
      ? preferredWithinBound(
          candidates,
          scores,
          this.weights.newSessionSlack,
          request.workflowStep !== null && request.workflowStep !== undefined,
        )
      : -1;
    if (index < 0) {
      const picked = pickMaxScore(scores, candidates.length, this.tieBreak, this.scratch, request.dryRun !== true);
      if (picked < 0) return NO_CHOICE;
      index = preferredAmongTies(candidates, scores, picked);
    }
    const chosen = candidates[index];
    const t = this.termsOf(chosen, request);
    const cached = t.cached;
    // what the decision teaches, applied in onRouted() if the router acts on it (not a dry run)
    this.chosenUncached = t.uncached;
    this.chosenPending = Math.min(t.prompt, t.pendingTokens);
    this.chosenAnchorTokens = chosen.anchorTokens > 0 ? chosen.anchorTokens : 0;
    this.chosenWork = t.work;
    // the model's estimate, not what lateness added to it: lateness is measured against the model
    this.chosenEstimate = t.wait - t.late + t.kvWait;
    // what the request would have recomputed elsewhere: the prefix it found there beyond what
    // every worker holds (a turn arriving later is counted as this one would have been)
    const held = t.prompt - t.uncached;
    this.chosenMoveWork = prefillWork(Math.max(0, held - this.fleet.leastCachedTokens), held, this.weights.attention);
    this.chosenHit = t.prompt > 0 ? 1 - t.uncached / t.prompt : 0;
    // recomputing a prefix another worker holds, because the queue it saves costs more
    const replicate = this.fleet.bestCachedTokens - cached >= request.blockSize && t.work > this.fleet.bestWork;
    return { index, confidence: chosen.cachedFraction, reason: replicate ? 'replicate' : 'cost' };
  }

  /**
   * Every candidate's score (−cost; NaN: excluded), by index, in a reused typed array: the
   * scores are written there rather than returned one by one, which would box each. NaN is
   * stored by an if statement of its own: `excluded ? NaN : x` boxes x (16 bytes each) in V8.
   */
  private scoreAll(candidates: readonly Candidate[], r: RouteFeatures): Float64Array {
    const n = candidates.length;
    if (this.scores.length < n) this.scores = new Float64Array(2 * n);
    const scores = this.scores;
    const f = this.fleet;
    if (f.newSession) {
      // a new session's terms were computed for its bound already
      for (let i = 0; i < n; i++) {
        if (this.boundedTtfts[i] > f.ttftBound) scores[i] = NaN;
        else scores[i] = -this.boundedCosts[i];
      }
    } else {
      for (let i = 0; i < n; i++) {
        const c = candidates[i];
        const t = this.termsOf(c, r);
        if (this.excludes(t, c)) scores[i] = NaN;
        else scores[i] = -t.cost;
      }
    }
    return scores;
  }

  /** Candidate `c`'s terms for request `r`, written into `into` (the reused scratch unless given). */
  private termsOf(c: Candidate, r: RouteFeatures, into: Terms = this.terms): Terms {
    into.pendingTokens = this.pending.blocksOn(c) * r.blockSize;
    // what cachedOn() returns, from the pending prefix just read
    into.cached = Math.max(c.cachedTokens, into.pendingTokens);
    const queuedHolder = this.inPrefill(this.pending.holderOn(c), c.worker.slot);
    into.pinnedAhead = queuedHolder ? into.pendingTokens : 0;
    // a holder still in prefill has put in K only what it found cached
    into.heldElsewhere = queuedHolder ? Math.min(into.pendingTokens, c.cachedTokens) : into.pendingTokens;
    this.stuckInto(into, c);
    into.queuedAttention = this.queuedAttention(c);
    into.queuedCached = this.queuedCached(c, r.blockSize);
    // not for a prefix in-flight requests share: where every worker runs late, the siblings'
    // lateness comes from the copies of the prefix, and leaving a late holder makes one more
    // (docs/routing.md §7, "Agent loops that outgrow their worker")
    into.late = this.fleet.hotness < 1 ? this.lateness(c.worker.slot) : 0;
    into.sharersHere = this.sharers.on(this.prefixKey, c.worker.slot);
    return computeTerms(into, c, r, this.weights, this.fleet);
  }

  /** A worker that cannot take the request: the prompt does not fit, or its KV is over the ceiling (capacity unknown). */
  private excludes(t: Terms, c: Candidate): boolean {
    const w = this.weights;
    const f = this.fleet;
    return (!t.fits && f.anyFits) || (t.kvCapacity <= 0 && f.anyBelowCeiling && c.worker.load >= w.pressureCeiling);
  }

  /**
   * A new session's TTFT bound: its lowest estimated TTFT over the workers that can take it,
   * plus the slack. Keeps each candidate's cost and TTFT for score() (NaN: excluded).
   */
  private boundNewSession(candidates: readonly Candidate[], r: RouteFeatures): void {
    if (this.boundedCosts.length < candidates.length) {
      this.boundedCosts = new Float64Array(2 * candidates.length);
      this.boundedTtfts = new Float64Array(2 * candidates.length);
    }
    let lowest = Infinity;
    for (let i = 0; i < candidates.length; i++) {
      const c = candidates[i];
      const t = this.termsOf(c, r);
      const excluded = this.excludes(t, c);
      // stored by statements, not `excluded ? NaN : x`, which boxes x (see scoreAll())
      if (excluded) {
        this.boundedCosts[i] = NaN;
        this.boundedTtfts[i] = NaN;
      } else {
        this.boundedCosts[i] = t.cost;
        this.boundedTtfts[i] = t.wait + t.kvWait;
      }
      if (!excluded && t.wait + t.kvWait < lowest) lowest = t.wait + t.kvWait;
    }
    // the lowest itself always qualifies, whatever rounding does to the product
    if (lowest < Infinity) this.fleet.ttftBound = Math.max(lowest * (1 + this.weights.newSessionSlack), lowest);
  }

  /**
   * Prompt tokens the worker holds or is about to hold: the index's count (what its engine
   * reported, plus the router's short-lived predictions), or, if longer, the prefix of a
   * request this router sent there that has not finished. Under load a worker reports a
   * prefix only after the request's queue wait (tens of seconds at saturation), and without
   * this a conversation's next turn, arriving meanwhile, would see its prefix nowhere and
   * recompute it on another worker.
   */
  private cachedOn(c: Candidate, r: RouteFeatures): number {
    return Math.max(c.cachedTokens, this.pending.blocksOn(c) * r.blockSize);
  }

  /** Points `t` at the worker's table of recently routed requests, by what leaving would cost each. */
  private stuckInto(t: Terms, c: Candidate): void {
    const slot = c.worker.slot;
    t.stuckCounts = this.stuckCounts;
    t.stuckSums = this.stuckSums;
    if (slot >= this.routedAt.length) {
      t.stuckBase = -1;
      return;
    }
    t.stuckBase = slot * STUCK_BUCKETS;
    t.stuckDecay = decayOver(this.lastNow - this.routedAt[slot]);
  }

  /** Counts a request routed to the worker (grows the tables on a new slot only). */
  private countRouted(slot: number, now: number, moveWork: number): void {
    if (slot >= this.routedAt.length) {
      const n = Math.max(16, slot * 2);
      this.stuckCounts = resized(this.stuckCounts, n * STUCK_BUCKETS);
      this.stuckSums = resized(this.stuckSums, n * STUCK_BUCKETS);
      this.routedAt = resized(this.routedAt, n);
      this.attentionQueued = resized(this.attentionQueued, n);
      this.cachedQueued = resized(this.cachedQueued, n);
      this.anchorsQueued = resized(this.anchorsQueued, n);
      this.lateRing = resized(this.lateRing, n * LATE_RING);
      this.lateHead = resized(this.lateHead, n);
      this.lateTail = resized(this.lateTail, n);
      this.firstTokenTicket = resized(this.firstTokenTicket, n);
    }
    // a time that is no finite number is not kept: the decision counts at the last known time
    const t = Number.isFinite(now) ? now : this.lastNow;
    const decay = decayOver(t - this.routedAt[slot]);
    const base = slot * STUCK_BUCKETS;
    if (decay !== 1) {
      for (let b = base; b < base + STUCK_BUCKETS; b++) {
        this.stuckCounts[b] *= decay;
        this.stuckSums[b] *= decay;
      }
    }
    const b = base + stuckBucket(moveWork);
    this.stuckCounts[b] += 1;
    this.stuckSums[b] += moveWork;
    this.routedAt[slot] = t;
    // never back: a clock set back would hide how late the requests queued before it are
    if (t > this.lastNow) this.lastNow = t;
  }

  /** A routed request: the mean work, the hit rate and the prefix's count learn from it; its prefix is pending on the worker. */
  onRouted(worker: WorkerState, request: RouteFeatures, ticket = 0, now = 0): void {
    this.countRouted(worker.slot, now, this.chosenMoveWork);
    // the attention work is known for the request just chosen (the router passes the same features)
    if (ticket > 0 && request === this.request) {
      // a slot still held by a ticket 65,536 older is overwritten: its work stops counting early
      const i = ticket & (QUEUED_TICKETS - 1);
      this.endPrefill(this.queuedTicket[i]);
      const attention = Math.max(0, this.chosenWork - this.chosenUncached);
      this.queuedTicket[i] = ticket;
      this.queuedSlot[i] = worker.slot + 1;
      this.queuedWork[i] = attention;
      this.attentionQueued[worker.slot] += attention;
      // a prefix another request in flight there brings or holds is pinned once: by that request
      // when admitted (counted with it) or already (a running request's blocks are in kvUsage)
      const cached = Math.max(0, request.promptTokens - this.chosenUncached - this.chosenPending);
      const anchors = Math.min(cached, this.chosenAnchorTokens);
      this.queuedCachedTokens[i] = cached;
      this.queuedCachedAnchorTokens[i] = anchors;
      this.cachedQueued[worker.slot] += cached;
      this.anchorsQueued[worker.slot] += anchors;
      // due on the policy's clock, which never goes back (a request routed after the clock was set
      // back is not late from the moment it is routed)
      // an answer not streamed has its first token with its last: its wait says nothing of the queue
      const timed = request.firstTokenReported !== false;
      this.queuedTimed[i] = timed ? 1 : 0;
      if (timed) {
        const at = Number.isFinite(now) && now > this.lastNow ? now : this.lastNow;
        this.queuedDue[i] = at + (1000 * this.chosenEstimate) / this.weights.prefillTokensPerSecond;
        this.queueForLateness(worker.slot, ticket);
      }
    }
    const u = this.chosenUncached;
    this.meanWork = this.meanWork === 0 ? Math.max(1, u) : this.meanWork + (u - this.meanWork) / WORK_SMOOTHING;
    this.meanHit += (this.chosenHit - this.meanHit) / WORK_SMOOTHING;
    const p = request.promptTokens;
    if (p > 0) this.meanPrompt = this.meanPrompt === 0 ? p : this.meanPrompt + (p - this.meanPrompt) / WORK_SMOOTHING;
    this.countPrefix(this.prefixKey);
    this.pending.record(worker.slot, ticket, request.blocks);
    // the prefix key is the one just observed for this request
    if (request === this.request) this.sharers.record(this.prefixKey, worker.slot, ticket);
  }

  onReleased(ticket: number): void {
    this.pending.release(ticket);
    this.sharers.release(ticket);
    this.endPrefill(ticket);
  }

  /** The request's first token: its prefill no longer queues on its worker. */
  onPrefillDone(ticket: number): void {
    const slot = this.endPrefill(ticket);
    if (slot >= 0 && this.queuedTimed[ticket & (QUEUED_TICKETS - 1)] === 1 && ticket > this.firstTokenTicket[slot])
      this.firstTokenTicket[slot] = ticket;
  }

  /** The ticket's prefill no longer queues: its tallies leave its worker's. Returns that worker's slot (-1: none). */
  private endPrefill(ticket: number): number {
    const i = ticket & (QUEUED_TICKETS - 1);
    if (ticket <= 0 || this.queuedTicket[i] !== ticket || this.queuedSlot[i] === 0) return -1;
    const slot = this.queuedSlot[i] - 1;
    this.queuedSlot[i] = 0;
    this.attentionQueued[slot] = Math.max(0, this.attentionQueued[slot] - this.queuedWork[i]);
    this.cachedQueued[slot] = Math.max(0, this.cachedQueued[slot] - this.queuedCachedTokens[i]);
    this.anchorsQueued[slot] = Math.max(0, this.anchorsQueued[slot] - this.queuedCachedAnchorTokens[i]);
    return slot;
  }

  /** Puts a ticket routed to `slot` last in its ring (the oldest is forgotten when it is full). */
  private queueForLateness(slot: number, ticket: number): void {
    const base = slot * LATE_RING;
    if (this.lateTail[slot] - this.lateHead[slot] >= LATE_RING) this.lateHead[slot]++;
    this.lateRing[base + (this.lateTail[slot] % LATE_RING)] = ticket;
    this.lateTail[slot]++;
  }

  /**
   * How late the worker runs, in token equivalents: how far past its estimated first token
   * (`queuedDue`) the oldest request this router queued there still is, at the decision's time,
   * beyond `lateGraceTokens`; 0 when none is later than that. The requests queued behind it
   * wait at least that much more than the router estimated, and so would one routed there now.
   * Tickets that have had their first token, ended or been overwritten are taken out of the ring
   * first, and so are those routed before one that has had its first token.
   */
  private lateness(slot: number): number {
    if (slot >= this.lateHead.length) return 0;
    const base = slot * LATE_RING;
    while (this.lateHead[slot] < this.lateTail[slot]) {
      const ticket = this.lateRing[base + (this.lateHead[slot] % LATE_RING)];
      const i = ticket & (QUEUED_TICKETS - 1);
      // one routed after it has had its first token: an engine takes its queue in order, so what
      // holds this one back is its own (a grammar compiling, an adapter or an image loading)
      if (this.queuedTicket[i] === ticket && this.queuedSlot[i] === slot + 1 && ticket > this.firstTokenTicket[slot]) {
        // past what every engine adds to a first token (lateGraceTokens): that says nothing of its queue
        const late = ((this.lastNow - this.queuedDue[i]) / 1000) * this.weights.prefillTokensPerSecond;
        return late > this.weights.lateGraceTokens ? late - this.weights.lateGraceTokens : 0;
      }
      this.lateHead[slot]++;
    }
    return 0;
  }

  /** Whether the request with this ticket (low 32 bits) is still in prefill on worker `slot`. */
  private inPrefill(ticket: number, slot: number): boolean {
    if (ticket === 0) return false;
    const i = ticket & (QUEUED_TICKETS - 1);
    return this.queuedSlot[i] === slot + 1 && (this.queuedTicket[i] | 0) === ticket;
  }

  /** Attention work of this router's requests queued on the worker (what their token count leaves out). */
  private queuedAttention(c: Candidate): number {
    return c.worker.slot < this.attentionQueued.length ? this.attentionQueued[c.worker.slot] : 0;
  }

  /**
   * Cached prompt tokens of this router's requests queued on the worker: what they will take
   * out of its free KV when admitted, before a request routed there now. vLLM counts a cached
   * prefix no running request holds as free KV (evictable) until a request that reuses it is
   * admitted, so the KV usage it reports leaves them out. A prefix shared by several of them
   * (siblings of one context, a turn queued behind its previous turn) counts once: each request
   * counts only what it reuses beyond the prefixes requests in flight there already bring.
   */
  private queuedCached(c: Candidate, blockSize: number): number {
    const slot = c.worker.slot;
    if (slot >= this.cachedQueued.length) return 0;
    // the prefixes they pin are blocks the worker holds: their union is at most what the index
    // holds for it. The pending table knows one worker per block, so a prefix several workers
    // hold, pending on the last one sent a request that shares it, looks pinned by no request on
    // the others, and each of their queued requests counts it again: a hot prefix held on three
    // workers of 40,000 tokens of KV made each look short of several times its whole KV
    const anchors = this.anchorsQueued[slot];
    const blocks = Math.max(0, this.cachedQueued[slot] - anchors);
    return Math.min(blocks, c.indexEntries * blockSize) + anchors;
  }

  onWorkerRemoved(worker: WorkerState): void {
    this.pending.removeWorker(worker.slot);
    this.sharers.removeWorker(worker.slot);
    if (worker.slot < this.attentionQueued.length) this.attentionQueued[worker.slot] = 0;
    if (worker.slot < this.cachedQueued.length) this.cachedQueued[worker.slot] = 0;
    if (worker.slot < this.anchorsQueued.length) this.anchorsQueued[worker.slot] = 0;
    if (worker.slot < this.lateHead.length) {
      this.lateHead[worker.slot] = this.lateTail[worker.slot];
      this.firstTokenTicket[worker.slot] = 0;
    }
    if (worker.slot < this.routedAt.length) {
      const base = worker.slot * STUCK_BUCKETS;
      this.stuckCounts.fill(0, base, base + STUCK_BUCKETS);
      this.stuckSums.fill(0, base, base + STUCK_BUCKETS);
    }
  }

  /** Saturation, hotness and the best-cached candidate: what every candidate's cost shares. */
  private observeFleet(candidates: readonly Candidate[], r: RouteFeatures): void {
    const w = this.weights;
    const f = this.fleet;
    let queued = 0;
    let holderQueued = 0;
    let holderSlot = -1;
    let idle = 0;
    // the first two idle workers: one of them is the sole idle one besides the holder, if any
    let idleA = -1;
    let idleB = -1;
    let holderIdle = 0;
    let inFlight = 0;
    let busy = 0;
    let mostEntries = 0;
    let mostOverlap = 0;
    let leastCached = Infinity;
    let best = 0;
    let anyBelowCeiling = false;
    let anyFits = false;
    let affinity = false;
    const prompt = r.promptTokens > 0 ? r.promptTokens : 0;
    for (const c of candidates) {
      queued += c.worker.queuedPrefillTokens;
      const isIdle = idleFor(c.worker, w, this.meanPrompt);
      if (isIdle) {
        idle++;
        if (idleA < 0) idleA = c.worker.slot;
        else if (idleB < 0) idleB = c.worker.slot;
      }
      inFlight += c.worker.inFlightRequests;
      if (c.worker.inFlightRequests > 0) busy++;
      if (c.indexEntries > mostEntries) mostEntries = c.indexEntries;
      if (c.overlapBlocks > mostOverlap) mostOverlap = c.overlapBlocks;
      if (c.cachedTokens < leastCached) leastCached = c.cachedTokens;
      const cached = prompt > 0 ? Math.min(prompt, this.cachedOn(c, r)) : c.cachedFraction * REFERENCE_PROMPT_TOKENS;
      if (cached > best) {
        best = cached;
        holderQueued = c.worker.queuedPrefillTokens;
        holderIdle = isIdle ? 1 : 0;
        holderSlot = c.worker.slot;
      }
      if (c.worker.load < w.pressureCeiling) anyBelowCeiling = true;
      if (c.continuity || c.servesCla) affinity = true;
      const capacity = c.worker.kvCapacityTokens > 0 ? c.worker.kvCapacityTokens : w.kvCapacityTokens;
      if (capacity <= 0 || prompt <= capacity) anyFits = true;
    }
    const p = prompt > 0 ? prompt : REFERENCE_PROMPT_TOKENS;
    f.bestCachedTokens = best;
    f.leastCachedTokens = leastCached;
    f.bestWork = prefillWork(p - best, p, w.attention);
    // the holder's own queue is left out: it must not shield the holder from replication
    const others = best > 0 ? candidates.length - 1 : candidates.length;
    f.queuedPerWorker =
      this.meanWork > 0 && others > 0 ? (queued - (best > 0 ? holderQueued : 0)) / others / this.meanWork : 0;
    f.idleWorkers = idle - (best > 0 ? holderIdle : 0);
    const holder = best > 0 ? holderSlot : -1;
    f.soleIdleSlot = f.idleWorkers === 1 ? (idleA !== holder ? idleA : idleB) : -1;
    // below saturation a recompute still occupies a worker that an arrival may need: with the
    // share of busy workers as that chance, one delayed request at most
    f.busyShare = busy / candidates.length;
    const hit = Math.min(this.meanHit, MAX_REUSE_HIT);
    f.reuse = hit / (1 - hit);
    f.mostEntries = mostEntries;
    // hotness is the count of the prefix a replica would recompute: the deepest one held or
    // about to be held. A pending prefix deeper than any the index knows (a conversation's
    // history) is keyed by its own last block, not by the shorter held prefix it extends (a
    // system prompt every request shares), whose siblings would not reuse the history
    const deepest = this.pending.deepest;
    this.prefixKey =
      r.blocks && deepest > mostOverlap && deepest <= r.blocks.length
        ? r.blocks.lo[deepest - 1]
        : (r.sharedPrefixKey ?? 0);
    f.hotness = this.prefixShare(this.prefixKey) * inFlight;
    f.anyBelowCeiling = anyBelowCeiling;
    f.anyFits = anyFits;
    // without blocks (the seed API) the workflow's previous worker and the CLA group's stand in
    // for the cache: a request with either has a worker of its own
    f.newSession = best - leastCached < r.blockSize && !(r.requestBlocks === 0 && affinity);
    f.ttftBound = Infinity;
  }

  /** Fraction of the last HOT_WINDOW_DECISIONS decisions that shared this prefix. */
  private prefixShare(key: number): number {
    if (key === 0) return 0;
    const slot = key & (HOT_SLOTS - 1);
    if (this.hotKeys[slot] !== (key | 0)) return 0;
    const decayed = this.hotCounts[slot] * Math.exp(-(this.decisions - this.hotSeen[slot]) / HOT_WINDOW_DECISIONS);
    return Math.min(1, decayed / HOT_WINDOW_DECISIONS);
  }

  private countPrefix(key: number): void {
    this.decisions++;
    if (key === 0) return;
    const slot = key & (HOT_SLOTS - 1);
    if (this.hotKeys[slot] !== (key | 0)) {
      this.hotKeys[slot] = key | 0;
      this.hotCounts[slot] = 0;
      this.hotSeen[slot] = this.decisions;
    }
    this.hotCounts[slot] =
      this.hotCounts[slot] * Math.exp(-(this.decisions - this.hotSeen[slot]) / HOT_WINDOW_DECISIONS) + 1;
    this.hotSeen[slot] = this.decisions;
  }

  scoreTerms(c: Candidate, request: RouteFeatures): Record<string, number | boolean> {
    const w = this.weights;
    const f = this.fleet;
    const t = this.termsOf(c, request, new Terms());
    const cached = t.cached;
    const seconds = (tokens: number) => tokens / w.prefillTokensPerSecond;
    /** A new session's estimated TTFT here is over its lowest plus the slack: not considered. */
    const outsideNewSessionSlack = t.wait + t.kvWait > f.ttftBound;
    const excluded = this.excludes(t, c) || outsideNewSessionSlack;
    return {
      promptTokens: t.prompt,
      /** Tokens of the prompt an unfinished request routed to this worker is bringing there. */
      pendingTokens: t.pendingTokens,
      uncachedTokens: t.uncached,
      queuedPrefillTokens: c.worker.queuedPrefillTokens,
      activeDecodeTokens: c.worker.activeDecodeTokens,
      /** Attention work of this router's requests queued there, beyond their tokens. */
      queuedAttentionTokens: this.queuedAttention(c),
      /** Cached prompt tokens of this router's requests queued there: KV they take when admitted. */
      queuedCachedTokens: this.queuedCached(c, request.blockSize),
      queueSeconds: seconds(t.queue * t.slowdown),
      /** How far past the router's own estimate the oldest request it queued there is (0 for a prefix in-flight requests share). */
      latenessSeconds: seconds(t.late),
      prefillSeconds: seconds(t.work * t.slowdown),
      decodeSlowdown: t.slowdown,
      estimatedTtftSeconds: seconds(t.wait + t.kvWait),
      kvWaitSeconds: seconds(t.kvWait),
      /** Its cached prefix that the requests admitted before it may evict while it waits for KV (at most the shortfall), and that prefix's recompute. */
      prefixAtRiskTokens: t.prefixAtRiskTokens,
      /** In-flight requests this router sent there that share the prefix: they keep it while this one waits. */
      prefixSharersHere: t.sharersHere,
      prefixAtRiskSeconds: seconds(t.prefixAtRisk),
      fits: t.fits,
      saturation: t.saturation,
      reuse: f.reuse,
      cacheFullness: t.fullness,
      hotness: f.hotness,
      recomputeSeconds: seconds(t.recompute),
      replicate: f.bestCachedTokens - cached >= request.blockSize && t.work > f.bestWork && !excluded,
      kvUsage: c.worker.load,
      /** KV the request holds on this worker: its uncached tokens and its share of the cached prefix (the pressure's base). */
      kvFootprintTokens: t.kvFootprint,
      guardSeconds: seconds(t.guard),
      /** Of the guard, the pressure past the knee: the footprint's recompute, times the weight and how far past the knee. */
      pressureSeconds: seconds(t.pressure),
      arrivalDelaySeconds: seconds(t.arrivalDelay),
      newSession: f.newSession,
      outsideNewSessionSlack,
      servesCla: c.servesCla,
      continuity: c.continuity,
      excluded,
      costSeconds: seconds(t.cost),
      /** What the policy maximises (−cost, in seconds); NaN when excluded. */
      score: excluded ? NaN : -seconds(t.cost),
    };
  }
}
