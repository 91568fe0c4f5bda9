import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter, type KVAwareRouterOptions } from '../../src/core/router/index.js';
import { MAX_WORKERS } from '../../src/core/worker-registry.js';
import {
  ClusterRelay,
  ClusterStateStore,
  type ClusterMessage,
  type ClusterRelayOptions,
} from '../../src/state/cluster-state-store.js';
import {
  SharedStateUnanswered,
  type WorkerChange,
  type WorkerChangeVerdict,
  type WorkerRecord,
} from '../../src/state/state-store.js';
import { prompt, tiers } from '../helpers/prompts.js';
import { drainAndSettle, drainingAt, workerHost } from '../helpers/state-host.js';
import { settled, until } from '../helpers/wait.js';

/** Gateway processes and the primary's relay in one thread: messages are delivered asynchronously, in order. */
function fleet(
  n: number,
  configured: string[] = ['e0', 'e1'],
  settings: { relay?: ClusterRelayOptions; router?: KVAwareRouterOptions } = {},
) {
  const relay = new ClusterRelay(settings.relay);
  const processes = Array.from({ length: n }, (_, i) => {
    const id = String(i + 1);
    const listeners = new Set<(m: unknown) => void>();
    /** What this process wrote to its channel: one entry per IPC message. */
    const sent: ClusterMessage[] = [];
    // the relay knows the process from its first message (its hello): what was relayed
    // before it listened is not its
    let joined = false;
    const store = new ClusterStateStore({
      replicaId: id,
      channel: {
        send: (m: ClusterMessage) => {
          if (!joined) {
            joined = true;
            relay.add({
              id,
              send: (out) =>
                queueMicrotask(() => {
                  for (const l of listeners) l(structuredClone(out));
                }),
            });
          }
          sent.push(m);
          queueMicrotask(() => relay.receive(id, structuredClone(m)));
        },
        onMessage: (l) => void listeners.add(l),
        offMessage: (l) => void listeners.delete(l),
      },
    });
    const router = new KVAwareRouter({ policy: 'cost', ...settings.router });
    /** KV events posted to another process, as this one was given them. */
    const posted: Array<[string, unknown]> = [];
    const { host, workers, unheldRemovals } = workerHost(router, configured, posted);
    return { id, store, router, host, sent, posted, workers, unheldRemovals };
  });
  return { relay, processes };
}

/** Routes as the gateway does: learn first, then decide and share. */
async function route(p: ReturnType<typeof fleet>['processes'][number], workflowId: string, text: string) {
  await p.store.beforeRoute({ workflowId, text });
  const r = p.router.route({ text, workflowId, workflowStep: 0 }, { share: true });
  p.store.decisionMade(r.shared!);
  return r;
}

/** Lets the in-process relay deliver what is queued (its messages travel one setImmediate). */
const settle = () => new Promise<void>((r) => setImmediate(r));

test('two processes starting one workflow at once end up on the first claim; in-flight load is shared', async () => {
  const {
    relay,
    processes: [a, b],
  } = fleet(2);
  await Promise.all([a.store.attach(a.host), b.store.attach(b.host)]);
  // B is busier on e0, so on its own it picks e1 where A (idle) picks e0
  b.router.route({ text: 'other work', promptTokens: 5000 });
  const [ra, rb] = await Promise.all([
    route(a, 'wf', 'step one of the workflow'),
    route(b, 'wf', 'a different first message'),
  ]);
  assert.notEqual(ra.workerId, rb.workerId, 'the race this test is about');
  // one of them claimed it first; the other follows, and both agree
  assert.equal(
    await settled(
      () => relay.counters.claimsLost,
      (n) => n === 1,
    ),
    1,
  );
  const agree = () => a.router.workflowAffinity('wf')?.workerId === b.router.workflowAffinity('wf')?.workerId;
  await until(agree, 'both processes to follow the winning claim');
  assert.equal(a.router.workflowAffinity('wf')?.workerId, b.router.workflowAffinity('wf')?.workerId);
  // A's tracked request counts on B's view of its worker, and leaves it when released
  const before = b.router.listWorkers().find((w) => w.id === ra.workerId)!.inFlightRequests;
  a.store.decisionEnded(ra.shared!);
  const onB = () => b.router.listWorkers().find((w) => w.id === ra.workerId)!.inFlightRequests;
  assert.equal(await settled(onB, (n) => n === before - 1), before - 1);
});

test('lookups never followed by a decision do not stop later workflows being claimed', async () => {
  const {
    relay,
    processes: [a, b],
  } = fleet(2);
  await Promise.all([a.store.attach(a.host), b.store.attach(b.host)]);
  // requests that looked their workflow up and then were not routed (no worker, client gone)
  for (let batch = 0; batch < 101; batch++)
    await Promise.all(
      Array.from({ length: 1000 }, (_, i) => a.store.beforeRoute({ workflowId: `lost-${batch}-${i}`, text: 'x' })),
    );
  // both look the new workflow up before either has claimed it; B claims it first
  await Promise.all([
    a.store.beforeRoute({ workflowId: 'wf', text: 'x' }),
    b.store.beforeRoute({ workflowId: 'wf', text: 'x' }),
  ]);
  const rb = b.router.route({ text: 'first step', workflowId: 'wf', workflowStep: 0 }, { share: true });
  b.store.decisionMade(rb.shared!);
  await until(() => a.router.workflowAffinity('wf') !== undefined, "A to hear B's claim");
  const ra = a.router.route({ text: 'first step', workflowId: 'wf', workflowStep: 0 }, { share: true });
  a.store.decisionMade(ra.shared!);
  assert.equal(
    await settled(
      () => relay.counters.claimsLost,
      (n) => n === 1,
    ),
    1,
    "A's decision claims the workflow, and loses it to B's",
  );
});

test("a process that starts late gets the workflows, blocks and load from the relay; a stopped one's load is dropped", async () => {
  const {
    relay,
    processes: [a, b],
  } = fleet(2);
  await a.store.attach(a.host);
  const prompt = 'the long shared system prompt of a late workflow. '.repeat(20);
  const r = await route(a, 'wf-late', prompt);
  await settle();
  await b.store.attach(b.host);
  assert.equal(b.router.workflowAffinity('wf-late')?.workerId, r.workerId);
  const onB = b.router.route({ text: prompt }, { dryRun: true });
  assert.equal(onB.workerId, r.workerId);
  assert.ok(onB.cachedTokens > 0, 'the blocks A recorded are known to B');
  const worker = () => b.router.listWorkers().find((w) => w.id === r.workerId)!.inFlightRequests;
  assert.equal(worker(), 1);
  relay.remove(a.id);
  assert.equal(await settled(worker, (n) => n === 0), 0);
  assert.equal(b.store.stats().kind, 'cluster');
});

