/**
 * The fault suite's engines and infrastructure: engines that hang, answer 500 or can be killed
 * and restarted on the same port, and a redis-server of the suite's own on a free port that can
 * be killed and restarted. Every wait has a deadline; nothing sleeps a fixed time to "let
 * things settle".
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createConnection, createServer as createTcpServer, type AddressInfo } from 'node:net';
import { MockEngine, type MockEngineOptions } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import type { Registry } from 'prom-client';
import type { StateStore } from '../../src/state/state-store.js';
import { until } from '../helpers/wait.js';

export async function freePort(): Promise<number> {
  const server = createTcpServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((r) => server.close(() => r()));
  return port;
}

export interface FakeEngine {
  url: string;
  port: number;
  /** Requests received on the OpenAI paths. */
  requests: number;
  /** Health probes received. */
  probes: number;
  close(): Promise<void>;
}

/** What a fake engine's /health answers: a status, or 'hang' (no answer until the engine closes: a probe times out). */
export type HealthAnswer = number | 'hang';

/**
 * An HTTP engine whose OpenAI paths are answered by `handler`; /health answers 200 and
 * /metrics 404 (so neither takes it out of rotation unless a test says so).
 */
export async function fakeEngine(
  handler: (req: IncomingMessage, res: ServerResponse) => void,
  healthStatus: () => HealthAnswer = () => 200,
): Promise<FakeEngine> {
  const engine = { url: '', port: 0, requests: 0, probes: 0, close: async () => {} };
  const server = createServer((req, res) => {
    if (req.url === '/health') {
      engine.probes++;
      const h = healthStatus();
      // a hung probe's response is left open: it ends with the engine's connections
      if (h !== 'hang') res.writeHead(h).end();
      return;
    }
    if (req.url === '/metrics') return void res.writeHead(404).end();
    engine.requests++;
    handler(req, res);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  engine.port = (server.address() as AddressInfo).port;
  engine.url = `http://127.0.0.1:${engine.port}`;
  engine.close = () =>
    new Promise<void>((r) => {
      server.closeAllConnections();
      server.close(() => r());
    });
  return engine;
}

/** What a canned engine answers a completion with. */
export interface CannedAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * A fake engine answering every `/v1/completions` with `answer(stream)` (the request's `stream`
 * flag), and 404 elsewhere; `completions()` counts the completions it answered.
 */
export async function cannedEngine(
  answer: (stream: boolean) => CannedAnswer,
): Promise<FakeEngine & { completions: () => number }> {
  let completions = 0;
  const engine = await fakeEngine((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      if (req.url !== '/v1/completions') return void res.writeHead(404).end();
      completions++;
      const { stream } = JSON.parse(Buffer.concat(parts).toString()) as { stream?: boolean };
      const a = answer(stream === true);
      res.writeHead(a.status, a.headers).end(a.body);
    });
  });
  return Object.assign(engine, { completions: () => completions });
}

/** An engine that reads the request and never answers. */
export const hangingEngine = () => fakeEngine((req) => req.resume());

/** An engine that answers every request, once read, with `status` and a JSON `body`. */
export const answeringEngine = (status: number, body: string, headers: Record<string, string> = {}) =>
  fakeEngine((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(body));
  });

/**
 * An engine that records the body of every POST in `received` and answers it with one
 * completion (an event stream when the body asks for `stream: true`); other methods get 404.
 */
export const recordingEngine = (received: string[]) =>
  fakeEngine((req, res) => {
    let text = '';
    req.setEncoding('utf8');
    req.on('data', (d: string) => (text += d));
    req.on('end', () => {
      if (req.method !== 'POST') {
        res.writeHead(404).end();
        return;
      }
      received.push(text);
      if ((JSON.parse(text) as { stream?: unknown }).stream === true) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end('data: {"choices":[{"text":"ok"}]}\n\ndata: [DONE]\n\n');
        return;
      }
      const answer = '{"choices":[{"text":"ok"}]}';
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': answer.length }).end(answer);
    });
  });

