/**
 * The shared state's wire format on Redis: key names under the fleet's prefix, the messages
 * replicas publish on the events channel (short keys; block hashes as base64 of (hi, lo)
 * uint32 pairs), workflow values and per-replica load snapshots. Replicas of different
 * versions meet on this format, so changes to it must stay readable by the previous one
 * (docs/architecture.md §8 lists what each version added).
 */
import type { ContentAnchor } from '../core/content-anchors.js';
import type { KVAwareRouter, SharedDecision } from '../core/router/index.js';
import type { WorkerRecord } from './state-store.js';
import { isRemoteAmount, type ReplicaLoad } from './remote-load.js';
import { BlockHashes, hashHex } from '../core/hashing.js';
import { escapedText } from '../core/shown-text.js';
import { isWorkerId } from '../core/validate.js';
import {
  DECIDED,
  hasShape,
  isText,
  isWorkflowStep,
  KV_EVENTS,
  optional,
  PREFILLED,
  REFUSED,
  RELEASED,
  WORKER_ADDED,
  WORKER_REMOVED,
  workerDrained,
  type Shape,
} from './message-checks.js';

/** A decision on the wire: short keys, block hashes as base64 of (hi, lo) uint32 pairs. */
export interface WireDecision extends DecisionFields {
  r: string;
  k: 'd';
  w: string;
  h: string;
}
/**
 * The shared-state format's version. 2 added `pd` and `rl.d`: a version-1 replica ignores
 * `pd` and takes `rl.q` off its queued prefill as before, which stays right for it. 3 added
 * the decision's id `i` (on `d`, `pd` and `rl`) and `rf`: an earlier replica ignores both (it
 * counts an `rf` among its malformed messages and goes on), and a decision from one comes
 * without an id, so nothing of it is kept to withdraw. 4 added `ld`: a version-3 replica
 * ignores it (counting it among its malformed messages) and keeps the tally it had. 5 added
 * `dr` and `ev` and the `draining` and `removed` hashes: an earlier replica ignores both
 * messages (counting them among its malformed ones), so it neither drains with the others nor
 * takes their posted KV events, and never reads the hashes. 6 added `rm`: a version-5 replica
 * ignores it (counting it among its malformed messages). 7 added the `workflows` index (sorted
 * set id → last use) that bounds the `wf:{id}` keys and that a starting replica loads the newest
 * of: a version-6 replica neither writes nor reads it, so the keys it writes stay outside the
 * bound until they expire, and it still scans every `wf:` key when it starts. 8 added `ns` on
 * `d`, the namespace a decision's content anchors were made under: a version-7 replica ignores
 * it and keys them by id alone, as it keys its own; a decision from one comes without it, and
 * its anchors are taken as made under the CLA group `c` it names (none when it names none).
 */
export const STATE_WIRE_VERSION = 8;

/** A tracked request's prefill finished (its first token): its tokens move from queued prefill to decode. */
export interface WirePrefilled {
  r: string;
  k: 'pd';
  w: string;
  /** Its uncached prompt tokens, off the queued prefill. */
  q: number;
  /** Its KV tokens, onto the decode load. */
  d: number;
  /** The decision's id (version 3): what it added stays for good. */
  i?: string;
}
/** A tracked request ended: its work leaves the worker. */
export interface WireReleased {
  r: string;
  k: 'rl';
  w: string;
  /** Its uncached prompt tokens (always present: what a version-1 replica takes off). */
  q: number;
  /** Present when its `pd` was published: the decode tokens to take off (q already left the prefill). */
  d?: number;
  /** The decision's id (version 3): what it added stays for good. */
  i?: string;
}
/** A tracked request's engine refused it, holding none of it: what its decision alone added is withdrawn (version 3). */
export interface WireRefused {
  r: string;
  k: 'rf';
  w: string;
  /** The decision's id. */
  i: string;
}
/**
 * A replica's in-flight work after it (re)connected (version 4): the others replace their
 * tally of it, which may hold requests whose releases it could not publish while cut off.
 */
