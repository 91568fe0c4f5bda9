import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { SharedDecision } from '../../src/core/router/index.js';
import {
  decodeMessage,
  encodeDecision,
  encodeLoad,
  encodeLoadEntry,
  encodePrefilled,
  encodeRefused,
  encodeReleased,
  encodeWorkflow,
  isWellFormed,
  MAX_DECISION_FIELDS_BYTES,
  MAX_OTHER_MESSAGE_BYTES,
  maxMessageBytes,
  MessageTooLong,
  parseWorkflow,
  STATE_WIRE_VERSION,
} from '../../src/state/redis-wire.js';

// Replicas of different versions meet on the events channel: what a version-2 replica does
// with each message this version publishes, read as it reads them.

/** What a version-2 replica does with a channel message (its onMessage, as released). */
function actionOfVersion2(raw: Buffer): string {
  let msg: Record<string, unknown>;
  try {
    msg = decodeMessage(raw) as unknown as Record<string, unknown>;
  } catch {
    return 'malformed';
  }
  switch (msg.k) {
    case 'd':
      return `decision w=${String(msg.w)} h=${String(msg.h)} q=${String(msg.q)}`;
    case 'pd':
      return `prefilled w=${String(msg.w)} q=${String(msg.q)} d=${String(msg.d)}`;
    case 'rl':
      return `released w=${String(msg.w)} q=${String(msg.q)} d=${typeof msg.d === 'number' ? msg.d : 'none'}`;
    case 'wa':
    case 'wr':
      return 'registry';
    default:
      return 'ignored'; // counted among its malformed messages; nothing applied, nothing thrown
  }
}

const decision: SharedDecision = {
  workerId: 'e0',
  hi: Uint32Array.of(1, 2),
  lo: Uint32Array.of(3, 4),
  workflowStep: null,
  claGroup: null,
  prefillTokens: 300,
  decodeTokens: 500,
  tracked: true,
  id: 'ab12cd34.7',
};
const wire = (m: object) => Buffer.from(JSON.stringify(m));

test('version 3: a version-2 replica ignores a refusal and reads the other messages as before', () => {
  const refusal = encodeRefused('r1', decision)!;
  assert.deepEqual(refusal, { r: 'r1', k: 'rf', w: 'e0', i: 'ab12cd34.7' });
  assert.equal(actionOfVersion2(wire(refusal)), 'ignored');
  // the decision's id rides along on what version 2 knows, which it reads unchanged
  const { id: _, ...withoutId } = decision;
  for (const [withId, without] of [
    [encodeDecision('r1', decision), encodeDecision('r1', withoutId)],
    [encodePrefilled('r1', decision), encodePrefilled('r1', withoutId)],
    [encodeReleased('r1', decision, true), encodeReleased('r1', withoutId, true)],
    [encodeReleased('r1', decision, false), encodeReleased('r1', withoutId, false)],
  ]) {
    assert.equal((withId as { i?: string }).i, 'ab12cd34.7');
    assert.equal((without as { i?: string }).i, undefined);
    assert.equal(actionOfVersion2(wire(withId)), actionOfVersion2(wire(without)));
    assert.notEqual(actionOfVersion2(wire(withId)), 'ignored');
  }
  // a decision without an id (untracked, or from an earlier version) has no refusal to send
  assert.equal(encodeRefused('r1', withoutId), undefined);
});

test('version 4: a replica back from an outage says what it holds; earlier replicas ignore it', () => {
  const load = encodeLoad('r1', { e0: encodeLoadEntry(2, 300, 500) });
  assert.deepEqual(load, { r: 'r1', k: 'ld', l: { e0: '2,300,500' } });
  // a version-3 replica reads kinds as version 2 did, plus rf: ld is neither
  assert.equal(actionOfVersion2(wire(load)), 'ignored');
});

test('version 5: drains and posted KV events are shared; earlier replicas ignore both', () => {
  assert.equal(STATE_WIRE_VERSION, 8);
  // a version-4 replica reads kinds as version 2 did, plus rf and ld: dr and ev are neither
  assert.equal(actionOfVersion2(wire({ r: 'r1', k: 'dr', id: 'e0', on: true })), 'ignored');
  assert.equal(actionOfVersion2(wire({ r: 'r1', k: 'ev', w: 'e0', e: [{ type: 'AllBlocksCleared' }] })), 'ignored');
});

