import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { KVAwareRouter, PromptTooLongError } from '../../src/index.js';
import { MAX_INDEX_ENTRIES, MAX_PROMPT_TOKENS } from '../../src/core/router/options-schema.js';

const r = new KVAwareRouter();
r.registerWorker('w0');

describe('bad input is rejected with an error naming the argument', () => {
  const cases: Array<[string, () => unknown, ErrorConstructor, RegExp]> = [
    ['registerWorker: empty id', () => r.registerWorker(''), RangeError, /workerId/],
    ['registerWorker: non-string id', () => r.registerWorker(42 as never), TypeError, /workerId/],
    [
      'registerWorker: bad claGroups',
      () => r.registerWorker('x', { claGroups: [1.5] }),
      RangeError,
      /info.claGroups\[0\]/,
    ],
    ['registerWorker: info not an object', () => r.registerWorker('x', 'info' as never), TypeError, /info/],
    ['removeWorker: empty id', () => r.removeWorker(''), RangeError, /workerId/],
    ['getWorkerForAnchor: empty anchor', () => r.getWorkerForAnchor(''), RangeError, /anchorHash/],
    ['constructor: unknown policy', () => new KVAwareRouter({ policy: 'nope' }), RangeError, /policy must be one of/],
    ['constructor: anchorCapacity 0', () => new KVAwareRouter({ anchorCapacity: 0 }), RangeError, /anchorCapacity/],
    ['constructor: numWorkers -1', () => new KVAwareRouter({ numWorkers: -1 }), RangeError, /numWorkers/],
    [
      'constructor: flag not boolean',
      () => new KVAwareRouter({ enableClaAffinity: 'yes' as never }),
      TypeError,
      /enableClaAffinity/,
    ],
  ];
  for (const [name, fn, type, message] of cases) {
    test(name, () => assert.throws(fn, (e: unknown) => e instanceof type && message.test((e as Error).message)));
  }

  const asyncCases: Array<[string, () => Promise<unknown>, ErrorConstructor, RegExp]> = [
    ['updateWorkerState: NaN load', () => r.updateWorkerState('w0', NaN), RangeError, /load must not be NaN/],
    ['updateWorkerState: negative load', () => r.updateWorkerState('w0', -0.1), RangeError, /load must be >= 0/],
    ['updateWorkerState: load not a number', () => r.updateWorkerState('w0', '0.5' as never), TypeError, /load/],
    ['updateWorkerState: empty worker id', () => r.updateWorkerState('', 0.5), RangeError, /workerId/],
    [
      'updateWorkerState: non-integer CLA group',
      () => r.updateWorkerState('w0', 0.5, { claGroup: 1.5 }),
      RangeError,
      /claGroup/,
    ],
    [
      'updateWorkerState: negative step',
      () => r.updateWorkerState('w0', 0.5, { workflowStep: -1 }),
      RangeError,
      /workflowStep/,
    ],
    ['selectWorker: empty anchor', () => r.selectWorker(''), RangeError, /anchorHash/],
    ['selectWorker: anchor not a string', () => r.selectWorker(undefined as never), TypeError, /anchorHash/],
    ['selectWorker: non-integer CLA group', () => r.selectWorker('a', { claGroup: 0.5 }), RangeError, /claGroup/],
    ['selectWorker: string CLA group', () => r.selectWorker('a', { claGroup: '1' as never }), TypeError, /claGroup/],
    ['selectWorker: NaN tokenLength', () => r.selectWorker('a', { tokenLength: NaN }), RangeError, /tokenLength/],
    ['selectWorker: empty workflowId', () => r.selectWorker('a', { workflowId: '' }), RangeError, /workflowId/],
    [
      'broadcastNewBlocks: blockIds not an array',
      () => r.broadcastNewBlocks('a', 'b1' as never, 'w0'),
      TypeError,
      /blockIds/,
    ],
    [
      'broadcastNewBlocks: non-string block id',
      () => r.broadcastNewBlocks('a', ['b', 3 as never], 'w0'),
      TypeError,
      /blockIds\[1\]/,
    ],
    ['broadcastNewBlocks: empty target', () => r.broadcastNewBlocks('a', [], ''), RangeError, /targetWorkerId/],
  ];
  for (const [name, fn, type, message] of asyncCases) {
    test(name, () => assert.rejects(fn, (e: unknown) => e instanceof type && message.test((e as Error).message)));
  }

  test('rejected calls change nothing', async () => {
    const before = JSON.stringify(r.getStats());
    await assert.rejects(r.updateWorkerState('w0', NaN));
    await assert.rejects(r.broadcastNewBlocks('a', ['b', 3 as never], 'w0'));
    await assert.rejects(r.selectWorker('a', { claGroup: -2 }));
    assert.equal(JSON.stringify(r.getStats()), before);
  });
});

