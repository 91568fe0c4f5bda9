import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { CLI } from '../helpers/cli-entry.js';

function cli(...args: string[]) {
  return spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8' });
}

test('demo --json prints one JSON object comparing the policies', () => {
  const r = cli('demo', '--workflows', '12', '--json');
  assert.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout) as { results: Array<{ policy: string; requests: number }> };
  assert.deepEqual(
    out.results.map((x) => x.policy),
    ['seed', 'cost'],
  );
  assert.ok(out.results.every((x) => x.requests === 48));
});

test('demo prints a table for people', () => {
  const r = cli('demo', '--workflows', '8');
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /token hit rate/);
  assert.match(r.stdout, /^seed\s+32\s/m);
  assert.match(r.stdout, /^cost\s+32\s/m);
});

test('bad flags exit non-zero with a message naming the flag', () => {
  const r = cli('demo', '--workers', 'x');
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--workers must be an integer/);
  const p = cli('demo', '--policies', 'nope', '--workflows', '2');
  assert.equal(p.status, 2);
  assert.match(p.stderr, /--policies: unknown policy 'nope' \(known: .*cost/);
  assert.doesNotMatch(p.stderr, /at .*\.ts/); // a message, not a stack trace
});

test("the README's example runs", () => {
  const example = fileURLToPath(new URL('../../examples/quickstart.ts', import.meta.url));
  const r = spawnSync(process.execPath, ['--import', 'tsx', example], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  // the first decision has no home yet; after the broadcast, the home holds the anchor (the seed's 1.0)
  assert.match(r.stdout, /confidence: 0,[^}]*\}\s*\{[^}]*targetWorkerId: 'gpu-0'[^}]*confidence: 1,/);
});

test("the README's route() example runs and routes to the worker holding the prefix", () => {
  const example = fileURLToPath(new URL('../../examples/route.ts', import.meta.url));
  const r = spawnSync(process.execPath, ['--import', 'tsx', example], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /workerId: 'gpu-1'/);
  assert.match(r.stdout, /cachedTokens: 2048/);
});

test('live-demo runs a small workload through mock engines and the router over HTTP', () => {
  const r = cli('live-demo', '--workflows', '6', '--speed', '8', '--json');
  assert.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout) as {
    requests: number;
    workers: number;
    results: Array<{ policy: string; requests: number; hitRate: number; perWorker: Record<string, number> }>;
  };
  assert.deepEqual(
    out.results.map((x) => x.policy),
    ['cost', 'round-robin'],
  );
  for (const x of out.results) {
    assert.equal(x.requests, out.requests);
    assert.equal(
      Object.values(x.perWorker).reduce((a, b) => a + b, 0),
      out.requests,
      `${x.policy}: every request reached a worker`,
    );
  }
  const [cost, roundRobin] = out.results;
  // round-robin spreads evenly over the engines; the cache-aware policy reuses far more KV
  assert.deepEqual(Object.values(roundRobin.perWorker), Array(out.workers).fill(out.requests / out.workers));
  assert.ok(cost.hitRate > roundRobin.hitRate + 0.1, `cost ${cost.hitRate} vs round-robin ${roundRobin.hitRate}`);
});

test('live-demo stops cleanly on Ctrl-C mid-run: engines and router closed, exit 130', async () => {
  const child = spawn(process.execPath, [...CLI, 'live-demo', '--workflows', '40', '--speed', '1'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  let stdout = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
    child.once('exit', (code, signal) => r({ code, signal })),
  );
  // interrupt once the first quarter of the cost run has gone through HTTP
  await new Promise<void>((resolve, reject) => {
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
      if (/^cost: \d+\/\d+ requests$/m.test(stderr)) resolve();
    });
    void exited.then(() => reject(new Error(`exited before progress: ${stderr}`)));
  });
  child.kill('SIGINT');
  // the process only exits by itself once every server and socket is closed (it sets exitCode, never calls exit)
  const { code, signal } = await exited;
  assert.equal(signal, null, `it handled the signal instead of being killed by it: ${stderr}`);
  assert.equal(code, 130, stderr);
  assert.match(stderr, /stopping…/);
  assert.equal(stdout, '', 'no results table for an interrupted run');
});
