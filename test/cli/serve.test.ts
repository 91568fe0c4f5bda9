import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { after, test } from 'node:test';
import { parseWorkerSpec } from '../../src/cli/commands/serve.js';
import { MockEngine } from '../../src/engines/mock-engine.js';

test('--worker specs are parsed, and bad ones are refused with the reason', () => {
  assert.deepEqual(parseWorkerSpec('id=w1,url=http://127.0.0.1:9001,events=tcp://127.0.0.1:5557,cla=1;2'), {
    id: 'w1', url: 'http://127.0.0.1:9001', claGroups: [1, 2], events: 'tcp://127.0.0.1:5557', replay: undefined, metrics: undefined,
  });
  assert.throws(() => parseWorkerSpec('url=http://x'), /id and url are required/);
  assert.throws(() => parseWorkerSpec('id=a,url=x'), /must start with http/);
  assert.throws(() => parseWorkerSpec('id=a,url=http://x,color=red'), /unknown key 'color'/);
  assert.throws(() => parseWorkerSpec('id=a,url=http://x,cla=one'), /cla group 'one'/);
  assert.throws(() => parseWorkerSpec('id=a,url=http://x,replay=tcp://y'), /replay needs events/);
});

const engines: MockEngine[] = [];
after(async () => {
  for (const e of engines) await e.close();
});

test('contextforge-router serve proxies to the workers it was given and stops on SIGTERM', async () => {
  const e = await new MockEngine({ events: 'tcp://127.0.0.1:*' }).start();
  engines.push(e);
  const main = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', main, 'serve', '--port', '0', '--worker', `id=m0,url=http://127.0.0.1:${e.port},events=${e.eventsEndpoint}`], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  const base = await new Promise<string>((resolve, reject) => {
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
      const m = /serving on (http:\/\/[\d.]+:\d+)/.exec(stderr);
      if (m) resolve(m[1]);
    });
    child.once('exit', (code) => reject(new Error(`exited ${code}: ${stderr}`)));
  });
  assert.match(stderr, /KV events are ignored with --tokenize text/);
  assert.match(stderr, /approximate index/);
  const res = await fetch(`${base}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }), headers: { 'content-type': 'application/json' } });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('x-contextforge-worker'), 'm0');
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});
