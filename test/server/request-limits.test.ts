import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import fc from 'fast-check';
import {
  checkGenerateRequest,
  checkGrammar,
  checkJsonDepth,
  checkRequestLimits,
  clientMessage,
  DEFAULT_REQUEST_LIMITS,
  longestPromptTokens,
  MAX_BIASED_TOKENS,
  parseJsonBody,
  readMessages,
  readMetadata,
  readGenerateRouteRequest,
  readPrompt,
  readRouteRequest,
  RequestLimitError,
  requestedOutputTokens,
  type JsonLimits,
} from '../../src/server/request-limits.js';

const limits = DEFAULT_REQUEST_LIMITS;
/** The JSON limits with the given depth, containers and members (the defaults for those not given). */
const jsonLimits = (
  maxJsonDepth: number,
  maxJsonContainers = limits.maxJsonContainers,
  maxJsonObjectMembers = limits.maxJsonObjectMembers,
): JsonLimits => ({ maxJsonDepth, maxJsonContainers, maxJsonObjectMembers });
/** Asserts `fn` throws a RequestLimitError naming `param`. */
const rejects = (fn: () => unknown, param: string, message?: RegExp) =>
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof RequestLimitError, `a RequestLimitError, got ${String(e)}`);
    assert.equal(e.param, param);
    assert.equal(e.status, 400);
    if (message) assert.match(e.message, message);
    return true;
  });

describe('JSON depth', () => {
  test('a 10,000-deep body is refused before parsing, without recursion', () => {
    rejects(() => parseJsonBody('['.repeat(10_000) + ']'.repeat(10_000), jsonLimits(64)), 'body', /deeper than 64/);
    rejects(() => parseJsonBody(`{"a":${'{"a":'.repeat(100)}1${'}'.repeat(101)}`, jsonLimits(64)), 'body');
  });
  test('brackets inside strings (with escaped quotes) do not count', () => {
    const deepText = JSON.stringify({ s: '[[[[[[[[[[{{{{{{{{ \\" [[[[', t: 'x"[[' });
    assert.deepEqual(parseJsonBody(deepText, jsonLimits(2)), JSON.parse(deepText));
    checkJsonDepth('[[1]]', 2);
    rejects(() => checkJsonDepth('[[[1]]]', 2), 'body');
    // a string ending in escaped backslashes closes at its quote: the brackets after it count
    rejects(() => checkJsonDepth(JSON.stringify(['a\\\\', [[1]]]), 2), 'body');
    rejects(() => checkJsonDepth(JSON.stringify(['\\', '\\"', [[1]]]), 2), 'body');
    checkJsonDepth(JSON.stringify(['\\"[[[', '\\\\']), 1);
  });
  test('invalid JSON is a 400 that does not echo the body', () => {
    rejects(() => parseJsonBody('{"secret": nope', jsonLimits(64)), 'body', /^the body is not valid JSON$/);
  });
});

describe('JSON arrays and objects', () => {
  test('a body of more arrays and objects than maxJsonContainers is refused before parsing', () => {
    // 1,002: the body object, its prompt list and a thousand one-token prompts
    const many = JSON.stringify({ prompt: Array.from({ length: 1000 }, () => [1]) });
    rejects(() => parseJsonBody(many, jsonLimits(64, 1001)), 'body', /more than 1001 arrays and objects/);
    assert.equal((parseJsonBody(many, jsonLimits(64, 1002)) as { prompt: unknown[] }).prompt.length, 1000);
    // brackets inside strings are no arrays
    checkJsonDepth(JSON.stringify({ s: '[]{}'.repeat(100) }), 64, 1);
  });
  test('the default leaves room for long conversations and large tool lists', () => {
    assert.equal(DEFAULT_REQUEST_LIMITS.maxJsonContainers, 100_000);
    assert.deepEqual(checkRequestLimits({ maxJsonContainers: 10 }).maxJsonContainers, 10);
  });
});

describe('JSON object members', () => {
  /** An object of `n` members `"k0": 0, …` (each value `value`, when given). */
  const object = (n: number, value?: unknown) =>
    Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, value ?? i])) as Record<string, unknown>;
  const tooMany = (n: number) => new RegExp(`^an object in the body has more than ${n} members$`);

  test('an object of exactly maxJsonObjectMembers members passes, one more is refused before parsing', () => {
    checkJsonDepth(JSON.stringify(object(4)), 64, Infinity, 4);
    rejects(() => checkJsonDepth(JSON.stringify(object(5)), 64, Infinity, 4), 'body', tooMany(4));
    // compact or spaced, as a client writes it
    checkJsonDepth(JSON.stringify(object(4), null, 2), 64, Infinity, 4);
    rejects(() => checkJsonDepth(JSON.stringify(object(5), null, 2), 64, Infinity, 4), 'body', tooMany(4));
    assert.deepEqual(parseJsonBody(JSON.stringify(object(4)), jsonLimits(64, 100, 4)), object(4));
    rejects(() => parseJsonBody(JSON.stringify(object(5)), jsonLimits(64, 100, 4)), 'body', tooMany(4));
  });

  test('nested objects are counted each on its own, the outer one resuming after an inner one closes', () => {
    // four members at each level: within a limit of 4
    checkJsonDepth(
      JSON.stringify({ a: object(4), b: object(4), c: [object(4), object(4)], d: object(4) }),
      64,
      Infinity,
      4,
    );
    // an inner object after the outer one's fourth member: still four each
    checkJsonDepth('{"a":1,"b":2,"c":3,"d":{"x":1,"y":2,"z":3,"w":4}}', 64, Infinity, 4);
    // the outer object's fifth member comes after an inner object closed
    rejects(() => checkJsonDepth('{"a":1,"b":{"x":1},"c":3,"d":4,"e":5}', 64, Infinity, 4), 'body', tooMany(4));
    rejects(() => checkJsonDepth('{"a":{"x":{"y":1}},"b":[{"z":1}],"c":3,"d":4,"e":5}', 64, Infinity, 4), 'body');
    // a fifth member deep inside
    rejects(
      () => checkJsonDepth(JSON.stringify({ a: { b: [{ c: object(5) }] } }), 64, Infinity, 4),
      'body',
      tooMany(4),
    );
    // empty objects have no members, and an object of them has as many as it lists
    checkJsonDepth('{}', 64, Infinity, 1);
    checkJsonDepth('{"a":{},"b":{ }}', 64, Infinity, 2);
    checkJsonDepth(JSON.stringify([{}, {}, { a: {} }, {}]), 64, Infinity, 1);
    rejects(() => checkJsonDepth('{"a":{},"b":{},"c":{}}', 64, Infinity, 2), 'body', tooMany(2));
  });

  test('every level of a deep body keeps its own count', () => {
    // 5,000 objects, one inside the other, of two members each: {"v":0,"o":{"v":0,"o":…}}
    const deep = (depth: number, innermost: string) =>
      '{"v":0,"o":'.repeat(depth - 1) + innermost + '}'.repeat(depth - 1);
    checkJsonDepth(deep(5_000, '{"v":0,"w":1}'), 10_000, Infinity, 2);
    rejects(() => checkJsonDepth(deep(5_000, '{"v":0,"w":1,"x":2}'), 10_000, Infinity, 2), 'body', tooMany(2));
    // a shallower body scanned after it starts from clean counts
    checkJsonDepth(JSON.stringify({ a: object(2), b: object(2) }), 64, Infinity, 2);
  });

  test("':' and braces inside strings are not members", () => {
    const text = JSON.stringify({ 'a:b:c:d': 'x:y:z:{"p":1,"q":2}', 'k\\":{': ':::' });
    assert.deepEqual(parseJsonBody(text, jsonLimits(64, 100, 2)), JSON.parse(text));
    checkJsonDepth(JSON.stringify({ s: '{"a":1,"b":2,"c":3}'.repeat(100) }), 64, Infinity, 1);
    // a key ending in an escaped backslash closes at its quote: the members after it count
    rejects(() => checkJsonDepth('{"a\\\\":1,"b":2,"c":3}', 64, Infinity, 2), 'body', tooMany(2));
  });

  test('arrays are not bounded by it, however many elements they hold', () => {
    const longList = {
      prompt: Array.from({ length: 20_000 }, (_, i) => i),
      more: Array.from({ length: 100 }, () => 'x:y'),
    };
    checkJsonDepth(JSON.stringify(longList), 64, Infinity, 2);
    checkJsonDepth(JSON.stringify(Array.from({ length: 20_000 }, () => ({ a: 1 }))), 64, Infinity, 1);
    checkJsonDepth(
      JSON.stringify([
        [1, 2, 3, 4, 5],
        [6, 7, 8, 9, 10],
      ]),
      64,
      Infinity,
      1,
    );
  });

  test('a body is refused exactly when one of its objects has more members than the limit', () => {
    const mostMembers = (v: unknown): number =>
      Array.isArray(v)
        ? Math.max(0, ...v.map(mostMembers))
        : v !== null && typeof v === 'object'
          ? Math.max(Object.keys(v).length, ...Object.values(v).map(mostMembers))
          : 0;
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 6 }), fc.integer({ min: 1, max: 8 }), fc.boolean(), (value, max, spaced) => {
        const text = JSON.stringify(value, null, spaced ? 1 : undefined);
        if (mostMembers(value) > max) rejects(() => checkJsonDepth(text, 64, Infinity, max), 'body', tooMany(max));
        else checkJsonDepth(text, 64, Infinity, max);
      }),
    );
  });

  test('the default, 4,096, is past any object of the OpenAI API or /generate', () => {
    assert.equal(DEFAULT_REQUEST_LIMITS.maxJsonObjectMembers, 4096);
    assert.equal(checkRequestLimits({}).maxJsonObjectMembers, 4096);
    assert.equal(checkRequestLimits({ maxJsonObjectMembers: 10 }).maxJsonObjectMembers, 10);
    assert.throws(() => checkRequestLimits({ maxJsonObjectMembers: 0 }), /maxJsonObjectMembers/);
    assert.throws(() => checkRequestLimits({ maxJsonObjectMembers: 1.5 }), /maxJsonObjectMembers/);
    // parseJsonBody applies the default when not given
    assert.equal(Object.keys(parseJsonBody(JSON.stringify(object(4096)), jsonLimits(64)) as object).length, 4096);
    rejects(() => parseJsonBody(JSON.stringify(object(4097)), jsonLimits(64)), 'body', tooMany(4096));
  });
});