export interface WireLoad {
  r: string;
  k: 'ld';
  /** Worker id → "requests,prefill,decode", as in its `load:{replica}` snapshot. */
  l: Record<string, string>;
}
export interface WireWorkerAdded {
  r: string;
  k: 'wa';
  worker: WorkerRecord;
}
export interface WireWorkerRemoved {
  r: string;
  k: 'wr';
  id: string;
}
/** A worker drained (`on`) or resumed through a replica's admin API (version 5). */
export interface WireWorkerDrained {
  r: string;
  k: 'dr';
  id: string;
  on: boolean;
}
/** KV events posted to a replica's admin API, as JSON (version 5): the others apply them too. */
export interface WireKvEvents {
  r: string;
  k: 'ev';
  /** The worker (or data-parallel rank, `ID#r`) they are of. */
  w: string;
  e: unknown;
}
/**
 * A mark a replica publishes just before it reads the registry (on the same connection): what
 * it hears after its own mark is as new as what it read, or newer. The others ignore it.
 */
export interface WireReadMark {
  r: string;
  k: 'rm';
  n: string;
}
export type WireMessage =
  | WireReadMark
  | WireDecision
  | WirePrefilled
  | WireReleased
  | WireRefused
  | WireLoad
  | WireWorkerAdded
  | WireWorkerRemoved
  | WireWorkerDrained
  | WireKvEvents;

/** Key names of one fleet: everything lives under its prefix (default `contextforge:`). */
export class RedisKeys {
  /**
   * The channel decisions, releases and registry changes are published on: `{prefix}events`, and
   * `{prefix}events:db{N}` on a database N other than 0. Redis's channels are one namespace for the
   * whole server, whatever database a connection selected: fleets kept apart by database, with
   * one prefix, would otherwise hear each other's messages and add each other's workers.
   */
  readonly channel: string;

  constructor(
    readonly prefix: string,
    db = 0,
  ) {
    this.channel = db === 0 ? `${prefix}events` : `${prefix}events:db${db}`;
  }

  key(...parts: string[]): string {
    return this.prefix + parts.join(':');
  }

  /** Where a decision's blocks are kept: by worker and the hash of its last block. */
  chainKey(workerId: string, hi: number, lo: number): string {
    return this.key('chain', workerId, hashHex(hi, lo));
  }
}

/** A decision's fields beside its worker and blocks, under the short names both state stores send. */
export interface DecisionFields {
  wf?: string;
  s?: number | null;
  a?: string;
  c?: number | null;
  ca?: ContentAnchor[];
  /**
   * The namespace `ca` was made under (SharedDecision.anchorNamespace, 16 hex digits; version
   * 8): without it, as from an earlier replica, the anchors are taken as made under `c` alone.
   */
  ns?: string;
  /** Present when the request counts as in-flight: its uncached prompt tokens. */
  q?: number;
  /** The decision's id (SharedDecision.id), which its prefill-done, release and refusal name. */
  i?: string;
}

/** Writes the decision's workflow, anchor, content anchors and in-flight prefill into `m` (the Redis and the process channel alike). */
export function writeDecisionFields(d: SharedDecision, m: DecisionFields): void {
  if (d.workflowId !== undefined) {
    m.wf = d.workflowId;
    m.s = d.workflowStep;
  }
  if (d.anchor !== undefined) {
    m.a = d.anchor;
    m.c = d.claGroup;
  }
  if (d.contentAnchors && d.contentAnchors.length > 0) {
    m.ca = d.contentAnchors.map((a) => ({ id: a.id, tokens: a.tokens }));
    if (d.anchorNamespace !== undefined) m.ns = d.anchorNamespace;
  }
  if (d.tracked) m.q = d.prefillTokens;
  if (d.id !== undefined) m.i = d.id;
}

/** A decision as this replica publishes it. */
export function encodeDecision(replicaId: string, d: SharedDecision): WireDecision {
  const wire: WireDecision = { r: replicaId, k: 'd', w: d.workerId, h: encodeHashes(d.hi, d.lo) };
  writeDecisionFields(d, wire);
  return wire;
}

/** A tracked decision's prefill-done as this replica publishes it. */
export function encodePrefilled(replicaId: string, d: SharedDecision): WirePrefilled {
  const wire: WirePrefilled = { r: replicaId, k: 'pd', w: d.workerId, q: d.prefillTokens, d: d.decodeTokens };
  if (d.id !== undefined) wire.i = d.id;
  return wire;
}

/** A tracked decision's release; `prefilled` when its prefill-done was published. */
export function encodeReleased(replicaId: string, d: SharedDecision, prefilled: boolean): WireReleased {
  const wire: WireReleased = { r: replicaId, k: 'rl', w: d.workerId, q: d.prefillTokens };
  if (prefilled) wire.d = d.decodeTokens;
  if (d.id !== undefined) wire.i = d.id;
  return wire;
}