test('a prompt over maxPromptTokens throws PromptTooLongError and leaves nothing behind', () => {
  const router = new KVAwareRouter({ blockSize: 16, maxPromptTokens: 1024 });
  router.registerWorker('w0');
  for (const request of [
    { tokens: Array.from({ length: 1025 }, (_, i) => i) },
    { text: 'z'.repeat(4 * 1100) },
    { messages: [{ role: 'user', content: 'z'.repeat(4 * 1100) }] },
  ]) {
    assert.throws(
      () => router.route(request),
      (err: unknown) => err instanceof PromptTooLongError && err instanceof RangeError && err.maxPromptTokens === 1024,
    );
  }
  assert.equal(router.index.entryCount, 0);
  assert.equal(router.localLoad('w0').inFlightRequests, 0);
  assert.deepEqual(router.getStats().decisionsByReason, {});
  // at the limit it routes; a length alone records no blocks but is counted in flight, so it is refused too
  assert.equal(router.route({ tokens: Array.from({ length: 1024 }, (_, i) => i) }).workerId, 'w0');
  assert.throws(() => router.route({ promptTokens: 5000 }), PromptTooLongError);
  assert.equal(router.route({ promptTokens: 1024 }).workerId, 'w0');
  assert.throws(() => new KVAwareRouter({ maxPromptTokens: 0 }), /maxPromptTokens/);
});