/**
 * A gateway process as the primary starts one: added to the relay when it is forked, before it
 * says hello, so what the others decide meanwhile is relayed to it before its snapshot (which
 * holds it too). With `inbox`, what the relay sends it waits there until the test delivers it.
 */
function connect(relay: ClusterRelay, id: string, inbox?: unknown[]) {
  const listeners = new Set<(m: unknown) => void>();
  relay.add({
    id,
    send: (m) => (inbox ? inbox.push(structuredClone(m)) : queueMicrotask(() => deliver(m))),
  });
  const deliver = (m: unknown) => {
    for (const l of listeners) l(structuredClone(m));
  };
  const store = new ClusterStateStore({
    replicaId: id,
    timeoutMs: 20,
    channel: {
      send: (m) => relay.receive(id, structuredClone(m)),
      onMessage: (l) => void listeners.add(l),
      offMessage: (l) => void listeners.delete(l),
    },
  });
  const router = new KVAwareRouter({ policy: 'cost' });
  return { store, router, host: workerHost(router, ['e0', 'e1']).host, deliver };
}

test('a process that starts while others route counts each of their requests once: relayed before its snapshot, and in it', async () => {
  const relay = new ClusterRelay();
  const a = connect(relay, '1');
  /** What the relay sent the starting process, delivered when the test says. */
  const inbox: unknown[] = [];
  const b = connect(relay, '2', inbox);
  await a.store.attach(a.host);
  const r = a.router.route(
    { text: 'a request routed while another process starts', promptTokens: 400 },
    { share: true },
  );
  a.store.decisionMade(r.shared!);
  await until(() => relay.counters.relayed > 0, "the relay to take A's decision");
  const attached = b.store.attach(b.host); // listens, then says hello: the decision comes first, then the snapshot
  for (const m of inbox.splice(0)) b.deliver(m);
  await attached;
  const onB = () => {
    const w = b.router.listWorkers().find((x) => x.id === r.workerId)!;
    return [w.inFlightRequests, w.queuedPrefillTokens];
  };
  assert.deepEqual(onB(), [1, 400]);
  a.router.release(r.ticket);
  a.store.decisionEnded(r.shared!);
  await until(() => inbox.length > 0, "the relay to pass on A's release");
  for (const m of inbox.splice(0)) b.deliver(m);
  assert.deepEqual(onB(), [0, 0]);
  // A dies with a request in flight: B drops it, and what A sent that reaches the primary after its exit is not relayed
  const again = a.router.route({ text: 'a request A never ends', promptTokens: 400 }, { share: true });
  a.store.decisionMade(again.shared!);
  await until(() => inbox.length > 0, "the relay to pass on A's second decision");
  for (const m of inbox.splice(0)) b.deliver(m);
  const onAgain = () => b.router.listWorkers().find((x) => x.id === again.workerId)!.inFlightRequests;
  assert.equal(onAgain(), 1);
  relay.remove('1');
  await until(() => inbox.length > 0, 'the relay to say A is gone');
  for (const m of inbox.splice(0)) b.deliver(m);
  assert.equal(onAgain(), 0);
  const relayed = relay.counters.relayed;
  a.store.decisionMade(a.router.route({ text: 'sent as A was killed' }, { share: true }).shared!);
  await settle();
  await settle();
  assert.equal(relay.counters.relayed, relayed);
  assert.equal(onAgain(), 0);
  await Promise.all([a.store.close(), b.store.close()]);
});

test('a decision relayed to a starting process before its snapshot is applied once there, so its refusal withdraws it', async () => {
  const relay = new ClusterRelay();
  const a = connect(relay, '1');
  const inbox: unknown[] = [];
  const b = connect(relay, '2', inbox);
  await a.store.attach(a.host);
  const tokens = prompt(41, 4);
  const d = a.router.route({ tokens }, { share: true });
  a.store.decisionMade(d.shared!);
  await until(() => inbox.length > 0, "the relay to pass on A's decision");
  const attached = b.store.attach(b.host);
  for (const m of inbox.splice(0)) b.deliver(m); // the decision, then the snapshot that holds it too
  await attached;
  assert.deepEqual(tiers(b.router, d.workerId, tokens), Array(4).fill('predicted'));
  assert.equal(b.store.stats().decisionsApplied, 1);
  // A's engine refuses it: B withdraws what it alone added (applied a second time, without its
  // id, the snapshot's copy would have taken those blocks over, and they would stay)
  a.router.markRefused(d.ticket);
  a.store.decisionRefused(d.shared!);
  await until(() => inbox.length > 0, "the relay to pass on A's refusal");
  for (const m of inbox.splice(0)) b.deliver(m);
  assert.deepEqual(tiers(b.router, d.workerId, tokens), Array(4).fill(null));
  assert.equal(b.store.stats().refusalsWithdrawn, 1);
  await Promise.all([a.store.close(), b.store.close()]);
});

test('a decision relayed to a starting process before it knew the worker is applied from its snapshot', async () => {
  const relay = new ClusterRelay();
  const a = connect(relay, '1');
  const inbox: unknown[] = [];
  const b = connect(relay, '2', inbox);
  await a.store.attach(a.host);
  a.router.registerWorker('e2');
  a.store.workerAdded({ id: 'e2', url: 'http://e2' });
  await until(() => inbox.length > 0, "the relay to pass on A's worker");
  inbox.length = 0; // relayed before B listened: B learns of e2 from its snapshot
  a.router.drainWorker('e0');
  a.router.drainWorker('e1');
  const tokens = prompt(42, 3);
  const d = a.router.route({ tokens }, { share: true });
  assert.equal(d.workerId, 'e2');
  a.store.decisionMade(d.shared!);
  await until(() => inbox.length > 0, "the relay to pass on A's decision");
  const attached = b.store.attach(b.host);
  for (const m of inbox.splice(0)) b.deliver(m); // the decision on a worker B lacks, then the snapshot
  await attached;
  assert.deepEqual(tiers(b.router, 'e2', tokens), Array(3).fill('predicted'));
  assert.equal(b.store.stats().decisionsApplied, 1);
  await Promise.all([a.store.close(), b.store.close()]);
});

test("messages that are not the relay's are ignored", async () => {
  const {
    processes: [a],
  } = fleet(1);
  await a.store.attach(a.host);
  const relay = new ClusterRelay();
  relay.add({ id: 'x', send: () => {} });
  relay.receive('x', { hello: 1 });
  relay.receive('x', null);
  relay.receive('unknown', { cf: 'hello', r: 'unknown' });
  assert.equal(relay.counters.relayed, 0);
});

