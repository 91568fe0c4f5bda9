/**
 * Engine errors where an answer should be: which statuses the error objects of a 200 answer and
 * the error events of a stream stand for, read as the engines write them and as the SSE format
 * allows.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  errorAnswer,
  errorAnswerStatus,
  errorEvent,
  errorEventStatus,
  holdsMalformedEvent,
} from '../../src/server/engine-errors.js';
import { steadyBytesPerCall } from '../helpers/route-path-allocation.js';

const events = (text: string) => errorEventStatus(Buffer.from(text));
const answer = (text: string) => errorAnswerStatus(Buffer.from(text));

test('an error object in a whole answer stands for the status its code names', () => {
  assert.equal(answer('{"error": {"message": "m", "type": "InternalServerError", "param": null, "code": 500}}'), 500);
  assert.equal(answer('{"object":"error","message":"m","type":"BadRequestError","param":null,"code":400}'), 400);
  assert.equal(answer('{"error":{"message":"slow down","code":"429"}}'), 429, 'a numeric string');
  assert.equal(answer('{"error":{"message":"m","type":"server_error","code":null}}'), 500, 'no code: the engine');
  assert.equal(
    answer('{"error":{"message":"m","type":"invalid_request_error","code":"context_length_exceeded"}}'),
    400,
  );
  assert.equal(answer('{"error":"the engine is down"}'), 500, 'a bare message');
  assert.equal(answer(' {\n "error" : {"code": 503}\n} '), 503);
});

test('an error object after a UTF-8 byte order mark is read as one; a second mark is not skipped', () => {
  const bom = Buffer.from([0xef, 0xbb, 0xbf]);
  const error = Buffer.from('{"error":{"message":"m","type":"server_error","code":503}}');
  assert.equal(errorAnswerStatus(Buffer.concat([bom, error])), 503);
  assert.equal(errorAnswerStatus(Buffer.concat([bom, bom, error])), 0);
});

test('an answer that is not an error object stands for none', () => {
  for (const text of [
    '{"id":"c","object":"text_completion","choices":[{"text":"\\"error\\""}]}',
    '{"id":"c","choices":[{"text":"x","finish_reason":"stop"}],"error":null}',
    '{"id":"c","choices":[{"text":"x","finish_reason":"stop"}],"error":false}',
    '{"choices":[{"text":"say \\"error\\"","error":{"code":500}}]}',
    '[{"error":{"code":500}}]',
    '{"error":{"code":500}',
    'error',
    '',
  ])
    assert.equal(answer(text), 0, text);
  // an answer longer than any error is not read
  const long = JSON.stringify({ error: { code: 500, message: 'x'.repeat(70_000) } });
  assert.equal(answer(long), 0);
});

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

test('an event whose data is neither whole JSON nor [DONE] is malformed; only whole events are judged', () => {
  const malformed = (text: string, atStreamStart = false) => holdsMalformedEvent(Buffer.from(text), atStreamStart);
  assert.equal(malformed('data: {"choices":[]}\n\ndata: [DONE]\n\n'), false);
  assert.equal(
    malformed('data: {"choices":\ndata: []}\r\n\r\n'),
    false,
    'data lines joined as the SSE format joins them',
  );
  assert.equal(malformed(': ping\n\nevent: ping\n\nid: 3\n\n'), false, 'blocks without data are no events');
  assert.equal(malformed('data: {}\ndata: {}\n\n'), true, 'two data lines each whole JSON join into no JSON');
  assert.equal(malformed('data: [DONE]\ndata: x\n\n'), true, '[DONE] and a further line join into no [DONE]');
  assert.equal(malformed('data: {}\n\ndata: [\ndata: ]\n\ndata: {}\n\n'), false, 'each event read on its own');
  assert.equal(malformed('data: {"a":\ndata: 1}\n\ndata: {"b"\n\n'), true, 'a cut event after a joined one');
  assert.equal(malformed('data:[DONE]\t\r\r'), false);
  assert.equal(malformed('data: {"choices":[]}\n\ndata: hello\n\n'), true, 'any event of the chunk');
  assert.equal(malformed('data: {"choices":[{"te\n\n'), true, 'JSON cut short');
  assert.equal(malformed('data: 42\n\n'), true, 'JSON that is no object or array');
  assert.equal(malformed('data:\n\n'), true, 'empty data');
  assert.equal(malformed('data: hello'), false, 'an event the bytes end before its end is not judged');
  assert.equal(malformed('\uFEFFdata: {}\n\n', true), false, "a byte order mark at the stream's start is dropped");
});

test('judging a chunk of token events allocates nothing (it runs on every chunk of every stream)', () => {
  const chunk = Buffer.from(
    'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null}]}\n\n'.repeat(
      2,
    ),
  );
  let malformed = 0;
  const bytes = steadyBytesPerCall(
    20_000,
    () => {
      if (holdsMalformedEvent(chunk, false)) malformed++;
    },
    4,
  );
  assert.equal(malformed, 0);
  assert.ok(bytes < 4, `${bytes.toFixed(1)} bytes per chunk judged`);
});

test("a UTF-8 byte order mark is skipped at the stream's start only, as the SSE format has it", () => {
  const bom = '\uFEFFdata: {"error": {"code": 500}}\n\n';
  assert.equal(errorEventStatus(Buffer.from(bom), true), 500, "at the stream's start: the BOM is no part of the field");
  assert.equal(errorEventStatus(Buffer.from(bom), false), 0, 'elsewhere: the field is not `data`');
  assert.equal(errorEventStatus(Buffer.from('data: {"error": {"code": 500}}\n\n'), true), 500, 'no BOM');
  assert.equal(errorEventStatus(Buffer.from('\uFEFF\uFEFFdata: {"error": {"code": 500}}\n\n'), true), 0, 'only one');
});

test("SGLang's refusal of a request it will not queue is read as such, and nothing else is", () => {
  const whole = (message: string, code: unknown = 503) =>
    errorAnswer(Buffer.from(JSON.stringify({ object: 'error', message, type: '503', param: null, code })));
  const event = (message: string, code: unknown = 503) =>
    errorEvent(
      Buffer.from(
        `data: ${JSON.stringify({ error: { message, type: 'SERVICE_UNAVAILABLE', code } })}\n\ndata: [DONE]\n\n`,
      ),
      true,
    );
  for (const message of [
    'The request queue is full.',
    'The request is aborted by a higher priority request.',
    'Request waiting timeout reached.',
  ]) {
    assert.deepEqual(whole(message), { status: 503, queueFull: true }, message);
    assert.deepEqual(whole(message, '503'), { status: 503, queueFull: true }, `${message}, a numeric string`);
    assert.deepEqual(event(message), { status: 503, queueFull: true }, message);
  }
  for (const [message, code] of [
    ['The request queue is full.', 500],
    ['The request queue is full.', 429],
    ['Request running timeout reached.', 503],
    ['the request queue is full.', 503],
    ['The request queue is full. ', 503],
    ['Using priority is disabled for this server. Please send a new request without a priority.', 503],
    ['Internal server error', 503],
  ] as const) {
    assert.equal(whole(message, code).queueFull, false, `${message} (${code})`);
    assert.equal(event(message, code).queueFull, false, `${message} (${code})`);
  }
  assert.deepEqual(errorAnswer(Buffer.from('{"error": "The request queue is full."}')), {
    status: 500,
    queueFull: false,
  });
  assert.deepEqual(errorAnswer(Buffer.from('')), { status: 0, queueFull: false });
});

/** vLLM's refusals of a request its admission control will not take (vllm/exceptions.py, v0.29.0). */
const VLLM_REFUSALS = [
  'The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.',
  'The engine has reached its prefill token backlog limit. Please try again later or on a different instance.',
];