test('a text or chat past maxPromptTokens is refused with the count its hashing gives, one at the limit served', () => {
  // 64-byte text chunks of 16 "tokens" each, and half a chunk for the tail: 4,095 bytes are 63
  // chunks, 1,016 tokens; 4,096 bytes are 64 chunks, 1,032 tokens
  const limited = new KVAwareRouter({ blockSize: 16, maxPromptTokens: 1024 });
  const open = new KVAwareRouter({ blockSize: 16 });
  limited.registerWorker('w0');
  open.registerWorker('w0');
  // 4,095 bytes each: 10 of ASCII, then 4,085 of the kind named
  const texts: [string, string][] = [
    ['ascii', 'z'.repeat(4085)],
    ['3-byte', '漢'.repeat(1361) + 'zz'],
    ['surrogate pairs', '😀'.repeat(1021) + 'z'],
    ['lone surrogates', '\uD800'.repeat(1361) + 'zz'],
    ['mixed', 'é'.repeat(2000) + 'z'.repeat(85)],
  ].map(([name, text]) => [name, 'abcdefghij' + text]);
  const chat = (content: string) => ({ messages: [{ role: 'user', content }] });
  // the chat's canonical text adds "<|user|>\n" and "\n" to its content: 10 bytes; the parts
  // are joined (a surrogate pair cut between two parts is whole again)
  const parts = (content: string) => ({
    messages: [{ role: 'user', content: [content.slice(0, 7), { type: 'text', text: content.slice(7) }] }],
  });
  for (const [name, atLimit] of texts) {
    for (const [shape, request, over] of [
      ['text', { text: atLimit }, { text: atLimit + 'z' }],
      ['chat', chat(atLimit.slice(10)), chat(atLimit.slice(10) + 'z')],
      ['parts', parts(atLimit.slice(10)), parts(atLimit.slice(10) + 'z')],
    ] as const) {
      const label = `${name} ${shape}`;
      const served = limited.route(request, { dryRun: true });
      assert.equal(served.workerId, 'w0', label);
      assert.equal(served.promptTokens, 1016, label);
      assert.throws(
        () => limited.route(over),
        (err: unknown) =>
          err instanceof PromptTooLongError &&
          err.promptTokens === 1032 &&
          err.message === 'the prompt has 1032 tokens, more than the 1024 this router takes (maxPromptTokens)',
        label,
      );
      assert.equal(open.route(over, { dryRun: true }).promptTokens, 1032, label);
    }
  }
  // far past the limit: the count the same text routes with where it is allowed
  const big = '漢字😀 z'.repeat(50_000);
  assert.throws(
    () => limited.route({ text: big }),
    (err: unknown) =>
      err instanceof PromptTooLongError &&
      err.promptTokens === open.route({ text: big }, { dryRun: true }).promptTokens,
  );
  // a length given is the prompt's, but the text's chunks are what is recorded: a text past the
  // bound is refused whatever length is given with it
  assert.throws(
    () => limited.route({ text: 'z'.repeat(10_000), promptTokens: 1000 }, { dryRun: true }),
    (err: unknown) => err instanceof PromptTooLongError && err.promptTokens === 2504,
  );
  assert.equal(limited.route({ text: 'z'.repeat(4000), promptTokens: 1000 }, { dryRun: true }).promptTokens, 1000);
  assert.equal(limited.index.entryCount, 0);
  assert.equal(limited.localLoad('w0').inFlightRequests, 0);
});