test("B's view of A's request moves from queued prefill to decode on A's prefill-done, and a late process gets both", async () => {
  const {
    processes: [a, b, c],
  } = fleet(3);
  await Promise.all([a.store.attach(a.host), b.store.attach(b.host)]);
  const waiting = a.router.route({ text: 'still waiting for its first token', promptTokens: 300 }, { share: true });
  const r = a.router.route({ text: 'a request about to get its first token', promptTokens: 700 }, { share: true });
  a.store.decisionMade(waiting.shared!);
  a.store.decisionMade(r.shared!);
  const on = (p: typeof b, id: string) => {
    const w = p.router.listWorkers().find((x) => x.id === id)!;
    return [w.inFlightRequests, w.queuedPrefillTokens, w.activeDecodeTokens];
  };
  const onB = (expected: number[]) =>
    settled(
      () => on(b, r.workerId),
      (v) => v.every((x, i) => x === expected[i]),
    );
  const both = waiting.workerId === r.workerId;
  const queued = both ? [2, 1000, 0] : [1, 700, 0];
  assert.deepEqual(await onB(queued), queued);
  a.router.markPrefillDone(r.ticket);
  a.store.decisionPrefilled(r.shared!);
  const decoding = both ? [2, 300, 700] : [1, 0, 700];
  assert.deepEqual(await onB(decoding), decoding);
  // a process that starts now learns the same split from the relay's snapshot
  await c.store.attach(c.host);
  assert.deepEqual(on(c, r.workerId), on(b, r.workerId));
  a.router.release(r.ticket);
  a.store.decisionEnded(r.shared!);
  const released = both ? [1, 300, 0] : [0, 0, 0];
  assert.deepEqual(await onB(released), released);
  const onC = await settled(
    () => on(c, r.workerId),
    (v) => v.every((x, i) => x === released[i]),
  );
  assert.deepEqual(onC, released);
});

test("one turn's decisions and releases cross the channel as one message, and each is applied", async () => {
  const {
    relay,
    processes: [a, b],
  } = fleet(2);
  await Promise.all([a.store.attach(a.host), b.store.attach(b.host)]);
  await settle();
  a.sent.length = 0;
  const relayed = relay.counters.relayed;
  const decisions = Array.from({ length: 5 }, (_, i) => {
    const r = a.router.route({ text: `request ${i} `.repeat(40) }, { share: true });
    a.store.decisionMade(r.shared!);
    return r;
  });
  a.store.decisionEnded(decisions[0].shared!);
  await settle();
  await settle();
  assert.equal(a.sent.length, 1);
  assert.equal(a.sent[0].cf, 'batch');
  assert.equal(b.store.stats().decisionsApplied, 5);
  assert.equal(relay.counters.relayed - relayed, 6);
  // B sees A's four requests still in flight
  const inFlight = b.router.listWorkers().reduce((n, w) => n + w.inFlightRequests, 0);
  assert.equal(inFlight, 4);
});

test("A's refused request withdraws at B what B applied of it, and a process that starts later does not get it", async () => {
  const {
    processes: [a, b, c],
  } = fleet(3);
  await Promise.all([a.store.attach(a.host), b.store.attach(b.host)]);
  const heldBy = (p: typeof b, workerId: string, tokens: number[]) => tiers(p.router, workerId, tokens);
  /** A routes and shares the request; B has applied it. */
  const routed = async (tokens: number[]) => {
    const d = a.router.route({ tokens }, { share: true });
    a.store.decisionMade(d.shared!);
    const atB = await settled(
      () => heldBy(b, d.workerId, tokens),
      (t) => t.every((x) => x === 'predicted'),
    );
    assert.deepEqual(atB, Array(atB.length).fill('predicted'));
    return d;
  };
  /** A's engine refused it; B has withdrawn it. */
  const refused = async (d: Awaited<ReturnType<typeof routed>>, tokens: number[]) => {
    a.router.markRefused(d.ticket);
    a.store.decisionRefused(d.shared!);
    const atB = await settled(
      () => heldBy(b, d.workerId, tokens),
      (t) => t.every((x) => x === null),
    );
    assert.deepEqual(atB, Array(atB.length).fill(null));
  };
  const first = await routed(prompt(31, 5));
  const kept = await routed(prompt(32, 4));
  a.router.markPrefillDone(kept.ticket);
  a.store.decisionPrefilled(kept.shared!);
  await refused(first, prompt(31, 5));
  assert.deepEqual(heldBy(b, kept.workerId, prompt(32, 4)), Array(4).fill('predicted'));
  // the relay's snapshot for a process that starts now leaves the refused decision out
  await c.store.attach(c.host);
  assert.deepEqual(heldBy(c, first.workerId, prompt(31, 5)), Array(5).fill(null));
  assert.deepEqual(heldBy(c, kept.workerId, prompt(32, 4)), Array(4).fill('predicted'));
  // past its first token a decision is settled at B: a refusal named later withdraws nothing
  // (messages arrive in order: once the next refusal is applied, so is this one)
  a.store.decisionRefused(kept.shared!);
  await refused(await routed(prompt(33, 3)), prompt(33, 3));
  assert.deepEqual(heldBy(b, kept.workerId, prompt(32, 4)), Array(4).fill('predicted'));
  assert.equal(b.store.stats().refusalsWithdrawn, 2);
});

const drained = (p: ReturnType<typeof fleet>['processes'][number]) => drainingAt(p.router);

test('a drain or resume on one process reaches the others and a process that starts later', async () => {
  const {
    processes: [a, b, c],
  } = fleet(3);
  await Promise.all([a.store.attach(a.host), b.store.attach(b.host)]);
  assert.deepEqual(await drainAndSettle(a, b, 'e1'), ['e1']);
  await c.store.attach(c.host);
  assert.deepEqual(drained(c), ['e1'], 'the relay keeps which workers are draining');
  b.router.resumeWorker('e1');
  b.store.workerDrained('e1', false);
  for (const p of [a, c])
    assert.deepEqual(
      await settled(
        () => drained(p),
        (d) => d.length === 0,
      ),
      [],
    );
});

