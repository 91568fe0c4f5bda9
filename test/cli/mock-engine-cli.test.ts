import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';

/** Starts `contextforge-router mock-engine` and resolves once it says where it serves. */
async function startMockEngine(args: string[]) {
  const main = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', main, 'mock-engine', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  const url = await new Promise<string>((resolve, reject) => {
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
      const m = /on (http:\/\/[\d.]+:\d+)/.exec(stderr);
      if (m) resolve(m[1]);
    });
    child.once('exit', (code) => reject(new Error(`exited ${code}: ${stderr}`)));
  });
  return { child, url, stderr: () => stderr };
}

test('contextforge-router mock-engine serves until SIGTERM and exits cleanly', async () => {
  const { child, url, stderr: err } = await startMockEngine(['--port', '0', '--events', 'tcp://127.0.0.1:*']);
  const stderr = err();
  assert.match(stderr, /KV events on tcp:\/\/127\.0\.0\.1:\d+/);
  const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: Array<{ id: string }> };
  assert.equal(models.data[0].id, 'mock');
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test('mock-engine rejects bad flags', async () => {
  const main = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', main, 'mock-engine', '--replay', 'tcp://127.0.0.1:*'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  assert.notEqual(code, 0);
  assert.match(stderr, /--replay needs --events/);
});

test('mock-engine --data-parallel-size and --lora-modules', async () => {
  const base = 20_000 + Math.floor(Math.random() * 30_000);
  const {
    child,
    url,
    stderr: err,
  } = await startMockEngine([
    '--port',
    '0',
    '--events',
    `tcp://127.0.0.1:${base}`,
    '--data-parallel-size',
    '2',
    '--lora-modules',
    'sql,chat',
  ]);
  const stderr = err();
  assert.match(stderr, new RegExp(`KV events on tcp://127\\.0\\.0\\.1:${base} tcp://127\\.0\\.0\\.1:${base + 1}`));
  const models = (await (await fetch(`${url}/v1/models`)).json()) as {
    data: Array<{ id: string; parent: string | null }>;
  };
  assert.deepEqual(
    models.data.map((m) => [m.id, m.parent]),
    [
      ['mock', null],
      ['sql', 'mock'],
      ['chat', 'mock'],
    ],
  );
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test('mock-engine closes cleanly on a SIGTERM sent as soon as it says where it serves', async () => {
  // the line is the readiness signal a supervisor waits for: stopping it then is a clean close, not a kill
  for (let i = 0; i < 3; i++) {
    const { child } = await startMockEngine(['--port', '0']);
    const exited = new Promise<[number | null, string | null]>((r) =>
      child.once('exit', (code, sig) => r([code, sig])),
    );
    child.kill('SIGTERM');
    assert.deepEqual(await exited, [0, null], `attempt ${i + 1}`);
  }
});
