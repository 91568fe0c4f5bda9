import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { loadMooncakeTrace, parseTraceLine, TraceFormatError } from '../../src/sim/trace.js';

const dir = mkdtempSync(join(tmpdir(), 'cf-trace-ids-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;
const write = (content: string) => {
  const path = join(dir, `t${files++}.jsonl`);
  writeFileSync(path, content);
  return path;
};
const ids = (n: number) => Array.from({ length: n }, (_, i) => i);
const line = (fields: Record<string, unknown>) =>
  JSON.stringify({ timestamp: 0, input_length: 1024, output_length: 8, hash_ids: [1, 2], ...fields });
/** parseTraceLine(text) throws a TraceFormatError whose message is exactly `message`. */
const refuses = (text: string, message: string, defaultBlockSize = 512) =>
  assert.throws(
    () => parseTraceLine(text, 6, defaultBlockSize, 'a.jsonl'),
    (e: unknown) => {
      assert.ok(e instanceof TraceFormatError, String(e));
      assert.equal(e.message, `a.jsonl line 7: ${message}`);
      return true;
    },
  );

describe('Mooncake trace loader: hash_ids against input_length and the block size', () => {
  test('one hash id per block of the prompt, the last partial block included, give or take one, is read', () => {
    for (const [input, blocks] of [
      [1, 1],
      [512, 1],
      [513, 2],
      [1024, 2],
      [1025, 3],
    ])
      assert.equal(parseTraceLine(line({ input_length: input, hash_ids: ids(blocks) }), 0).hashIds.length, blocks);
    assert.equal(parseTraceLine(line({ input_length: 1000, hash_ids: ids(63), block_size: 16 }), 0).blockSize, 16);
    // one id more or fewer is rounding, not another block size: the last block counted as
    // `input_length // block_size + 1`, or a partial last block left out
    assert.equal(parseTraceLine(line({ input_length: 1024, hash_ids: ids(3) }), 0).hashIds.length, 3);
    assert.equal(parseTraceLine(line({ input_length: 1000, hash_ids: ids(1) }), 0).hashIds.length, 1);
    // a trace-wide default other than 512 counts the same way
    assert.equal(parseTraceLine(line({ input_length: 1000, hash_ids: ids(63) }), 0, 16).hashIds.length, 63);
  });

  test('a trace of 16-token blocks without block_size is refused, naming the block size that fits', () => {
    const refusals: Array<{ fields: Record<string, unknown>; message: string }> = [
      {
        fields: { input_length: 1000, hash_ids: ids(63) },
        message:
          '"hash_ids" has 63 entries but "input_length" 1000 at the default block size 512 needs 2 ' +
          '(a block size of 16 would fit: set "block_size" on every line)',
      },
      {
        fields: { input_length: 1000, hash_ids: ids(8), block_size: 16 },
        message:
          '"hash_ids" has 8 entries but "input_length" 1000 at "block_size" 16 needs 63 (a block size of 128 would fit)',
      },
      // no power of two fits: the block sizes that would are named
      {
        fields: { input_length: 1000, hash_ids: ids(5) },
        message:
          '"hash_ids" has 5 entries but "input_length" 1000 at the default block size 512 needs 2 ' +
          '(a block size from 200 to 249 would fit: set "block_size" on every line)',
      },
      // no block size gives more blocks than tokens, or none at all
      {
        fields: { input_length: 4, hash_ids: ids(5), block_size: 4 },
        message: '"hash_ids" has 5 entries but "input_length" 4 at "block_size" 4 needs 1',
      },
      {
        fields: { input_length: 10, hash_ids: [] },
        message: '"hash_ids" has 0 entries but "input_length" 10 at the default block size 512 needs 1',
      },
    ];
    for (const { fields, message } of refusals) refuses(line(fields), message);
  });

  test('with content anchors, the ids may cover the prompt outside them or the whole prompt', () => {
    const anchored = (n: number) =>
      line({ input_length: 420, hash_ids: ids(n), block_size: 128, anchors: [77, 78], anchor_lengths: [64, 200] });
    // 156 tokens outside the anchors: 2 blocks; the whole prompt: 4
    for (const n of [2, 3, 4]) assert.equal(parseTraceLine(anchored(n), 0).hashIds.length, n);
    refuses(
      anchored(0),
      '"hash_ids" has 0 entries but "input_length" 420 (264 of them in "anchors") at "block_size" 128 needs from 2 to 4',
    );
    refuses(
      anchored(30),
      '"hash_ids" has 30 entries but "input_length" 420 (264 of them in "anchors") at "block_size" 128 needs from 2 to 4 ' +
        '(a block size of 8 would fit)',
    );
  });

  test('input_length 0 is refused, naming the line and the field; output_length 0 is read', () => {
    refuses(
      line({ input_length: 0, hash_ids: [] }),
      '"input_length" must be a whole number of tokens from 1 to 16777216',
    );
    assert.equal(parseTraceLine(line({ output_length: 0 }), 0).outputLength, 0);
  });

  test('hash_ids and token counts of the wrong type are errors naming the field, not crashes', () => {
    for (const hashIds of ['1,2', { a: 1 }, null, [1, 2.5], [1, '2'], [1, null], [2 ** 53]])
      refuses(line({ hash_ids: hashIds }), '"hash_ids" must be an array of non-negative integers');
    refuses(
      JSON.stringify({ timestamp: 0, input_length: 1, output_length: 1 }),
      '"hash_ids" must be an array of non-negative integers',
    );
    refuses(line({ input_length: -1 }), '"input_length" must be a non-negative number');
    refuses(line({ input_length: '1024' }), '"input_length" must be a non-negative number');
  });

  test('the file loader reports the first inconsistent line by file and line number', async () => {
    const path = write(`${line({})}\n\n${line({ hash_ids: ids(64) })}\n${line({})}\n`);
    await assert.rejects(loadMooncakeTrace(path), (e: unknown) => {
      assert.ok(e instanceof TraceFormatError, String(e));
      assert.equal(
        e.message,
        `${path} line 3: "hash_ids" has 64 entries but "input_length" 1024 at the default block size 512 needs 2 ` +
          '(a block size of 16 would fit: set "block_size" on every line)',
      );
      return true;
    });
  });
});