test('KV events posted to one process are given to every other', async () => {
  const {
    processes: [a, b, c],
  } = fleet(3);
  await Promise.all([a.store.attach(a.host), b.store.attach(b.host), c.store.attach(c.host)]);
  const events = [{ type: 'AllBlocksCleared' }];
  a.store.kvEventsPosted('e0', events);
  for (const p of [b, c])
    assert.deepEqual(
      await settled(
        () => p.posted,
        (x) => x.length > 0,
      ),
      [['e0', events]],
    );
  assert.deepEqual(a.posted, [], 'not back to the process that applied them');
});

test('a removed worker stays removed for a process that (re)starts with it configured; a new one it announces', async () => {
  const {
    processes: [a, b, c],
  } = fleet(3, ['e0', 'e1']);
  await a.store.attach(a.host);
  a.host.removeWorkerFromState('e1');
  a.store.workerRemoved('e1');
  a.router.drainWorker('e0');
  a.store.workerDrained('e0', true);
  await settle();
  // B starts (a replacement for a process that crashed) with e1 in its flags, and e2 besides
  b.workers.push({ id: 'e2', url: 'http://e2' });
  b.router.registerWorker('e2');
  await b.store.attach(b.host);
  assert.deepEqual(
    b.workers.map((w) => w.id),
    ['e0', 'e2'],
    'e1 was removed: it is not back',
  );
  assert.deepEqual(drained(b), ['e0']);
  assert.deepEqual(
    await settled(
      () => a.workers.map((w) => w.id),
      (ids) => ids.includes('e2'),
    ),
    ['e0', 'e2'],
    'what B added is announced',
  );
  // added again after its removal: a process that starts later keeps it
  a.host.addWorkerFromState({ id: 'e1', url: 'http://e1' });
  a.store.workerAdded({ id: 'e1', url: 'http://e1' });
  await settle();
  await c.store.attach(c.host);
  assert.deepEqual(c.workers.map((w) => w.id).sort(), ['e0', 'e1', 'e2']);
});

test('the relay keeps only admin removals, for a day, and forgets the oldest past its bound', () => {
  let now = 0;
  const relay = new ClusterRelay({ removals: 2 }, () => now);
  const snapshots: ClusterMessage[] = [];
  relay.add({ id: 'a', send: () => {} });
  relay.add({ id: 'late', send: (m) => void snapshots.push(m) });
  const removedAtStart = () => {
    relay.receive('late', { cf: 'hello', r: 'late' });
    let s = snapshots.pop(); // after the removals relayed to it, in one batch
    if (s?.cf === 'batch') s = s.m.at(-1);
    assert.equal(s?.cf, 'snapshot');
    return s.cf === 'snapshot' ? s.removed : undefined;
  };
  relay.receive('a', { cf: 'worker-removed', r: 'a', id: 'gone-from-dns', record: false });
  assert.deepEqual(removedAtStart(), [], "discovery's removal is not kept");
  for (const id of ['r1', 'r2', 'r3']) relay.receive('a', { cf: 'worker-removed', r: 'a', id });
  assert.deepEqual(removedAtStart(), ['r2', 'r3'], 'the oldest forgotten past the bound, the newest kept');
  now = 12 * 3_600_000;
  relay.receive('a', { cf: 'worker-removed', r: 'a', id: 'r2' }); // removed again (after being added back)
  now = 25 * 3_600_000;
  assert.deepEqual(removedAtStart(), ['r2'], 'a removal recorded more than a day ago is forgotten');
});

test("the relay replays to a starting process only decisions younger than that process's prediction lifetime", () => {
  let now = 0;
  const relay = new ClusterRelay({}, () => now);
  const snapshots: ClusterMessage[] = [];
  relay.add({ id: 'a', send: () => {} });
  relay.add({ id: 'late', send: (m) => void snapshots.push(m) });
  const replayed = (ttl?: number) => {
    relay.receive('late', { cf: 'hello', r: 'late', ...(ttl === undefined ? {} : { ttl }) });
    let s = snapshots.pop();
    if (s?.cf === 'batch') s = s.m.at(-1);
    assert.equal(s?.cf, 'snapshot');
    return s.cf === 'snapshot' ? s.decisions.length : -1;
  };
  const block = { hi: new Uint32Array([1]), lo: new Uint32Array([2]) };
  relay.receive('a', { cf: 'decision', r: 'a', w: 'e0', ...block });
  now = 10_000;
  // a precise-mode process (5 s) would record it for 5 s more, where its maker dropped it 5 s ago
  assert.equal(replayed(5_000), 0);
  assert.equal(replayed(120_000), 1, 'an approximate-mode process still takes it');
  assert.equal(replayed(), 1, 'a process that says nothing of its lifetime: the relay keeps it 120 s');
  now = 130_000;
  assert.equal(replayed(200_000), 0, 'never past what the relay keeps');
});

test("a process tells the relay its router's prediction lifetime when it starts", async () => {
  const sent: ClusterMessage[] = [];
  const relay = new ClusterRelay();
  let listener: ((m: unknown) => void) | undefined;
  relay.add({ id: 'p', send: (m) => queueMicrotask(() => listener?.(m)) });
  const store = new ClusterStateStore({
    replicaId: 'p',
    channel: {
      send: (m) => {
        sent.push(m);
        relay.receive('p', m);
      },
      onMessage: (l) => void (listener = l),
      offMessage: () => void (listener = undefined),
    },
  });
  const router = new KVAwareRouter({ indexMode: 'precise' });
  await store.attach(workerHost(router, ['e0']).host);
  assert.deepEqual(sent[0], { cf: 'hello', r: 'p', ttl: 5_000 });
  assert.equal(router.predictionTtlMs, 5_000);
  assert.equal(new KVAwareRouter().predictionTtlMs, 120_000);
  assert.equal(new KVAwareRouter({ predictionTtlMs: 777 }).predictionTtlMs, 777);
  await store.close();
});

