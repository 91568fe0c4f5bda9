/**
 * The library API at its edges, as a caller outside the gateway reaches it: ids that are
 * Object.prototype's own names, lengths past any prompt, options of the wrong type or with a
 * misspelt key, arrays where objects belong, and the exported constants.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { AnchorTable } from '../../src/core/anchor-table.js';
import { MAX_REMOTE_LOAD } from '../../src/core/router/in-flight.js';
import { MAX_PROMPT_TOKENS } from '../../src/core/router/options-schema.js';
import * as api from '../../src/index.js';
import {
  createPolicy,
  KVAwareRouter,
  NoEndpointsError,
  POLICY_NAMES,
  PromptTooLongError,
  type RoutingPolicy,
} from '../../src/index.js';

/** What a refused call must leave as it was. */
function snapshot(router: KVAwareRouter) {
  return JSON.stringify({
    workers: router.listWorkers().map((w) => ({
      id: w.id,
      load: w.load,
      inFlight: w.inFlightRequests,
      queued: w.queuedPrefillTokens,
      decode: w.activeDecodeTokens,
    })),
    stats: router.getStats(),
  });
}

function refuses(router: KVAwareRouter, call: () => unknown, error: typeof TypeError, message: RegExp): void {
  const before = snapshot(router);
  assert.throws(call, (err: unknown) => {
    assert.ok(err instanceof error, `${String(err)} is not a ${error.name}`);
    assert.match((err as Error).message, message);
    return true;
  });
  assert.equal(snapshot(router), before, `state changed by a refused call (${message.source})`);
}

function throwsNaming(call: () => unknown, error: typeof TypeError, message: RegExp): void {
  assert.throws(call, (err: unknown) => {
    assert.ok(err instanceof error, `${String(err)} is not a ${error.name}`);
    assert.match((err as Error).message, message);
    return true;
  });
}

describe('ids that are names of Object.prototype', () => {
  test('a worker named __proto__ is a key of getStats().workerLoads like any other', () => {
    const router = new KVAwareRouter({ policy: 'seed' });
    for (const id of ['a', '__proto__', 'constructor', 'toString']) router.registerWorker(id);
    void router.updateWorkerState('__proto__', 0.5);
    const loads = router.getStats().workerLoads;
    assert.deepEqual(Object.keys(loads), ['a', '__proto__', 'constructor', 'toString']);
    assert.ok(Object.hasOwn(loads, '__proto__'));
    assert.equal(Object.getOwnPropertyDescriptor(loads, '__proto__')?.value.load, 0.5);
    assert.equal(Object.getPrototypeOf(loads), Object.prototype);
    assert.deepEqual(Object.keys(JSON.parse(JSON.stringify(loads))), ['a', '__proto__', 'constructor', 'toString']);
  });

  test("a policy's reason named __proto__ is counted in decisionsByReason", () => {
    const policy: RoutingPolicy = {
      name: 'mine',
      choose: () => ({ index: 0, confidence: 1, reason: '__proto__' as never }),
    };
    const router = new KVAwareRouter({ policy });
    router.registerWorker('a');
    router.route({ tokens: [1, 2, 3] });
    router.route({ tokens: [1, 2, 3] });
    const byReason = router.getStats().decisionsByReason;
    assert.equal(Object.getOwnPropertyDescriptor(byReason, '__proto__')?.value, 2);
    assert.equal(Object.getPrototypeOf(byReason), Object.prototype);
  });
});