export interface HoldingEngine extends FakeEngine {
  /** POSTs received. */
  readonly posts: number;
  /** POSTs whose connection closed before their answer was written. */
  readonly abandoned: number;
  /** Answers every POST held so far with one completion naming the engine. */
  release(): void;
}

/** What a holding engine answers besides its completions. */
export interface HoldingEngineOptions {
  /** The status its held POSTs are answered with (default 200; another: an error object naming the engine). */
  status?: number;
  /** The entries its GET /v1/models lists, read at each request (default: none, 404). */
  models?: () => Array<{ id: string; parent?: string }>;
}

/**
 * An engine that holds every POST, once read, until release() (an engine still computing it),
 * then answers it with one completion whose text is `name` (with `options.status`, an error);
 * GET /v1/models lists `options.models()` when given; other requests get 404. Its /health
 * answers `healthStatus()`.
 */
export async function holdingEngine(
  name: string,
  healthStatus: () => HealthAnswer = () => 200,
  { status = 200, models }: HoldingEngineOptions = {},
): Promise<HoldingEngine> {
  const waiting: Array<() => void> = [];
  const answer =
    status === 200
      ? JSON.stringify({ choices: [{ text: name }], usage: { prompt_tokens: 1, completion_tokens: 1 } })
      : JSON.stringify({ error: { message: name } });
  const counts = { posts: 0, abandoned: 0 };
  const engine = await fakeEngine((req, res) => {
    req.resume();
    if (req.method === 'GET' && req.url === '/v1/models' && models !== undefined)
      return void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ data: models() }));
    if (req.method !== 'POST') return void res.writeHead(404).end();
    counts.posts++;
    res.on('close', () => {
      if (!res.writableFinished) counts.abandoned++;
    });
    req.on('end', () =>
      waiting.push(() => {
        if (!res.destroyed) res.writeHead(status, { 'content-type': 'application/json' }).end(answer);
      }),
    );
  }, healthStatus);
  // the counts are read live: the engine object is the one fakeEngine's close and requests use
  return Object.defineProperties(engine, {
    posts: { get: () => counts.posts },
    abandoned: { get: () => counts.abandoned },
    release: {
      value: () => {
        for (const send of waiting.splice(0)) send();
      },
    },
  }) as HoldingEngine;
}

/** An engine that answers every request with HTTP 500. */
export const failingEngine = () => answeringEngine(500, '{"error":{"message":"engine exploded"}}');

/** A mock engine on a fixed port that can be killed and restarted there (with an empty cache). */
export class KillableEngine {
  engine: MockEngine | undefined;
  port = 0;

  constructor(private readonly options: MockEngineOptions = {}) {
    this.options = { ...options };
  }

