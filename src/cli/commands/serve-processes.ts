import cluster from 'node:cluster';
import type { Serializable } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { rereadAdminTokenFile, resolveAdminToken, type ResolvedAdminToken } from '../../server/admin-auth.js';
import { shownText } from '../../core/shown-text.js';
import { stderrLog } from '../log-line.js';
import { MAX_TIMER_MS } from '../../server/timeouts.js';
import { closeUnansweredHandoffs } from './connection-handoff.js';
import { ClusterRelay } from '../../state/cluster-state-store.js';
import { MetricsAggregator } from '../../server/process-metrics.js';
import type { ServeConfig } from './serve.js';

/**
 * `serve --processes N`: the primary forks N gateway processes that share the listening port
 * (node:cluster hands out the connections), relays their state (ClusterRelay) unless Redis
 * holds it, restarts one that crashes, stops them all on SIGINT/SIGTERM, and on SIGHUP re-reads
 * the admin token file and hands the new token to every process.
 */
export async function runPrimary(c: ServeConfig): Promise<void> {
  const log = stderrLog();
  cluster.setupPrimary({ serialization: 'advanced' });
  // one admin token for every process: resolved (or generated) here, inherited through the environment
  let admin = serveAdminToken(c);
  if (admin.origin === 'generated') log(`admin token generated and written to ${admin.file} (mode 0600)`);
  process.env.CONTEXTFORGE_ADMIN_TOKEN = admin.token;
  /** How to reach each gateway process that runs, by id. */
  const senders = new Map<string, (m: unknown) => void>();
  // decisions replayed to a process that starts later live as long as the router's predictions
  const relay =
    c.state === 'memory'
      ? new ClusterRelay({
          decisionTtlMs: c.predictionTtlMs,
          // the decisions the processes' routers take: configured alike, as this process is
          maxPromptTokens: c.maxPromptTokens,
          blockSize: c.blockSize,
          log,
        })
      : undefined;
  // /metrics of any process answers every process's counters, merged here (a stopped one's kept)
  const metrics = new MetricsAggregator({ log });
  let stopping = false;
  const listening = new Set<number>();
  let announced = false;
  const backoff = new RestartBackoff();
  /** Replacements waiting out their pause (several when several processes failed at once). */
  const restartTimers = new Set<NodeJS.Timeout>();
  const failedToStart = new Promise<never>((_resolve, reject) => {
    const fork = () => {
      const worker = cluster.fork();
      // a connection handed to a process killed before it took it would otherwise never be closed
      closeUnansweredHandoffs(worker);
      const id = String(worker.id);
      const send = (m: unknown) => {
        // a process that is exiting may close its channel after the check: the write then
        // fails with EPIPE, reported to the callback (not as an 'error' that would stop the
        // primary); its 'exit' removes it from the relay
        if (worker.isConnected()) worker.send(m as Serializable, undefined, undefined, ignoreClosedChannel);
      };
      relay?.add({ id, send });
      metrics.add(id, { send });
      senders.set(id, send);
      // the token it inherits (the environment, as it is now); one SIGHUP brings while it starts
      // may reach it before it listens for messages, so the current one is sent once it listens
      let tokenSent = admin.token;
      worker.on('message', (m: unknown) => {
        if (!metrics.receive(id, m)) relay?.receive(id, m);
      });
      worker.on('listening', (address) => {
        listening.add(worker.id);
        backoff.listening(worker.id);
        if (tokenSent !== admin.token) {
          tokenSent = admin.token;
          send({ cfAdminToken: admin.token } satisfies AdminTokenMessage);
        }
        if (announced || listening.size < c.processes) return;
        announced = true;
        const host =
          address.address && address.address.includes(':') ? `[${address.address}]` : address.address || c.host;
        log(
          `contextforge-router serving on http://${host}:${address.port} (${c.processes} processes, policy ${c.policy}, ${c.workers.length} workers${c.state === 'memory' ? '' : ' configured (each process counts those of the shared registry too)'}, tokenize ${c.tokenize}, state ${c.state === 'memory' ? 'shared by the processes' : 'redis'})`,
        );
      });
      worker.on('exit', (code, signal) => {
        senders.delete(id);
        relay?.remove(id);
        metrics.remove(id);
        const started = listening.delete(worker.id);
        if (stopping) return;
        const how = signal ?? `exit ${code}`;
        // one of the first that never served is a configuration error: restarting would only repeat it
        if (!started && !announced)
          return reject(new RangeError(`a gateway process failed to start (${how}); its error is above`));
        // whatever its code (exit 0 too: SIGTERM to it alone) the port is short of a process: one
        // that served long is replaced at once; one that died starting (killed, or what it reads is
        // gone) or soon after it started serving (a crash on its first requests, or on a message
        // every process receives) is tried again while the others keep serving, less often each
        // time it fails, so that a crash loop does not spin
        const { delayMs, servedMs } = backoff.exited(worker.id);
        if (delayMs === 0) {
          log(`gateway process ${id} stopped (${how}); starting another`);
          return fork();
        }
        log(
          servedMs === undefined
            ? `gateway process ${id} exited before it served (${how}); starting another in ${delayMs} ms`
            : `gateway process ${id} stopped (${how}); starting another in ${delayMs} ms, as it served only ${servedMs} ms`,
        );
        const timer = setTimeout(() => {
          restartTimers.delete(timer);
          if (!stopping) fork();
        }, delayMs);
        restartTimers.add(timer);
      });
    };
    for (let i = 0; i < c.processes; i++) fork();
  });
  let signalled = (): void => {};
  const stopSignal = new Promise<void>((resolve) => (signalled = resolve));
  // handled for as long as the processes stop: a second SIGINT/SIGTERM would otherwise take its
  // default action, end the primary and with it the processes' channels, cutting their requests
  const onSignal = (signal: NodeJS.Signals) => {
    if (!stopping) return signalled();
    log(
      `${signal}: already stopping; the gateway processes finish their requests (within --shutdown-grace-ms ${c.shutdownGraceMs})`,
    );
  };
  // SIGHUP: the token file read again, its token handed to every process (and, through the
  // environment, to every process started from now on); a file refused keeps the current token
  const onHangUp = () => {
    const token = reloadAdminToken(admin, log);
    if (token === undefined) return;
    admin = { ...admin, token };
    process.env.CONTEXTFORGE_ADMIN_TOKEN = token;
    for (const send of senders.values()) send({ cfAdminToken: token } satisfies AdminTokenMessage);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  process.on('SIGHUP', onHangUp);
  try {
    await Promise.race([failedToStart, stopSignal]);
  } finally {
    stopping = true;
    for (const timer of restartTimers) clearTimeout(timer);
    log(`stopping: the gateway processes finish their requests (within --shutdown-grace-ms ${c.shutdownGraceMs})`);
    // the margin may carry a grace near a timer's limit past it (such a timer fires at once)
    await stopWorkers(Math.min(c.shutdownGraceMs + STOP_MARGIN_MS, MAX_TIMER_MS));
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    process.off('SIGHUP', onHangUp);
  }
}

/** A message to a process whose channel has just closed is dropped: the process is going away. */
function ignoreClosedChannel(): void {}

/** The first pause before a replacement that failed (see RestartBackoff) is tried again; it doubles up to the max. */
const MIN_RESTART_DELAY_MS = 100;
const MAX_RESTART_DELAY_MS = 10_000;

/**
 * How long a gateway process serves before its start counts as good. A process that crashes on
 * its first requests, or on a message every process receives (its start snapshot, a relayed
 * decision), does so within a second or two of listening: 10 s catches those with room to spare
 * on a loaded machine, and costs little when it misjudges (a process that crashes once, by
 * chance, this early is replaced after MIN_RESTART_DELAY_MS). It equals MAX_RESTART_DELAY_MS: a
 * process that keeps crashing just after this long is started no more often than the longest
 * pause would start it.
 */
const SERVED_OK_MS = 10_000;

/**
 * When to start a gateway process in place of one that exited: at once after one that served
 * SERVED_OK_MS; else (it exited before it listened, or soon after) after a pause that starts at
 * MIN_RESTART_DELAY_MS and doubles with each such failure up to MAX_RESTART_DELAY_MS. The pause
 * goes back to the start once a process that started serving after the last failure has served
 * SERVED_OK_MS.
 */
export class RestartBackoff {
  /** When each process that listens started listening. */
  private readonly servingSince = new Map<number, number>();
  private delayMs = 0;
  private lastFailureAt = -Infinity;

  constructor(private readonly now: () => number = Date.now) {}

  /** Process `id` listens (on its first port: one with --epp-port listens twice). */
  listening(id: number): void {
    if (!this.servingSince.has(id)) this.servingSince.set(id, this.now());
  }

  /** Process `id` exited: the pause before its replacement (0: none), and how long it served (undefined: never). */
  exited(id: number): { delayMs: number; servedMs: number | undefined } {
    const at = this.now();
    const since = this.servingSince.get(id);
    // a process that started serving since the last failure (this one too) has served long
    // enough: what made the others fail is gone (one serving since before proves nothing)
    if ([...this.servingSince.values()].some((s) => s >= this.lastFailureAt && s + SERVED_OK_MS <= at))
      this.delayMs = 0;
    this.servingSince.delete(id);
    const servedMs = since === undefined ? undefined : at - since;
    if (servedMs !== undefined && servedMs >= SERVED_OK_MS) return { delayMs: 0, servedMs };
    this.lastFailureAt = at;
    this.delayMs = Math.min(Math.max(this.delayMs * 2, MIN_RESTART_DELAY_MS), MAX_RESTART_DELAY_MS);
    return { delayMs: this.delayMs, servedMs };
  }
}

/** Time a gateway process has, past its grace, to close its engine connections and state. */
const STOP_MARGIN_MS = 5000;

/** Asks every gateway process to finish its requests and stop; kills those still there after `killAfterMs`. */
async function stopWorkers(killAfterMs: number): Promise<void> {
  const workers = Object.values(cluster.workers ?? {}).filter((w) => w !== undefined);
  await Promise.all(
    workers.map(
      (w) =>
        new Promise<void>((resolve) => {
          if (w.isDead()) return resolve();
          const timer = setTimeout(() => w.process.kill('SIGKILL'), killAfterMs);
          w.once('exit', () => {
            clearTimeout(timer);
            resolve();
          });
          w.process.kill('SIGTERM');
        }),
    ),
  );
}

/**
 * `serve`'s admin token: configured (flag, CONTEXTFORGE_ADMIN_TOKEN, config), else the token
 * file, else a random one written to a private default file the operator can read.
 */
export function serveAdminToken(c: Pick<ServeConfig, 'adminToken' | 'adminTokenFile'>) {
  return resolveAdminToken({
    token: c.adminToken,
    // a missing directory is made (mode 0700) for a named file too, as for the default one: the
    // path is logged at start, so a typo in it shows
    tokenFile: c.adminTokenFile ?? defaultAdminTokenFile(),
  });
}

/** Where a generated admin token goes when no file is named: a per-user private directory. */
export function defaultAdminTokenFile(): string {
  const uid = typeof process.getuid === 'function' ? process.getuid() : 'user';
  return join(process.env.XDG_RUNTIME_DIR || tmpdir(), `contextforge-router-${uid}`, 'admin-token');
}

/** The primary's message to a gateway process: check this admin token from now on. */
export interface AdminTokenMessage {
  cfAdminToken: string;
}

export function isAdminTokenMessage(m: unknown): m is AdminTokenMessage {
  return m !== null && typeof m === 'object' && typeof (m as { cfAdminToken?: unknown }).cfAdminToken === 'string';
}

/**
 * What SIGHUP does to `serve`'s admin token: the token file read again, its token returned; or,
 * for a token that came from no file, or a file refused (gone, unreadable, empty, not a token),
 * undefined: the current token stays. Either way one line is logged (naming the file and the
 * reason, never a token).
 */
export function reloadAdminToken(admin: ResolvedAdminToken, log: (m: string) => void): string | undefined {
  if (admin.file === undefined) {
    log(
      'SIGHUP: the admin token was given by --admin-token, CONTEXTFORGE_ADMIN_TOKEN or the config file, not read from a file: it cannot be re-read; restart to change it',
    );
    return undefined;
  }
  let token: string;
  try {
    token = rereadAdminTokenFile(admin.file);
  } catch (err) {
    log(`SIGHUP: admin token not reloaded, the current one stays: ${(err as Error).message}`);
    return undefined;
  }
  log(
    `SIGHUP: admin token reloaded from ${shownText(admin.file)}${token === admin.token ? ' (unchanged)' : '; the previous one is refused from now on'}`,
  );
  return token;
}