describe('a prompt length past maxPromptTokens', () => {
  test('is refused whether or not the request gives blocks, naming promptTokens', () => {
    const router = new KVAwareRouter({ policy: 'dynamo', maxPromptTokens: 1024 });
    router.registerWorker('w0');
    router.registerWorker('w1');
    for (const promptTokens of [1e308, 2 ** 60, 1025])
      for (const options of [{}, { servedBy: 'w0' }, { dryRun: true }])
        refuses(
          router,
          () => router.route({ promptTokens }, options),
          RangeError,
          new RegExp(
            `^promptTokens must be at most 1024 \\(maxPromptTokens\\), got ${String(promptTokens).replace('+', '\\+')}$`,
          ),
        );
    assert.throws(() => router.route({ promptTokens: 2 ** 60 }), PromptTooLongError);
    // a length that is no count is refused as such, not as too long
    refuses(
      router,
      () => router.route({ text: 'hi', promptTokens: '5000' as unknown as number }),
      TypeError,
      /^promptTokens must be a non-negative integer, got string$/,
    );
    // with precomputed blocks, as before
    refuses(router, () => router.route({ blockHashes: [1, 2], promptTokens: 5000 }), RangeError, /^promptTokens/);
    // a length estimated from the blocks (promptTokens 0: not given) is the prompt's, not the field's
    refuses(
      router,
      () => router.route({ text: 'z'.repeat(8000), promptTokens: 0 }),
      RangeError,
      /^the prompt has \d+ tokens/,
    );
    // at the bound it routes, and the counters stay numbers
    const r = router.route({ promptTokens: 1024 });
    assert.equal(router.localLoad(r.workerId).queuedPrefillTokens, 1024);
    router.release(r.ticket);
    assert.equal(router.localLoad(r.workerId).queuedPrefillTokens, 0);
  });

  test('does not let a short promptTokens pass a prompt whose blocks are past it', () => {
    const router = new KVAwareRouter({ blockSize: 16, maxPromptTokens: 1024 });
    router.registerWorker('w0');
    router.registerWorker('w1');
    // what is held before: a refused request must not evict it
    const held = Array.from({ length: 64 }, (_, i) => i);
    router.route({ tokens: held }, { track: false });
    const tooLong = (tokens: number, source = '') =>
      new RegExp(
        `^the prompt has ${tokens} tokens${source}, more than the 1024 this router takes \\(maxPromptTokens\\)$`,
      );
    // 8,000 bytes of text are 125 chunks of 16 "tokens" and half a chunk: 2,008 tokens
    for (const promptTokens of [1, 1000, 1024]) {
      refuses(router, () => router.route({ text: 'z'.repeat(8000), promptTokens }), RangeError, tooLong(2008));
      refuses(
        router,
        () => router.route({ messages: [{ role: 'user', content: 'z'.repeat(8000) }], promptTokens }),
        RangeError,
        /^the prompt has \d+ tokens, more than the 1024/,
      );
      refuses(
        router,
        () => router.route({ blockHashes: Array.from({ length: 65 }, (_, i) => i), promptTokens }),
        RangeError,
        tooLong(1040, ' \\(blockHashes: 65 blocks of 16\\)'),
      );
      refuses(
        router,
        () => router.route({ blockHashes: [1, 2, 3], blockTokens: 512, promptTokens }),
        RangeError,
        tooLong(1536, ' \\(blockHashes: 3 blocks of 512\\)'),
      );
    }
    // past the bound both ways: the length given is named
    refuses(
      router,
      () => router.route({ blockHashes: Array.from({ length: 65 }, (_, i) => i), promptTokens: 5000 }),
      RangeError,
      /^promptTokens must be at most 1024/,
    );
    assert.throws(() => router.route({ text: 'z'.repeat(8000), promptTokens: 1 }), PromptTooLongError);
    assert.equal(router.route({ tokens: held }, { dryRun: true }).cachedTokens, 64);
    // blocks within the bound route with the length given, a length alone too
    const blocks = router.route({ blockHashes: Array.from({ length: 64 }, (_, i) => i), promptTokens: 1 });
    assert.equal(blocks.promptTokens, 1);
    assert.equal(blocks.blocks, 64);
    router.release(blocks.ticket);
    const text = router.route({ text: 'z'.repeat(4000), promptTokens: 900 }, { dryRun: true });
    assert.equal(text.promptTokens, 900);
    assert.equal(router.route({ promptTokens: 1024 }, { dryRun: true }).promptTokens, 1024);
  });

  test("the seed API's tokenLength too, naming tokenLength", async () => {
    const router = new KVAwareRouter({ policy: 'seed', maxPromptTokens: 1024 });
    router.registerWorker('w0');
    await assert.rejects(router.selectWorker('a', { tokenLength: 2 ** 60 }), {
      name: 'PromptTooLongError',
      message: /^tokenLength must be at most 1024 \(maxPromptTokens\), got 1152921504606847000$/,
    });
    assert.equal(router.getWorkerForAnchor('a'), undefined);
    assert.equal((await router.selectWorker('a', { tokenLength: 1024 })).targetWorkerId, 'w0');
  });
});