/** A replica's in-flight work per worker (worker id → encodeLoadEntry()), as it publishes it after (re)connecting. */
export function encodeLoad(replicaId: string, load: Record<string, string>): WireLoad {
  return { r: replicaId, k: 'ld', l: load };
}

/** A tracked decision's refusal by its engine; undefined for a decision without an id. */
export function encodeRefused(replicaId: string, d: SharedDecision): WireRefused | undefined {
  return d.id === undefined ? undefined : { r: replicaId, k: 'rf', w: d.workerId, i: d.id };
}

/**
 * The id a receiving replica knows a message's decision by, if it carries a well-formed one:
 * scoped by the sender's replica id, so that replicas configured with one instance id (which
 * the decision's own id starts with) still name their decisions apart.
 */
export function decisionIdOf(msg: { r: string; i?: unknown }): string | undefined {
  return typeof msg.i === 'string' ? `${msg.r}/${msg.i}` : undefined;
}

/** The shape each kind of message must have (message-checks.ts, as the process channel's): one failing it is malformed. */
const SHAPES: Partial<Record<WireMessage['k'], Shape>> = {
  d: DECIDED,
  pd: PREFILLED,
  rl: RELEASED,
  rf: REFUSED,
  ev: KV_EVENTS,
  wa: WORKER_ADDED,
  wr: WORKER_REMOVED,
  dr: workerDrained('on'),
};

/**
 * Whether a message has its kind's shape: the worker it names (`w`, `id`, or its worker
 * record's id) one the router takes through its API (isWorkerId), its amounts in range
 * (isRemoteAmount), its decision id and flags of their kinds. True for kinds without one.
 */
export function isWellFormed(msg: WireMessage): boolean {
  return !Object.hasOwn(SHAPES, msg.k) || hasShape(msg, SHAPES[msg.k]!);
}

/**
 * Bytes of the largest channel message of any kind but a decision, at the limits that bound
 * them, rounded up: an `ev` is at most MAX_RELAYED_EVENTS_BYTES (1 MiB) of events and an
 * envelope of two ids; an `ld` names at most MAX_WORKERS (4,096) workers, each with an id of at
 * most 256 UTF-16 code units (768 bytes of UTF-8; 1,536 escaped) and "requests,prefill,decode"
 * amounts of at most 2^40 (13 digits each): 4,096 × (1,536 + 50) ≈ 6.5 MB escaped, 3.3 MB as
 * plain UTF-8, 1.3 MB for ASCII ids; a `wa` worker record is at most 1,024 models of 512
 * characters and 1,024 CLA groups (WORKER_RECORD_SCHEMA): about 0.6 MB for ASCII names. 8 MiB
 * holds each of them even at their worst.
 */
export const MAX_OTHER_MESSAGE_BYTES = 8 * 1024 * 1024;

/**
 * Bytes of a decision's fields beside its blocks, at most, rounded up: its replica id and worker
 * (256 code units each), its workflow, anchor and decision ids, and its content anchors (the
 * gateway's defaults: 128 anchors of ids of at most 256 bytes, ≤ 1,536 escaped, with a token
 * count, and their namespace: about 200 KB). 1 MiB leaves room for those limits raised fivefold.
 */
export const MAX_DECISION_FIELDS_BYTES = 1024 * 1024;

/**
 * The longest channel message a replica reads. The largest legitimate one is a decision of the
 * longest prompt (`maxPromptTokens`) on a worker of `blockSize` tokens per block (the router
 * refuses a shared decision of more blocks, applySharedDecision()): 8 bytes per block as base64
 * (4 characters per 3 bytes), plus MAX_DECISION_FIELDS_BYTES; that doubled (headroom for
 * settings that differ between replicas), or MAX_OTHER_MESSAGE_BYTES when that is more. With the
 * defaults (1,048,576 tokens, 16 a block: 65,536 blocks, 699,052 characters of hashes, 1.75 MB
 * with the other fields, 3.5 MB doubled) the other kinds bound it: 8 MiB. With one token a
 * block, 1,048,576 blocks are 11,184,812 characters of hashes: 2 × 12.2 MB ≈ 24.5 MB. Past the
 * bound a message is nothing a replica sends, and parsing it costs the event loop (a 20 MB
 * one, JSON.parse then its hashes' base64, held it for hundreds of milliseconds).
 */
