/**
 * `serve --processes N` started as a child process for the tests, with the mock engines, clients
 * and processes each test file must close: a file calls `after(closeServeProcesses)`.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Client } from 'undici';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { CLI } from './cli-entry.js';

export const engines: MockEngine[] = [];
export const children: ChildProcess[] = [];
export const clients: Client[] = [];

/** Closes the clients, kills the serve processes and closes the engines the tests started. */
export async function closeServeProcesses(): Promise<void> {
  for (const c of clients) await c.close().catch(() => {});
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  for (const e of engines) await e.close();
}

/** Every process of one serve checks the same admin token (the primary hands it to them). */
export const ADMIN_TOKEN = 'processes-test-admin-token';

/** Starts `serve` and resolves with its URL once it says where it serves. */
export function startServe(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ child: ChildProcess; base: string; output: () => string }> {
  const child = spawn(process.execPath, [...CLI, 'serve', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, CONTEXTFORGE_ADMIN_TOKEN: ADMIN_TOKEN, ...env },
  });
  children.push(child);
  let stderr = '';
  return new Promise((resolve, reject) => {
    child.stderr!.on('data', (d: Buffer) => {
      stderr += d.toString();
      const m = /serving on (http:\/\/[\d.]+:\d+)/.exec(stderr);
      if (m) resolve({ child, base: m[1], output: () => stderr });
    });
    child.once('exit', (code) => reject(new Error(`serve exited ${code}: ${stderr}`)));
  });
}

/** `serve` on any free port with two gateway processes, health polling off. */
export const TWO_PROCESSES = ['--port', '0', '--processes', '2', '--health-interval-ms', '0'];
/** As TWO_PROCESSES, with metrics polling off too. */
export const TWO_PROCESSES_QUIET = [...TWO_PROCESSES, '--metrics-interval-ms', '0'];

/** Starts two mock engines and `serve --processes 2` with them as workers e0 and e1, polling off. */
export async function serveOnTwoEngines(): ReturnType<typeof startServe> {
  for (let i = 0; i < 2; i++)
    engines.push(await new MockEngine({ prefillTokS: 1_000_000, decodeTokS: 100_000 }).start());
  const pair = engines.slice(-2);
  return startServe([
    ...TWO_PROCESSES_QUIET,
    ...pair.flatMap((e, i) => ['--worker', `id=e${i},url=http://127.0.0.1:${e.port}`]),
  ]);
}

/**
 * The pids of the gateway processes under `primary`. A primary run from the sources through tsx
 * has a child of another kind too, for as long as tsx keeps it: esbuild's service, left out.
 */
export function childPids(primary: ChildProcess): number[] {
  try {
    return execFileSync('pgrep', ['-P', String(primary.pid)], { encoding: 'utf8' })
      .trim()
      .split('\n')
      .filter(Boolean)
      .map(Number)
      .filter((pid) => !isEsbuild(pid));
  } catch {
    return []; // pgrep exits 1 when it finds none
  }
}

/** Whether process `pid` is esbuild's (false once it is gone, or where /proc cannot tell). */
function isEsbuild(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'esbuild';
  } catch {
    return false;
  }
}

export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Starts a slow stream through `base` and returns it once its first chunk arrived. */
export async function slowStream(base: string): Promise<{ rest: () => Promise<string> }> {
  const client = new Client(base);
  clients.push(client);
  const res = await client.request({
    path: '/v1/chat/completions',
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock', messages: [{ role: 'user', content: 'hi' }], max_tokens: 20, stream: true }),
  });
  assert.equal(res.statusCode, 200);
  const iterator = res.body.setEncoding('utf8')[Symbol.asyncIterator]();
  const chunks = [String((await iterator.next()).value)];
  return {
    rest: async () => {
      try {
        for (let next = await iterator.next(); !next.done; next = await iterator.next())
          chunks.push(String(next.value));
      } catch (err) {
        chunks.push(`\n(stream broken: ${(err as Error).message})`);
      }
      return chunks.join('');
    },
  };
}