test('an inline image is counted by its digest, not its base64, toward maxPromptTokens', () => {
  const router = new KVAwareRouter({ blockSize: 16, maxPromptTokens: 1024 });
  router.registerWorker('w0');
  // 8 KB of base64 would be 2,000 "tokens" of text; the engine makes the image's own tokens
  const image = (data: string) => ({
    messages: [
      { role: 'system', content: 's'.repeat(400) },
      { role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,' + data } }] },
    ],
  });
  const a = router.route(image('iVBO'.repeat(2048)));
  assert.equal(a.workerId !== '', true);
  // the system prompt's 400 bytes and a few for the image's digest and the roles
  assert.ok(a.promptTokens > 100 && a.promptTokens < 150, `estimated ${a.promptTokens} tokens`);
});

test('maxPromptTokens past MAX_PROMPT_TOKENS (2^27) is refused when the router is built', () => {
  assert.equal(MAX_PROMPT_TOKENS, 2 ** 27);
  for (const n of [MAX_PROMPT_TOKENS + 1, Number.MAX_SAFE_INTEGER])
    assert.throws(
      () => new KVAwareRouter({ maxPromptTokens: n }),
      (err: unknown) =>
        err instanceof RangeError && err.message === `maxPromptTokens must be <= ${MAX_PROMPT_TOKENS} (got ${n})`,
      String(n),
    );
  assert.equal(new KVAwareRouter({ maxPromptTokens: MAX_PROMPT_TOKENS }).maxPromptTokens, MAX_PROMPT_TOKENS);
});

test('maxIndexEntries past what the index can allocate is refused when the router is built', () => {
  assert.throws(
    () => new KVAwareRouter({ maxIndexEntries: 1e12 }),
    (err: unknown) => err instanceof RangeError && /maxIndexEntries/.test(err.message) && /100000000/.test(err.message),
  );
  assert.equal(new KVAwareRouter({ maxIndexEntries: MAX_INDEX_ENTRIES }).index.maxEntries, MAX_INDEX_ENTRIES);
});

test('a token list of a billion ids is refused by its length before hashing; a length that is no count names tokens', () => {
  const router = new KVAwareRouter({ blockSize: 16 });
  router.registerWorker('w0');
  const huge = { length: 1e9 } as unknown as number[];
  assert.throws(
    () => router.route({ tokens: huge }),
    (err: unknown) => err instanceof PromptTooLongError && err.maxPromptTokens === 1_048_576,
  );
  for (const length of [NaN, -1, 1.5, Infinity]) {
    assert.throws(
      () => router.route({ tokens: { length } as unknown as number[] }),
      (err: unknown) => err instanceof TypeError && /tokens must be an array of token ids/.test((err as Error).message),
      String(length),
    );
  }
  assert.throws(() => router.route({ tokens: null as unknown as number[] }), TypeError);
  assert.equal(router.route({ tokens: [1, 2, 3] }).workerId, 'w0');
});

test('applyStored takes block hashes as plain arrays of numbers, as BlockSequence allows', () => {
  const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
  router.registerWorker('a');
  router.registerWorker('b');
  const tokens = Array.from({ length: 64 }, (_, i) => i + 1);
  const keys = router.hashTokens(tokens);
  router.applyStored('b', { hi: Array.from(keys.hi), lo: Array.from(keys.lo), length: keys.length });
  const d = router.route({ tokens });
  assert.equal(d.workerId, 'b');
  assert.equal(d.cachedTokens, 64);
});

describe('bad library arguments throw an error naming them, and the router keeps working', () => {
  const toks = Array.from({ length: 64 }, (_, i) => i + 1);
  const fleet = (): KVAwareRouter => {
    const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
    router.registerWorker('a');
    router.registerWorker('b');
    router.applyStored('b', router.hashTokens(toks));
    return router;
  };
  const snapshot = (router: KVAwareRouter): string =>
    JSON.stringify([router.getStats(), router.listWorkers().map((w) => ({ ...w, claGroups: [...w.claGroups] }))]);
  const works = (router: KVAwareRouter): void => {
    for (const tokens of [toks, toks.map((t) => t + 1000)]) {
      const x = router.route({ tokens });
      assert.equal(x.noWorker, undefined, JSON.stringify(x.noWorker));
      assert.notEqual(x.workerId, '');
      router.release(x.ticket);
    }
  };
  const u32 = (n: number): Uint32Array => new Uint32Array(n);
  const cases: Array<[string, (r: KVAwareRouter) => unknown, ErrorConstructor, RegExp]> = [
    ['route: now NaN', (x) => x.route({ tokens: toks }, { now: NaN }), RangeError, /\bnow\b/],
    ['route: now Infinity', (x) => x.route({ tokens: toks }, { now: Infinity }), RangeError, /\bnow\b/],
    ['route: now -Infinity', (x) => x.route({ tokens: toks }, { now: -Infinity }), RangeError, /\bnow\b/],
    ['route: now a string', (x) => x.route({ tokens: toks }, { now: 'x' as never }), TypeError, /\bnow\b/],
    ['route: options null', (x) => x.route({ tokens: toks }, null as never), TypeError, /\boptions\b/],
    ['route: options a string', (x) => x.route({ tokens: toks }, 'x' as never), TypeError, /\boptions\b/],
    ['route: exclude an array', (x) => x.route({ tokens: toks }, { exclude: ['b'] as never }), TypeError, /exclude/],
    ['route: exclude a string', (x) => x.route({ tokens: toks }, { exclude: 'b' as never }), TypeError, /exclude/],
    [
      'route: panicCandidates an array',
      (x) => x.route({ tokens: toks }, { panicCandidates: ['b'] as never }),
      TypeError,
      /panicCandidates/,
    ],
    ['applyStored: blocks null', (x) => x.applyStored('a', null as never), TypeError, /\bblocks\b/],
    ['applyStored: blocks {}', (x) => x.applyStored('a', {} as never), TypeError, /blocks\.hi/],
    [
      'applyStored: an array holding no block hash',
      (x) => x.applyStored('a', { hi: ['x', 2], lo: [3, 4], length: 2 } as never),
      TypeError,
      /blocks\.hi/,
    ],
    [
      'applyStored: strings',
      (x) => x.applyStored('a', { hi: 'xy', lo: 'zw', length: 2 } as never),
      TypeError,
      /blocks\.hi/,
    ],
    [
      'applyStored: lo a hash past 32 bits',
      (x) => x.applyStored('a', { hi: u32(2), lo: [3, 2 ** 32], length: 2 } as never),
      TypeError,
      /blocks\.lo/,
    ],
    [
      'applyStored: length 1e9 past 2-element arrays',
      (x) => x.applyStored('a', { hi: u32(2), lo: u32(2), length: 1e9 }),
      RangeError,
      /blocks\.length/,
    ],
    [
      'applyStored: length past the shorter array',
      (x) => x.applyStored('a', { hi: u32(4), lo: u32(1), length: 2 }),
      RangeError,
      /blocks\.length/,
    ],
    [
      'applyStored: negative length',
      (x) => x.applyStored('a', { hi: u32(1), lo: u32(1), length: -5 }),
      RangeError,
      /blocks\.length/,
    ],
    [
      'applyStored: fractional length',
      (x) => x.applyStored('a', { hi: u32(2), lo: u32(2), length: 1.5 }),
      RangeError,
      /blocks\.length/,
    ],
    [
      'applyStored: length a string',
      (x) => x.applyStored('a', { hi: u32(2), lo: u32(2), length: '2' } as never),
      TypeError,
      /blocks\.length/,
    ],
    ['applyStored: tier bogus', (x) => x.applyStored('a', x.hashTokens(toks), 'bogus' as never), RangeError, /tier/],
    ['applyStored: tier a number', (x) => x.applyStored('a', x.hashTokens(toks), 1 as never), TypeError, /tier/],
    ['applyRemoved: blocks null', (x) => x.applyRemoved('b', null as never), TypeError, /\bblocks\b/],
    [
      'applyRemoved: length past the arrays',
      (x) => x.applyRemoved('b', { hi: u32(1), lo: u32(1), length: 100_000 }),
      RangeError,
      /blocks\.length/,
    ],
    ['applyRemoved: tier bogus', (x) => x.applyRemoved('b', x.hashTokens(toks), 'bogus' as never), RangeError, /tier/],
    ['updateWorkerMetrics: null', (x) => x.updateWorkerMetrics('a', null as never), TypeError, /metrics/],
    [
      'updateWorkerMetrics: a bad sampledAt after a good kvUsage',
      (x) => x.updateWorkerMetrics('a', { kvUsage: 0.5, waitingRequests: 3, sampledAt: NaN }),
      RangeError,
      /sampledAt/,
    ],
    [
      'updateWorkerMetrics: a bad runningRequests after a good waitingRequests',
      (x) => x.updateWorkerMetrics('a', { waitingRequests: 3, runningRequests: -1 }),
      RangeError,
      /runningRequests/,
    ],
    ['setRemoteLoad: null', (x) => x.setRemoteLoad('a', null as never), TypeError, /\bload\b/],
    ['release: NaN', (x) => x.release(NaN), RangeError, /\bticket\b/],
    ['release: a string', (x) => x.release('1' as never), TypeError, /\bticket\b/],
    ['release: -1', (x) => x.release(-1), RangeError, /\bticket\b/],
    ['markPrefillDone: 1.5', (x) => x.markPrefillDone(1.5), RangeError, /\bticket\b/],
    ['markPrefillDone: undefined', (x) => x.markPrefillDone(undefined as never), TypeError, /\bticket\b/],
    ['markRefused: Infinity', (x) => x.markRefused(Infinity), RangeError, /\bticket\b/],
    ['applySharedDecision: null', (x) => x.applySharedDecision(null as never), TypeError, /decision/],
    [
      'applySharedDecision: now NaN',
      (x) => x.applySharedDecision({ workerId: 'a', hi: u32(1), lo: u32(1), workflowStep: null, claGroup: null }, NaN),
      RangeError,
      /\bnow\b/,
    ],
    [
      'applySharedDecision: now a string',
      (x) =>
        x.applySharedDecision(
          { workerId: 'a', hi: u32(1), lo: u32(1), workflowStep: null, claGroup: null },
          'x' as never,
        ),
      TypeError,
      /\bnow\b/,
    ],
    ['settleSharedDecision: null', (x) => x.settleSharedDecision(null as never), TypeError, /decision/],
    ['refuseSharedDecision: null', (x) => x.refuseSharedDecision(null as never), TypeError, /decision/],
    ['hashTokens: tokens null', (x) => x.hashTokens(null as never), TypeError, /tokens/],
    ['hashTokens: tokens a number', (x) => x.hashTokens(5 as never), TypeError, /tokens/],
    ['hashTokens: ns a number', (x) => x.hashTokens(toks, 5 as never), TypeError, /\bns\b/],
    ['hashTokens: blockSize -1', (x) => x.hashTokens(toks, undefined, -1), RangeError, /blockSize/],
    ['hashTokens: blockSize 0', (x) => x.hashTokens(toks, undefined, 0), RangeError, /blockSize/],
    ['hashTokens: blockSize 1.5', (x) => x.hashTokens(toks, undefined, 1.5), RangeError, /blockSize/],
    ['hashTokens: blockSize NaN', (x) => x.hashTokens(toks, undefined, NaN), RangeError, /blockSize/],
    ['hashTokens: blockSize 65537', (x) => x.hashTokens(toks, undefined, 65_537), RangeError, /blockSize.*65536/],
    ['hashTokens: blockSize a string', (x) => x.hashTokens(toks, undefined, '16' as never), TypeError, /blockSize/],
  ];
  for (const [name, fn, type, message] of cases) {
    test(name, () => {
      const router = fleet();
      works(router); // the worker the cost policy counted are in its state before the bad call
      const before = snapshot(router);
      assert.throws(
        () => fn(router),
        (e: unknown) => e instanceof type && message.test((e as Error).message),
      );
      assert.equal(snapshot(router), before, 'a rejected call changes nothing');
      works(router);
    });
  }

  test('a clock that returns no finite time is named by the call that reads it, which changes nothing', () => {
    let time = 1_000;
    const router = new KVAwareRouter({ blockSize: 16, clock: () => time });
    router.registerWorker('a');
    router.registerWorker('b');
    works(router);
    for (const bad of [NaN, Infinity, 'x' as unknown as number]) {
      time = bad;
      const before = snapshot(router);
      const named = (e: unknown): boolean =>
        (e instanceof RangeError || e instanceof TypeError) && /\bclock\b/.test((e as Error).message);
      assert.throws(() => router.route({ tokens: toks }), named);
      assert.throws(() => router.updateWorkerMetrics('a', { waitingRequests: 1 }), named);
      assert.throws(
        () => router.applySharedDecision({ workerId: 'a', hi: u32(1), lo: u32(1), workflowStep: null, claGroup: null }),
        named,
      );
      assert.throws(() => router.now(), named);
      assert.equal(snapshot(router), before);
      time = 2_000;
      works(router);
    }
  });

  test('capacities past what the router can hold name the option and its maximum', () => {
    for (const option of ['anchorCapacity', 'workflowCapacity', 'contentAnchorCapacity'] as const) {
      assert.throws(
        () => new KVAwareRouter({ [option]: 1e12 }),
        (e: unknown) => e instanceof RangeError && new RegExp(`${option} must be <= 10000000`).test(e.message),
      );
    }
  });
});
