import assert from 'node:assert/strict';

/** Sends `count` short completions through the gateway at `base`: each must be served (200) by a worker it can forward to. */
export async function allServed(base: string, count: number): Promise<void> {
  for (let i = 0; i < count; i++) {
    const r = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: `request ${i} `.repeat(10), max_tokens: 1 }),
    });
    assert.equal(r.status, 200, await r.text());
  }
}