test('the relay counts and drops what a process sends malformed, as the Redis channel does; the rest still works', async () => {
  const {
    relay,
    processes: [a, b],
  } = fleet(2);
  await Promise.all([a.store.attach(a.host), b.store.attach(b.host)]);
  const blocks = { hi: Uint32Array.of(1, 2), lo: Uint32Array.of(3, 4) };
  const bad: unknown[] = [
    { cf: 'decision', r: a.id, w: 'x'.repeat(257), ...blocks, q: 10 },
    { cf: 'decision', r: a.id, w: '\uD800', ...blocks },
    { cf: 'decision', r: a.id, w: 'e0', q: 10 }, // no blocks: the relay read hi.length of nothing
    { cf: 'decision', r: a.id, w: 'e0', hi: Uint32Array.of(1), lo: Uint32Array.of(1, 2) },
    { cf: 'decision', r: a.id, w: 'e0', ...blocks, q: -1 },
    { cf: 'decision', r: a.id, w: 'e0', ...blocks, wf: { a: 1 } },
    { cf: 'decision', r: a.id, w: 'e0', ...blocks, wf: 'wf-bad', s: 1.5 },
    { cf: 'decision', r: a.id, w: 'e0', ...blocks, q: 10, a: '' },
    { cf: 'decision', r: a.id, w: 'e0', ...blocks, q: 10, a: 'anchor', c: -1 },
    { cf: 'decision', r: a.id, w: 'e0', ...blocks, q: 10, ca: 'passages' },
    { cf: 'decision', r: a.id, w: 'e0', ...blocks, q: 10, ca: [{ id: 'p', tokens: 1.5 }] },
    { cf: 'decision', r: a.id, w: 'e0', ...blocks, q: 10, ca: [null] },
    { cf: 'decision', r: b.id, w: 'e0', ...blocks, q: 10 }, // in another process's name
    { cf: 'prefilled', r: a.id, w: 'e0', q: 10, d: Number.NaN },
    { cf: 'released', r: a.id, w: 'e0', q: 2 ** 41 },
    { cf: 'refused', r: a.id, w: 'e0', i: 5 },
    { cf: 'worker-added', r: a.id, worker: { id: '', url: 'http://x' } },
    { cf: 'worker-removed', r: a.id, id: 7 },
    { cf: 'worker-drained', r: a.id, id: 'e0', draining: 'yes' },
    { cf: 'kv-events', r: a.id, w: null, events: [] },
    { cf: 'workflow?', r: a.id, q: 1, id: '' },
    { cf: 'hello', r: a.id, ttl: Number.NaN },
    { cf: 'batch', m: 'not a list' },
  ];
  for (const m of bad) relay.receive(a.id, m);
  assert.equal(relay.counters.malformed, bad.length);
  assert.equal(relay.counters.relayed, 0);
  await settle();
  const e0 = () => b.router.listWorkers().find((w) => w.id === 'e0')!;
  assert.equal(e0().inFlightRequests, 0);
  assert.equal(b.router.getStats().index.entries, 0);
  assert.equal(b.router.workflowAffinity('wf-bad'), undefined);
  assert.deepEqual(drainingAt(b.router), []);
  assert.equal(b.store.stats().malformedMessages, 0, 'nothing malformed relayed');
  // a well-formed one still goes through
  relay.receive(a.id, { cf: 'decision', r: a.id, w: 'e0', ...blocks, q: 10 });
  await settle();
  assert.equal(e0().inFlightRequests, 1);
  assert.equal(b.router.getStats().index.entries, 2);
});

test('the relay counts no load of a decision the processes drop as malformed: a process that starts later sees none', async () => {
  const {
    relay,
    processes: [a, b, c],
  } = fleet(3);
  await Promise.all([a.store.attach(a.host), b.store.attach(b.host)]);
  const blocks = { hi: Uint32Array.of(1, 2), lo: Uint32Array.of(3, 4) };
  // its content anchors are not { id, tokens }: B's router refuses it, as would every process's
  relay.receive(a.id, { cf: 'decision', r: a.id, w: 'e0', ...blocks, q: 10, ca: [{ id: '', tokens: 5 }] });
  relay.receive(a.id, { cf: 'decision', r: a.id, w: 'e1', ...blocks, q: 20 });
  const e = (p: typeof b, id: string) => p.router.listWorkers().find((w) => w.id === id)!.inFlightRequests;
  assert.equal(
    await settled(
      () => e(b, 'e1'),
      (n) => n === 1,
    ),
    1,
  );
  assert.equal(relay.counters.malformed, 1);
  await c.store.attach(c.host);
  assert.deepEqual([e(c, 'e0'), e(c, 'e1')], [e(b, 'e0'), e(b, 'e1')]);
  assert.deepEqual([e(c, 'e0'), e(c, 'e1')], [0, 1]);
  assert.equal(b.store.stats().malformedMessages, 0, 'nothing malformed relayed');
  assert.equal(c.store.stats().malformedMessages, 0, 'nor replayed');
});

test('a process counts and drops what the relay passes on malformed; a start snapshot keeps its well-formed entries', async () => {
  const listeners = new Set<(m: unknown) => void>();
  const store = new ClusterStateStore({
    replicaId: '9',
    timeoutMs: 20,
    channel: { send: () => {}, onMessage: (l) => void listeners.add(l), offMessage: (l) => void listeners.delete(l) },
  });
  const router = new KVAwareRouter({ policy: 'cost' });
  const { host } = workerHost(router, ['e0', 'e1']);
  const attached = store.attach(host);
  const deliver = (m: unknown) => {
    for (const l of listeners) l(structuredClone(m));
  };
  const blocks = { hi: Uint32Array.of(1, 2), lo: Uint32Array.of(3, 4) };
  deliver({
    cf: 'snapshot',
    workers: [
      { id: 'x'.repeat(257), url: 'http://x' },
      { id: 'e2', url: 'http://e2' },
    ],
    workflows: [
      ['wf-good', 'e1', 2],
      ['wf-bad', 'e1', -1],
      ['', 'e1', null],
    ],
    decisions: [
      { cf: 'decision', r: '1', w: 'e0', ...blocks },
      { cf: 'decision', r: '1', w: 'e0', hi: 'no' },
      { cf: 'decision', r: '1', w: 'e0', ...blocks, ca: 'passages' },
    ],
    loads: [
      ['1', 'e0', 2, 20, 0],
      ['1', '\uD800', 2, 20, 0],
      ['1', 'e1', '2', 20, 0],
    ],
    draining: ['e1', 5],
    removed: [null],
  });
  await attached;
  // a worker, two workflows, two decisions, two loads, a drain, a removal
  const malformedAtStart = 9;
  assert.equal(store.stats().malformedMessages, malformedAtStart);
  assert.deepEqual(
    router.listWorkers().map((w) => w.id),
    ['e0', 'e1', 'e2'],
  );
  assert.deepEqual(router.workflowAffinity('wf-good'), { workerId: 'e1', step: 2 });
  assert.equal(router.workflowAffinity('wf-bad'), undefined);
  assert.equal(router.getStats().index.entries, 2);
  const on = (id: string) => router.listWorkers().find((w) => w.id === id)!;
  assert.equal(on('e0').inFlightRequests, 2);
  assert.equal(on('e1').inFlightRequests, 0);
  assert.deepEqual(drainingAt(router), ['e1']);
  // messages after the start, alone and in a batch
  const bad: unknown[] = [
    { cf: 'prefilled', r: '1', w: 'e0', q: -5, d: 1 },
    { cf: 'released', r: '1', w: 'x'.repeat(300), q: 1 },
    { cf: 'released', r: '1', w: 'e0', q: 1, d: Number.POSITIVE_INFINITY },
    { cf: 'worker-removed', r: '1', id: { id: 'e0' } },
    { cf: 'worker-drained', r: '1', id: 'e0', draining: 1 },
    { cf: 'workflow', q: 0, id: 'wf-x', w: '' },
    { cf: 'gone', r: 3 },
  ];
  deliver({ cf: 'batch', m: [...bad, 'not a message'] });
  for (const m of bad) deliver(m);
  await settle();
  assert.equal(store.stats().malformedMessages, malformedAtStart + 2 * bad.length + 1);
  assert.equal(on('e0').inFlightRequests, 2);
  assert.equal(on('e0').queuedPrefillTokens, 20);
  assert.deepEqual(drainingAt(router), ['e1']);
  assert.equal(router.workflowAffinity('wf-x'), undefined);
  // a well-formed release still counts
  deliver({ cf: 'released', r: '1', w: 'e0', q: 10 });
  assert.equal(on('e0').inFlightRequests, 1);
  await store.close();
});

