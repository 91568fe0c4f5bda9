/**
 * `serve --processes 2` as its processes come and go: crashes and replacements, a primary killed
 * outright, signals while stopping (the routing and shared-state tests are in
 * serve-processes.test.ts; the two files run side by side).
 */
import assert from 'node:assert/strict';
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { Client } from 'undici';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { until } from '../helpers/wait.js';
import {
  alive,
  childPids,
  closeServeProcesses,
  engines,
  serveOnTwoEngines,
  slowStream,
  startServe,
  TWO_PROCESSES_QUIET,
} from '../helpers/serve-processes.js';

after(closeServeProcesses);

/** GET /healthz on a new connection: its status, or 0 when no process answered. */
async function healthStatus(base: string): Promise<number> {
  const c = new Client(base, { pipelining: 1 });
  try {
    const res = await c.request({ path: '/healthz', method: 'GET' });
    await res.body.text();
    return res.statusCode;
  } catch {
    return 0;
  } finally {
    await c.close().catch(() => {});
  }
}

test('serve --processes 2: a replacement that cannot start is retried while the other process keeps serving', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'contextforge-processes-'));
  const template = join(dir, 'chat-template.jinja');
  writeFileSync(template, '{% for m in messages %}{{ m.content }}{% endfor %}');
  try {
    const { child, base, output } = await startServe([...TWO_PROCESSES_QUIET, '--chat-template', template]);
    const [first, second] = childPids(child);
    assert.ok(first !== undefined && second !== undefined, 'two gateway processes');
    // from now on a new process fails to start (its chat template is gone)
    renameSync(template, `${template}.away`);
    process.kill(first, 'SIGKILL');
    await until(
      () => {
        assert.equal(child.exitCode, null, `the primary keeps running: ${output()}`);
        return (output().match(/exited before it served .*; starting another in/g)?.length ?? 0) >= 2;
      },
      'the primary to retry a replacement that cannot start',
      { timeoutMs: 60_000 },
    );
    assert.equal(child.exitCode, null, 'the primary keeps running');
    assert.ok(alive(second), 'the healthy process keeps running');
    assert.equal(await healthStatus(base), 200, 'the healthy process serves');
    // once it can start again, a replacement serves
    renameSync(`${template}.away`, template);
    await until(
      () => childPids(child).length === 2 && /\[process (?![12]\])\d+\] contextforge-router process/.test(output()),
      'a replacement to serve',
      {
        timeoutMs: 60_000,
      },
    );
    const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
    child.kill('SIGTERM');
    assert.equal(await exited, 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** `serve --processes 2` on one slow engine (a stream takes about a second), long grace. */
async function serveOnSlowEngine(): ReturnType<typeof startServe> {
  const engine = await new MockEngine({ prefillTokS: 1_000_000, decodeTokS: 20 }).start();
  engines.push(engine);
  return startServe([
    ...TWO_PROCESSES_QUIET,
    '--shutdown-grace-ms',
    '60000',
    '--worker',
    `id=e0,url=http://127.0.0.1:${engine.port}`,
  ]);
}

test('serve --processes 2: a primary killed outright leaves its processes to finish their streams and exit', async () => {
  const { child, base } = await serveOnSlowEngine();
  const pids = childPids(child);
  assert.equal(pids.length, 2);
  const stream = await slowStream(base);
  child.kill('SIGKILL');
  assert.match(await stream.rest(), /data: \[DONE\]/, 'the stream ran to its end');
  await until(() => !pids.some(alive), 'the orphaned gateway processes to exit', { timeoutMs: 60_000 });
});

test('serve --processes 2: a connection handed to a process killed before it took it is closed, not left hanging', async () => {
  const { child, base } = await serveOnTwoEngines();
  const [victim] = childPids(child);
  // stopped, the process cannot take the connection the primary hands it, nor answer for it;
  // the other serves the rest
  process.kill(victim, 'SIGSTOP');
  try {
    const { hostname, port } = new URL(base);
    const sockets = Array.from({ length: 4 }, () => {
      const s = { answered: false, ended: false };
      const socket = connect(Number(port), hostname, () =>
        socket.write(`GET /healthz HTTP/1.1\r\nhost: ${hostname}\r\nconnection: close\r\n\r\n`),
      );
      socket.on('data', () => (s.answered = true));
      socket.on('error', () => {}); // a reset is an answer too
      socket.on('close', () => (s.ended = true));
      return s;
    });
    // round robin: the stopped process holds one connection, the other answers the rest
    await until(() => sockets.filter((s) => s.answered && s.ended).length === 3, 'three connections answered', {
      timeoutMs: 30_000,
    });
    const held = sockets.filter((s) => !s.answered);
    assert.equal(held.length, 1, 'one connection waits for the stopped process');
    process.kill(victim, 'SIGKILL');
    await until(() => held[0].ended, 'the connection handed to the killed process to be closed', {
      timeoutMs: 30_000,
    });
    assert.equal(held[0].answered, false, 'no process read its request');
  } finally {
    if (alive(victim)) process.kill(victim, 'SIGKILL');
  }
});

test('serve --processes 2: a second SIGTERM while stopping does not cut a stream in flight', async () => {
  const { child, base, output } = await serveOnSlowEngine();
  const stream = await slowStream(base);
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  await until(() => /stopping/.test(output()), 'the primary to say it is stopping', { timeoutMs: 30_000 });
  child.kill('SIGTERM');
  child.kill('SIGINT');
  assert.match(await stream.rest(), /data: \[DONE\]/, 'the stream ran to its end');
  assert.equal(await exited, 0);
  assert.match(output(), /already stopping/);
});

/** How many gateway processes have said they serve (each says so once its SIGTERM handler is set). */
function processesServing(output: string): number {
  return output.match(/\[process \d+\] contextforge-router process/g)?.length ?? 0;
}

test('serve --processes 2: a process that exits cleanly is replaced and logged, and so are all of them', async () => {
  const { child, base, output } = await startServe(TWO_PROCESSES_QUIET);
  await until(() => processesServing(output()) === 2, 'both processes to serve', { timeoutMs: 30_000 });
  const [first, second] = childPids(child);
  assert.ok(first !== undefined && second !== undefined, 'two gateway processes');
  process.kill(first, 'SIGTERM');
  await until(() => /gateway process \d+ stopped \(exit 0\); starting another/.test(output()), 'the replacement', {
    timeoutMs: 30_000,
  });
  await until(() => processesServing(output()) === 3, 'the replacement to serve', { timeoutMs: 30_000 });
  assert.equal(await healthStatus(base), 200);
  // (once none is left node:cluster closes the port: with --port 0 their replacements get another)
  // every one of them stopped: the primary replaces them all rather than exit with nothing serving
  for (const pid of childPids(child)) process.kill(pid, 'SIGTERM');
  await until(
    () => (output().match(/stopped \(exit 0\); starting another/g)?.length ?? 0) >= 3,
    'the primary to replace all of them',
    { timeoutMs: 30_000 },
  );
  await until(() => processesServing(output()) === 5, 'their replacements to serve', { timeoutMs: 60_000 });
  assert.equal(child.exitCode, null, 'the primary keeps running');
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test('serve --processes 2: a process that keeps crashing soon after it starts serving is restarted less often each time', async () => {
  const { child, base, output } = await startServe(TWO_PROCESSES_QUIET);
  await until(() => processesServing(output()) === 2, 'both processes to serve', { timeoutMs: 30_000 });
  const [first, second] = childPids(child);
  assert.ok(first !== undefined && second !== undefined, 'two gateway processes');
  // each process in the first one's place crashes as soon as it serves, as one would on its
  // first requests: the primary waits longer before each replacement
  let victim = first;
  const delays = () =>
    [...output().matchAll(/stopped \(SIGKILL\); starting another in (\d+) ms/g)].map((m) => Number(m[1]));
  for (let crash = 1; crash <= 4; crash++) {
    process.kill(victim, 'SIGKILL');
    await until(() => delays().length === crash, `the primary to log crash ${crash}`, { timeoutMs: 30_000 });
    await until(() => processesServing(output()) === 2 + crash, `replacement ${crash} to serve`, { timeoutMs: 60_000 });
    const replacement = childPids(child).find((pid) => pid !== second && alive(pid));
    assert.ok(replacement !== undefined, `replacement ${crash} runs`);
    victim = replacement;
  }
  assert.deepEqual(delays(), [100, 200, 400, 800], output());
  assert.doesNotMatch(output(), /stopped \(SIGKILL\); starting another\n/, 'no replacement started at once');
  assert.ok(alive(second), 'the other process keeps running');
  assert.equal(await healthStatus(base), 200, 'the port is served throughout');
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});
