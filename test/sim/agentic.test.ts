import assert from 'node:assert/strict';
import { test } from 'node:test';
import { generateAgenticTrace } from '../../src/sim/agentic.js';
import { loadTrace } from '../../src/sim/load-trace.js';
import type { TraceRequest } from '../../src/sim/trace.js';

const trace = generateAgenticTrace({ sessions: 40, seed: 3 });
const bySession = new Map<string, TraceRequest[]>();
for (const r of trace) {
  const list = bySession.get(r.sessionId!) ?? [];
  list.push(r);
  bySession.set(r.sessionId!, list);
}
const mains = [...bySession].filter(([id]) => !id.includes('/sub-'));
const fullBlocks = (r: TraceRequest) => r.hashIds.slice(0, Math.floor(r.inputLength / r.blockSize));
const sharedPrefix = (a: number[], b: number[]) => {
  let k = 0;
  while (k < a.length && k < b.length && a[k] === b[k]) k++;
  return k;
};

test('agentic traces are deterministic per seed', () => {
  assert.deepEqual(generateAgenticTrace({ sessions: 5, seed: 7 }), generateAgenticTrace({ sessions: 5, seed: 7 }));
  assert.notDeepEqual(generateAgenticTrace({ sessions: 5, seed: 7 }), generateAgenticTrace({ sessions: 5, seed: 8 }));
  assert.throws(() => generateAgenticTrace({ sessions: 0 }), RangeError);
});

test('agentic: N sessions of tens of turns, 64-token blocks, sorted, indexed', () => {
  assert.equal(mains.length, 40);
  for (const [, turns] of mains) assert.ok(turns.length >= 15 && turns.length <= 60, `${turns.length} turns`);
  trace.forEach((r, i) => {
    assert.equal(r.index, i);
    assert.equal(r.blockSize, 64);
    assert.equal(r.hashIds.length, Math.ceil(r.inputLength / 64));
    if (i > 0) assert.ok(r.timestamp >= trace[i - 1].timestamp);
  });
});

test('agentic: prompts from ~10k to several hundred thousand tokens, median ~100k', () => {
  const sizes = trace.map((r) => r.inputLength).sort((a, b) => a - b);
  const median = sizes[Math.floor(sizes.length / 2)];
  assert.ok(sizes[0] >= 8_000 && sizes[0] <= 20_000, `min ${sizes[0]}`);
  assert.ok(median >= 60_000 && median <= 150_000, `median ${median}`);
  assert.ok(sizes[sizes.length - 1] >= 200_000, `max ${sizes[sizes.length - 1]}`);
});

test('agentic: every turn re-sends the whole context; compaction keeps the shared prefix', () => {
  const first = trace[0].hashIds[0];
  for (const r of trace) assert.equal(r.hashIds[0], first, 'one system prompt for every session');
  let extended = 0;
  let compacted = 0;
  for (const [, turns] of mains) {
    for (let t = 1; t < turns.length; t++) {
      const prev = fullBlocks(turns[t - 1]);
      const cur = turns[t].hashIds;
      if (sharedPrefix(prev, cur) === prev.length) {
        extended++;
        assert.ok(turns[t].inputLength > turns[t - 1].inputLength);
      } else {
        // compaction: the system prompt and repository context stay, the rest is new
        compacted++;
        assert.ok(turns[t].inputLength < turns[t - 1].inputLength);
        assert.ok(sharedPrefix(prev, cur) * 64 >= 8_000);
      }
      // think time: the next turn comes after the answer and a tool run or a user reply
      assert.ok(turns[t].timestamp - turns[t - 1].timestamp >= 1_500);
    }
  }
  assert.ok(extended > 20 * compacted, `${extended} extended, ${compacted} compacted`);
  assert.ok(compacted > 0);
});

test("agentic: sub-agents fork the session's context; sessions overlap in time", () => {
  const subs = [...bySession].filter(([id]) => id.includes('/sub-'));
  assert.ok(subs.length >= 10, `${subs.length} sub-agents`);
  for (const [id, turns] of subs) {
    const parent = bySession.get(id.split('/')[0])!;
    const before = parent.filter((r) => r.timestamp <= turns[0].timestamp);
    const last = before[before.length - 1];
    assert.ok(turns.every((r) => r.agentRole === 'subagent'));
    assert.equal(
      sharedPrefix(fullBlocks(last), turns[0].hashIds),
      fullBlocks(last).length,
      `${id} forks its parent's context`,
    );
    assert.ok(turns.length >= 3 && turns.length <= 10);
  }
  // most of the time, several sessions are active at once
  const spans = mains.map(([, t]) => [t[0].timestamp, t[t.length - 1].timestamp]);
  const mid = (trace[0].timestamp + trace[trace.length - 1].timestamp) / 2;
  assert.ok(spans.filter(([a, b]) => a <= mid && b >= mid).length >= 5);
});

test('agentic:N[:SEED] loads anywhere a trace does', async () => {
  const t = await loadTrace('agentic:3:2');
  assert.equal(t.name, 'agentic:3:2');
  assert.deepEqual(t.requests, generateAgenticTrace({ sessions: 3, seed: 2 }));
  await assert.rejects(loadTrace('agentic:0'), /agentic:N needs N/);
});
