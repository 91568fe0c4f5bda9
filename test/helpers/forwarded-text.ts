/**
 * What a gateway forwards of a body a client wrote, read from an engine that records each body it
 * receives (recordingEngine in test/faults/harness.ts).
 */
import assert from 'node:assert/strict';
import { post } from '../faults/harness.js';

/**
 * A 64-bit seed JSON.parse would round to a double: it reaches the engine as written only if the
 * gateway edits the body's text rather than serialising it again.
 */
export const SEED_64_BIT = '18446744073709551557';

/**
 * For the engine recording into `received`: a function that POSTs `text` as it is to `path` on
 * the gateway at `url`, which must answer 200 and forward it to that engine once, and returns the
 * body the engine received.
 */
export function forwardedTo(received: string[]) {
  return async (url: string, path: string, text: string, headers: Record<string, string> = {}): Promise<string> => {
    const before = received.length;
    const res = await post(url, path, text, headers);
    assert.equal(res.status, 200, res.text);
    assert.equal(received.length, before + 1);
    return received[before]!;
  };
}

/** `text` parsed with its seed as written (a string), so a rounded seed would not compare equal. */
export function parsedWithSeed(text: string): Record<string, unknown> {
  assert.match(text, new RegExp(`"seed":\\s*${SEED_64_BIT}[,}]`));
  return JSON.parse(text.replace(SEED_64_BIT, `"${SEED_64_BIT}"`)) as Record<string, unknown>;
}
