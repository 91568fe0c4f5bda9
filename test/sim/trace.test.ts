import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import { loadMooncakeTrace, parseTraceLine, TraceFormatError } from '../../src/sim/trace.js';

const fixture = (name: string) => fileURLToPath(new URL(`../fixtures/${name}`, import.meta.url));

describe('Mooncake trace loader', () => {
  test('reads the first 300 lines of the real conversation trace', async () => {
    const t = await loadMooncakeTrace(fixture('mooncake-conversation-head300.jsonl'));
    assert.equal(t.length, 300);
    assert.deepEqual(t[0].hashIds.slice(0, 3), [0, 1, 2]);
    assert.equal(t[0].inputLength, 6758);
    assert.equal(t[0].blockSize, 512);
    // the trace README: len(hash_ids) == ceil(input_length / 512) on every line
    for (const r of t) assert.equal(r.hashIds.length, Math.ceil(r.inputLength / 512));
    for (let i = 1; i < t.length; i++) assert.ok(t[i].timestamp >= t[i - 1].timestamp);
  });

  test('honours every optional field, skips blank lines, sorts by time keeping line indices', async () => {
    const t = await loadMooncakeTrace(fixture('trace-optional-fields.jsonl'));
    assert.deepEqual(
      t.map((r) => r.index),
      [0, 3, 1],
    ); // line 2 is blank; sorted by timestamp
    const [a, iso, b] = t;
    assert.equal(a.blockSize, 128);
    assert.equal(a.sessionId, 'wf-a');
    assert.equal(a.step, 0);
    assert.equal(a.claGroup, 1);
    assert.equal(a.agentRole, 'retriever');
    assert.equal(a.model, 'm1');
    assert.deepEqual(b.anchors, [
      { id: '77', tokens: 64 },
      { id: '78', tokens: 32 },
    ]);
    assert.equal(iso.isolate, true);
  });

  test('a field the router would refuse mid-replay is refused as the line is read, naming the line and the field', () => {
    const line = (extra: string) =>
      `{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[1]${extra ? `,${extra}` : ''}}`;
    const cases: Array<[string, string]> = [
      ['"session_id":"s","step":1.5', '"step" must be a non-negative integer'],
      ['"step":-1', '"step" must be a non-negative integer'],
      ['"session_id":""', '"session_id" must be a non-empty string or a number'],
      ['"session_id":true', '"session_id" must be a non-empty string or a number'],
      ['"agent_role":""', '"agent_role" must be a non-empty string'],
      ['"agent_role":5', '"agent_role" must be a non-empty string'],
      ['"anchors":[""],"anchor_lengths":[10]', '"anchors[0]" must be a non-empty string or a number'],
      ['"anchors":["a",{"id":1}],"anchor_lengths":[1,2]', '"anchors[1]" must be a non-empty string or a number'],
      ['"anchors":[null],"anchor_lengths":[1]', '"anchors[0]" must be a non-empty string or a number'],
      ['"model":""', '"model" must be a non-empty string'],
      ['"model":3', '"model" must be a non-empty string'],
      // past the router's id bound (1,024 bytes of UTF-8): it stopped the replay midway, naming no line
      [`"session_id":"${'s'.repeat(1025)}"`, '"session_id" must be at most 1024 bytes of UTF-8, got 1025 characters'],
      [`"agent_role":"${'é'.repeat(513)}"`, '"agent_role" must be at most 1024 bytes of UTF-8, got 513 characters'],
      [`"model":"${'m'.repeat(1025)}"`, '"model" must be at most 1024 bytes of UTF-8, got 1025 characters'],
      [
        `"anchors":["${'a'.repeat(1025)}"],"anchor_lengths":[1]`,
        '"anchors[0]" must be at most 1024 bytes of UTF-8, got 1025 characters',
      ],
    ];
    for (const [extra, message] of cases)
      assert.throws(
        () => parseTraceLine(line(extra), 3000),
        (e: unknown) => e instanceof TraceFormatError && e.message === `trace line 3001: ${message}`,
        extra,
      );
    // passages that claim more tokens than the whole prompt would make its figures inconsistent
    assert.throws(
      () => parseTraceLine(line('"anchors":["x","y"],"anchor_lengths":[6,5]'), 4, 512, 'a.jsonl'),
      (e: unknown) =>
        e instanceof TraceFormatError &&
        e.message === 'a.jsonl line 5: "anchor_lengths" add up to 11 tokens, more than "input_length" (10)',
    );
    assert.equal(parseTraceLine(line('"anchors":["x","y"],"anchor_lengths":[6,4]'), 0).anchors?.length, 2);
    // what the router takes: ids as strings, numbers as their decimal text, whole steps
    const ok = parseTraceLine(line('"session_id":7,"step":2,"anchors":[5,"doc"],"anchor_lengths":[3,4]'), 0);
    assert.equal(ok.sessionId, '7');
    assert.equal(ok.step, 2);
    assert.deepEqual(ok.anchors, [
      { id: '5', tokens: 3 },
      { id: 'doc', tokens: 4 },
    ]);
  });

  test('a malformed line is an error naming the line and the field', () => {
    assert.throws(
      () => parseTraceLine('{"timestamp": 0}', 4),
      (e: unknown) => e instanceof TraceFormatError && /line 5: missing "input_length"/.test(e.message),
    );
    assert.throws(() => parseTraceLine('not json', 0), /line 1: not valid JSON/);
    assert.throws(
      () => parseTraceLine('{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1,-2]}', 0),
      /hash_ids/,
    );
    assert.throws(
      () =>
        parseTraceLine(
          '{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[],"anchors":[1],"anchor_lengths":[]}',
          0,
        ),
      /anchors/,
    );
    assert.throws(
      () => parseTraceLine('{"timestamp":-1,"input_length":1,"output_length":1,"hash_ids":[]}', 0),
      /timestamp/,
    );
  });
});
