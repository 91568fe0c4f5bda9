/**
 * Engine errors where an answer should be: which statuses the error events of a stream stand
 * for, read as the engines write them and as the SSE format allows.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { errorEventStatus } from '../../src/server/engine-errors.js';

const events = (text: string) => errorEventStatus(Buffer.from(text));

test('error events are read per the SSE format', () => {
  const cases: ReadonlyArray<readonly [string, number]> = [
    ['data: {"error": {"code": 500}}\n\n', 500],
    ['data:{"error":{"code":500}}\n\n', 500],
    ['data: {"error":\ndata: {"code": 502}}\n\n', 502],
    ['data: {"error":\r\ndata: {"code": 502}}\r\n\r\n', 502],
    ['data: {"error":\rdata: {"code": 502}}\r\r', 502],
    ['event: error\ndata: {"message": "m", "code": 503}\n\n', 503],
    ['event:error\ndata: engine gone\n\n', 500],
    ['data: {"message": "m"}\nevent: error\n\n', 500],
    ['event: error\ndata: {"code": 400, "type": "BadRequestError"}\n\n', 400],
    ['id: 7\nretry: 10\ndata: {"error": {"type": "BadRequestError", "code": null}}\n\n', 400],
    // an engine's ErrorResponse as it is, in an event of any type
    ['event: message\ndata: {"object": "error", "message": "m", "code": 500}\n\n', 500],
    // the first failure wins over an earlier client error
    ['data: {"error": {"code": 400}}\n\ndata: {"error": {"code": 500}}\n\n', 500],
  ];
  for (const [text, status] of cases) assert.equal(events(text), status, JSON.stringify(text));
});

test('events that are not errors, or not whole, stand for none', () => {
  const cases: readonly string[] = [
    'data: {"choices":[{"text":"error"}]}\n\n',
    'data: {"choices":[{"text":"\\"error\\": 500"}]}\n\n',
    'data: {"choices":[{"text":"x"}],"error":null}\n\n',
    ': error\n\n',
    ':event: error\ndata: {"n":1}\n\n',
    'event: error\n\n',
    'event: errors\ndata: {"code": 500}\n\n',
    'events: error\ndata: {"code": 500}\n\n',
    'data: error\n\n',
    'datum: {"error": {"code": 500}}\n\n',
    // its blank line has not arrived: the event is not whole
    'data: {"error": {"code": 500}}\n',
    'data: {"error": {"code": 500}}',
    // an event without data is not dispatched, and its type does not carry over
    'event: error\n\ndata: {"n":1}\n\n',
  ];
  for (const text of cases) assert.equal(events(text), 0, JSON.stringify(text));
});

test('a long stream chunk with many lines and no error is passed over whatever its size', () => {
  const chunk = 'data: {"choices":[{"text":"no error here"}]}\n\n'.repeat(20_000);
  assert.equal(events(chunk), 0);
  assert.equal(events(chunk + 'data: {"error": {"code": 500}}\n\n'), 500);
});