export function maxMessageBytes(maxPromptTokens: number, blockSize: number): number {
  const blocks = Math.ceil(maxPromptTokens / blockSize);
  const hashChars = 4 * Math.ceil((8 * blocks) / 3);
  return Math.max(MAX_OTHER_MESSAGE_BYTES, 2 * (hashChars + MAX_DECISION_FIELDS_BYTES));
}

/** A channel message longer than the bound decodeMessage() was given: refused unread. */
export class MessageTooLong extends Error {
  constructor(
    readonly bytes: number,
    readonly maxBytes: number,
  ) {
    super(`a message of ${bytes} bytes (at most ${maxBytes})`);
  }
}

/**
 * Parses a channel message; throws on anything that is not an object with a replica id, and
 * on a message longer than `maxBytes` before reading any of it (MessageTooLong).
 */
export function decodeMessage(raw: Buffer, maxBytes = Infinity): WireMessage {
  if (raw.length > maxBytes) throw new MessageTooLong(raw.length, maxBytes);
  const msg = JSON.parse(raw.toString('utf8')) as WireMessage;
  if (msg === null || typeof msg !== 'object' || typeof msg.r !== 'string') throw new Error('not a message');
  return msg;
}

/** A workflow's worker and step, as stored under `wf:{id}`. */
export function encodeWorkflow(workerId: string, step: number | null): string {
  return JSON.stringify({ w: workerId, s: step });
}

/**
 * A `wf:{id}` value; undefined unless its worker is an id the router takes (isWorkerId; a step
 * that is not a non-negative integer reads as none).
 */
export function parseWorkflow(value: string): { w: string; s: number | null } | undefined {
  try {
    const v = JSON.parse(value) as { w?: unknown; s?: unknown } | null;
    if (v === null || typeof v !== 'object' || !isWorkerId(v.w)) return undefined;
    return { w: v.w, s: isWorkflowStep(v.s) ? (v.s ?? null) : null };
  } catch {
    return undefined;
  }
}

/** One worker's entry of a replica's load snapshot (`load:{replica}` hash): "requests,prefill,decode". */
export function encodeLoadEntry(
  inFlightRequests: number,
  queuedPrefillTokens: number,
  activeDecodeTokens: number,
): string {
  return `${inFlightRequests},${queuedPrefillTokens},${activeDecodeTokens}`;
}

/**
 * A replica's load snapshot (a `load:{replica}` hash, or an `ld` message's `l`); entries that
 * are malformed, negative or out of range, or of an id the router would refuse (isWorkerId),
 * are left out. Kept in a Map: an id such as `__proto__` is a key like any other.
 */
export function decodeLoadSnapshot(hash: Readonly<Record<string, unknown>>): ReplicaLoad {
  const load: ReplicaLoad = new Map();
  for (const [id, v] of Object.entries(hash)) {
    if (!isWorkerId(id) || typeof v !== 'string') continue;
    const [requests, prefill, decode] = v.split(',').map(Number);
    if ([requests, prefill, decode].every(isRemoteAmount)) load.set(id, { requests, prefill, decode });
  }
  return load;
}

export function encodeHashes(hi: Uint32Array, lo: Uint32Array): string {
  const pairs = new Uint32Array(hi.length * 2);
  for (let i = 0; i < hi.length; i++) {
    pairs[2 * i] = hi[i];
    pairs[2 * i + 1] = lo[i];
  }
  return Buffer.from(pairs.buffer, pairs.byteOffset, pairs.byteLength).toString('base64');
}

export function decodeHashes(b64: string): { hi: Uint32Array; lo: Uint32Array } {
  if (typeof b64 !== 'string') throw new TypeError('hashes must be base64');
  const buf = Buffer.from(b64, 'base64');
  if (buf.length % 8 !== 0) throw new RangeError('hashes must be (hi, lo) uint32 pairs');
  const n = buf.length / 8;
  const hi = new Uint32Array(n);
  const lo = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    hi[i] = buf.readUInt32LE(8 * i);
    lo[i] = buf.readUInt32LE(8 * i + 4);
  }
  return { hi, lo };
}