describe("broadcastNewBlocks' block ids", () => {
  test('are not kept when blocks are not counted (policy seed)', async () => {
    const table = new AnchorTable(10, 0);
    table.recordBlocks('a', ['b1', 'b2', 'b3'], 'w0');
    assert.equal(table.peek('a')?.workerId, 'w0');
    assert.equal(table.peek('a')?.blocks, null);
    assert.equal(table.blocksOn('w0'), 0);
    const router = new KVAwareRouter({ policy: 'seed' });
    router.registerWorker('w0');
    await router.broadcastNewBlocks('one-anchor', ['x', 'y'], 'w0');
    assert.equal(router.getWorkerForAnchor('one-anchor'), 'w0');
    assert.equal(router.getStats().workerLoads.w0.activeBlocks, 0);
  });

  test('are kept up to a bound over all anchors when counted; ids past it are counted no more', () => {
    const table = new AnchorTable(10, 5);
    table.recordBlocks('a', ['b1', 'b2', 'b3'], 'w0');
    table.recordBlocks('b', ['c1', 'c2', 'c3', 'c4'], 'w1');
    assert.equal(table.blocksOn('w0'), 3);
    assert.equal(table.blocksOn('w1'), 2);
    assert.equal(table.keptBlockIds, 5);
    table.recordBlocks('a', ['b1', 'b9'], 'w0'); // b1 is kept already; b9 is past the bound
    assert.equal(table.blocksOn('w0'), 3);
    // moving an anchor frees what it kept
    table.recordBlocks('b', ['d1'], 'w0');
    assert.equal(table.blocksOn('w1'), 0);
    assert.equal(table.blocksOn('w0'), 4);
    assert.equal(table.keptBlockIds, 4);
    table.dropWorker('w0');
    assert.equal(table.keptBlockIds, 0);
  });
});

describe("route()'s boolean options", () => {
  test('are booleans: a string is refused, naming the option', () => {
    const router = new KVAwareRouter({ policy: 'seed' });
    router.registerWorker('w0');
    for (const name of ['dryRun', 'track', 'explain', 'share', 'firstTokenReported'])
      for (const value of ['false', 0, 1, null])
        refuses(
          router,
          () => router.route({ promptTokens: 3, anchor: 'q' }, { [name]: value } as never),
          TypeError,
          new RegExp(`^options\\.${name} must be a boolean, got `),
        );
    assert.equal(router.getWorkerForAnchor('q'), undefined);
  });
});

describe('unknown keys', () => {
  test('of a route() request are refused, naming the key', () => {
    const router = new KVAwareRouter({ policy: 'seed' });
    router.registerWorker('w0');
    refuses(
      router,
      () => router.route({ promptTokens: 1, clagroup: 1 } as never, { track: false }),
      TypeError,
      /^request\.clagroup is not a known key \(did you mean claGroup\?\)$/,
    );
    // a key given as undefined is not given
    router.route({ promptTokens: 1, clagroup: undefined } as never, { dryRun: true });
  });

  test("of setRemoteLoad()'s load, applySharedDecision()'s decision and hashTokens()'s ns", () => {
    const router = new KVAwareRouter();
    router.registerWorker('w0');
    const load = { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 };
    refuses(
      router,
      () => router.setRemoteLoad('w0', { ...load, bogus: 1 } as never),
      TypeError,
      /^load\.bogus is not a known key/,
    );
    const decision = {
      workerId: 'w0',
      hi: new Uint32Array(0),
      lo: new Uint32Array(0),
      workflowStep: null,
      claGroup: null,
    };
    refuses(
      router,
      () => router.applySharedDecision({ ...decision, bogus: 1 } as never),
      TypeError,
      /^decision\.bogus is not a known key/,
    );
    throwsNaming(
      () => router.hashTokens([1, 2], { lroa: 'x' } as never),
      TypeError,
      /^ns\.lroa is not a known key \(did you mean lora\?\)$/,
    );
    // a decision as route() shared it, every key of SharedDecision, is applied
    const shared = router.route({ tokens: Array.from({ length: 32 }, (_, i) => i) }, { share: true }).shared!;
    assert.equal(router.applySharedDecision(shared), true);
    router.setRemoteLoad('w0', load);
  });
});

