/**
 * KV-event subscribers opened and closed in every state a worker's removal can find them in,
 * counting the process's open file descriptors (test/engines/kv-event-subscriber-close.test.ts).
 * Run in a process of its own: a ZeroMQ context whose reaper is stuck releases no socket for the
 * rest of its process, whatever runs there next. Run directly, this file prints the counts as JSON.
 * Endpoints are ipc:// paths in a directory of its own: no port is taken.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Router } from 'zeromq';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { KvEventPublisher } from '../../src/engines/kv-events/publisher.js';
import { KvEventSubscriber } from '../../src/engines/kv-events/subscriber.js';
import { KVAwareRouter } from '../../src/index.js';
import { until } from './wait.js';

/** The counts the cycles left: open descriptors before them and once they are all closed. */
export interface SubscriberCycles {
  cycles: number;
  states: string[];
  before: number;
  after: number;
}

const openFds = () => readdirSync('/proc/self/fd').length;

/** `cycles` subscribers opened and closed, each in one of the states below in turn. */
export async function subscriberCycles(cycles: number, slack: number): Promise<SubscriberCycles> {
  const dir = mkdtempSync(join(tmpdir(), 'kv-subscriber-cycles-'));
  const router = new KVAwareRouter({ blockSize: 4 });
  router.registerWorker('w', { url: 'http://127.0.0.1:1' });
  const applier = new KvEventApplier(router);
  const pub = await new KvEventPublisher({
    endpoint: `ipc://${dir}/events`,
    replayEndpoint: `ipc://${dir}/replay`,
    bufferSize: 4,
  }).start();
  // a replay endpoint that takes requests and never answers: a replay stays under way
  const silent = new Router({ linger: 0 });
  await silent.bind(`ipc://${dir}/silent`);
  let replaysAsked = 0;
  void (async () => {
    for await (const _ of silent) replaysAsked++;
  })().catch(() => {});
  const subscriber = (endpoint: string, replayEndpoint?: string) =>
    new KvEventSubscriber({ workerId: 'w', endpoint, replayEndpoint, applier, replayTimeoutMs: 60_000 });
  const probe = { ts: 1, events: [{ type: 'AllBlocksCleared' as const }], dataParallelRank: null };
  const states: Record<string, () => Promise<KvEventSubscriber>> = {
    // subscribed, batches applied, its connect's replay answered
    connected: async () => {
      const s = subscriber(pub.endpoint, pub.replayEndpoint).start();
      await until(
        async () => {
          if (s.stats.batches > 0 && s.stats.replays > 0) return true;
          await pub.publish(probe);
          return false;
        },
        'a batch live and a replay',
        { intervalMs: 20 },
      );
      return s;
    },
    // connected, its replay waiting for an answer
    replaying: async () => {
      const asked = replaysAsked;
      const s = subscriber(pub.endpoint, `ipc://${dir}/silent`).start();
      await until(() => replaysAsked > asked, 'the replay to be asked for');
      return s;
    },
    // an engine that is not there (yet): ZeroMQ retries
    unreached: async () => subscriber(`ipc://${dir}/nobody`, `ipc://${dir}/nobody-replay`).start(),
    // an endpoint ZeroMQ refuses (a wildcard host is for binding)
    refused: async () => {
      const s = subscriber('tcp://*:5557');
      try {
        s.start();
      } catch {
        // refused, as it should: closed below all the same
      }
      return s;
    },
    // constructed, never started
    unstarted: async () => subscriber(`ipc://${dir}/nobody`),
  };
  const names = Object.keys(states);
  try {
    // once each first: the context's threads and the publisher's own descriptors are not counted
    for (const name of names) await (await states[name]()).close();
    const before = openFds();
    for (let i = 0; i < cycles; i++) await (await states[names[i % names.length]]()).close();
    // the publisher's end of each connection and the reaped sockets go on the next turns
    let after = openFds();
    await until(() => (after = openFds()) <= before + slack, 'the descriptors to be released', {
      timeoutMs: 5000,
    }).catch(() => {});
    return { cycles, states: names, before, after };
  } finally {
    silent.close();
    await pub.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

const self = fileURLToPath(import.meta.url);

/** subscriberCycles() in a new process; `exited` says whether it ended of itself within `exitMs`. */
export async function subscriberCyclesInProcess(
  cycles: number,
  slack: number,
  exitMs: number,
): Promise<SubscriberCycles & { exited: boolean }> {
  const child = spawn(process.execPath, ['--import', 'tsx', self, String(cycles), String(slack)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let text = '';
  child.stdout.on('data', (d: Buffer) => (text += d.toString()));
  let code: number | null | undefined;
  child.once('exit', (c) => (code = c));
  try {
    await until(() => text.endsWith('\n') || code !== undefined, 'the counts', { timeoutMs: 120_000 });
    if (!text.endsWith('\n')) throw new Error(`the cycling process exited ${code} without its counts`);
    const counts = JSON.parse(text) as SubscriberCycles;
    const exited = await until(() => code !== undefined, 'the process to exit', { timeoutMs: exitMs }).then(
      () => true,
      () => false,
    );
    return { ...counts, exited };
  } finally {
    if (code === undefined) child.kill('SIGKILL');
  }
}

if (process.argv[1] === self) {
  const counts = await subscriberCycles(Number(process.argv[2]), Number(process.argv[3]));
  process.stdout.write(`${JSON.stringify(counts)}\n`);
}