/** The relay's start snapshot for a process that says hello now (after what was relayed to it before). */
function snapshotOf(relay: ClusterRelay, to: string, sent: ClusterMessage[]) {
  relay.receive(to, { cf: 'hello', r: to });
  let s = sent.pop();
  if (s?.cf === 'batch') s = s.m.at(-1);
  assert.equal(s?.cf, 'snapshot');
  return s as Extract<ClusterMessage, { cf: 'snapshot' }>;
}

test("the relay counts and drops a decision longer than the processes' routers take, before any of it counts", async () => {
  // 64 tokens at most: 4 blocks of 16 (the routers' block size), 8 on a worker of 8-token blocks
  const settings = { relay: { maxPromptTokens: 64, blockSize: 16 }, router: { maxPromptTokens: 64, blockSize: 16 } };
  const {
    relay,
    processes: [a, b, c],
  } = fleet(3, ['e0', 'e1'], settings);
  await Promise.all([a.store.attach(a.host), b.store.attach(b.host)]);
  await settle(); // the workers they announce reach the relay
  await settle();
  const blocks = (n: number) => ({ hi: new Uint32Array(n).fill(1), lo: new Uint32Array(n).fill(2) });
  const send = (m: ClusterMessage) => relay.receive(a.id, m);
  send({ cf: 'decision', r: a.id, w: 'e0', ...blocks(5), q: 10, wf: 'wf-long', s: 0 });
  send({ cf: 'decision', r: a.id, w: 'e1', ...blocks(4), q: 20 });
  const inFlight = (p: typeof b, id: string) => p.router.listWorkers().find((w) => w.id === id)!.inFlightRequests;
  assert.equal(
    await settled(
      () => inFlight(b, 'e1'),
      (x) => x === 1,
    ),
    1,
  );
  assert.equal(relay.counters.tooLong, 1);
  assert.equal(b.store.stats().malformedMessages, 0, 'not relayed');
  await c.store.attach(c.host);
  assert.deepEqual([inFlight(c, 'e0'), inFlight(c, 'e1')], [0, 1], 'nor its load kept for a process that starts later');
  assert.equal(c.store.stats().malformedMessages, 0, 'nor its blocks');
  assert.equal(c.router.workflowAffinity('wf-long'), undefined, 'nor its workflow claimed');

  // the bound is the worker's: its own block size, a rank's its worker's; the smallest block
  // (1 token) for a worker the relay was not told of
  const sent: ClusterMessage[] = [];
  const solo = new ClusterRelay({ maxPromptTokens: 64, blockSize: 16 });
  solo.add({ id: 'a', send: () => {} });
  solo.add({ id: 'late', send: (m) => void sent.push(m) });
  solo.receive('a', { cf: 'worker-added', r: 'a', worker: { id: 'e0', url: 'http://e0' } });
  solo.receive('a', { cf: 'worker-added', r: 'a', worker: { id: 'e1', url: 'http://e1', blockSize: 8 } });
  solo.receive('a', {
    cf: 'worker-added',
    r: 'a',
    worker: { id: 'dp', url: 'http://dp', dpSize: 2, blockSize: 32 },
  });
  for (const [w, most] of [
    ['e0', 4],
    ['e1', 8],
    ['dp#1', 2],
    ['unknown', 64],
  ] as const) {
    solo.receive('a', { cf: 'decision', r: 'a', w, ...blocks(most), q: 1 });
    solo.receive('a', { cf: 'decision', r: 'a', w, ...blocks(most + 1), q: 1 });
  }
  assert.equal(solo.counters.tooLong, 4);
  const s = snapshotOf(solo, 'late', sent);
  assert.deepEqual(
    s.decisions.map((d) => [d.w, d.hi.length]),
    [
      ['e0', 4],
      ['e1', 8],
      ['dp#1', 2],
      ['unknown', 64],
    ],
  );
  assert.deepEqual(
    s.loads.map(([, w, requests]) => [w, requests]),
    [
      ['e0', 1],
      ['e1', 1],
      ['dp#1', 1],
      ['unknown', 1],
    ],
  );
  await Promise.all([a.store.close(), b.store.close(), c.store.close()]);
});

test('the relay keeps, and passes on, only a worker record a gateway would accept', () => {
  const sent: ClusterMessage[] = [];
  const relay = new ClusterRelay();
  relay.add({ id: 'a', send: () => {} });
  relay.add({ id: 'b', send: () => {} });
  relay.add({ id: 'late', send: (m) => void sent.push(m) });
  relay.receive('a', { cf: 'worker-removed', r: 'a', id: 'e9' });
  assert.equal(relay.counters.relayed, 2);
  const bad: unknown[] = [
    { id: 'e9' }, // no URL
    { id: 'e9', url: 'ftp://e9' },
    { id: 'e9', url: 'http://e9/v1' }, // a path
    { id: 'e9', url: 'http://e9', dpSize: 0 },
    { id: 'e9', url: 'http://e9', blockSize: 1.5 },
    { id: 'e9', url: 'http://e9', apiKeyEnv: 'CONTEXTFORGE_ADMIN_TOKEN' },
    { id: 'e9', url: 'http://e9', replay: 'tcp://e9:5558' }, // a replay without events
    { id: 'e9', url: 'http://e9', shard: 1 }, // a field no worker has
    { id: 'e 9', url: 'http://e9' }, // an id the gateway does not take
  ];
  for (const worker of bad) relay.receive('a', { cf: 'worker-added', r: 'a', worker } as ClusterMessage);
  assert.equal(relay.counters.workersRefused, bad.length);
  assert.equal(relay.counters.relayed, 2, 'none passed on');
  const s = snapshotOf(relay, 'late', sent);
  assert.deepEqual(s.workers, []);
  assert.deepEqual(s.removed, ['e9'], 'the removal stays');
  relay.receive('a', { cf: 'worker-added', r: 'a', worker: { id: 'e9', url: 'http://e9', blockSize: 8 } });
  const after = snapshotOf(relay, 'late', sent);
  assert.deepEqual(after.workers, [{ id: 'e9', url: 'http://e9', blockSize: 8 }]);
  assert.deepEqual(after.removed, []);
  assert.equal(relay.counters.workersRefused, bad.length);
});

