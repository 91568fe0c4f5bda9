/**
 * bench:epp — what the endpoint picker adds to each request: the time from Envoy's first
 * ext_proc message (request headers) to the last answer of the request phase (the echoed body's
 * end_of_stream), for a chat request of a few KB sent in 16 KiB chunks as Envoy sends them,
 * one request at a time (latency) and `--concurrency` streams at once (throughput). The picker
 * runs as its own process (the real `epp` command) in front of 4 mock engines; the client here
 * plays Envoy (no response phase: the accounting is released when the stream ends).
 *
 *   npm run bench:epp -- --json [--requests 2000] [--concurrency 16]
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { credentials, makeGenericClientConstructor, type ClientDuplexStream } from '@grpc/grpc-js';
import { MockEngine } from '../src/engines/mock-engine.js';
import { extProcService, type ProcessingRequest, type ProcessingResponse } from '../src/epp/proto.js';
import { benchFlags, intFlag, percentile, round } from './stats.js';

const flags = benchFlags(process.argv.slice(2), { json: 'switch', requests: 'value', concurrency: 'value' });
const REQUESTS = intFlag(flags, 'requests', 2000);
const CONCURRENCY = intFlag(flags, 'concurrency', 16);

function startPicker(args: string[]): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(
    process.execPath,
    // plaintext: the request phase is measured, not TLS (the numbers stay comparable across runs)
    [
      '--import',
      'tsx',
      'src/cli/main.ts',
      'epp',
      '--port',
      '0',
      '--metrics-port',
      '0',
      '--health-port',
      '0',
      '--secure-serving',
      'false',
      ...args,
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  return new Promise((resolve, reject) => {
    child.stderr!.on('data', (d: Buffer) => {
      stderr += d.toString();
      const m = /ext_proc gRPC, [^)]*\) on [\d.]+:(\d+)/.exec(stderr);
      if (m) resolve({ child, port: Number(m[1]) });
    });
    child.once('exit', (code) => reject(new Error(`epp exited ${code}: ${stderr}`)));
  });
}

const engines: MockEngine[] = [];
for (let i = 0; i < 4; i++) engines.push(await new MockEngine({}).start());
const picker = await startPicker(engines.flatMap((e, i) => ['--worker', `id=e${i},url=http://127.0.0.1:${e.port}`]));
const Ctor = makeGenericClientConstructor(extProcService(), 'ExternalProcessor');
const client = new Ctor(`127.0.0.1:${picker.port}`, credentials.createInsecure()) as unknown as {
  Process(): ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
  close(): void;
};

const systemPrompt = 'You are a careful assistant that answers questions about the attached documents. '.repeat(40);
const headers = {
  headers: [
    [':method', 'POST'],
    [':path', '/v1/chat/completions'],
    ['content-type', 'application/json'],
  ].map(([key, v]) => ({ key, raw_value: Buffer.from(v) })),
};

/** One request phase; resolves with its duration in ms. */
function one(i: number): Promise<number> {
  const body = Buffer.from(
    JSON.stringify({
      model: 'mock',
      messages: [
        { role: 'system', content: systemPrompt },
        { role: 'user', content: `question ${i % 50}` },
      ],
      max_tokens: 16,
    }),
  );
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const call = client.Process();
    call.on('data', (m: ProcessingResponse) => {
      if (m.response === 'immediate_response') reject(new Error('immediate response'));
      if (m.request_body?.response?.body_mutation?.streamed_response?.end_of_stream) {
        const ms = performance.now() - started;
        call.end();
        resolve(ms);
      }
    });
    call.on('error', reject);
    call.write({ request_headers: { headers, end_of_stream: false } });
    for (let off = 0; off < body.length; off += 16 * 1024) {
      const end = Math.min(body.length, off + 16 * 1024);
      call.write({ request_body: { body: body.subarray(off, end), end_of_stream: end === body.length } });
    }
  });
}

for (let i = 0; i < 200; i++) await one(i); // warm-up
const serial = new Float64Array(REQUESTS);
for (let i = 0; i < REQUESTS; i++) serial[i] = await one(i);
serial.sort();
let next = 0;
const parallel: number[] = [];
const t0 = performance.now();
await Promise.all(
  Array.from({ length: CONCURRENCY }, async () => {
    while (next < REQUESTS) parallel.push(await one(next++));
  }),
);
const seconds = (performance.now() - t0) / 1000;
parallel.sort((a, b) => a - b);

const result = {
  bodyBytes: Buffer.byteLength(
    JSON.stringify({
      model: 'mock',
      messages: [
        { role: 'system', content: systemPrompt },
        { role: 'user', content: 'question 0' },
      ],
      max_tokens: 16,
    }),
  ),
  sequential: { requests: REQUESTS, p50Ms: round(percentile(serial, 50)), p99Ms: round(percentile(serial, 99)) },
  concurrent: {
    concurrency: CONCURRENCY,
    requests: REQUESTS,
    rps: Math.round(REQUESTS / seconds),
    p50Ms: round(percentile(parallel, 50)),
    p99Ms: round(percentile(parallel, 99)),
  },
};
client.close();
picker.child.kill('SIGTERM');
for (const e of engines) await e.close();
if (flags.has('json')) process.stdout.write(`${JSON.stringify(result)}\n`);
else console.log(result);
