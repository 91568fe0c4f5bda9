import assert from 'node:assert/strict';
import { test } from 'node:test';
import { declaresJson, isWholeJson, isWholeJsonIn } from '../../src/server/whole-json.js';

const whole = (text: string) => isWholeJson(Buffer.from(text));

const ANSWER = JSON.stringify({
  id: 'cmpl-1',
  choices: [{ index: 0, text: 'a "quoted" {brace} [bracket] \\ and \\"', finish_reason: 'stop' }],
  usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 },
  nested: [[], {}, [{ a: [1, 2, { b: null }] }]],
});

test('a whole object or array passes, with whitespace around it', () => {
  assert.ok(whole(ANSWER));
  assert.ok(whole(`\r\n ${ANSWER}\n`));
  assert.ok(whole('[]'));
  assert.ok(whole('{}'));
  assert.ok(whole('[{"a":"]"},"}"]'));
});

test('a UTF-8 byte order mark before the answer is skipped (RFC 8259 §8.1 lets a parser ignore it); one elsewhere is not', () => {
  assert.ok(whole(`\uFEFF${ANSWER}`));
  assert.ok(whole(`\uFEFF \n${ANSWER}`));
  assert.ok(!whole(` \uFEFF${ANSWER}`));
  assert.ok(!whole('\uFEFF'));
});

test('no proper prefix of an answer passes, whatever byte it ends on', () => {
  for (let end = 0; end < ANSWER.length; end++)
    assert.equal(whole(ANSWER.slice(0, end)), false, `cut at ${end}: ${ANSWER.slice(0, end)}`);
});

test('what is not one JSON object or array does not pass', () => {
  for (const text of [
    '',
    '   ',
    '<html>bad gateway</html>',
    '"a string"',
    '42',
    `${ANSWER}${ANSWER}`,
    `${ANSWER}x`,
    '{"a":[1}',
    '{"a":1]',
    '{"a":"\\"}',
    '}{',
  ])
    assert.equal(whole(text), false, text);
});

test('a range of a buffer is judged as a buffer of its bytes alone would be', () => {
  const deep = (depth: number) => `${'[{"a":'.repeat(depth)}"x"${'}]'.repeat(depth)}`;
  const inputs = [
    ANSWER,
    `\uFEFF ${ANSWER}\n`,
    ` \uFEFF${ANSWER}`,
    '\uFEFF',
    '\uFEFF{}',
    '[{"a":"]"},"}"]',
    '{"a":"\\"}"}',
    '{"a":"\\\\"}',
    '{"a":"\\\\\\"]"}',
    '{"a":"\\"}',
    '{"a":"x\\',
    '[[[]]]',
    '[[[]]',
    '[[]]]',
    '{"a":[1}',
    '{"a":1]',
    '}{',
    '"a string"',
    '42',
    '',
    ' ',
    `${ANSWER}${ANSWER}`,
    `${ANSWER}x`,
    deep(40),
    deep(5000),
    deep(5000).slice(0, -1),
    `${deep(5000)}]`,
    `${'['.repeat(100_000)}${']'.repeat(100_000)}`,
    `${'['.repeat(100_000)}${']'.repeat(99_999)}`,
    ...Array.from({ length: ANSWER.length }, (_, end) => ANSWER.slice(0, end)),
  ];
  // bytes around the range that would change the answer were they read: quotes, brackets, backslashes, a BOM
  const frames: Array<[string, string]> = [
    ['', ''],
    ['data: ', '\n\n'],
    ['\uFEFF"\\', '"}]\\"'],
    ['{["', '"]}'],
    ['}]', '[{'],
  ];
  for (const text of inputs) {
    const expected = isWholeJson(Buffer.from(text));
    for (const [before, after] of frames) {
      const start = Buffer.byteLength(before);
      const bytes = Buffer.from(before + text + after);
      const end = start + Buffer.byteLength(text);
      assert.equal(isWholeJsonIn(bytes, start, end), expected, `${JSON.stringify(before)} + ${text.slice(0, 60)}`);
      assert.equal(isWholeJson(bytes.subarray(start, end)), expected, `a view: ${text.slice(0, 60)}`);
    }
  }
  assert.ok(whole(deep(5000)), 'nesting deeper than the kept stack');
  assert.ok(whole(ANSWER), 'the kept stack still serves after a deeper input');
});

test('JSON media types', () => {
  for (const t of [
    'application/json',
    'application/json; charset=utf-8',
    'Application/JSON',
    'application/problem+json',
  ])
    assert.ok(declaresJson(t), t);
  for (const t of ['text/plain', 'application/jsonl', 'text/event-stream', 'application/x-ndjson'])
    assert.equal(declaresJson(t), false, t);
});