test("vLLM's admission refusal (--max-num-queued-reqs, --max-num-queued-tokens) is read as SGLang's is, and nothing else is", () => {
  // vLLM's ErrorResponse as its API server writes it: compact JSON, type the status's phrase
  const vllm = (message: string, code: unknown = 503, type = 'Service Unavailable') =>
    JSON.stringify({ error: { message, type, param: null, code } });
  for (const message of VLLM_REFUSALS) {
    assert.deepEqual(errorAnswer(Buffer.from(vllm(message))), { status: 503, queueFull: true }, message);
    assert.deepEqual(
      errorEvent(Buffer.from(`data: ${vllm(message)}\n\ndata: [DONE]\n\n`), true),
      { status: 503, queueFull: true },
      `${message}: as a stream's first event`,
    );
  }
  for (const [message, code] of [
    [VLLM_REFUSALS[0], 500],
    [VLLM_REFUSALS[1], 429],
    [VLLM_REFUSALS[0].toLowerCase(), 503],
    [`${VLLM_REFUSALS[1]} `, 503],
    // an earlier draft's wording, which no release sends
    ['Request queue full.', 503],
    ['Request queue reached max pending tokens limit.', 503],
    ['EngineCore encountered an issue. See stack trace (above) for the root cause.', 503],
  ] as const) {
    assert.equal(errorAnswer(Buffer.from(vllm(message, code))).queueFull, false, `${message} (${code})`);
  }
});

test("vLLM's model-not-found 404 is read as such, in both of its shapes, and no other 404 is", () => {
  const message = 'The model `typo` does not exist.';
  // 0.10 and later (OpenAIServing._check_model), and before (the flat ErrorResponse)
  const wrapped = { error: { message, type: 'NotFoundError', param: 'model', code: 404 } };
  const flat = { object: 'error', message, type: 'NotFoundError', param: null, code: 404 };
  for (const body of [wrapped, flat])
    assert.deepEqual(errorAnswer(Buffer.from(JSON.stringify(body))), {
      status: 404,
      queueFull: false,
      modelNotFound: true,
    });
  for (const body of [
    // FastAPI's answer for a route the server does not serve
    { detail: 'Not Found' },
    // an OpenAI-style 404 of another kind, an error of another status typed NotFoundError
    { error: { message, type: 'invalid_request_error', param: 'model', code: 'model_not_found' } },
    { error: { message, type: 'NotFoundError', param: null, code: 400 } },
    { message, type: 'NotFoundError', param: null, code: 404 },
  ])
    assert.notEqual(errorAnswer(Buffer.from(JSON.stringify(body))).modelNotFound, true, JSON.stringify(body));
});