test("the relay keeps at most a router's workers and drained workers: past that it counts, and logs once", () => {
  const sent: ClusterMessage[] = [];
  const logs: string[] = [];
  const relay = new ClusterRelay({ log: (m) => logs.push(m) });
  relay.add({ id: 'a', send: () => {} });
  relay.add({ id: 'late', send: (m) => void sent.push(m) });
  const add = (id: string, more: object = {}) =>
    relay.receive('a', { cf: 'worker-added', r: 'a', worker: { id, url: `http://${id}`, ...more } });
  // each data-parallel rank is one of the router's workers, as the gateway counts them
  add('dp', { dpSize: 4 });
  for (let i = 0; i < MAX_WORKERS - 5; i++) add(`w${i}`);
  add('dp2', { dpSize: 2 }); // 2 ranks where one is left
  assert.equal(relay.counters.refusedPastBound, 1);
  add('last');
  const relayed = relay.counters.relayed;
  add('one-more');
  assert.equal(relay.counters.relayed, relayed, 'not passed on: no process would take it');
  add('w0', { blockSize: 8 }); // the same worker again replaces its record
  add('dp', { dpSize: 2 }); // with fewer ranks: room for one more
  add('one-more');
  assert.equal(relay.counters.refusedPastBound, 2);
  const s = snapshotOf(relay, 'late', sent);
  assert.equal(s.workers.length, MAX_WORKERS - 5 + 3);
  assert.deepEqual(
    s.workers.filter((w) => ['w0', 'dp', 'dp2', 'one-more'].includes(w.id)),
    [
      { id: 'dp', url: 'http://dp', dpSize: 2 },
      { id: 'w0', url: 'http://w0', blockSize: 8 },
      { id: 'one-more', url: 'http://one-more' },
    ],
  );
  // drains: of at most as many workers
  const drain = (id: string, draining = true) => relay.receive('a', { cf: 'worker-drained', r: 'a', id, draining });
  for (let i = 0; i < MAX_WORKERS; i++) drain(`d${i}`);
  const drains = relay.counters.relayed;
  drain('d-past');
  assert.equal(relay.counters.relayed, drains + 1, 'passed on: a process with the worker drains it');
  drain('d0'); // already kept
  assert.equal(relay.counters.refusedPastBound, 3);
  drain('d1', false);
  drain('d-past');
  assert.equal(relay.counters.refusedPastBound, 3);
  const d = snapshotOf(relay, 'late', sent).draining!;
  assert.equal(d.length, MAX_WORKERS);
  assert.ok(d.includes('d-past') && !d.includes('d1'));
  assert.equal(logs.length, 2, `one line for the workers, one for the drains: ${logs.join(' | ')}`);
});

/** A process's admin worker change as the gateway makes it: decided by the relay, applied here as the verdict comes. */
function adminChange(p: ReturnType<typeof fleet>['processes'][number], change: WorkerChange) {
  return p.store.orderWorkerChange(change, (v: WorkerChangeVerdict) => {
    if (!v.ok) return v;
    if (change.op === 'add') p.host.addWorkerFromState(change.worker);
    else if (change.op === 'remove') p.host.removeWorkerFromState(v.id);
    else p.host.drainWorkerFromState!(v.id, change.draining);
    return v;
  });
}

/** What a process holds: its workers (id → url) and those draining. */
function viewOf(p: ReturnType<typeof fleet>['processes'][number]) {
  return {
    workers: Object.fromEntries(p.workers.map((w) => [w.id, w.url]).sort()),
    draining: drainingAt(p.router).sort(),
  };
}

/** The relay's registry, as a process that starts gets it. */
function registryOf(relay: ClusterRelay, spy: ClusterMessage[]) {
  const s = snapshotOf(relay, 'spy', spy);
  return {
    workers: Object.fromEntries(s.workers.map((w: WorkerRecord) => [w.id, w.url]).sort()),
    draining: [...(s.draining ?? [])].sort(),
  };
}

test('racing admin adds of one id: the relay decides, one is made and one conflicts, and every process holds the winner', async () => {
  const { relay, processes } = fleet(3, ['e0']);
  const [a, b, c] = processes;
  const spy: ClusterMessage[] = [];
  relay.add({ id: 'spy', send: (m) => void spy.push(m) });
  await Promise.all(processes.map((p) => p.store.attach(p.host)));
  for (let round = 0; round < 20; round++) {
    const id = `x${round}`;
    const [va, vb] = await Promise.all([
      adminChange(a, { op: 'add', worker: { id, url: `http://a-${round}` } }),
      adminChange(b, { op: 'add', worker: { id, url: `http://b-${round}` } }),
    ]);
    assert.deepEqual(
      [va, vb].map((v) => (v.ok ? 201 : v.status)).sort(),
      [201, 409],
      `one add made, the other refused: ${JSON.stringify([va, vb])}`,
    );
    const loser = va.ok ? vb : va;
    assert.deepEqual(loser, { ok: false, status: 409, message: `worker '${id}' exists`, param: 'id' });
    // both requesters hold the winner's worker as they read their verdicts: no wait
    const url = va.ok ? `http://a-${round}` : `http://b-${round}`;
    assert.equal(a.workers.find((w) => w.id === id)?.url, url);
    assert.equal(b.workers.find((w) => w.id === id)?.url, url);
    // a delete through the third process right after: the relay has it, whatever c has heard
    assert.deepEqual(await adminChange(c, { op: 'remove', id }), { ok: true, id });
    assert.deepEqual(await adminChange(a, { op: 'remove', id }), {
      ok: false,
      status: 404,
      message: `no worker '${id}'`,
    });
  }
  await Promise.all(processes.map((p) => p.store.syncWorkerChanges()));
  const registry = registryOf(relay, spy);
  assert.deepEqual(registry, { workers: { e0: 'http://e0' }, draining: [] });
  for (const p of processes) assert.deepEqual(viewOf(p), registry, `process ${p.id}`);
});