describe('metadata', () => {
  test('ids: strings of at most maxIdBytes UTF-8 bytes, never numbers or empty', () => {
    assert.equal(readMetadata({ workflowId: 'w'.repeat(256) }, {}, limits).workflowId, 'w'.repeat(256));
    rejects(() => readMetadata({ workflowId: 'w'.repeat(257) }, {}, limits), 'contextforge.workflowId', /256 bytes/);
    rejects(() => readMetadata({ workflowId: 'é'.repeat(129) }, {}, limits), 'contextforge.workflowId'); // 258 bytes
    rejects(() => readMetadata({ workflowId: 5 }, {}, limits), 'contextforge.workflowId', /string/);
    rejects(() => readMetadata({ agentRole: '' }, {}, limits), 'contextforge.agentRole');
    rejects(() => readMetadata(undefined, { 'x-workflow-id': 'x'.repeat(1 << 20) }, limits), 'x-workflow-id');
    rejects(() => readMetadata(undefined, { 'x-agent-role': 'r'.repeat(300) }, limits), 'x-agent-role');
    const small = checkRequestLimits({ maxIdBytes: 4 });
    rejects(() => readMetadata({ agentRole: 'critic' }, {}, small), 'contextforge.agentRole', /4 bytes/);
  });
  test('anchors: a bounded list of ids, each {id, tokens} or "id[:tokens]"', () => {
    assert.deepEqual(readMetadata({ anchors: ['a', { id: 'b', tokens: 32 }, 'c:7'] }, {}, limits).contentAnchors, [
      { id: 'a', tokens: 0 },
      { id: 'b', tokens: 32 },
      { id: 'c', tokens: 7 },
    ]);
    assert.deepEqual(readMetadata(undefined, { 'x-anchor-ids': 'doc-1:64, doc-2' }, limits).contentAnchors, [
      { id: 'doc-1', tokens: 64 },
      { id: 'doc-2', tokens: 0 },
    ]);
    rejects(() => readMetadata({ anchors: [{ id: 5 }] }, {}, limits), 'contextforge.anchors[0].id');
    rejects(() => readMetadata({ anchors: [null] }, {}, limits), 'contextforge.anchors[0]');
    rejects(() => readMetadata({ anchors: 'a' }, {}, limits), 'contextforge.anchors');
    rejects(
      () => readMetadata({ anchors: Array.from({ length: 129 }, (_, i) => `a${i}`) }, {}, limits),
      'contextforge.anchors',
      /more than 128/,
    );
    rejects(
      () =>
        readMetadata(undefined, { 'x-anchor-ids': Array.from({ length: 129 }, (_, i) => `a${i}`).join(',') }, limits),
      'x-anchor-ids',
    );
    rejects(() => readMetadata({ anchors: [{ id: 'x'.repeat(300) }] }, {}, limits), 'contextforge.anchors[0].id');
    rejects(() => readMetadata({ anchors: [{ id: 'a', tokens: -1 }] }, {}, limits), 'contextforge.anchors[0].tokens');
  });
  test('anchors: a token count after the last ":" in decimal digits only; ids may hold ":"', () => {
    const header = (v: string) => readMetadata(undefined, { 'x-anchor-ids': v }, limits).contentAnchors;
    // what reads as a number but is no decimal count is refused, never taken into the id
    for (const count of ['0x10', '1e3', ' 7', '-1', '+5', '1.5', '', '99999999999999999', 'Infinity', '0b1']) {
      rejects(() => header(`a:${count}`), 'x-anchor-ids', /^x-anchor-ids\[0\] must be id or id:tokens/);
      rejects(
        () => readMetadata({ anchors: ['b', `a:${count}`] }, {}, limits),
        'contextforge.anchors[1]',
        /^contextforge\.anchors\[1\] must be id or id:tokens, the token count a non-negative decimal integer of at most 15 digits$/,
      );
    }
    // the anchor named by its place in the list; the message never repeats the value
    rejects(
      () => header('doc-1:64, doc-2:0x10'),
      'x-anchor-ids',
      /^x-anchor-ids\[1\] must be id or id:tokens, the token count a non-negative decimal integer of at most 15 digits$/,
    );
    // ids the docs allow (any non-empty string) still pass, ':' and all
    assert.deepEqual(header('urn:doc, urn:uuid:123e4567-e89b-12d3-a456-426614174000, sha256:3f2a, ns:a:7, v:1.5:0'), [
      { id: 'urn:doc', tokens: 0 },
      { id: 'urn:uuid:123e4567-e89b-12d3-a456-426614174000', tokens: 0 },
      { id: 'sha256:3f2a', tokens: 0 },
      { id: 'ns:a', tokens: 7 },
      { id: 'v:1.5', tokens: 0 },
    ]);
    assert.deepEqual(
      readMetadata({ anchors: ['urn:doc', 'ns:a:7', { id: 'v:1.5', tokens: 3 }] }, {}, limits).contentAnchors,
      [
        { id: 'urn:doc', tokens: 0 },
        { id: 'ns:a', tokens: 7 },
        { id: 'v:1.5', tokens: 3 },
      ],
    );
    assert.deepEqual(header(':5'), [{ id: ':5', tokens: 0 }], 'no id before the colon: the whole is the id');
  });
  test('steps and CLA groups: integers, and headers in decimal digits only', () => {
    assert.equal(readMetadata(undefined, { 'x-workflow-step': '16' }, limits).workflowStep, 16);
    assert.equal(readMetadata({ workflowStep: 3 }, { 'x-workflow-step': '16' }, limits).workflowStep, 3);
    assert.equal(
      readMetadata(undefined, { 'x-workflow-step': '', 'x-agent-role': '', 'x-workflow-id': '' }, limits).workflowId,
      undefined,
      'empty headers are not set',
    );
    for (const v of ['0x10', '1e3', ' 7', '-1', '1.5', '99999999999999999'])
      rejects(() => readMetadata(undefined, { 'x-workflow-step': v }, limits), 'x-workflow-step');
    rejects(() => readMetadata(undefined, { 'x-cla-group': '0b1' }, limits), 'x-cla-group');
    rejects(() => readMetadata({ workflowStep: 1.5 }, {}, limits), 'contextforge.workflowStep');
    rejects(() => readMetadata({ claGroup: '2' }, {}, limits), 'contextforge.claGroup');
    // the refusal says the bound and what came, a number past 2^53 without digits it has lost
    for (const [value, got] of [
      [2 ** 53, 'a number past 2\\^53 - 1'],
      [-1, '-1'],
      [1.5, '1.5'],
      ['2', 'a string'],
      [[2], 'an array'],
    ] as const)
      rejects(
        () => readMetadata({ workflowStep: value }, {}, limits),
        'contextforge.workflowStep',
        new RegExp(`^contextforge\\.workflowStep must be a non-negative integer of at most 2\\^53 - 1, got ${got}$`),
      );
    rejects(() => readMetadata(undefined, { 'x-workflow-step': ['1', '2'] }, limits), 'x-workflow-step', /once/);
  });
  test('isolate: booleans only (and 1/0/true/false in the header)', () => {
    assert.equal(readMetadata({ isolate: true }, {}, limits).isolate, true);
    assert.equal(readMetadata({ isolate: false }, {}, limits).isolate, undefined);
    assert.equal(readMetadata(undefined, { 'x-kv-isolate': 'true' }, limits).isolate, true);
    assert.equal(readMetadata(undefined, { 'x-kv-isolate': '0' }, limits).isolate, undefined);
    rejects(() => readMetadata({ isolate: 'yes' }, {}, limits), 'contextforge.isolate');
    rejects(() => readMetadata({ isolate: 1 }, {}, limits), 'contextforge.isolate');
    rejects(() => readMetadata(undefined, { 'x-kv-isolate': 'yes' }, limits), 'x-kv-isolate');
  });
  test("the contextforge field's keys are read in camelCase or as the trace format spells them", () => {
    const snake = readMetadata(
      { workflow_id: 'wf', workflow_step: 2, agent_role: 'critic', cla_group: 3, isolate: true },
      { 'x-workflow-id': 'from-header' },
      limits,
    );
    assert.deepEqual(
      [snake.workflowId, snake.workflowStep, snake.agentRole, snake.claGroup, snake.isolate],
      ['wf', 2, 'critic', 3, true],
    );
    // an error names the field as the client spelt it; one field in both spellings is refused
    rejects(() => readMetadata({ cla_group: -1 }, {}, limits), 'contextforge.cla_group');
    rejects(
      () => readMetadata({ workflowId: 'a', workflow_id: 'b' }, {}, limits),
      'contextforge.workflow_id',
      /one field given twice/,
    );
  });
  test('the contextforge field is an object of known keys', () => {
    rejects(() => readMetadata(5, {}, limits), 'contextforge');
    rejects(() => readMetadata([], {}, limits), 'contextforge');
    rejects(() => readMetadata({ workflowID: 'typo' }, {}, limits), 'contextforge.workflowID', /not a known field/);
    // a key that is no plausible field name is not repeated, in the message or the param
    for (const key of ['k'.repeat(100_000), 'a b', 'x\u0000y', '<script>']) {
      rejects(
        () => readMetadata({ [key]: 1 }, {}, limits),
        'contextforge',
        /^contextforge has an unknown field \(known:/,
      );
    }
  });
});

describe('prompts and messages', () => {
  test('token ids are integers in [0, 2^32)', () => {
    assert.deepEqual(readPrompt([1, 2, 4294967295]), { tokens: [1, 2, 4294967295] });
    assert.deepEqual(readPrompt([[1, 2], [3]]), { tokens: [1, 2] });
    assert.deepEqual(readPrompt(['a', 'b']), { text: 'a' });
    // the error's param names the element its message names
    for (const bad of [[1e300], [4294967296], [-1], [1.5], [NaN]])
      rejects(() => readPrompt(bad), 'prompt[0]', /^prompt\[0\] must be a token id/);
    rejects(() => readPrompt([1, 'a']), 'prompt[1]', /^prompt\[1\] must be a token id/);
    rejects(() => readPrompt([[1], [2, 1e300]]), 'prompt[1][1]', /^prompt\[1\]\[1\] must be a token id/);
    rejects(() => readPrompt([[1], [2], ['x']]), 'prompt[2][0]', /^prompt\[2\]\[0\] must be a token id/);
    rejects(() => readPrompt([1, -2], 'input_ids'), 'input_ids[1]', /^input_ids\[1\] must be a token id/);
    rejects(() => readPrompt(['a', 1]), 'prompt');
    rejects(() => readPrompt([]), 'prompt');
    rejects(() => readPrompt({ a: 1 }), 'prompt');
  });
  test('content parts: objects of known types; text parts carry text', () => {
    const ok = [
      {
        role: 'user',
        content: [
          { type: 'text', text: 'hi' },
          { type: 'image_url', image_url: { url: 'http://x/y.png' } },
        ],
      },
      { role: 'assistant', content: null },
    ];
    assert.equal(readMessages(ok), ok);
    rejects(() => readMessages([{ role: 'user', content: [null] }]), 'messages[0].content[0]');
    rejects(() => readMessages([{ role: 'user', content: [{ type: 'evil' }] }]), 'messages[0].content[0].type');
    rejects(
      () => readMessages([{ role: 'user', content: [{ type: 'text', text: 5 }] }]),
      'messages[0].content[0].text',
    );
    rejects(
      () => readMessages([{ role: 'user', content: [{ type: 'image_url', image_url: null }] }]),
      'messages[0].content[0].image_url',
    );
    rejects(() => readMessages([{ role: 'user', content: 5 }]), 'messages[0].content');
    rejects(() => readMessages([{ content: 'x' }]), 'messages[0].role');
    rejects(() => readMessages([null]), 'messages[0]');
    rejects(() => readMessages([]), 'messages');
  });
});

test('client messages: checks pass through, runtime errors become a generic sentence', () => {
  assert.equal(
    clientMessage(new RangeError('workflowId must be a non-empty string')),
    'workflowId must be a non-empty string',
  );
  assert.equal(
    clientMessage(new TypeError("Cannot read properties of null (reading 'type')")),
    'the request could not be routed',
  );
  assert.equal(clientMessage(new RangeError('Maximum call stack size exceeded')), 'the request could not be routed');
  assert.equal(clientMessage(new Error('ECONNREFUSED 10.0.0.5')), 'the request could not be routed');
});

test('limits must be positive integers', () => {
  assert.throws(() => checkRequestLimits({ maxAnchors: 0 }), {
    name: 'RangeError',
    message: 'limits.maxAnchors must be >= 1 (got 0)',
  });
  assert.throws(() => checkRequestLimits({ maxJsonDepth: 1.5 }), {
    name: 'TypeError',
    message: /^limits\.maxJsonDepth must be an integer/,
  });
  assert.throws(() => checkRequestLimits({ maxDepth: 3 } as never), {
    name: 'RangeError',
    message: /^limits\.maxDepth is not a known key/,
  });
  assert.deepEqual(checkRequestLimits(undefined), DEFAULT_REQUEST_LIMITS);
});

test('a whole request: metadata removed from the body, cache_salt and stream checked', async () => {
  const { readRouteRequest } = await import('../../src/server/request-limits.js');
  const r = readRouteRequest(
    '/v1/chat/completions',
    {
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
      contextforge: { workflowId: 'wf', isolate: true },
      cache_salt: 's',
    },
    { 'x-workflow-step': '2' },
    limits,
  );
  assert.deepEqual(r.body, { model: 'm', messages: [{ role: 'user', content: 'hi' }], cache_salt: 's' });
  assert.equal(r.unchanged, false);
  assert.deepEqual(
    [r.routeRequest.workflowId, r.routeRequest.workflowStep, r.routeRequest.isolate, r.routeRequest.cacheSalt],
    ['wf', 2, true, 's'],
  );
  const c = readRouteRequest('/v1/completions', { prompt: [1, 2, 3] }, {}, limits);
  assert.deepEqual([c.routeRequest.tokens, c.unchanged], [[1, 2, 3], true]);
  rejects(() => readRouteRequest('/v1/completions', { prompt: 'x', cache_salt: '' }, {}, limits), 'cache_salt');
  rejects(() => readRouteRequest('/v1/completions', { prompt: 'x', cache_salt: 5 }, {}, limits), 'cache_salt');
  rejects(() => readRouteRequest('/v1/completions', { prompt: 'x', stream: 'true' }, {}, limits), 'stream');
  rejects(() => readRouteRequest('/v1/completions', { prompt: 'x', stream: 1 }, {}, limits), 'stream');
  for (const stream of [true, false, null])
    assert.equal(readRouteRequest('/v1/completions', { prompt: 'x', stream }, {}, limits).body.stream, stream);
  rejects(() => readRouteRequest('/v1/completions', [1], {}, limits), 'body');
  rejects(() => readRouteRequest('/v1/completions', null, {}, limits), 'body');
});

test('cache_salt null is no salt, as vLLM and SGLang read it (Optional[str]): routed unsalted, forwarded as written', async () => {
  const { readRouteRequest } = await import('../../src/server/request-limits.js');
  for (const path of ['/v1/completions', '/v1/chat/completions']) {
    const body = { prompt: 'x', messages: [{ role: 'user', content: 'hi' }], cache_salt: null };
    const r = readRouteRequest(path, body, {}, limits);
    assert.equal(r.routeRequest.cacheSalt, undefined, 'no salt: the blocks the engine keeps are unsalted');
    assert.equal(r.unchanged, true);
    assert.equal(r.body.cache_salt, null);
  }
});

test('cache_salt as a list is refused with 400: SGLang declares the list form but its OpenAI serving fails on one', async () => {
  const { readRouteRequest } = await import('../../src/server/request-limits.js');
  for (const path of ['/v1/completions', '/v1/chat/completions'])
    for (const cache_salt of [['a'], ['a', 'b'], [], [null]]) {
      const body = { prompt: ['x', 'y'], messages: [{ role: 'user', content: 'hi' }], cache_salt };
      rejects(
        () => readRouteRequest(path, body, {}, limits),
        'cache_salt',
        /^cache_salt must be a string, not a list \(one salt for the whole request\)$/,
      );
    }
});

test('a body with nothing to remove shares one frozen empty list of removed fields', async () => {
  const { readRouteRequest } = await import('../../src/server/request-limits.js');
  const a = readRouteRequest('/v1/completions', { prompt: 'a' }, {}, limits);
  const b = readRouteRequest('/v1/completions', { prompt: 'b' }, {}, limits);
  assert.deepEqual(a.removed, []);
  assert.ok(Object.isFrozen(a.removed), 'the shared list cannot be pushed to');
  assert.equal(a.removed, b.removed, 'one list for every such request, not one each');
  const c = readRouteRequest('/v1/completions', { prompt: 'c', kv_transfer_params: {} }, {}, limits);
  assert.deepEqual(c.removed, ['kv_transfer_params']);
});

test('the fields removed by default: the KV-transfer fields and the code fields, each kept by its own setting', async () => {
  const { readRouteRequest } = await import('../../src/server/request-limits.js');
  const body = {
    contextforge: {},
    prompt: 'p',
    kv_transfer_params: {},
    custom_logit_processor: '{"callable": "80"}',
    logits_processors: ['m.P'],
    custom_params: { k: 1 },
  };
  const read = (forward?: object) => readRouteRequest('/v1/completions', body, {}, limits, forward);
  const removed = (forward?: object) => [...read(forward).removed].sort();
  assert.deepEqual(removed(), ['contextforge', 'custom_logit_processor', 'kv_transfer_params', 'logits_processors']);
  assert.deepEqual(read().body, { prompt: 'p', custom_params: { k: 1 } });
  assert.deepEqual(removed({ forwardKvTransferParams: true }), [
    'contextforge',
    'custom_logit_processor',
    'logits_processors',
  ]);
  assert.deepEqual(removed({ forwardCustomLogitProcessor: true }), ['contextforge', 'kv_transfer_params']);
  assert.deepEqual(removed({ forwardKvTransferParams: true, forwardCustomLogitProcessor: true }), ['contextforge']);
  // the body as received is left as it is
  assert.equal(body.custom_logit_processor, '{"callable": "80"}');
});

describe("SGLang's per-prompt lists: at most one entry per prompt", () => {
  // SGLang (python/sglang/srt/managers/io_struct.py, GenerateReqInput._determine_batch_size)
  // counts the prompts of `text`, else `input_ids`, else `input_embeds`
  const PROMPTS: Array<{ prompt: object; count: number }> = [
    { prompt: { text: 'a' }, count: 1 },
    { prompt: { text: ['a', 'b', 'c'] }, count: 3 },
    { prompt: { input_ids: [1, 2, 3] }, count: 1 },
    { prompt: { input_ids: [[1], [2]] }, count: 2 },
    { prompt: { input_embeds: [[0.5, 0.25]] }, count: 1 },
    { prompt: { input_embeds: [[[0.5]], [[0.25]]] }, count: 2 },
    { prompt: { text: null, input_ids: [[1], [2]] }, count: 2 },
    { prompt: {}, count: 1 },
  ];
  const LISTS: Array<{ field: string; entry: unknown }> = [
    { field: 'rid', entry: 'r' },
    { field: 'lora_path', entry: null },
    { field: 'extra_key', entry: 'k' },
    { field: 'custom_logit_processor', entry: null },
    { field: 'session_params', entry: { id: 's' } },
    { field: 'top_logprobs_num', entry: 1 },
    { field: 'sampling_params', entry: { max_new_tokens: 4 } },
    { field: 'token_ids_logprob', entry: [1, 2] },
  ];
  for (const { field, entry } of LISTS) {
    test(`${field}: as many entries as prompts pass, one more is refused naming it`, () => {
      for (const { prompt, count } of PROMPTS) {
        checkGenerateRequest({ ...prompt, [field]: Array(count).fill(entry) }, limits);
        rejects(
          () => checkGenerateRequest({ ...prompt, [field]: Array(count + 1).fill(entry) }, limits),
          field,
          new RegExp(`^${field} must have at most ${count} entr(y|ies), one per prompt$`),
        );
      }
    });
  }
  test('one per prompt, not per sequence: SGLang multiplies the lists by n itself', () => {
    const body = { text: ['a', 'b'], sampling_params: { n: 4 } };
    checkGenerateRequest({ ...body, rid: ['r0', 'r1'] }, limits);
    rejects(() => checkGenerateRequest({ ...body, rid: ['r0', 'r1', 'r2'] }, limits), 'rid');
  });
  test('the OpenAI paths count the prompts of `prompt`; a chat is one prompt', async () => {
    const { readRouteRequest } = await import('../../src/server/request-limits.js');
    const completions = (prompt: unknown, rid: unknown) =>
      readRouteRequest('/v1/completions', { prompt, rid }, {}, limits);
    completions(['a', 'b'], ['r0', 'r1']);
    completions([[1], [2]], ['r0', 'r1']);
    rejects(() => completions(['a', 'b'], ['r0', 'r1', 'r2']), 'rid', /^rid must have at most 2 entries/);
    rejects(() => completions([1, 2, 3], ['r0', 'r1']), 'rid', /^rid must have at most 1 entry, one per prompt$/);
    rejects(() => completions('a', ['r0', 'r1']), 'rid');
    const chat = (fields: object) =>
      readRouteRequest('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], ...fields }, {}, limits);
    chat({ custom_logit_processor: [null], lora_path: ['a'] });
    rejects(() => chat({ custom_logit_processor: [null, null] }), 'custom_logit_processor');
    rejects(() => chat({ extra_key: ['a', 'b'] }), 'extra_key');
  });
});

describe("SGLang's token_ids_logprob", () => {
  test('a list of at most maxLogprobs token ids, or one such list per prompt', () => {
    const ids = (count: number) => Array.from({ length: count }, (_, i) => i);
    checkGenerateRequest({ text: 'a', token_ids_logprob: ids(20) }, limits);
    checkGenerateRequest({ text: ['a', 'b'], token_ids_logprob: [ids(20), ids(1)] }, limits);
    for (const absent of [undefined, null, []]) checkGenerateRequest({ text: 'a', token_ids_logprob: absent }, limits);
    rejects(
      () => checkGenerateRequest({ text: 'a', token_ids_logprob: ids(21) }, limits),
      'token_ids_logprob',
      /^token_ids_logprob has more than 20 token ids \(the most log probabilities a token may report\)$/,
    );
    rejects(
      () => checkGenerateRequest({ text: ['a', 'b'], token_ids_logprob: [ids(1), ids(21)] }, limits),
      'token_ids_logprob[1]',
      /^token_ids_logprob\[1\] has more than 20 token ids/,
    );
    const tight = checkRequestLimits({ maxLogprobs: 2 });
    checkGenerateRequest({ text: 'a', token_ids_logprob: ids(2) }, tight);
    rejects(() => checkGenerateRequest({ text: 'a', token_ids_logprob: ids(3) }, tight), 'token_ids_logprob');
    // no log probabilities at all: no ids either
    const none = checkRequestLimits({ maxLogprobs: 0 });
    checkGenerateRequest({ text: 'a', token_ids_logprob: [] }, none);
    rejects(() => checkGenerateRequest({ text: 'a', token_ids_logprob: [5] }, none), 'token_ids_logprob');
  });
  test('entries are token ids (integers from 0 to 2^32 - 1); anything but a list is refused', () => {
    for (const bad of [-1, 1.5, '7', 4294967296, null, true])
      rejects(
        () => checkGenerateRequest({ text: 'a', token_ids_logprob: [1, bad] }, limits),
        'token_ids_logprob[1]',
        /^token_ids_logprob\[1\] must be a token id \(an integer from 0 to 4294967295\)$/,
      );
    rejects(
      () => checkGenerateRequest({ text: ['a', 'b'], token_ids_logprob: [[1], [2, -3]] }, limits),
      'token_ids_logprob[1][1]',
      /^token_ids_logprob\[1\]\[1\] must be a token id/,
    );
    rejects(
      () => checkGenerateRequest({ text: ['a', 'b'], token_ids_logprob: [[1], 2] }, limits),
      'token_ids_logprob[1]',
      /^token_ids_logprob\[1\] must be a list of token ids$/,
    );
    for (const bad of [5, 'x', { 0: 1 }])
      rejects(
        () => checkGenerateRequest({ text: 'a', token_ids_logprob: bad }, limits),
        'token_ids_logprob',
        /^token_ids_logprob must be a list of token ids, or one such list per prompt$/,
      );
  });
});

describe('prompts per request', () => {
  const strings = (count: number) => Array<string>(count).fill('a');
  const idLists = (count: number) => Array.from({ length: count }, () => [1, 2]);
  test('a completions prompt of more than maxPrompts strings or token-id lists is refused naming prompt', async () => {
    const { readRouteRequest } = await import('../../src/server/request-limits.js');
    const completions = (prompt: unknown, l = limits) => readRouteRequest('/v1/completions', { prompt }, {}, l);
    assert.equal(DEFAULT_REQUEST_LIMITS.maxPrompts, 256);
    completions(strings(256));
    completions(idLists(256));
    rejects(() => completions(strings(257)), 'prompt', /^prompt has more than 256 prompts \(--max-prompts\)$/);
    rejects(() => completions(idLists(257)), 'prompt', /^prompt has more than 256 prompts/);
    // a list of token ids is one prompt, however long
    completions(Array.from({ length: 10_000 }, (_, i) => i));
    const two = checkRequestLimits({ maxPrompts: 2 });
    completions(['a', 'b'], two);
    rejects(() => completions(['a', 'b', 'c'], two), 'prompt', /^prompt has more than 2 prompts/);
  });
  test('the count is checked before the elements: a long list is refused without reading them', async () => {
    const { readRouteRequest } = await import('../../src/server/request-limits.js');
    const bad = [[1], [2, -1], ...idLists(255)];
    // within the count, the bad element is what is refused
    rejects(() => readRouteRequest('/v1/completions', { prompt: bad.slice(0, 256) }, {}, limits), 'prompt[1][1]');
    rejects(
      () => readRouteRequest('/v1/completions', { prompt: bad }, {}, limits),
      'prompt',
      /^prompt has more than 256 prompts/,
    );
  });
  test("vLLM's prompt_embeds list is bounded as prompt is", async () => {
    const { readRouteRequest } = await import('../../src/server/request-limits.js');
    const embeds = (count: number) =>
      readRouteRequest('/v1/completions', { prompt_embeds: strings(count) }, {}, limits);
    embeds(256);
    rejects(() => embeds(257), 'prompt_embeds', /^prompt_embeds has more than 256 prompts/);
  });
  test('prompt_embeds only: no tokenizer is asked, in either tokenize mode (there is no text to tokenize)', async () => {
    const { createRequestParser } = await import('../../src/server/openai-request.js');
    let asked = 0;
    for (const tokenize of ['engine', 'tokenizer'] as const) {
      const parse = createRequestParser({
        tokenize,
        limits,
        promptTokenizer: { tokenize: () => (asked++, [1]) },
        tokenizeOnEngine: () => (asked++, Promise.resolve([1])),
      });
      const parsed = await parse('/v1/completions', { body: { model: 'm', prompt_embeds: 'AAAA' }, headers: {} });
      assert.ok(!('status' in parsed), JSON.stringify(parsed));
      assert.equal(parsed.routeRequest.tokens, undefined);
      assert.equal(asked, 0, `${tokenize}: nothing to tokenize`);
    }
  });
  test('prompt_embeds must be a base64 string or a list of them', async () => {
    const { readRouteRequest } = await import('../../src/server/request-limits.js');
    for (const prompt_embeds of [5, { a: 1 }, ['AAAA', 5], [[0.5]]])
      rejects(
        () => readRouteRequest('/v1/completions', { prompt_embeds }, {}, limits),
        'prompt_embeds',
        /^prompt_embeds must be a base64 string of a tensor, or a list of them$/,
      );
  });
  test('prompt and prompt_embeds are bounded together: vLLM runs the prompts of both', async () => {
    const { readRouteRequest } = await import('../../src/server/request-limits.js');
    const both = (prompt: unknown, embeds: unknown) =>
      readRouteRequest('/v1/completions', { prompt, prompt_embeds: embeds }, {}, limits);
    both(strings(200), strings(56));
    both('p', strings(255));
    both(strings(255), 'e');
    rejects(
      () => both(strings(200), strings(57)),
      'prompt_embeds',
      /^prompt and prompt_embeds have more than 256 prompts together \(--max-prompts\)$/,
    );
    rejects(() => both('p', strings(256)), 'prompt_embeds', /more than 256 prompts together/);
    rejects(() => both(strings(256), 'e'), 'prompt_embeds', /more than 256 prompts together/);
  });
  test('prompt_embeds without prompt is a completion with nothing to hash; neither keeps the prompt error', async () => {
    const { readRouteRequest } = await import('../../src/server/request-limits.js');
    for (const prompt_embeds of ['AAAA', ['AAAA', 'BBBB']]) {
      const { routeRequest } = readRouteRequest('/v1/completions', { model: 'm', prompt_embeds }, {}, limits);
      assert.equal(routeRequest.text, undefined);
      assert.equal(routeRequest.tokens, undefined);
      assert.equal(routeRequest.messages, undefined);
    }
    // with both, the prompt is read (and checked) as before
    const { routeRequest } = readRouteRequest('/v1/completions', { prompt: 'p', prompt_embeds: 'AAAA' }, {}, limits);
    assert.equal(routeRequest.text, 'p');
    rejects(() => readRouteRequest('/v1/completions', { prompt: 5, prompt_embeds: 'AAAA' }, {}, limits), 'prompt');
    for (const body of [{ model: 'm' }, { prompt_embeds: null }, { prompt: null }, { prompt_embeds: [] }])
      rejects(
        () => readRouteRequest('/v1/completions', body, {}, limits),
        'prompt',
        /^prompt must be a string, a list of strings, token ids, or a list of token-id lists$/,
      );
  });
  test("SGLang's /generate: text, input_ids and input_embeds batches of at most maxPrompts, each named", () => {
    const embedBatch = (count: number) => Array.from({ length: count }, () => [[0.5, 0.25]]);
    for (const body of [{ text: strings(256) }, { input_ids: idLists(256) }, { input_embeds: embedBatch(256) }])
      checkGenerateRequest(body, limits);
    rejects(() => checkGenerateRequest({ text: strings(257) }, limits), 'text', /^text has more than 256 prompts/);
    rejects(() => checkGenerateRequest({ input_ids: idLists(257) }, limits), 'input_ids');
    rejects(() => checkGenerateRequest({ input_embeds: embedBatch(257) }, limits), 'input_embeds');
    // one prompt each, however long
    checkGenerateRequest({ input_ids: Array.from({ length: 10_000 }, (_, i) => i) }, limits);
    checkGenerateRequest({ input_embeds: Array.from({ length: 1000 }, () => [0.5]) }, limits);
    // SGLang reads text before input_ids, but either list is bounded
    rejects(() => checkGenerateRequest({ text: 'a', input_ids: idLists(257) }, limits), 'input_ids');
    const two = checkRequestLimits({ maxPrompts: 2 });
    checkGenerateRequest({ text: ['a', 'b'] }, two);
    rejects(() => checkGenerateRequest({ text: ['a', 'b', 'c'] }, two), 'text', /^text has more than 2 prompts/);
  });
  test('maxPrompts is a setting of at least 1', () => {
    assert.equal(checkRequestLimits({ maxPrompts: 1 }).maxPrompts, 1);
    assert.throws(() => checkRequestLimits({ maxPrompts: 0 }), { message: 'limits.maxPrompts must be >= 1 (got 0)' });
  });
});

describe("vLLM's logprob_token_ids", () => {
  const ids = (count: number) => Array.from({ length: count }, (_, i) => i);
  for (const path of ['/v1/completions', '/v1/chat/completions']) {
    const read = (fields: object, l = limits) =>
      import('../../src/server/request-limits.js').then(({ readRouteRequest }) =>
        readRouteRequest(path, { prompt: 'p', messages: [{ role: 'user', content: 'hi' }], ...fields }, {}, l),
      );
    test(`at most maxLogprobs token ids (${path})`, async () => {
      await read({ logprobs: 1, logprob_token_ids: ids(20) });
      for (const absent of [undefined, null, []]) await read({ logprob_token_ids: absent });
      await assert.rejects(read({ logprob_token_ids: ids(21) }), (e: unknown) => {
        assert.ok(e instanceof RequestLimitError);
        assert.equal(e.param, 'logprob_token_ids');
        assert.equal(
          e.message,
          'logprob_token_ids has more than 20 token ids (the most log probabilities a token may report)',
        );
        return true;
      });
      await read({ logprob_token_ids: ids(2) }, checkRequestLimits({ maxLogprobs: 2 }));
      await assert.rejects(read({ logprob_token_ids: ids(3) }, checkRequestLimits({ maxLogprobs: 2 })), {
        param: 'logprob_token_ids',
      });
      await assert.rejects(read({ logprob_token_ids: [5] }, checkRequestLimits({ maxLogprobs: 0 })), {
        param: 'logprob_token_ids',
      });
    });
    test(`entries are token ids; anything but a list is refused (${path})`, async () => {
      for (const bad of [-1, 1.5, '7', 4294967296, null])
        await assert.rejects(read({ logprob_token_ids: [1, bad] }), {
          param: 'logprob_token_ids[1]',
          message: 'logprob_token_ids[1] must be a token id (an integer from 0 to 4294967295)',
        });
      for (const bad of [5, 'x', { 0: 1 }])
        await assert.rejects(read({ logprob_token_ids: bad }), { param: 'logprob_token_ids' });
      await assert.rejects(read({ logprob_token_ids: [[1]] }), { param: 'logprob_token_ids[0]' });
    });
  }
});

describe('logit_bias', () => {
  const bias = (count: number, value: unknown = 1) =>
    Object.fromEntries(Array.from({ length: count }, (_, i) => [String(i), value]));
  test('a bias that JSON.parse read as infinite (1e400) is refused: the OpenAI API takes -100 to 100', async () => {
    const { readRouteRequest } = await import('../../src/server/request-limits.js');
    const body = parseJsonBody('{"prompt":"x","logit_bias":{"5":1e400}}', jsonLimits(64));
    rejects(() => readRouteRequest('/v1/completions', body, {}, limits), 'logit_bias', /from -100 to 100/);
  });
  test("SGLang's /generate: in sampling_params (an object, or one per prompt), named by its path", () => {
    checkGenerateRequest({ text: 'a', sampling_params: { logit_bias: bias(MAX_BIASED_TOKENS) } }, limits);
    checkGenerateRequest({ text: 'a', sampling_params: { logit_bias: null } }, limits);
    rejects(
      () => checkGenerateRequest({ text: 'a', sampling_params: { logit_bias: bias(MAX_BIASED_TOKENS + 1) } }, limits),
      'sampling_params.logit_bias',
      /^sampling_params\.logit_bias has more than 1024 entries/,
    );
    rejects(
      () =>
        checkGenerateRequest(
          { text: ['a', 'b'], sampling_params: [{ logit_bias: { '1': 2 } }, { logit_bias: { '1': -200 } }] },
          limits,
        ),
      'sampling_params[1].logit_bias',
      /^sampling_params\[1\]\.logit_bias values must be numbers from -100 to 100/,
    );
  });
});

describe('grammars, regexes and schemas', () => {
  test('an object is measured as JSON.stringify writes it, to the byte: at its length passes, one less refuses', () => {
    fc.assert(
      fc.property(fc.jsonValue(), (value) => {
        if (value === null || typeof value === 'string') return;
        const bytes = Buffer.byteLength(JSON.stringify(value));
        checkGrammar(value, 'guided_json', bytes);
        rejects(() => checkGrammar(value, 'guided_json', bytes - 1), 'guided_json', /as JSON/);
      }),
      { numRuns: 500 },
    );
  });
  test('escapes, surrogate pairs and numbers JSON.parse made infinite count as JSON writes them', () => {
    for (const text of ['{"a":"\\n\\u0001\\"\\\\"}', '["😀é",1e400,-0,1.5e-7,true,null]', '{"":{}, "k":[[],{}]}']) {
      const value = JSON.parse(text) as unknown;
      const bytes = Buffer.byteLength(JSON.stringify(value));
      checkGrammar(value, 'response_format', bytes);
      rejects(() => checkGrammar(value, 'response_format', bytes - 1), 'response_format');
    }
  });
  test("SGLang's /generate: json_schema, regex, ebnf and structural_tag in sampling_params, named by their path", () => {
    const tight = checkRequestLimits({ maxGrammarBytes: 8 });
    for (const key of ['json_schema', 'regex', 'ebnf', 'structural_tag']) {
      checkGenerateRequest({ text: 'a', sampling_params: { [key]: 'x'.repeat(8) } }, tight);
      rejects(
        () => checkGenerateRequest({ text: ['a', 'b'], sampling_params: [{}, { [key]: 'x'.repeat(9) }] }, tight),
        `sampling_params[1].${key}`,
        new RegExp(`^sampling_params\\[1\\]\\.${key} is longer than 8 bytes`),
      );
    }
  });
});

test("a chat body's tools reach the tokenizer as their JSON text, also when the body is forwarded without its metadata", async () => {
  const { readRouteRequest } = await import('../../src/server/request-limits.js');
  const { chatTemplateRequest } = await import('../../src/server/engine-deployments.js');
  const tools = '[{"type": "function", "function": {"name": "f", "parameters": {"minimum": 0.0, "maximum": 1e-7}}}]';
  const text = `{"model": "m", "contextforge": {"workflowId": "w"}, "messages": [{"role": "user", "content": "x"}], "tools": ${tools}}`;
  const read = readRouteRequest('/v1/chat/completions', parseJsonBody(text, limits), {}, limits);
  assert.equal(read.body.contextforge, undefined, 'a copy without the metadata');
  assert.equal(chatTemplateRequest(read.body).toolsJson, tools);
  // a body not read from text (or without tools) has none
  assert.equal(chatTemplateRequest({ messages: [], tools: [] }).toolsJson, undefined);
  assert.equal(
    chatTemplateRequest(parseJsonBody('{"messages": []}', limits) as Record<string, unknown>).toolsJson,
    undefined,
  );
});

describe('numbers past the largest double', () => {
  const PATHS = ['/v1/completions', '/v1/chat/completions'];
  const BASE = '"model":"m","prompt":"x","messages":[{"role":"user","content":"hi"}]';
  /** The body `text` (its members after the base ones) read as the gateway reads it. */
  const read = (path: string, members: string) =>
    readRouteRequest(path, parseJsonBody(`{${BASE},${members}}`, limits), {}, limits);
  const generate = (text: string) => readGenerateRouteRequest(parseJsonBody(text, limits), {}, limits);
  const OVERFLOWS = ['1e999', '-1e999', '1E400', '-2.5e+309', '1' + '0'.repeat(400), '-' + '9'.repeat(309) + '.5'];

  test('a literal JSON.parse reads as ±Infinity is refused with 400 naming its field (it reaches Python as inf)', () => {
    const fields = ['temperature', 'top_p', 'presence_penalty', 'frequency_penalty', 'min_p', 'repetition_penalty'];
    for (const path of PATHS)
      for (const field of [...fields, 'top_k', 'seed', 'min_tokens', 'priority', 'length_penalty'])
        for (const literal of OVERFLOWS)
          rejects(() => read(path, `"${field}":${literal}`), field, new RegExp(`^${field} must be a finite number`));
  });

  test('anywhere in the body, named by its path; the first one in the body is named', () => {
    for (const path of PATHS) {
      rejects(() => read(path, '"stream":true,"stream_options":{"include_usage":true,"x":1e999}'), 'stream_options.x');
      rejects(() => read(path, '"vllm_xargs":{"a":[1,2,-1e999]}'), 'vllm_xargs.a[2]');
      rejects(
        () => read(path, '"mm_processor_kwargs":{"max pixels":[{"v":1e999}]}'),
        'mm_processor_kwargs["max pixels"][0].v',
      );
      rejects(() => read(path, '"temperature":1e999,"top_p":1e999'), 'temperature');
    }
  });

  test('a key that names the field is not echoed past 64 characters', () => {
    const key = 'k'.repeat(1000) + ' ';
    assert.throws(
      () => read('/v1/completions', `"x":{"${key}":1e999}`),
      (e: unknown) => e instanceof RequestLimitError && e.param !== null && e.param.length < 100,
    );
  });

  test('large finite numbers, underflows to zero and overflows inside JSON the engine renders as text pass', () => {
    for (const path of PATHS) {
      read(path, '"seed":18446744073709551557,"temperature":1.7976931348623157e308,"top_p":1e-999,"top_k":-0');
      // numbers of the prompt's template and of the grammars: vLLM writes an overflow back as
      // Infinity, as the router's tokenizer does (the chat parity fixture holds such a tool)
      read(path, '"tools":[{"type":"function","function":{"name":"f","parameters":{"maximum":1e400}}}]');
      read(path, '"chat_template_kwargs":{"budget":1e999},"documents":[{"n":-1e999}]');
      read(path, '"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"maximum":1e999}}}');
      read(path, '"guided_json":{"maximum":1e999},"structured_outputs":{"json":{"minimum":-1e999}}');
    }
  });

  test("SGLang's /generate: in sampling_params and anywhere else", () => {
    rejects(() => generate('{"text":"a","sampling_params":{"temperature":1e999}}'), 'sampling_params.temperature');
    rejects(() => generate('{"text":["a","b"],"sampling_params":[{},{"top_p":-1e999}]}'), 'sampling_params[1].top_p');
    rejects(() => generate('{"input_embeds":[[0.5,1e999]]}'), 'input_embeds[0][1]');
    rejects(() => generate('{"text":"a","custom_params":{"w":1e999}}'), 'custom_params.w');
    generate('{"text":"a","sampling_params":{"temperature":0.5,"max_new_tokens":8},"seed":18446744073709551557}');
  });
});

describe('max_tokens and max_completion_tokens', () => {
  const PATHS = ['/v1/completions', '/v1/chat/completions'];
  const read = (path: string, fields: object) =>
    readRouteRequest(
      path,
      { model: 'm', prompt: 'x', messages: [{ role: 'user', content: 'hi' }], ...fields },
      {},
      limits,
    );

  test('absent, null or a non-negative integer passes (0 is a completion that echoes its prompt only)', () => {
    for (const path of PATHS)
      for (const field of ['max_tokens', 'max_completion_tokens'])
        for (const value of [null, 0, 1, 16, 131072, Number.MAX_SAFE_INTEGER]) read(path, { [field]: value });
    // 5.0 is read as 5, as vLLM's pydantic model reads it
    readRouteRequest('/v1/completions', parseJsonBody('{"prompt":"x","max_tokens":5.0}', limits), {}, limits);
  });

  test('a string, a boolean, a fraction, a negative or a number past 2^53 is refused, as n is', () => {
    for (const path of PATHS)
      for (const field of ['max_tokens', 'max_completion_tokens'])
        for (const value of ['16', true, false, 1.5, -1, 2 ** 53, 1e20, Infinity, [16], { n: 16 }])
          rejects(() => read(path, { [field]: value }), field, new RegExp(`^${field} must be a non-negative integer`));
  });

  test("SGLang's /generate: max_new_tokens in sampling_params, named by its path", () => {
    checkGenerateRequest({ text: 'a', sampling_params: { max_new_tokens: 0 } }, limits);
    checkGenerateRequest({ text: 'a', sampling_params: { max_new_tokens: null } }, limits);
    rejects(
      () => checkGenerateRequest({ text: 'a', sampling_params: { max_new_tokens: '8' } }, limits),
      'sampling_params.max_new_tokens',
    );
    rejects(
      () => checkGenerateRequest({ text: ['a', 'b'], sampling_params: [{}, { max_new_tokens: -1 }] }, limits),
      'sampling_params[1].max_new_tokens',
      /^sampling_params\[1\]\.max_new_tokens must be a non-negative integer/,
    );
  });
});

test('a chat whose chat_template_kwargs hold keys vLLM refuses, or whose text holds a lone surrogate, is a 400 naming the field', () => {
  const chat = (fields: object) =>
    readRouteRequest(
      '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'hi' }], ...fields },
      {},
      DEFAULT_REQUEST_LIMITS,
    );
  const refused = (fields: object, param: string) =>
    assert.throws(
      () => chat(fields),
      (e: unknown) => e instanceof RequestLimitError && e.status === 400 && e.param === param,
      JSON.stringify(fields),
    );
  // vLLM's resolve_chat_template_kwargs rejects these two by name; the other three reach
  // apply_chat_template or the template's render() twice
  for (const key of ['chat_template', 'tokenize', 'messages', 'tools', 'conversation'])
    refused({ chat_template_kwargs: { enable_thinking: false, [key]: 1 } }, 'chat_template_kwargs');
  chat({ chat_template_kwargs: { enable_thinking: false, add_generation_prompt: false, documents: [] } });
  // a lone surrogate is no text: pydantic and the tokenizer refuse it
  const lone = 'a\ud83d b';
  refused({ messages: [{ role: 'user', content: lone }] }, 'messages[0].content');
  refused(
    { messages: [{ role: 'user', content: ['ok', { type: 'text', text: lone }] }] },
    'messages[0].content[1].text',
  );
  refused({ messages: [{ role: 'user', content: [lone] }] }, 'messages[0].content[0]');
  refused({ messages: [{ role: 'user', content: 'x', name: lone }] }, 'messages[0].name');
  refused({ messages: [{ role: 'assistant', content: 'x', reasoning: '\udc00' }] }, 'messages[0].reasoning');
  refused(
    { messages: [{ role: 'assistant', content: null, tool_calls: [{ function: { name: 'f', arguments: lone } }] }] },
    'messages[0].tool_calls[0].function.arguments',
  );
  // a pair is a character
  chat({ messages: [{ role: 'user', content: 'rocket \ud83d\ude80', name: '\ud83d\ude80' }] });
});

test("a message's tools send the messages' JSON text to the tokenizer, whatever its role", async () => {
  const { chatTemplateRequest } = await import('../../src/server/engine-deployments.js');
  const tools = [{ type: 'function', function: { name: 'f', parameters: { default: 1.0 } } }];
  for (const role of ['system', 'developer']) {
    const text = JSON.stringify({ messages: [{ role, content: 'hi', tools }] }).replace('"default":1', '"default":1.0');
    const body = parseJsonBody(text, jsonLimits(64)) as Record<string, unknown>;
    // SGLang hands a system message's tools to the template as vLLM does a developer's: their
    // numbers are read again from the text (1.0, not 1)
    assert.match(chatTemplateRequest(body).messagesJson ?? '', /"default":1\.0/, role);
  }
  const plain = parseJsonBody('{"messages":[{"role":"user","content":"hi"}]}', jsonLimits(64));
  assert.equal(chatTemplateRequest(plain as Record<string, unknown>).messagesJson, undefined);
});

test('the output tokens an engine checks against its context, per endpoint', () => {
  const chat = '/v1/chat/completions';
  const completions = '/v1/completions';
  // chat: max_completion_tokens over max_tokens (vLLM's `or`: 0 falls through), none when neither
  assert.equal(requestedOutputTokens({ max_completion_tokens: 30, max_tokens: 1 }, chat), 30);
  assert.equal(requestedOutputTokens({ max_completion_tokens: 0, max_tokens: 5 }, chat), 5);
  assert.equal(requestedOutputTokens({}, chat), undefined);
  assert.equal(requestedOutputTokens({ max_tokens: null }, chat), undefined);
  // completions: max_tokens only, the engines' 16 when absent, none when null
  assert.equal(requestedOutputTokens({}, completions), 16);
  assert.equal(requestedOutputTokens({ max_tokens: 0 }, completions), 0);
  assert.equal(requestedOutputTokens({ max_tokens: null }, completions), undefined);
  assert.equal(requestedOutputTokens({ max_tokens: 3, max_completion_tokens: 3000 }, completions), 3);
  assert.equal(requestedOutputTokens({ max_completion_tokens: 3000 }, completions), 16);
});

test("a batch's longest prompt is what an engine checks against its context", () => {
  const completions = '/v1/completions';
  assert.equal(longestPromptTokens({ prompt: [[1, 2], [1, 2, 3, 4, 5], [1]] }, completions, [1, 2]), 5);
  assert.equal(longestPromptTokens({ prompt: [1, 2, 3] }, completions, [1, 2, 3]), 3);
  // a batch of strings: only the routed prompt's ids are known
  assert.equal(longestPromptTokens({ prompt: ['a', 'b b b'] }, completions, [7]), 1);
  assert.equal(longestPromptTokens({ prompt: [[1], [1, 2]] }, completions, undefined), undefined);
  assert.equal(longestPromptTokens({ messages: [] }, '/v1/chat/completions', [1, 2, 3]), 3);
});
