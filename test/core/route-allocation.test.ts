import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  allocationWithinBounds,
  BLOCK,
  bytesPerCall,
  roundsUntil,
  steadyBytesPerCall,
  WORKERS,
} from '../helpers/route-path-allocation.js';
import type { Candidate, RouteFeatures } from '../../src/core/policies/types.js';
import { WorkerState } from '../../src/core/worker-registry.js';
import { ContentAnchorIndex } from '../../src/core/content-anchors.js';
import { chainRoot, fmix32, mixIntoChain } from '../../src/core/hashing.js';
import { InFlightTickets } from '../../src/core/router/in-flight.js';
import { createRng } from '../../src/core/rng.js';
import { KVAwareRouter } from '../../src/index.js';

describe('route path allocation', () => {
  test("the cost policy's choose() allocates nothing per candidate", async () => {
    // measured in a process of its own, up to three (see allocationWithinBounds)
    const measured = await allocationWithinBounds('choose');
    if (!measured.ok) assert.fail(`bytes per choose() over ${WORKERS} candidates, ${measured.seen}`);
  });

  test('opening and releasing tickets allocates nothing once the table has grown', () => {
    const tickets = new InFlightTickets();
    const w = new WorkerState('w0', {}, 0);
    const held: number[] = [];
    const bytes = steadyBytesPerCall(
      5000,
      (i) => {
        held.push(tickets.open(w, 100, 1000, i));
        // 64 in flight, the oldest released first
        if (held.length > 64) tickets.release(held.shift()!);
      },
      8,
    );
    assert.ok(bytes < 8, `${bytes.toFixed(1)} bytes per ticket opened and released`);
    for (const t of held) tickets.release(t);
    assert.equal(tickets.size, 0);
    assert.equal(w.inFlightRequests, 0);
    assert.equal(w.queuedPrefillTokens, 0);
  });

  test('tickets released in any order leave each worker with exactly the rest', () => {
    const rng = createRng(5);
    const tickets = new InFlightTickets();
    const workers = [0, 1, 2].map((i) => new WorkerState(`w${i}`, {}, i));
    const open = new Map<number, { worker: WorkerState; uncached: number; prompt: number; prefilled: boolean }>();
    const expectCounts = () => {
      assert.equal(tickets.size, open.size);
      for (const w of workers) {
        const mine = [...open.values()].filter((t) => t.worker === w);
        assert.equal(w.inFlightRequests, mine.length);
        const queued = mine.filter((t) => !t.prefilled).reduce((sum, t) => sum + t.uncached, 0);
        const decoding = mine.filter((t) => t.prefilled).reduce((sum, t) => sum + t.prompt, 0);
        assert.equal(w.queuedPrefillTokens, queued);
        assert.equal(w.activeDecodeTokens, decoding);
      }
    };
    // enough tickets to grow the table several times; each round releases a random half of
    // those open and moves another part from prefill to decode, found by their numbers
    for (let round = 0; round < 4; round++) {
      for (let i = 0; i < 700; i++) {
        const worker = workers[i % 3];
        const uncached = 1 + Math.floor(rng() * 1000);
        const prompt = uncached + Math.floor(rng() * 1000);
        open.set(tickets.open(worker, uncached, prompt), { worker, uncached, prompt, prefilled: false });
      }
      for (const [ticket, t] of [...open]) {
        const r = rng();
        if (r < 0.5) {
          tickets.release(ticket);
          tickets.release(ticket); // idempotent
          open.delete(ticket);
        } else if (r < 0.7) {
          tickets.markPrefillDone(ticket);
          t.prefilled = true;
        }
      }
      expectCounts();
    }
    for (const ticket of [...open.keys()]) {
      tickets.release(ticket);
      open.delete(ticket);
    }
    expectCounts();
  });

  test('route() and release() allocate about the result and no more, whatever the fleet and prompt', async () => {
    // a fleet and its prompts, and one with twice the workers and twice the blocks per prompt,
    // measured in a process of its own, up to three (see measureRouteAllocation and
    // allocationWithinBounds)
    const measured = await allocationWithinBounds('route');
    if (!measured.ok) assert.fail(`bytes per decision, ${measured.seen}`);
  });

  test("route()'s options, unknown keys refused among them, are checked without allocating", () => {
    let now = 0;
    const router = new KVAwareRouter({ policy: 'cost', indexMode: 'precise', blockSize: BLOCK, clock: () => now });
    for (let w = 0; w < WORKERS; w++) router.registerWorker(`w${w}`);
    const requests = Array.from({ length: 16 }, (_, k) =>
      Uint32Array.from({ length: 2048 }, (_, i) => (i < 1024 ? i : i * 7 + k * 13) >>> 0),
    );
    const request = { tokens: requests[0] };
    // what the gateway and the endpoint picker pass on every request (one object reused here,
    // as a caller's own is made by the caller whether or not the router checks it)
    const options = {
      exclude: new Set<string>(),
      share: false,
      firstTokenReported: true,
      now: 0,
      servedBy: undefined,
      track: true,
    };
    const run = (withOptions: boolean) =>
      bytesPerCall(2000, (i) => {
        now += 1;
        options.now = now;
        request.tokens = requests[i % requests.length];
        router.release(router.route(request, withOptions ? options : undefined).ticket);
      });
    // the fewest bytes of each over rounds of both (at least 3, past the first optimisations),
    // until the options cost under 16 bytes more (or the deadline: see STEADY_DEADLINE_MS)
    let plainLeast = Infinity;
    let optionsLeast = Infinity;
    let rounds = 0;
    roundsUntil(
      () => {
        rounds++;
        plainLeast = Math.min(plainLeast, run(false));
        optionsLeast = Math.min(optionsLeast, run(true));
      },
      () => rounds >= 3 && optionsLeast - plainLeast < 16,
    );
    // a list of the keys kept, or a string built per key, would be 50 bytes and more a call
    const extra = optionsLeast - plainLeast;
    assert.ok(extra < 16, `${extra.toFixed(1)} more bytes per decision with options`);
  });

  test("a policy object of the caller's own gets features of its own for every decision", () => {
    const kept: RouteFeatures[] = [];
    const router = new KVAwareRouter({
      blockSize: BLOCK,
      policy: {
        name: 'keeps-features',
        choose: (_candidates: readonly Candidate[], request: RouteFeatures) => {
          kept.push(request);
          return { index: 0, confidence: 0, reason: 'cost' };
        },
      },
    });
    router.registerWorker('w0');
    router.route({ tokens: Array.from({ length: 2 * BLOCK }, (_, i) => i) });
    router.route({ tokens: Array.from({ length: 5 * BLOCK }, (_, i) => i) });
    assert.notEqual(kept[0], kept[1]);
    assert.deepEqual(
      kept.map((f) => [f.promptTokens, f.requestBlocks]),
      [
        [2 * BLOCK, 2],
        [5 * BLOCK, 5],
      ],
    );
  });

  test("a request's namespace (LoRA, cache salt, CLA group) is mixed in without building a string", () => {
    let now = 0;
    const router = new KVAwareRouter({ policy: 'cost', indexMode: 'precise', blockSize: BLOCK, clock: () => now });
    for (let w = 0; w < WORKERS; w++) router.registerWorker(`w${w}`);
    const requests = Array.from({ length: 16 }, (_, k) =>
      Uint32Array.from({ length: 2048 }, (_, i) => (i < 1024 ? i : i * 7 + k * 13) >>> 0),
    );
    // content anchors are keyed under the namespace too (the chain's root, two numbers)
    const contentAnchors = Array.from({ length: 8 }, (_, i) => ({ id: `passage-${i}`, tokens: 64 }));
    const plain = { tokens: requests[0], contentAnchors };
    const namespaced = {
      tokens: requests[0],
      contentAnchors,
      lora: 'adapter-a',
      cacheSalt: 'tenant-1',
      claGroup: 12345,
    };
    const run = (request: { tokens: Uint32Array }) =>
      bytesPerCall(2000, (i) => {
        now += 1;
        request.tokens = requests[i % requests.length];
        router.release(router.route(request).ticket);
      });
    // the fewest bytes of each over rounds of both, until the namespace costs under 16 bytes more
    // (or the deadline: see STEADY_DEADLINE_MS); a namespace that allocates in the steady state
    // stays over in every round
    let plainLeast = Infinity;
    let namespacedLeast = Infinity;
    roundsUntil(
      () => {
        plainLeast = Math.min(plainLeast, run(plain));
        namespacedLeast = Math.min(namespacedLeast, run(namespaced));
      },
      () => namespacedLeast - plainLeast < 16,
    );
    const extra = namespacedLeast - plainLeast;
    // 'lora:adapter-a', 'salt:tenant-1', '12345' and 'cla:12345' built, and a pair per field
    // returned, would be well over 100 bytes; a key built per content anchor, 8 × 40 and more
    assert.ok(extra < 16, `${extra.toFixed(1)} more bytes per decision with a namespace`);
  });

  test('recording content anchors the worker holds already allocates nothing', () => {
    const index = new ContentAnchorIndex(1000, 600_000);
    const anchors = Array.from({ length: 8 }, (_, i) => ({ id: `passage-${i}`, tokens: 64 }));
    const ns = new Uint32Array(2);
    chainRoot({ lora: 'adapter-a', claGroup: 3 }, ns);
    let now = 0;
    for (let slot = 0; slot < 4; slot++) index.record(slot, anchors, ns, now);
    // the anchors recorded longest ago are looked at only once they may have expired
    const bytes = steadyBytesPerCall(5000, (i) => index.record(i % 4, anchors, ns, ++now), 8);
    assert.ok(bytes < 8, `${bytes.toFixed(1)} bytes per record() of 8 anchors held`);
    assert.equal(index.heldTokens(3, anchors, ns, now), 8 * 64);
  });

  test('the namespace mixes as its label and value joined would, for every kind of value', () => {
    // the reference: the string joined, then mixed (what chainRoot's output is pinned to)
    const mix = (hi: number, lo: number, s: string): [number, number] => {
      let a = hi ^ 0x811c9dc5;
      let b = lo ^ 0x01000193;
      for (let i = 0; i < s.length; i++) {
        const c = s.charCodeAt(i);
        a = Math.imul(a ^ c, 0x01000193);
        b = Math.imul(b ^ c, 0x5bd1e995);
        b ^= b >>> 15;
      }
      return [fmix32(a ^ (b >>> 7)), fmix32(b ^ Math.imul(a, 0x9e3779b1))];
    };
    const root = (ns: { lora?: string; cacheSalt?: string; claGroup?: number }): number[] => {
      let h: [number, number] = [0x6a09e667, 0xbb67ae85];
      if (ns.lora) h = mix(h[0], h[1], 'lora:' + ns.lora);
      if (ns.cacheSalt) h = mix(h[0], h[1], 'salt:' + ns.cacheSalt);
      if (ns.claGroup !== undefined) h = mix(h[0], h[1], 'cla:' + ns.claGroup);
      return h;
    };
    const groups = [0, 1, 9, 10, 11, 99, 100, 12345, 999_999_999, 1_000_000_000, 2 ** 31 - 1, 2 ** 31, 2 ** 40 + 3];
    const odd = [2.5, 1e21, 2 ** 53 + 2, Number.MAX_VALUE, -0];
    for (const claGroup of [...groups, ...odd]) {
      for (const ns of [{ claGroup }, { lora: 'l', cacheSalt: 'ténant', claGroup }]) {
        const out = new Uint32Array(2);
        chainRoot(ns, out);
        assert.deepEqual([...out], root(ns), `claGroup ${claGroup}`);
      }
    }
    const out = new Uint32Array(2);
    mixIntoChain(0xdeadbeef, 0x12345678, '[["mm", 1]]', out);
    assert.deepEqual([...out], mix(0xdeadbeef, 0x12345678, '[["mm", 1]]'));
  });
});
