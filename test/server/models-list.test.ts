/**
 * GET /v1/models asks every available worker for its list. Clients asking at once with the same
 * Via share one read of each worker, and at most MAX_MODEL_LISTS_GATHERED lists are gathered at
 * once: without either, each client request opened a connection to every engine, past
 * --engine-connections, so a burst of them could take the descriptors the engines' requests
 * need. Past the bound a client is answered 503 with Retry-After. Real sockets; every wait has
 * a deadline.
 */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, MAX_MODEL_LISTS_GATHERED, type Gateway } from '../../src/server/gateway.js';
import { listening } from '../helpers/listening.js';
import { until } from '../helpers/wait.js';

/** The engine's /v1/models answers, held until `answerModels`. */
const heldModelReads: ServerResponse[] = [];
let answerAtOnce = true;
/** Reads of the engine's /v1/models, and client requests for /v1/models at the gateway. */
let modelReads = 0;
let modelRequests = 0;
let engine: { url: string; close: () => Promise<void> };
let gateway: Gateway;
let base = '';

const MODELS = JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model' }] });

before(async () => {
  engine = await listening(
    createServer((req, res) => {
      if (req.url !== '/v1/models') return void res.writeHead(404).end();
      modelReads++;
      if (answerAtOnce) return void res.writeHead(200, { 'content-type': 'application/json' }).end(MODELS);
      heldModelReads.push(res);
    }),
  );
  gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e', url: engine.url }],
    engineConnections: 4,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  gateway.app.server.on('request', (req: IncomingMessage) => {
    if (req.url === '/v1/models') modelRequests++;
  });
  // the gateway's own read at start (LoRA adapters) is done before the engine holds its answers
  await until(async () => (await fetch(`${base}/v1/models`)).status === 200, 'a first list');
  answerAtOnce = false;
});
after(async () => {
  for (const res of heldModelReads.splice(0)) res.destroy();
  await gateway.close(0);
  await engine.close();
});

function answerModels(): void {
  for (const res of heldModelReads.splice(0)) res.writeHead(200, { 'content-type': 'application/json' }).end(MODELS);
}

const list = (via?: string) =>
  fetch(`${base}/v1/models`, { headers: via === undefined ? {} : { via } }).then(async (res) => ({
    status: res.status,
    retryAfter: res.headers.get('retry-after'),
    body: (await res.json()) as { data?: Array<{ id: string }>; error?: { code: string | null } },
  }));

/** `promise`, or a failure naming `what` once `ms` pass: a request left waiting fails the test, not hangs it. */
function withDeadline<T>(promise: Promise<T>, what: string, ms = 10_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

test('clients asking for the model list at once share one read of each engine', async () => {
  const readsBefore = modelReads;
  const receivedBefore = modelRequests;
  const asked = Array.from({ length: 200 }, () => list());
  await until(() => modelRequests - receivedBefore >= 200, 'every client request at the gateway');
  await until(() => heldModelReads.length >= 1, "the engine's list asked for");
  answerModels();
  const answers = await withDeadline(Promise.all(asked), 'every client answered');
  for (const a of answers) {
    assert.equal(a.status, 200);
    assert.deepEqual(
      a.body.data?.map((m) => m.id),
      ['m'],
    );
  }
  assert.equal(modelReads - readsBefore, 1, 'one read of the engine answered them all');
});

test(`past ${MAX_MODEL_LISTS_GATHERED} lists gathered at once (each asked with its own Via), a client is answered 503 with Retry-After`, async () => {
  const receivedBefore = modelRequests;
  const n = MAX_MODEL_LISTS_GATHERED + 8;
  const asked = Array.from({ length: n }, (_, i) => list(`1.1 client-${i}`));
  await until(() => modelRequests - receivedBefore >= n, 'every client request at the gateway');
  await until(() => heldModelReads.length >= MAX_MODEL_LISTS_GATHERED, 'the reads in flight');
  answerModels();
  const answers = await withDeadline(Promise.all(asked), 'every client answered');
  const statuses = answers.map((a) => a.status).sort();
  assert.deepEqual(statuses, [...Array<number>(MAX_MODEL_LISTS_GATHERED).fill(200), ...Array<number>(8).fill(503)]);
  for (const a of answers.filter((x) => x.status === 503)) {
    assert.equal(a.retryAfter, '1');
    assert.equal(a.body.error?.code, 'model_lists_busy');
  }
});