describe('errors that name the argument', () => {
  test('hashTokens() of something that is no token list', () => {
    const router = new KVAwareRouter();
    for (const tokens of [{}, { length: -1 }, { length: 1.5 }, { length: NaN }, { length: Infinity }])
      throwsNaming(() => router.hashTokens(tokens as never), TypeError, /^tokens must be an array of token ids/);
    throwsNaming(() => router.hashTokens([1], [] as never), TypeError, /^ns must be an object/);
    throwsNaming(() => router.hashTokens([1], { lora: 5 } as never), TypeError, /^ns\.lora must be a string/);
    throwsNaming(() => router.hashTokens([1], { claGroup: -1 }), RangeError, /^ns\.claGroup must be/);
    assert.equal(router.hashTokens([]).length, 0);
  });

  test('hashTokens() of more ids than any router takes, or of ids that are no numbers', () => {
    const router = new KVAwareRouter();
    // refused by the length alone, before the keys' arrays or the hash's memory are sized for it
    for (const [length, blockSize] of [
      [2 ** 40, undefined],
      [1e9, 1],
      [MAX_PROMPT_TOKENS + 1, 16],
    ] as const)
      throwsNaming(
        () => router.hashTokens({ length } as never, undefined, blockSize),
        RangeError,
        new RegExp(
          `^tokens must hold at most 134217728 token ids \\(MAX_PROMPT_TOKENS, the longest prompt a router takes\\), got ${length}$`,
        ),
      );
    throwsNaming(
      () => router.hashTokens(new BigUint64Array(32) as never),
      TypeError,
      /^tokens\[0\] must be a number \(a token id\), got bigint$/,
    );
    throwsNaming(
      () => router.hashTokens([1, 2, 3n, 4] as never),
      TypeError,
      /^tokens\[2\] must be a number \(a token id\), got bigint$/,
    );
    throwsNaming(() => router.hashTokens([1, Symbol('t')] as never), TypeError, /^tokens\[1\] must be a number/);
    throwsNaming(() => router.hashTokens([1, -1]), RangeError, /^tokens\[1\] must be an integer in \[0, 2\^32\)/);
    const vllm = new KVAwareRouter({ blockHash: 'vllm', pythonHashSeed: '0' });
    throwsNaming(
      () => vllm.hashTokens(new BigInt64Array(16) as never),
      TypeError,
      /^tokens\[0\] must be a number \(a token id\), got bigint$/,
    );
    assert.equal(router.hashTokens(new Uint32Array(64)).length, 4);
  });

  test('route() of bigint token ids, or of more block ids than maxPromptTokens, names the argument', () => {
    const router = new KVAwareRouter({ clock: () => 1000 });
    router.registerWorker('w0');
    refuses(
      router,
      () => router.route({ tokens: new BigUint64Array(32) as never }),
      TypeError,
      /^tokens\[0\] must be a number \(a token id\), got bigint$/,
    );
    refuses(
      router,
      () => router.route({ blockHashes: { length: 2 ** 40 } as never }),
      RangeError,
      /^the prompt has 17592186044416 tokens \(blockHashes: 1099511627776 blocks of 16\), more than the 1048576/,
    );
    assert.throws(() => router.route({ blockHashes: { length: 2 ** 40 } as never }), PromptTooLongError);
  });

  test('route() with blockHashes null', () => {
    const router = new KVAwareRouter();
    router.registerWorker('w0');
    refuses(router, () => router.route({ blockHashes: null as never }), TypeError, /^blockHashes must be an array/);
  });

  test('route() with blockHashes whose length is no count', () => {
    const router = new KVAwareRouter({ clock: () => 1000 });
    router.registerWorker('w0');
    router.registerWorker('w1');
    for (const [length, shown] of [
      [NaN, 'NaN'],
      [-5, '-5'],
      [2.5, '2\\.5'],
      [Infinity, 'Infinity'],
      [2 ** 53, '9007199254740992'],
      ['3', 'string'],
      [undefined, 'undefined'],
    ] as const)
      refuses(
        router,
        () => router.route({ blockHashes: { length, 0: 1, 1: 2, 2: 3 } as never }),
        TypeError,
        new RegExp(`^blockHashes must be an array of block ids \\(its length a count\\), got length ${shown}$`),
      );
    // the workers' counts stay numbers: the next route finds a worker
    const next = router.route({ tokens: Array.from({ length: 64 }, (_, i) => i) }, { track: false });
    assert.notEqual(next.workerId, '');
    assert.equal(
      router.listWorkers().every((w) => w.queuedPrefillTokens === 0),
      true,
    );
  });

  test('createPolicy() without options takes none; a name that is no string is refused', () => {
    assert.equal(createPolicy('seed').name, 'seed');
    throwsNaming(() => createPolicy({} as never, {}), TypeError, /^policy must be a policy name \(a string\)/);
    throwsNaming(() => createPolicy('seed', {}, null as never), TypeError, /^ctx must be an object/);
  });

  test("createPolicy()'s random source outside [0, 1) is refused at the draw, naming ctx.random()", () => {
    const sampling = ['random', 'power-of-two', 'llmd', 'sglang', 'dynamo'];
    for (const [value, error] of [
      [NaN, RangeError],
      [2, RangeError],
      [1, RangeError],
      [-1, RangeError],
      ['0.5', TypeError],
      [undefined, TypeError],
    ] as const) {
      for (const name of sampling) {
        const router = new KVAwareRouter({ policy: createPolicy(name, {}, { random: () => value as number }) });
        router.registerWorker('a');
        router.registerWorker('b');
        const got = value === undefined ? 'undefined' : typeof value === 'string' ? 'string' : String(value);
        const message = new RegExp(`^ctx\\.random\\(\\) must return a number in \\[0, 1\\), got ${got}$`);
        refuses(router, () => router.route({ tokens: [1, 2, 3] }), error, message);
      }
    }
    // a draw in range is taken as it comes, called on the context as before
    const ctx = {
      draws: 0,
      random(this: { draws: number }) {
        this.draws++;
        return 0.999;
      },
    };
    const router = new KVAwareRouter({ policy: createPolicy('random', {}, ctx) });
    router.registerWorker('a');
    router.registerWorker('b');
    assert.equal(router.route({ tokens: [1, 2, 3] }).workerId, 'b');
    assert.equal(ctx.draws, 1);
  });

  test("a user policy's choice that is no PolicyChoice is refused, naming the policy", () => {
    const routerChoosing = (choice: unknown) => {
      const router = new KVAwareRouter({ policy: { name: 'mine', choose: () => choice as never } });
      router.registerWorker('a');
      return router;
    };
    for (const [choice, error, message] of [
      [
        null,
        TypeError,
        /^policy 'mine': choose\(\) must return a PolicyChoice \{ index, confidence, reason \}, got null$/,
      ],
      [undefined, TypeError, /^policy 'mine': choose\(\) must return a PolicyChoice .*, got undefined$/],
      [0, TypeError, /^policy 'mine': choose\(\) must return a PolicyChoice .*, got number$/],
      [{ confidence: 0, reason: 'hash' }, RangeError, /^policy 'mine' chose index undefined of 1 candidates$/],
      [
        { index: 0, confidence: 'high', reason: 'hash' },
        TypeError,
        /^policy 'mine' chose a confidence of type string; it must be a number from 0 to 1$/,
      ],
      [{ index: 0, reason: 'hash' }, TypeError, /^policy 'mine' chose a confidence of type undefined;/],
      [{ index: 0, confidence: {}, reason: 'hash' }, TypeError, /^policy 'mine' chose a confidence of type object;/],
      [
        { index: 0, confidence: NaN, reason: 'hash' },
        RangeError,
        /^policy 'mine' chose confidence NaN; it must be a number from 0 to 1$/,
      ],
      [{ index: 0, confidence: 1.5, reason: 'hash' }, RangeError, /^policy 'mine' chose confidence 1\.5;/],
      [{ index: 0, confidence: -0.1, reason: 'hash' }, RangeError, /^policy 'mine' chose confidence -0\.1;/],
    ] as const) {
      const router = routerChoosing(choice);
      refuses(router, () => router.route({ tokens: [1, 2, 3] }), error, message);
      refuses(router, () => router.route({ tokens: [1, 2, 3] }, { dryRun: true }), error, message);
    }
    // the bounds themselves are confidences
    for (const confidence of [0, 1])
      assert.equal(
        routerChoosing({ index: 0, confidence, reason: 'hash' }).route({ tokens: [1] }).confidence,
        confidence,
      );
  });

  test('new NoEndpointsError() of no diagnosis', () => {
    throwsNaming(() => new (NoEndpointsError as unknown as new () => Error)(), TypeError, /^noWorker must be/);
    throwsNaming(() => new NoEndpointsError({ reason: 'nope' } as never, 'p'), TypeError, /^noWorker\.reason must be/);
    throwsNaming(
      () => new NoEndpointsError({ reason: 'no-workers', workers: 0, unavailable: 0, excluded: 0 }, 5 as never),
      TypeError,
      /^policy must be a string/,
    );
    const e = new NoEndpointsError({ reason: 'no-workers', workers: 0, unavailable: 0, excluded: 0 }, 'seed');
    assert.equal(e.reason, 'no-workers');
  });
});