test('interleaved admin adds, removes and drains leave every process holding the relay registry', async () => {
  const { relay, processes } = fleet(3, ['e0']);
  const spy: ClusterMessage[] = [];
  relay.add({ id: 'spy', send: (m) => void spy.push(m) });
  await Promise.all(processes.map((p) => p.store.attach(p.host)));
  let seed = 7;
  const next = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), Math.floor((seed / 2 ** 31) * n));
  const counts: Record<string, number> = {};
  for (let batch = 0; batch < 40; batch++) {
    const changes = Array.from({ length: 6 }, () => {
      const id = `x${next(3)}`;
      const op = next(4);
      const change: WorkerChange =
        op === 0 || op === 1
          ? { op: 'add', worker: { id, url: `http://${id}-${next(1000)}` } }
          : op === 2
            ? { op: 'remove', id }
            : { op: 'drain', id, draining: next(2) === 0 };
      return adminChange(processes[next(3)], change).then((v) => {
        const key = `${change.op} ${v.ok ? 'ok' : v.status}`;
        counts[key] = (counts[key] ?? 0) + 1;
      });
    });
    await Promise.all(changes);
    // sequential changes by one client through different processes see each other
    const id = `seq${batch}`;
    assert.equal((await adminChange(processes[batch % 3], { op: 'add', worker: { id, url: 'http://s' } })).ok, true);
    assert.equal((await adminChange(processes[(batch + 1) % 3], { op: 'drain', id, draining: true })).ok, true);
    assert.equal((await adminChange(processes[(batch + 2) % 3], { op: 'remove', id })).ok, true);
  }
  for (const key of ['add ok', 'add 409', 'remove ok', 'remove 404', 'drain ok', 'drain 404'])
    assert.ok(counts[key] > 0, `the interleavings include ${key}: ${JSON.stringify(counts)}`);
  await Promise.all(processes.map((p) => p.store.syncWorkerChanges()));
  const registry = registryOf(relay, spy);
  for (const p of processes) assert.deepEqual(viewOf(p), registry, `process ${p.id}`);
  for (const p of processes)
    assert.deepEqual(p.unheldRemovals, [], 'no process was asked to remove what it did not hold');
});

test('an admin change the relay does not answer in time is refused as unanswered, and applied if its verdict comes later', async () => {
  const listeners = new Set<(m: unknown) => void>();
  const sent: ClusterMessage[] = [];
  const store = new ClusterStateStore({
    replicaId: 'p',
    timeoutMs: 5,
    adminTimeoutMs: 50,
    channel: {
      send: (m) => {
        sent.push(m);
        // the start snapshot comes; nothing else is answered
        if (m.cf === 'hello')
          queueMicrotask(() => {
            for (const l of listeners) l({ cf: 'snapshot', workers: [], workflows: [], decisions: [], loads: [] });
          });
      },
      onMessage: (l) => void listeners.add(l),
      offMessage: (l) => void listeners.delete(l),
    },
  });
  const router = new KVAwareRouter();
  await store.attach(workerHost(router, ['e0']).host);
  const applied: WorkerChangeVerdict[] = [];
  await assert.rejects(
    store.orderWorkerChange({ op: 'remove', id: 'e0' }, (v) => applied.push(v)),
    (err: Error) =>
      err instanceof SharedStateUnanswered && /did not decide the worker change within 50 ms/.test(err.message),
  );
  await assert.rejects(store.syncWorkerChanges(), SharedStateUnanswered);
  const asked = sent.flatMap((m) => (m.cf === 'batch' ? m.m : [m])).find((m) => m.cf === 'change?');
  assert.ok(asked?.cf === 'change?');
  for (const l of listeners) l({ cf: 'change', q: asked.q, v: { ok: true, id: 'e0' } });
  assert.deepEqual(applied, [{ ok: true, id: 'e0' }]);
  await store.close();
});

test('once the channel to the primary closes, what waits for its answer is settled at once, and later questions too', async () => {
  const listeners = new Set<(m: unknown) => void>();
  let closeChannel = (): void => {};
  const store = new ClusterStateStore({
    replicaId: 'p',
    // far past the test's deadlines: only the channel's close can settle them
    timeoutMs: 60_000,
    adminTimeoutMs: 600_000,
    channel: {
      send: (m) => {
        // the start snapshot comes; nothing else is answered
        if (m.cf === 'hello')
          queueMicrotask(() => {
            for (const l of listeners) l({ cf: 'snapshot', workers: [], workflows: [], decisions: [], loads: [] });
          });
      },
      onMessage: (l) => void listeners.add(l),
      offMessage: (l) => void listeners.delete(l),
      onClose: (l) => void (closeChannel = l),
    },
  });
  const router = new KVAwareRouter();
  await store.attach(workerHost(router, ['e0']).host);
  const outcomes: Record<string, unknown> = {};
  const watch = (name: string, p: Promise<unknown> | undefined) => {
    assert.ok(p, `${name} waits for the primary`);
    p.then(
      () => (outcomes[name] = 'resolved'),
      (err: unknown) => (outcomes[name] = err),
    );
  };
  try {
    watch(
      'change',
      store.orderWorkerChange({ op: 'remove', id: 'e0' }, () => 'applied'),
    );
    watch('sync', store.syncWorkerChanges());
    watch('lookup', store.beforeRoute({ workflowId: 'wf', text: 'x' }));
    closeChannel();
    await until(() => Object.keys(outcomes).length === 3, 'every question to the gone primary to be settled');
    assert.ok(outcomes.change instanceof SharedStateUnanswered, String(outcomes.change));
    assert.match((outcomes.change as Error).message, /primary process is gone/);
    assert.ok(outcomes.sync instanceof SharedStateUnanswered, String(outcomes.sync));
    assert.equal(outcomes.lookup, 'resolved', 'the workflow is routed on what this process knows');
    // asked after the close: refused at once, and a workflow lookup does not wait
    await assert.rejects(
      store.orderWorkerChange({ op: 'remove', id: 'e0' }, () => 'applied'),
      SharedStateUnanswered,
    );
    assert.equal(store.beforeRoute({ workflowId: 'wf2', text: 'x' }), undefined);
    assert.deepEqual(
      router.listWorkers().map((w) => w.id),
      ['e0'],
      'the unanswered removal was not applied',
    );
  } finally {
    await store.close();
  }
});