/**
 * The settings that change the block hashes a replica writes (`{prefix}settings`, written with
 * SET NX by the first replica to start, compared by every one that starts or resynchronises):
 * replicas that hash differently fill each other's index with entries that never match, so they
 * must not share one prefix. `probe` is the hash of a fixed run of token ids under the replica's
 * block hash: it differs with vLLM's PYTHONHASHSEED (not written itself) and with a release that
 * hashes differently. `tokenize` ('text' or 'tokens': tokenizer and engine both hash token ids)
 * is absent where the caller did not say it, and `chatRendering` ('vllm' or 'sglang') where chats
 * are not rendered into token ids by the gateway (`--tokenize tokenizer`); a field absent on either
 * side is not compared.
 */
export interface HashingFingerprint {
  v: 1;
  blockSize: number;
  textChunkBytes: number;
  blockHash: string;
  prefixCachingHashAlgo?: string;
  tokenize?: 'text' | 'tokens';
  chatRendering?: 'vllm' | 'sglang';
  probe: string;
}

/** The fingerprint of a router's hashing settings (and its gateway's tokenize mode, when given). */
export function hashingFingerprint(
  router: Pick<KVAwareRouter, 'blockSize' | 'textChunkBytes' | 'keying'>,
  tokenize?: 'text' | 'tokenizer' | 'engine',
  chatRendering?: 'vllm' | 'sglang',
): HashingFingerprint {
  const tokens = Array.from({ length: 32 }, (_, i) => i * 7919 + 1);
  const out = router.keying.hashTokens(tokens, 16, undefined, new BlockHashes(2));
  const fp: HashingFingerprint = {
    v: 1,
    blockSize: router.blockSize,
    textChunkBytes: router.textChunkBytes,
    blockHash: router.keying.mode,
    probe: out.toHex(out.length - 1),
  };
  if (router.keying.vllmAlgo !== undefined) fp.prefixCachingHashAlgo = router.keying.vllmAlgo;
  if (tokenize !== undefined) fp.tokenize = tokenize === 'text' ? 'text' : 'tokens';
  // only the gateway's own tokenizer renders chats; an engine's /tokenize renders them its own way
  if (tokenize === 'tokenizer' && chatRendering !== undefined) fp.chatRendering = chatRendering;
  return fp;
}

/** What a stored fingerprint holds (hasShape): a value of another shape is garbage, replaced. */
const FINGERPRINT: Shape = {
  v: (x) => x === 1,
  blockSize: Number.isSafeInteger,
  textChunkBytes: Number.isSafeInteger,
  blockHash: isText,
  prefixCachingHashAlgo: optional(isText),
  tokenize: optional((x) => x === 'text' || x === 'tokens'),
  chatRendering: optional((x) => x === 'vllm' || x === 'sglang'),
  probe: isText,
};

/** A stored fingerprint read back; undefined for anything that is not one (garbage). */
export function parseFingerprint(value: string): HashingFingerprint | undefined {
  let v: unknown;
  try {
    v = JSON.parse(value);
  } catch {
    return undefined;
  }
  return !Array.isArray(v) && hasShape(v, FINGERPRINT) ? (v as HashingFingerprint) : undefined;
}

/**
 * The settings in which `mine` differs from `stored`, each as `name mine (stored: theirs)`; empty
 * when they hash alike. The probe is named only when nothing named explains it: with vLLM's block
 * hash, the engines' PYTHONHASHSEED; else the release's own hash.
 */
export function fingerprintDifferences(mine: HashingFingerprint, stored: HashingFingerprint): string[] {
  const out: string[] = [];
  const shown = (v: unknown) => (typeof v === 'string' ? escapedText(v) : String(v));
  for (const name of [
    'blockSize',
    'textChunkBytes',
    'blockHash',
    'prefixCachingHashAlgo',
    'tokenize',
    'chatRendering',
  ] as const) {
    const a = mine[name];
    const b = stored[name];
    if ((name === 'tokenize' || name === 'chatRendering') && (a === undefined || b === undefined)) continue;
    if (a !== b) out.push(`${name} ${shown(a ?? 'unset')} (stored: ${shown(b ?? 'unset')})`);
  }
  if (out.length === 0 && mine.probe !== stored.probe)
    out.push(
      mine.blockHash === 'vllm'
        ? 'pythonHashSeed (the block hashes of one probe differ)'
        : 'the block hash itself (another release that hashes differently?)',
    );
  return out;
}