  /** Starts (again) on the same HTTP port and event endpoints; a port the old process still holds is retried until free. */
  async start(): Promise<this> {
    const deadline = Date.now() + 10_000;
    for (;;) {
      const engine = new MockEngine({ ...this.options, port: this.port });
      try {
        this.engine = await engine.start();
        break;
      } catch (err) {
        await engine.close().catch(() => {});
        if (!/in use/i.test(String((err as Error).message)) || Date.now() > deadline) throw err;
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    this.port = this.engine.port;
    // the event endpoints it bound ('*' ports resolved) are where it binds again after a restart
    if (this.options.events) this.options.events = this.engine.eventsEndpoint;
    if (this.options.replay) this.options.replay = this.engine.replayEndpoint;
    return this;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Connections are cut, requests in its queue and batch are lost. */
  async kill(): Promise<void> {
    await this.engine?.close();
    this.engine = undefined;
  }

  /** A new process on the same port: nothing cached. */
  async restart(): Promise<void> {
    await this.kill();
    await this.start();
  }
}

/** A redis-server of the test's own on a free port, without persistence; `args` are added to its command line. */
export class RedisProcess {
  private child: ChildProcess | undefined;
  port = 0;

  constructor(private readonly args: readonly string[] = []) {}

  async start(): Promise<this> {
    if (this.port === 0) this.port = await freePort();
    const child = spawn(
      'redis-server',
      [
        '--port',
        String(this.port),
        '--bind',
        '127.0.0.1',
        '--save',
        '',
        '--appendonly',
        'no',
        '--protected-mode',
        'no',
        ...this.args,
      ],
      { stdio: 'ignore' },
    );
    this.child = child;
    child.on('error', (err) => assert.fail(`redis-server could not start: ${err.message}`));
    await until(() => this.ping(), `redis-server on port ${this.port}`, { timeoutMs: 10_000 });
    return this;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /** SIGKILL: connections drop, nothing is saved. */
  async kill(): Promise<void> {
    const child = this.child;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGKILL');
    await exited;
    this.child = undefined;
  }

  async restart(): Promise<void> {
    await this.kill();
    await this.start();
  }

  /** SIGSTOP: the server stops answering, its connections stay open. */
  pause(): void {
    this.child?.kill('SIGSTOP');
  }

  /** SIGCONT: a paused server answers again. */
  resume(): void {
    this.child?.kill('SIGCONT');
  }

  private ping(): Promise<boolean> {
    return new Promise((resolve) => {
      const socket = createConnection({ host: '127.0.0.1', port: this.port });
      socket.once('error', () => resolve(false));
      socket.once('connect', () => socket.write('PING\r\n'));
      socket.once('data', (d) => {
        socket.destroy();
        // a server that requires a password is up too: it answers NOAUTH
        resolve(/^(\+PONG|-NOAUTH)/.test(d.toString()));
      });
    });
  }
}

/** POSTs JSON to the gateway; resolves to status, headers and the body text. */
export async function post(
  base: string,
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/**
 * A TCP proxy in front of a Redis server. `withhold(word)` makes it stop passing Redis's
 * answers back on any connection that sends a command containing `word` (case-insensitive),
 * so a test can hold a command in flight; `drop()` cuts every connection.
 */
export class RedisProxy {
  port = 0;
  /** Connections whose answers were withheld. */
  withheld = 0;
  private word: string | undefined;
  private readonly sockets = new Set<import('node:net').Socket>();
  /** Client sockets whose connections pass nothing either way any more. */
  private readonly silenced = new WeakSet<import('node:net').Socket>();
  private readonly server = createTcpServer((client) => {
    const upstream = createConnection({ host: '127.0.0.1', port: this.targetPort });
    let held = false;
    this.clients.add(client);
    client.on('close', () => this.clients.delete(client));
    for (const s of [client, upstream]) {
      this.sockets.add(s);
      s.on('error', () => {});
      s.on('close', () => {
        this.sockets.delete(s);
        client.destroy();
        upstream.destroy();
      });
    }
    client.on('data', (d) => {
      if (this.silenced.has(client)) return;
      if (!held && this.word !== undefined && d.toString('latin1').toLowerCase().includes(this.word)) {
        held = true;
        this.withheld++;
      }
      upstream.write(d);
    });
    upstream.on('data', (d) => {
      if (!held && !this.silenced.has(client)) client.write(d);
    });
  });
  private readonly clients = new Set<import('node:net').Socket>();

  /** `targetPort`: where each new connection goes; changing it moves new connections only (a failover behind one address). */
  constructor(public targetPort: number) {}

  /** Listens on a free port, or again on its port after close(): the clients' address stays valid. */
  async start(): Promise<this> {
    await new Promise<void>((r) => this.server.listen(this.port, '127.0.0.1', r));
    this.port = (this.server.address() as AddressInfo).port;
    return this;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  withhold(word: string): void {
    this.word = word.toLowerCase();
  }

  drop(): void {
    for (const s of this.sockets) s.destroy();
  }

  /**
   * Every connection open now stops passing anything, either way, and stays open (a path
   * that drops packets without a reset: a NAT entry gone, a partition); new connections pass.
   */
  blackhole(): void {
    for (const c of this.clients) this.silenced.add(c);
  }

  async close(): Promise<void> {
    this.drop();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

/**
 * A gateway replica sharing state through `state`, in front of the one engine at `engineUrl`
 * (worker `e0`), listening on a free port; `log` collects what it logs.
 */
export async function stateReplica(
  state: StateStore,
  engineUrl: string,
  log?: (message: string) => void,
): Promise<{ gateway: Gateway; base: string }> {
  const gateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    state,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    ...(log ? { log } : {}),
    workers: [{ id: 'e0', url: engineUrl }],
  });
  return { gateway, base: await gateway.app.listen({ host: '127.0.0.1', port: 0 }) };
}

/** A gateway listening on `base` in front of a failing engine and perhaps a good one (badFirstGateway). */
export interface BadFirstGateway {
  router: KVAwareRouter;
  gateway: Gateway;
  base: string;
  /** Closes the gateway and the good engine. */
  close: () => Promise<void>;
}

/**
 * A round-robin gateway in front of `badUrl` (worker `bad`, so the first request goes to it)
 * and, with `withGood`, a mock engine second (worker `good`), polling neither health nor
 * metrics; a worker's circuit opens after 3 failures and stays open a minute. `options` add to
 * or replace the gateway's options.
 */
export async function badFirstGateway(
  badUrl: string,
  withGood: boolean,
  options: Omit<Partial<GatewayOptions>, 'router' | 'workers'> = {},
): Promise<BadFirstGateway> {
  const good = withGood ? await new MockEngine().start() : undefined;
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const workers = [{ id: 'bad', url: badUrl }];
  if (good) workers.push({ id: 'good', url: `http://127.0.0.1:${good.port}` });
  const gateway = await createGateway({
    router,
    workers,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    breakerFailures: 3,
    breakerCooldownMs: 60_000,
    ...options,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return {
    router,
    gateway,
    base,
    close: async () => {
      await gateway.close();
      await good?.close();
    },
  };
}

/** Collects the process's unhandled rejections until stop(). */
export function unhandledRejections(): { seen: unknown[]; stop: () => void } {
  const seen: unknown[] = [];
  const onUnhandled = (reason: unknown) => seen.push(reason);
  process.on('unhandledRejection', onUnhandled);
  return { seen, stop: () => process.off('unhandledRejection', onUnhandled) };
}

/**
 * One stateReplica per store, each logging into its own list of `logs` (given or made here),
 * into `gateways` (so a caller's cleanup sees those made before a failure); resolves once every
 * store is connected.
 */
export async function stateReplicas(
  stores: readonly (StateStore & { stats(): { connected?: boolean } })[],
  engineUrl: string,
  gateways: Gateway[],
  logs: string[][] = stores.map(() => []),
): Promise<string[]> {
  const bases: string[] = [];
  for (const [i, state] of stores.entries()) {
    const { gateway, base } = await stateReplica(state, engineUrl, (m) => logs[i].push(m));
    gateways.push(gateway);
    bases.push(base);
  }
  await until(() => stores.every((s) => s.stats().connected === true), 'the replicas to connect');
  return bases;
}

/** The counter of requests routed over workers held out only by slow probes (panic routing). */
export const PANIC_ROUTED = 'contextforge_panic_routed_total';

/** A whole completion answer, as a fake engine sends it. */
export const OK_COMPLETION = '{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}';

/**
 * A sample of the registry's text, or 0 when it has none; a series named with some of its labels
 * (`name{worker="w"}` of a counter also labelled by reason) is the sum of the samples that have them.
 */
export async function sample(registry: Registry, series: string): Promise<number> {
  const text = await registry.metrics();
  const brace = series.indexOf('{');
  const name = brace < 0 ? series : series.slice(0, brace);
  const labels =
    brace < 0
      ? []
      : series
          .slice(brace + 1, -1)
          .split(/,(?=[a-z_]+=")/)
          .filter((l) => l !== '');
  let sum = 0;
  let found = false;
  for (const line of text.split('\n')) {
    const space = line.lastIndexOf(' ');
    if (space < 0) continue;
    const key = line.slice(0, space);
    if (key !== name && !key.startsWith(`${name}{`)) continue;
    const have = key === name ? [] : key.slice(name.length + 1, -1).split(/,(?=[a-z_]+=")/);
    if (!labels.every((l) => have.includes(l))) continue;
    sum += Number(line.slice(space + 1));
    found = true;
  }
  return found ? sum : 0;
}
