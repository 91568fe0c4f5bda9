/**
 * What a message from another replica (the Redis channel, redis-wire.ts) or another gateway
 * process (the cluster's IPC, cluster-state-store.ts) must hold before any of it is used: one
 * rule for each field, whichever transport carries it. Both send the load and registry
 * messages under the same field names (`w` the worker, `q` and `d` the amounts, `i` the
 * decision's id), so each shape below is checked on either; a message that fails one is
 * counted among the malformed and dropped. No I/O here.
 */
import { isHashHex, isId, isWorkerId } from '../core/validate.js';
import { isRemoteAmount } from './remote-load.js';
import type { WorkerRecord } from './state-store.js';

/** A check of one field's value. */
export type FieldCheck = (v: unknown) => boolean;

/** The checks of a message's fields, by field name (a field not named is not read). */
export type Shape = Readonly<Record<string, FieldCheck>>;

/** `check`, or the field left out. */
export const optional =
  (check: FieldCheck): FieldCheck =>
  (v) =>
    v === undefined || check(v);

export const isText = (v: unknown): v is string => typeof v === 'string';

export const isFlag = (v: unknown): v is boolean => typeof v === 'boolean';

/** A worker record another replica shares: an object whose id is one the router takes (the rest the gateway checks when it adds it). */
export function isWorkerRecord(v: unknown): v is WorkerRecord {
  return v !== null && typeof v === 'object' && isWorkerId((v as { id?: unknown }).id);
}

/** A workflow's step: a non-negative integer, or none (null, or left out). */
export function isWorkflowStep(v: unknown): v is number | null | undefined {
  return v === undefined || v === null || (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0);
}

const isCount = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

/** A decision's content anchors: a list of { id, tokens? }, as the router takes them (checkContentAnchors()). */
export function isContentAnchors(v: unknown): boolean {
  return (
    Array.isArray(v) &&
    v.every(
      (a: unknown) =>
        a !== null &&
        typeof a === 'object' &&
        isId((a as { id?: unknown }).id) &&
        optional(isCount)((a as { tokens?: unknown }).tokens),
    )
  );
}

/**
 * A decision's fields beside its blocks (each transport carries those its own way): its load,
 * its id, and what the router records of it beside the blocks, by the rules the router applies
 * them by (applySharedDecision()), so that a decision the replicas drop is also one no relay
 * counts. How many blocks the router takes depends on its settings: the router checks that.
 */
export const DECIDED: Shape = {
  r: isText,
  w: isWorkerId,
  q: optional(isRemoteAmount),
  i: optional(isText),
  a: optional(isId),
  c: (v) => v === undefined || v === null || isCount(v),
  ca: optional(isContentAnchors),
  ns: optional(isHashHex),
};
/** A tracked request's prefill done: its tokens move from queued prefill to decode. */
export const PREFILLED: Shape = { r: isText, w: isWorkerId, q: isRemoteAmount, d: isRemoteAmount, i: optional(isText) };
/** A tracked request ended; `d` present when its prefill-done was sent. */
export const RELEASED: Shape = {
  r: isText,
  w: isWorkerId,
  q: isRemoteAmount,
  d: optional(isRemoteAmount),
  i: optional(isText),
};
/** A tracked request's engine refused it: decision `i` is withdrawn. */
export const REFUSED: Shape = { r: isText, w: isWorkerId, i: isText };
/** KV events posted to a replica, for worker (or rank) `w`; the events are the gateway's to read. */
export const KV_EVENTS: Shape = { r: isText, w: isWorkerId };
export const WORKER_ADDED: Shape = { r: isText, worker: isWorkerRecord };
export const WORKER_REMOVED: Shape = { r: isText, id: isWorkerId };
/** A worker drained (the flag true) or resumed: the flag is `on` on Redis, `draining` between processes. */
export const workerDrained = (flag: 'on' | 'draining'): Shape => ({ r: isText, id: isWorkerId, [flag]: isFlag });

/** Whether `m` is an object whose fields pass `shape`. */
export function hasShape(m: unknown, shape: Shape): boolean {
  if (m === null || typeof m !== 'object') return false;
  for (const field in shape) if (!shape[field]((m as Record<string, unknown>)[field])) return false;
  return true;
}
