import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { after, test } from 'node:test';
import { Client } from 'undici';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { CLI } from '../helpers/cli-entry.js';
import { settled, until } from '../helpers/wait.js';
import {
  ADMIN_TOKEN,
  children,
  clients,
  closeServeProcesses,
  engines,
  serveOnTwoEngines,
  slowStream,
  startServe,
  TWO_PROCESSES,
  TWO_PROCESSES_QUIET,
  childPids,
} from '../helpers/serve-processes.js';

after(closeServeProcesses);

/** Which gateway process a connection landed on (its replica id in /admin/stats). */
async function processOf(client: Client): Promise<string> {
  const res = await client.request({
    path: '/admin/stats',
    method: 'GET',
    headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
  });
  assert.equal(res.statusCode, 200);
  const stats = (await res.body.json()) as { state: { kind: string; replicaId: string } };
  assert.equal(stats.state.kind, 'cluster');
  return stats.state.replicaId;
}

/** One connection on each of two different processes; new connections until the port hands them out so. */
async function connectionsOnTwoProcesses(base: string, deadlineMs: number): Promise<[Client, Client, string, string]> {
  const deadline = Date.now() + deadlineMs;
  const first = new Client(base, { pipelining: 1 });
  clients.push(first);
  const p1 = await processOf(first);
  while (Date.now() < deadline) {
    const c = new Client(base, { pipelining: 1 });
    clients.push(c);
    const p = await processOf(c);
    if (p !== p1) return [first, c, p1, p];
  }
  throw new Error('every connection went to one process');
}

async function chat(
  client: Client,
  workflowId: string,
  step: number,
  messages: Array<{ role: string; content: string }>,
): Promise<string> {
  const res = await client.request({
    path: '/v1/chat/completions',
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-workflow-id': workflowId, 'x-workflow-step': String(step) },
    body: JSON.stringify({ model: 'mock', messages, max_tokens: 2 }),
  });
  await res.body.text();
  assert.equal(res.statusCode, 200);
  return String(res.headers['x-contextforge-worker']);
}