describe('arrays where objects belong', () => {
  test('are refused by the constructor, route() and the seed API', async () => {
    throwsNaming(() => new KVAwareRouter([] as never), TypeError, /^options must be an object, got an array$/);
    const router = new KVAwareRouter();
    router.registerWorker('w0');
    refuses(router, () => router.route([] as never), TypeError, /^request must be an object, got an array$/);
    await assert.rejects(router.selectWorker('a', [] as never), {
      name: 'TypeError',
      message: /^opts must be an object/,
    });
    await assert.rejects(router.updateWorkerState('w0', 0.5, [] as never), {
      name: 'TypeError',
      message: /^opts must be an object/,
    });
    assert.equal(router.getWorkerForAnchor('a'), undefined);
  });
});

describe('exported constants', () => {
  test('are frozen: a caller cannot change what the router accepts', () => {
    for (const [name, value] of Object.entries(api))
      if (value !== null && typeof value === 'object') assert.ok(Object.isFrozen(value), `${name} is not frozen`);
    assert.throws(() => (POLICY_NAMES as string[]).push('evil'), TypeError);
    assert.throws(() => new KVAwareRouter({ policy: 'evil' }), /policy/);
  });
});

describe('workflow and agent-role arguments', () => {
  test('are type-checked, naming the argument', () => {
    const router = new KVAwareRouter();
    router.registerWorker('w0');
    throwsNaming(() => router.workflowAffinity(5 as never), TypeError, /^workflowId must be a string/);
    throwsNaming(() => router.workflowAffinity(''), RangeError, /^workflowId must be a non-empty string/);
    throwsNaming(() => router.setWorkflowAffinity('wf', 5 as never), TypeError, /^workerId must be a string/);
    refuses(
      router,
      () => router.route({ tokens: [1], agentRole: 5 as never }),
      TypeError,
      /^agentRole must be a string/,
    );
    router.setWorkflowAffinity('wf', 'w0', 2);
    assert.deepEqual(router.workflowAffinity('wf'), { workerId: 'w0', step: 2 });
    router.setWorkflowAffinity('wf', 'unknown'); // an unknown worker is still ignored
    assert.deepEqual(router.workflowAffinity('wf'), { workerId: 'w0', step: 2 });
  });
});

