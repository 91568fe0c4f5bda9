/**
 * Largest seed: mulberry32's state is 32 bits, so a larger seed would only repeat a smaller one
 * (2^32 would be 0). Every seed a caller gives (flags, trace specs, options) is bounded by it.
 */
export const MAX_SEED = 0xffff_ffff;

/**
 * mulberry32: a small, fast, seedable PRNG so that every simulated run is reproducible. The
 * seed is an integer from 0 to MAX_SEED; a seed derived from another (seed * K + c) is reduced
 * to 32 bits by its maker (`>>> 0`), which then decides what repeats what.
 */
export function createRng(seed: number): () => number {
  return new SeededRandom(seed).next;
}

/**
 * The generator with its state in view (createRng's `next`): `next` draws, `state` reads and
 * sets where it is. The router draws its policies' random numbers from one and puts it back after a dry run,
 * so that the next decision is the one the dry run showed.
 */
export class SeededRandom {
  state: number;

  constructor(seed: number) {
    if (!(Number.isInteger(seed) && seed >= 0 && seed <= MAX_SEED))
      throw new RangeError(`seed must be an integer from 0 to ${MAX_SEED}, got ${seed}`);
    this.state = seed;
  }

  /** A number in [0, 1). */
  readonly next = (): number => {
    const a = (this.state = (this.state + 0x6d2b79f5) >>> 0);
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** An integer in [lo, hi]. */
export function randInt(rng: () => number, lo: number, hi: number): number {
  return lo + Math.floor(rng() * (hi - lo + 1));
}

/** Index in [0, n) drawn with Zipf weights 1/(i+1)^s: a few popular items, a long tail. */
export function zipfIndex(rng: () => number, n: number, s: number): number {
  let total = 0;
  for (let i = 0; i < n; i++) total += 1 / (i + 1) ** s;
  let x = rng() * total;
  for (let i = 0; i < n; i++) {
    x -= 1 / (i + 1) ** s;
    if (x <= 0) return i;
  }
  return n - 1;
}
