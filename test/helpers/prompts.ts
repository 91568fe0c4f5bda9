/** Routers of a few workers and prompts of whole blocks, as the core tests build them. */
import { KVAwareRouter, type KVAwareRouterOptions } from '../../src/index.js';

/** The block size of the routers and prompts made here. */
export const BS = 16;

/**
 * A router (block size BS, then `opts`) with workers w0 … w(n−1), on a clock that stands still
 * unless `opts` gives one: what it decides does not depend on how fast the test runs (a
 * prediction ages, a queued request runs late, only when the test moves the clock).
 */
export function fleet(n: number, opts: KVAwareRouterOptions = {}): KVAwareRouter {
  const r = new KVAwareRouter({ blockSize: BS, clock: () => 1000, ...opts });
  for (let i = 0; i < n; i++) r.registerWorker(`w${i}`);
  return r;
}

/** `blocks` full blocks of tokens; `family` picks the content, so equal families share prefixes. */
export function prompt(family: number, blocks: number, tail: number[] = []): number[] {
  const t: number[] = [];
  for (let i = 0; i < blocks * BS; i++) t.push((family * 1_000_003 + i * 7) % 150_000);
  return [...t, ...tail];
}

/** How the worker holds each of the prompt's blocks ('gpu', 'offload', 'predicted' or null). */
export function tiers(r: KVAwareRouter, workerId: string, tokens: number[]) {
  const slot = r.listWorkers().find((w) => w.id === workerId)!.slot;
  const keys = r.hashTokens(tokens);
  return Array.from({ length: keys.length }, (_, i) => r.index.holder(slot, keys.hi[i], keys.lo[i]));
}