describe('numWorkers', () => {
  test('is informational, as in the seed: any finite number from 0', () => {
    for (const n of [0, 2.5, 4]) assert.equal(new KVAwareRouter({ numWorkers: n }).numWorkers, n);
    for (const n of [-1, NaN, Infinity]) assert.throws(() => new KVAwareRouter({ numWorkers: n }), /numWorkers/);
    assert.throws(() => new KVAwareRouter({ numWorkers: '4' as never }), TypeError);
  });
});

describe("setRemoteLoad()'s amounts", () => {
  test('are numbers from 0 to MAX_REMOTE_LOAD, each named; a refused one changes nothing', () => {
    const router = new KVAwareRouter();
    router.registerWorker('w0');
    const t = router.route({ tokens: Array.from({ length: 64 }, (_, i) => i) }).ticket;
    assert.ok(t > 0);
    const ok = { inFlightRequests: 2, queuedPrefillTokens: 300, activeDecodeTokens: 40 };
    router.setRemoteLoad('w0', ok);
    for (const key of ['inFlightRequests', 'queuedPrefillTokens', 'activeDecodeTokens'] as const) {
      for (const bad of [1e308, MAX_REMOTE_LOAD + 1, Infinity, NaN, -1])
        refuses(
          router,
          () => router.setRemoteLoad('w0', { ...ok, [key]: bad }),
          RangeError,
          new RegExp(`^load\\.${key} must be a number from 0 to ${MAX_REMOTE_LOAD}, got `),
        );
      refuses(
        router,
        () => router.setRemoteLoad('w0', { ...ok, [key]: '5' as never }),
        TypeError,
        new RegExp(`^load\\.${key} must be a number`),
      );
    }
    // at the bound it is taken, and replacing it leaves this router's own counts exact
    const own = router.localLoad('w0');
    router.setRemoteLoad('w0', {
      inFlightRequests: MAX_REMOTE_LOAD,
      queuedPrefillTokens: MAX_REMOTE_LOAD,
      activeDecodeTokens: MAX_REMOTE_LOAD,
    });
    assert.equal(router.listWorkers()[0].queuedPrefillTokens, MAX_REMOTE_LOAD + own.queuedPrefillTokens);
    router.setRemoteLoad('w0', { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
    assert.deepEqual(router.localLoad('w0'), own);
    const w = router.listWorkers()[0];
    assert.deepEqual([w.inFlightRequests, w.queuedPrefillTokens, w.activeDecodeTokens], [1, 64, 0]);
  });
});
