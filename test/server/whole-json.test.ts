import assert from 'node:assert/strict';
import { test } from 'node:test';
import { declaresJson, isWholeJson } from '../../src/server/whole-json.js';

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