test("version 8: a decision's content anchors carry their namespace; an earlier replica reads it as before", () => {
  const anchored = { ...decision, contentAnchors: [{ id: 'doc', tokens: 90 }], anchorNamespace: '0123456789abcdef' };
  const m = encodeDecision('r1', anchored);
  assert.equal(m.ns, '0123456789abcdef');
  assert.ok(isWellFormed(m));
  // a version-7 replica reads decisions as version 2 did, with the fields it knows: ns is none
  const { anchorNamespace: _, ...without } = anchored;
  assert.equal(encodeDecision('r1', without).ns, undefined);
  assert.equal(actionOfVersion2(wire(m)), actionOfVersion2(wire(encodeDecision('r1', without))));
  // no anchors, no namespace
  assert.equal(encodeDecision('r1', { ...decision, anchorNamespace: '0123456789abcdef' }).ns, undefined);
  for (const ns of ['0123', '0123456789ABCDEF', 12, null]) assert.equal(isWellFormed({ ...m, ns } as never), false);
});

test('a workflow value names its worker by the id rule the router takes (isWorkerId), or reads as none', () => {
  assert.deepEqual(parseWorkflow(encodeWorkflow('e0', 3)), { w: 'e0', s: 3 });
  assert.deepEqual(parseWorkflow(encodeWorkflow('x'.repeat(256), null)), { w: 'x'.repeat(256), s: null });
  for (const w of ['', 'x'.repeat(257), '\uD800', 5, null])
    assert.equal(parseWorkflow(JSON.stringify({ w, s: 1 })), undefined);
  // a step past 2^53 - 1 is no step the router takes (setWorkflowAffinity would refuse it on every
  // request of the workflow, as the client's fault): read as none, as any other step it cannot take
  assert.deepEqual(parseWorkflow('{"w":"e2","s":99999999999999999999}'), { w: 'e2', s: null });
  assert.deepEqual(parseWorkflow(`{"w":"e2","s":${Number.MAX_SAFE_INTEGER}}`), { w: 'e2', s: Number.MAX_SAFE_INTEGER });
});

test("a shared decision's anchor token counts are integers the router takes", () => {
  const m = encodeDecision('r1', { ...decision, contentAnchors: [{ id: 'doc', tokens: 90 }] });
  assert.ok(isWellFormed(m));
  assert.equal(isWellFormed({ ...m, ca: [{ id: 'doc', tokens: 1e20 }] } as never), false);
  assert.equal(isWellFormed({ ...m, ca: [{ id: 'doc', tokens: 2 ** 53 }] } as never), false);
});

test('a message longer than the bound is refused before any of it is read', () => {
  // not JSON at all: refused for its length, not for what JSON.parse would say of it
  const junk = Buffer.alloc(1001, '{');
  assert.throws(
    () => decodeMessage(junk, 1000),
    (err: unknown) => err instanceof MessageTooLong && err.bytes === 1001,
  );
  assert.throws(() => decodeMessage(junk, 1001), SyntaxError);
  const ok = wire(encodeDecision('r1', decision));
  assert.equal(decodeMessage(ok, ok.length).k, 'd');
});

test("the bound holds the longest prompt's decision, with every other field at its limit, twice over", () => {
  for (const [maxPromptTokens, blockSize] of [
    [1_048_576, 16],
    [1_048_576, 1],
    [4_194_304, 4],
  ]) {
    const blocks = Math.ceil(maxPromptTokens / blockSize);
    const hi = new Uint32Array(blocks).fill(0xffffffff);
    const longest = {
      ...decision,
      workerId: 'w'.repeat(256),
      hi,
      lo: hi,
      workflowId: 'f'.repeat(256),
      workflowStep: 2 ** 31,
      anchor: 'a'.repeat(256),
      claGroup: 2 ** 31,
      // 128 content anchors of 256-byte ids, each escaped to 6 bytes a character
      contentAnchors: Array.from({ length: 128 }, (_, i) => ({ id: `${i}`.padEnd(256, '\u0001'), tokens: 2 ** 40 })),
      anchorNamespace: 'f'.repeat(16),
      prefillTokens: 2 ** 40,
      id: 'i'.repeat(256),
    };
    const raw = wire(encodeDecision('r'.repeat(256), longest));
    const bound = maxMessageBytes(maxPromptTokens, blockSize);
    assert.ok(
      2 * raw.length <= bound || bound === MAX_OTHER_MESSAGE_BYTES,
      `${blocks} blocks: ${raw.length} of ${bound}`,
    );
    assert.ok(raw.length <= bound);
    assert.equal((decodeMessage(raw, bound) as { h: string }).h.length, 4 * Math.ceil((8 * blocks) / 3));
    assert.ok(raw.length - 4 * Math.ceil((8 * blocks) / 3) <= MAX_DECISION_FIELDS_BYTES);
  }
  // the defaults: the other kinds bound it, and a 20 MB message is refused
  assert.equal(maxMessageBytes(1_048_576, 16), 8 * 1024 * 1024);
  assert.ok(maxMessageBytes(1_048_576, 16) < 20_000_000);
});