test('serve --processes 2: two processes on one port route as one router (a workflow is not split)', async () => {
  const { child, base, output } = await serveOnTwoEngines();
  assert.match(output(), /2 processes/);
  const [a, b, pa, pb] = await connectionsOnTwoProcesses(base, 30_000);
  assert.notEqual(pa, pb);

  // four workflows start on process A: with nothing cached and no load, A alternates between
  // the engines, so both are used
  const conversation = (wf: number) => [
    {
      role: 'system',
      content: `You are agent ${wf}; every workflow has its own long instructions. ${'Plan carefully. '.repeat(40)}`,
    },
    { role: 'user', content: `Task ${wf}: summarise the design.` },
  ];
  const firstStep = new Map<number, string>();
  for (let wf = 1; wf <= 4; wf++) firstStep.set(wf, await chat(a, `wf-${wf}`, 0, conversation(wf)));
  assert.equal(new Set(firstStep.values()).size, 2, `A used both engines: ${[...firstStep.values()]}`);

  // their next steps reach process B in the opposite order: on its own, B would alternate
  // from e0 again and split at least two of them; sharing the state, B follows each workflow
  for (let wf = 4; wf >= 1; wf--) {
    const next = [
      ...conversation(wf),
      { role: 'assistant', content: 'Done.' },
      { role: 'user', content: 'Next step.' },
    ];
    assert.equal(await chat(b, `wf-${wf}`, 1, next), firstStep.get(wf), `workflow ${wf}`);
  }
  const stats = (await (
    await b.request({ path: '/admin/stats', method: 'GET', headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })
  ).body.json()) as {
    state: { decisionsApplied: number };
  };
  assert.ok(stats.state.decisionsApplied >= 4, `B applied A's decisions: ${JSON.stringify(stats.state)}`);

  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test('bad --processes and --tokenizer-threads values exit with a message naming the flag', async () => {
  for (const [flag, value] of [
    ['--processes', '0'],
    ['--processes', '300'],
    ['--tokenizer-threads', '-1'],
    ['--tokenizer-threads', 'many'],
  ]) {
    const child = spawn(process.execPath, [...CLI, 'serve', flag, value, '--worker', 'id=e0,url=http://127.0.0.1:1'], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    children.push(child);
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const code = await new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
    assert.notEqual(code, 0);
    assert.match(stderr, new RegExp(flag), `${flag} ${value}: ${stderr}`);
  }
});

test('serve --processes 2 whose processes cannot start exits with their error, not a hang', async () => {
  const child = spawn(
    process.execPath,
    [
      ...CLI,
      'serve',
      '--port',
      '0',
      '--processes',
      '2',
      '--tokenize',
      'tokenizer',
      '--tokenizer',
      '/nonexistent/tokenizer.json',
      '--worker',
      'id=e0,url=http://127.0.0.1:1',
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  children.push(child);
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  assert.notEqual(code, 0);
  assert.match(stderr, /no such file or directory/);
  assert.match(stderr, /a gateway process failed to start/);
});

test('serve --processes 2 with the longest --shutdown-grace-ms lets a request in flight finish on SIGTERM', async () => {
  // slow enough that the stream is still under way when the signal comes
  const engine = await new MockEngine({ prefillTokS: 1_000_000, decodeTokS: 20 }).start();
  engines.push(engine);
  const { child, base, output } = await startServe([
    ...TWO_PROCESSES_QUIET,
    '--shutdown-grace-ms',
    '2147483647',
    '--worker',
    `id=e0,url=http://127.0.0.1:${engine.port}`,
  ]);
  const stream = await slowStream(base);
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.match(await stream.rest(), /data: \[DONE\]/, 'the stream ran to its end');
  assert.equal(await exited, 0);
  assert.doesNotMatch(output(), /TimeoutOverflowWarning/);
});

test('serve --processes 2 names an unknown CONTEXTFORGE_ variable once, not once per process', async () => {
  const { child, output } = await startServe(TWO_PROCESSES_QUIET, { CONTEXTFORGE_POLCY: 'dynamo' });
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
  assert.equal(output().match(/CONTEXTFORGE_POLCY is not a setting/g)?.length, 1, output());
});

test('serve --processes 2: a drain, a resume and posted KV events through one process hold in every process', async () => {
  const { child, base } = await serveOnTwoEngines();
  const [a, b] = await connectionsOnTwoProcesses(base, 30_000);
  const admin = async (client: Client, method: 'GET' | 'POST', path: string, body?: unknown) => {
    const res = await client.request({
      path,
      method,
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    assert.equal(res.statusCode, 200, path);
    return res.body.json();
  };
  type Workers = { workers: Array<{ id: string; draining: boolean; indexEntries: number }> };
  const workerOf = async (client: Client, id: string) =>
    ((await admin(client, 'GET', '/admin/workers')) as Workers).workers.find((w) => w.id === id)!;

  await admin(a, 'POST', '/admin/workers/e0/drain');
  assert.equal(
    (
      await settled(
        () => workerOf(b, 'e0'),
        (w) => w.draining,
      )
    ).draining,
    true,
    'the other process drains it too',
  );
  // new connections land on either process: none sends to the drained worker
  const used = new Set<string>();
  for (let i = 0; i < 10; i++) {
    const c = new Client(base, { pipelining: 1 });
    clients.push(c);
    used.add(await chat(c, `drained-${i}`, 0, [{ role: 'user', content: `request ${i} ${'text '.repeat(20)}` }]));
    await c.close();
  }
  assert.deepEqual([...used], ['e1']);

  await admin(b, 'POST', '/admin/workers/e0/resume');
  assert.equal(
    (
      await settled(
        () => workerOf(a, 'e0'),
        (w) => !w.draining,
      )
    ).draining,
    false,
  );

  // KV events as JSON, posted to A: B's index has them too
  const before = (await workerOf(b, 'e1')).indexEntries;
  const events = [
    {
      type: 'BlockStored',
      block_hashes: [101, 102],
      parent_block_hash: null,
      token_ids: Array.from({ length: 32 }, (_, i) => i + 1),
      block_size: 16,
      lora_id: null,
      medium: 'GPU',
    },
  ];
  const posted = (await admin(a, 'POST', '/admin/events', { worker: 'e1', events })) as {
    applied: { storedBlocks: number };
  };
  assert.equal(posted.applied.storedBlocks, 2);
  assert.equal(
    (
      await settled(
        () => workerOf(b, 'e1'),
        (w) => w.indexEntries > before,
      )
    ).indexEntries,
    before + 2,
  );

  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test('serve --processes 2: a worker removed through the admin API stays removed after a process crashes and is replaced', async () => {
  const { child, base, output } = await serveOnTwoEngines();
  const [a] = await connectionsOnTwoProcesses(base, 30_000);
  const auth = { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' };
  const removed = await a.request({ path: '/admin/workers/e1', method: 'DELETE', headers: auth });
  assert.equal(removed.statusCode, 200, await removed.body.text());
  // one gateway process dies; the primary starts a third in its place
  const pids = execFileSync('pgrep', ['-P', String(child.pid)], { encoding: 'utf8' })
    .trim()
    .split('\n');
  assert.equal(pids.length, 2, `two gateway processes: ${pids.join(' ')}`);
  process.kill(Number(pids[0]), 'SIGKILL');
  await until(() => /starting another/.test(output()), 'the primary to replace the process');
  /** The workers each process that new connections reach lists, until one is the replacement ('3'). */
  const seen = new Map<string, string[]>();
  await until(
    async () => {
      const c = new Client(base, { pipelining: 1 });
      clients.push(c);
      try {
        const res = await c.request({ path: '/admin/workers', method: 'GET', headers: auth });
        const replica = await processOf(c);
        const { workers } = (await res.body.json()) as { workers: Array<{ id: string }> };
        seen.set(replica, workers.map((w) => w.id).sort());
      } catch {
        // the connection reached the process that was killed
      } finally {
        await c.close();
      }
      return seen.has('3') && seen.size >= 2;
    },
    'connections to reach the replacement and a process that kept running',
    { timeoutMs: 30_000 },
  );
  for (const [replica, ids] of seen) assert.deepEqual(ids, ['e0'], `process ${replica}`);

  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test('serve --processes 2: admin worker changes through different processes are answered in one order', async () => {
  const { child, base } = await serveOnTwoEngines();
  const [a, b] = await connectionsOnTwoProcesses(base, 30_000);
  const engineUrl = `http://127.0.0.1:${engines.at(-1)!.port}`;
  const call = async (client: Client, method: 'GET' | 'POST' | 'DELETE', path: string, body?: unknown) => {
    const res = await client.request({
      path,
      method,
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.statusCode, body: (await res.body.json()) as Record<string, unknown> };
  };
  type Listed = { workers: Array<{ id: string; url: string; draining: boolean }> };
  const listed = async (client: Client) => {
    const res = await call(client, 'GET', '/admin/workers');
    assert.equal(res.status, 200);
    return (res.body as unknown as Listed).workers
      .map((w) => `${w.id} ${w.url}${w.draining ? ' draining' : ''}`)
      .sort();
  };
  // one client's changes, each through the other process than the last: each sees the one before
  const answers: string[] = [];
  for (let i = 0; i < 200; i++) {
    const [first, second] = i % 2 === 0 ? [a, b] : [b, a];
    const added = await call(first, 'POST', '/admin/workers', { id: 'cycled', url: engineUrl });
    const removed = await call(second, 'DELETE', '/admin/workers/cycled');
    answers.push(`${added.status} ${removed.status}`);
  }
  assert.deepEqual(
    answers.filter((x) => x !== '201 200'),
    [],
    'every add made and every delete right after it found the worker',
  );
  // two clients add one id at once, with different URLs, through different processes
  for (let i = 0; i < 20; i++) {
    const id = `raced-${i}`;
    const [ra, rb] = await Promise.all([
      call(a, 'POST', '/admin/workers', { id, url: 'http://127.0.0.1:1' }),
      call(b, 'POST', '/admin/workers', { id, url: 'http://127.0.0.1:2' }),
    ]);
    assert.deepEqual([ra.status, rb.status].sort(), [201, 409], `one add made: ${JSON.stringify([ra, rb])}`);
    const loser = ra.status === 409 ? ra : rb;
    assert.deepEqual(loser.body, {
      error: { message: `worker '${id}' exists`, type: 'invalid_request_error', param: 'id', code: null },
    });
    // a drain and a delete racing through both processes
    const [drained, deleted] = await Promise.all([
      call(b, 'POST', `/admin/workers/${id}/drain`),
      call(a, 'DELETE', `/admin/workers/${id}`),
    ]);
    assert.equal(deleted.status, 200);
    assert.ok([200, 404].includes(drained.status), `drain: ${JSON.stringify(drained)}`);
  }
  // both processes list the same workers, and none of those added is left
  const [onA, onB] = [await listed(a), await listed(b)];
  assert.deepEqual(onA, onB);
  assert.deepEqual(
    onA.map((w) => w.split(' ')[0]),
    ['e0', 'e1'],
  );

  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

/** A sample's value in a Prometheus page (the line `name{labels} value`), or undefined. */
function sample(page: string, series: string): number | undefined {
  for (const line of page.split('\n')) if (line.startsWith(`${series} `)) return Number(line.slice(series.length + 1));
  return undefined;
}

test('serve --processes 2: /metrics on any process counts the requests of every process', async () => {
  const engine = await new MockEngine({ prefillTokS: 1_000_000, decodeTokS: 100_000 }).start();
  engines.push(engine);
  const { child, base } = await startServe([...TWO_PROCESSES, '--worker', `id=e0,url=http://127.0.0.1:${engine.port}`]);
  const [a, b, pa, pb] = await connectionsOnTwoProcesses(base, 30_000);
  assert.notEqual(pa, pb);
  // three requests on process A, two on B
  for (const [client, n] of [
    [a, 3],
    [b, 2],
  ] as const)
    for (let i = 0; i < n; i++) await chat(client, `m-${pa}-${i}-${n}`, 0, [{ role: 'user', content: `hello ${i}` }]);
  const series = 'contextforge_requests_total{path="/v1/chat/completions",status="200"}';
  // a scrape on either process reads all five: never one process's count, which would read as a reset
  for (const client of [a, b, a, b]) {
    const res = await client.request({ path: '/metrics', method: 'GET' });
    assert.equal(res.statusCode, 200);
    const page = await res.body.text();
    assert.equal(
      sample(page, series),
      5,
      page
        .split('\n')
        .filter((l) => l.startsWith('contextforge_requests_total'))
        .join('\n'),
    );
    // a gauge of one quantity each process reads (the engine's KV usage) is not added up
    const usage = sample(page, 'contextforge_worker_kv_usage{worker="e0"}');
    assert.ok(usage !== undefined && usage >= 0 && usage <= 1, `kv usage ${usage}`);
    assert.equal(sample(page, 'contextforge_worker_available{worker="e0"}'), 1);
    // each process's own memory and event-loop delay, merged
    assert.ok(sample(page, 'process_resident_memory_bytes')! > 0, 'resident memory');
    assert.ok(sample(page, 'nodejs_eventloop_lag_max_seconds')! >= 0, 'event-loop delay');
  }
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test("serve --processes 2: /metrics counts a worker's KV batches once, through a process's replacement, and drops a removed worker's counts", async () => {
  const engine = await new MockEngine({
    prefillTokS: 1_000_000,
    decodeTokS: 100_000,
    events: 'tcp://127.0.0.1:*',
    replay: 'tcp://127.0.0.1:*',
  }).start();
  engines.push(engine);
  // a worker nothing answers: its failed attempts are counted per worker, in the process that made them
  const closed = createNetServer();
  await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
  const deadPort = (closed.address() as AddressInfo).port;
  await new Promise<void>((resolve) => closed.close(() => resolve()));
  const { child, base, output } = await startServe([
    ...TWO_PROCESSES_QUIET,
    '--worker',
    `id=e0,url=http://127.0.0.1:${engine.port},events=${engine.eventsEndpoint},replay=${engine.replayEndpoint}`,
    '--worker',
    `id=gone,url=http://127.0.0.1:${deadPort}`,
  ]);
  const [a, b] = await connectionsOnTwoProcesses(base, 30_000);
  const auth = { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' };
  const admin = async (client: Client, method: 'GET' | 'POST' | 'DELETE', path: string, body?: unknown) => {
    const res = await client.request({
      path,
      method,
      headers: auth,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.body.text();
    assert.ok(res.statusCode === 200 || res.statusCode === 201, `${method} ${path}: ${res.statusCode} ${text}`);
    return JSON.parse(text) as unknown;
  };
  type Workers = { workers: Array<{ id: string; draining: boolean; kvEvents?: { batches: number } }> };
  const workerOf = async (client: Client, id: string) =>
    ((await admin(client, 'GET', '/admin/workers')) as Workers).workers.find((w) => w.id === id)!;
  /** The KV batches a process's subscription to e0 applied. */
  const batchesSeenBy = async (client: Client) => (await workerOf(client, 'e0')).kvEvents!.batches;
  const scrape = async (client: Client) => {
    const res = await client.request({ path: '/metrics', method: 'GET' });
    assert.equal(res.statusCode, 200);
    return res.body.text();
  };
  const batches = 'contextforge_kv_event_batches_total{worker="e0"}';

  // with e0 drained every request goes to the dead worker, on both processes: each counts failures of it
  await admin(a, 'POST', '/admin/workers/e0/drain');
  await until(async () => (await workerOf(b, 'e0')).draining, 'the drain in both processes');
  for (const client of [a, b]) {
    const res = await client.request({
      path: '/v1/chat/completions',
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'mock',
        messages: [{ role: 'user', content: 'to the dead worker' }],
        max_tokens: 2,
      }),
    });
    await res.body.text();
    assert.notEqual(res.statusCode, 200);
  }
  await admin(a, 'POST', '/admin/workers/e0/resume');
  await admin(a, 'POST', '/admin/workers/gone/drain');
  await until(
    async () => !(await workerOf(b, 'e0')).draining && (await workerOf(b, 'gone')).draining,
    'e0 resumed and gone drained in both processes',
  );
  for (const [i, client] of [a, b, a, b, a].entries())
    await chat(client, `kv-${i}`, 0, [{ role: 'user', content: `batch ${i} ${'words '.repeat(40)}` }]);
  // every process hears each batch: the page counts it once, as each process does
  const seen = await settled(
    async () => [await batchesSeenBy(a), sample(await scrape(b), batches)] as const,
    ([own, merged]) => own > 0 && own === merged,
  );
  assert.equal(seen[1], seen[0], `merged ${seen[1]}, one process's ${seen[0]}`);
  const failures = 'contextforge_upstream_failures_total{worker="gone",reason="refused"}';
  assert.equal(sample(await scrape(a), failures), 2);

  // one process is killed and replaced; its replacement replays what e0 still buffers
  const [victim] = childPids(child);
  process.kill(victim, 'SIGKILL');
  await until(() => /starting another/.test(output()) && childPids(child).length === 2, 'the replacement', {
    timeoutMs: 30_000,
  });
  /** A connection to a process that kept running, and one to the replacement ('3'). */
  let survivor: Client | undefined;
  let replacement: Client | undefined;
  await until(
    async () => {
      const c = new Client(base, { pipelining: 1 });
      clients.push(c);
      try {
        const replica = await processOf(c);
        if (replica === '3') replacement ??= c;
        else survivor ??= c;
      } catch {
        // reached the killed process
      }
      return survivor !== undefined && replacement !== undefined;
    },
    'connections to the replacement and a process that kept running',
    { timeoutMs: 30_000 },
  );
  for (const [i, client] of [survivor!, replacement!, survivor!].entries())
    await chat(client, `kv-after-${i}`, 0, [{ role: 'user', content: `after ${i} ${'words '.repeat(40)}` }]);
  const after = await settled(
    async () => [await batchesSeenBy(survivor!), sample(await scrape(replacement!), batches)] as const,
    ([own, merged]) => own > seen[0] && own === merged,
    { timeoutMs: 30_000 },
  );
  assert.equal(after[1], after[0], `merged ${after[1]}, the process counting since the start ${after[0]}`);
  // the killed process's failure stays in the page
  assert.equal(sample(await scrape(replacement!), failures), 2);

  // the dead worker is removed: its counts leave the page, the killed process's among them
  await admin(survivor!, 'DELETE', '/admin/workers/gone');
  const gone = await settled(
    async () => (await scrape(replacement!)).split('\n').filter((l) => l.includes('worker="gone"')),
    (lines) => lines.length === 0,
  );
  assert.deepEqual(gone, [], 'no series of the removed worker stays');
  // added again under its id, drained: it counts from 0
  await admin(survivor!, 'POST', '/admin/workers', { id: 'gone', url: `http://127.0.0.1:${deadPort}` });
  await admin(survivor!, 'POST', '/admin/workers/gone/drain');
  assert.equal(sample(await scrape(survivor!), failures) ?? 0, 0, 'added again, it counts from 0');

  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

/** The pids of a primary's gateway processes (its children), [] when it has none. */
