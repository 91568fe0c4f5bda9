import cluster from 'node:cluster';
import { readFileSync } from 'node:fs';
import { descriptorLimitWarning, openFileLimit } from '../../server/client-connections.js';
import { KVAwareRouter } from '../../core/router/index.js';
import { fileErrorMessage, quotedText } from '../../core/shown-text.js';
import { stderrLog } from '../log-line.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../server/gateway.js';
import { collectDefaultMetrics } from 'prom-client';
import { registerStateMetrics } from '../../server/metrics.js';
import { ProcessMetrics, type ProcessMetricsMessage } from '../../server/process-metrics.js';
import { routerIdBytes, type RequestLimits } from '../../server/request-limits.js';
import { startPicker } from '../../epp/run-picker.js';
import { MAX_CHAT_TEMPLATE_BYTES, readRegularFile } from '../../engines/bounded-file.js';
import { ChatTokenizer } from '../../engines/chat-tokenizer.js';
import { defaultTokenizerThreads, TokenizerPool } from '../../engines/tokenizer-pool.js';
import { ClusterStateStore, type ClusterMessage } from '../../state/cluster-state-store.js';
import { createStateStore } from '../../state/create-state-store.js';
import type { StateStore } from '../../state/state-store.js';
import { loadApiKeysFile } from '../../server/api-keys.js';
import { ROUTER_SETTING_KEYS } from '../config/settings.js';
import { isAdminTokenMessage, reloadAdminToken, runPrimary, serveAdminToken } from './serve-processes.js';
import { serveEppTlsSettings, type GatewayConfig, type ServeConfig } from './serve.js';
import { SERVE_EPP_TLS_FLAGS } from '../config/epp-tls.js';

/**
 * What `serve` runs (and `epp` with it): the router, its shared state, the gateway and the
 * endpoint picker, loaded by the command's action once its settings are resolved.
 */

/**
 * The tokenize mode `auto` stands for: the engine's /tokenize when a worker publishes KV
 * events (they carry token ids, so only requests hashed from token ids can match them) or
 * vLLM block hashes are asked for; text otherwise.
 */
export function resolveTokenizeMode(
  c: Pick<GatewayConfig, 'tokenize' | 'workers' | 'blockHash' | 'discover'>,
): 'text' | 'tokenizer' | 'engine' {
  if (c.tokenize !== 'auto') return c.tokenize;
  return c.blockHash === 'vllm' || c.workers.some((w) => w.events) || c.discover?.eventsPort !== undefined
    ? 'engine'
    : 'text';
}

/** This process's open-file limit (Linux's /proc; undefined elsewhere or unreadable). */
function readOpenFileLimit(): number | undefined {
  try {
    return openFileLimit(readFileSync('/proc/self/limits', 'utf8'));
  } catch {
    return undefined;
  }
}

/** The router, its shared state and the gateway, as `serve` (each of its processes) and `epp` run them. */
export async function startGateway(
  config: GatewayConfig,
  log: (m: string) => void,
  extra: Partial<GatewayOptions> = {},
) {
  const c = { ...config, tokenize: resolveTokenizeMode(config) };
  const worker = cluster.isWorker ? cluster.worker! : undefined;
  // KV events carry token ids: only requests hashed from token ids can match them
  const eventsUsable = c.tokenize !== 'text';
  const discoveredEvents = c.discover?.eventsPort !== undefined;
  if (!eventsUsable && (c.workers.some((w) => w.events) || discoveredEvents)) {
    log(
      'warning: KV events are ignored with --tokenize text (they carry token ids, text requests are hashed from text); use --tokenize auto, tokenizer or engine',
    );
  }
  // read and checked even when no mode uses it (a warning says so): a file that cannot be read
  // stops the command, and every process of --processes reads it again when it starts
  const chatTemplate = c.chatTemplate === undefined ? undefined : readTemplate(c.chatTemplate);
  const tokenizerThreads = c.tokenizerThreads ?? defaultTokenizerThreads(c.processes ?? 1);
  const promptTokenizer =
    c.tokenize !== 'tokenizer'
      ? undefined
      : tokenizerThreads === 0
        ? ChatTokenizer.load(c.tokenizer!, {
            chatTemplate,
            rendering: c.chatRendering,
            chatTemplateSource: '--chat-template',
            source: '--tokenizer',
          })
        : await TokenizerPool.start({
            path: c.tokenizer!,
            chatTemplate,
            rendering: c.chatRendering,
            chatTemplateSource: '--chat-template',
            threads: tokenizerThreads,
            timeoutMs: c.tokenizeTimeoutMs,
            source: '--tokenizer',
            log,
          });
  const precise = eventsUsable && (c.workers.some((w) => w.events) || discoveredEvents);
  const routerOptions = Object.fromEntries(ROUTER_SETTING_KEYS.map((k) => [k, c[k]]));
  const indexMode = c.indexMode === 'auto' ? (precise ? 'precise' : 'approximate') : c.indexMode;
  // the ids the gateway lets through (--max-id-bytes) must pass the router's own bound
  const router = new KVAwareRouter({
    ...routerOptions,
    indexMode,
    maxIdBytes: routerIdBytes(c.maxIdBytes),
    // the router refuses what the gateway lets through past its own bound: the same bound in both
    maxContentAnchors: c.maxAnchors,
  });
  const fileLimit = descriptorLimitWarning(readOpenFileLimit(), c.maxClientConnections);
  if (fileLimit !== undefined) log(fileLimit);
  const admin = serveAdminToken(c);
  if (admin.origin === 'generated') log(`admin token generated and written to ${admin.file} (mode 0600)`);
  else if (admin.origin === 'file') log(`admin token read from ${admin.file}`);
  const apiKeys = c.apiKeysFile ? loadApiKeysFile(c.apiKeysFile) : undefined;
  if (apiKeys) log(`client API keys: ${apiKeys.size} (requests without one get 401)`);
  // several processes share what they learn: through the primary, or through Redis
  const state: StateStore =
    worker && c.state === 'memory'
      ? new ClusterStateStore({ replicaId: String(worker.id), channel: processChannel() })
      : // the shared chain entries live as long as the router's own predictions (the store takes the router's when unset);
        // the tokenize mode is one of the hashing settings replicas sharing a prefix must agree on
        createStateStore(c.state, {
          prefix: c.statePrefix,
          predictionTtlMs: c.predictionTtlMs,
          tokenize: c.tokenize,
          chatRendering: c.chatRendering,
        });
  // with --processes, /metrics merges every process's registry through the primary
  let processMetrics: ProcessMetrics | undefined;
  const gateway = await createGateway({
    state,
    ...(worker
      ? {
          metricsPage: () => processMetrics!.mergedMetrics(),
          workerMetricsForgotten: (id: string) => processMetrics?.forgetWorker(id),
        }
      : {}),
    router,
    workers: c.workers,
    adminToken: admin.token,
    tokenize: c.tokenize,
    promptTokenizer,
    kvEvents: eventsUsable,
    publicRouteApi: c.publicRouteApi,
    apiKeys,
    cachedTokensHeader: c.cachedTokensHeader,
    forwardKvTransferParams: c.forwardKvTransferParams,
    forwardCustomLogitProcessor: c.forwardCustomLogitProcessor,
    engineKeyEnvs: c.engineKeyEnvs,
    allowedMediaDomains: c.allowedMediaDomains,
    // every limit, not a Partial: the compiler names a limit added to RequestLimits and not passed here
    limits: {
      maxIdBytes: c.maxIdBytes,
      maxAnchors: c.maxAnchors,
      maxJsonDepth: c.maxJsonDepth,
      maxJsonContainers: c.maxJsonContainers,
      maxJsonObjectMembers: c.maxJsonObjectMembers,
      maxGrammarBytes: c.maxGrammarBytes,
      maxChoices: c.maxChoices,
      maxStopSequences: c.maxStopSequences,
      maxLogprobs: c.maxLogprobs,
      maxPrompts: c.maxPrompts,
    } satisfies RequestLimits,
    timeouts: {
      headersTimeoutMs: c.headersTimeoutMs,
      requestTimeoutMs: c.requestTimeoutMs,
      connectionTimeoutMs: c.connectionTimeoutMs,
      firstByteTimeoutMs: c.firstByteTimeoutMs,
      interChunkTimeoutMs: c.upstreamTimeoutMs,
    },
    bodyLimit: c.bodyLimit,
    bufferedBodyLimit: c.bufferedBodyLimit,
    minBodyRate: c.minBodyRate,
    minBodyRateGraceMs: c.minBodyRateGraceMs,
    maxClientConnections: c.maxClientConnections,
    bufferedAnswerLimit: c.bufferedAnswerLimit,
    maxRetries: c.maxRetries,
    engineConnections: c.engineConnections,
    upstreamTimeoutMs: c.upstreamTimeoutMs,
    metricsIntervalMs: c.metricsIntervalMs,
    healthCheckIntervalMs: c.healthIntervalMs,
    healthCheckTimeoutMs: c.healthTimeoutMs,
    stallTimeoutMs: c.stallTimeoutMs,
    breakerFailures: c.breakerFailures,
    breakerCooldownMs: c.breakerCooldownMs,
    panicRouting: c.panicRouting,
    log,
    ...extra,
  });
  registerStateMetrics(gateway.metrics, state);
  // the process's own: resident memory, heap, CPU, open descriptors, event-loop delay, garbage
  // collection (prom-client's default metrics, under their usual names); with --processes the
  // primary merges them (process-metrics.ts: memory summed, a limit not, event-loop delay
  // averaged, its maximum the largest)
  collectDefaultMetrics({ register: gateway.metrics });
  const onPrimaryMessage = (m: unknown) => {
    // the admin token the primary re-read on SIGHUP (it checked it: a refusal here is a bug, logged)
    if (isAdminTokenMessage(m)) {
      try {
        gateway.replaceAdminToken(m.cfAdminToken);
      } catch (err) {
        log(`admin token from the primary refused, the current one stays: ${(err as Error).message}`);
      }
      return;
    }
    void processMetrics?.receive(m);
  };
  if (worker) {
    processMetrics = new ProcessMetrics(gateway.metrics, processChannel());
    process.on('message', onPrimaryMessage);
  }
  const tokenizing =
    c.tokenize === 'tokenizer'
      ? ` on ${tokenizerThreads === 0 ? 'the event loop' : `${tokenizerThreads} thread${tokenizerThreads === 1 ? '' : 's'}`}`
      : '';
  const stateName =
    c.state === 'memory'
      ? worker
        ? 'shared by the processes'
        : 'memory'
      : `redis (replica ${String(state.stats().replicaId)})`;
  const describe = `policy ${c.policy}, ${workerCount(gateway)}, tokenize ${c.tokenize}${tokenizing}${c.tokenize === 'tokenizer' ? `, ${c.chatRendering} chat rendering` : ''}, ${indexMode} index, block hash ${c.blockHash}, state ${stateName}`;
  const close = async () => {
    await gateway.close(c.shutdownGraceMs);
    process.off('message', onPrimaryMessage);
    if (promptTokenizer instanceof TokenizerPool) await promptTokenizer.close();
  };
  return { gateway, describe, close, admin };
}

/**
 * The workers the gateway has once the shared state is read: those configured, and those the
 * shared registry held (any replica's, running or not; docs/state.md says how to start afresh).
 */
function workerCount(gateway: Gateway): string {
  const records = gateway.connections.records();
  const configured = records.filter((w) => gateway.addedByOperator(w.id)).length;
  const shared = records.length - configured;
  return shared === 0
    ? `${records.length} workers`
    : `${records.length} workers (${configured} configured, ${shared} from the shared registry)`;
}

export async function runServe(config: ServeConfig): Promise<void> {
  if (config.processes > 1 && cluster.isPrimary)
    return runPrimary({ ...config, tokenize: resolveTokenizeMode(config) });
  if (!cluster.isWorker) return serveProcess(config);
  // a gateway process that cannot start says why and exits (its IPC channel would keep it alive)
  try {
    await serveProcess(config);
  } catch (err) {
    stderrLog(`[process ${String(cluster.worker!.id)}] `)(`error: ${(err as Error).message}`);
    process.exit(1);
  }
}

/** One gateway process (and its endpoint picker, with --epp-port): alone, or one of `--processes N`. */
async function serveProcess(c: ServeConfig): Promise<void> {
  const worker = cluster.isWorker ? cluster.worker! : undefined;
  const log = stderrLog(worker ? `[process ${String(worker.id)}] ` : '');
  // SIGHUP re-reads the admin token file (taken from the start: its default action would end the
  // process, cutting its requests). A gateway process of --processes leaves it to the primary,
  // which hands the token to every process; one sent while this one starts is applied once it runs.
  let started: Awaited<ReturnType<typeof startGateway>> | undefined;
  let hungUp = false;
  const onHangUp = () => {
    if (worker)
      return log(
        `SIGHUP: a gateway process reloads nothing; send it to the primary (pid ${process.ppid}), which re-reads the admin token file for every process`,
      );
    if (!started) return void (hungUp = true);
    const token = reloadAdminToken(started.admin, log);
    if (token === undefined) return;
    started.gateway.replaceAdminToken(token);
    started.admin = { ...started.admin, token };
  };
  process.on('SIGHUP', onHangUp);
  try {
    await serveWith(c, worker, log, (s) => {
      started = s;
      if (hungUp) onHangUp();
    });
  } finally {
    process.off('SIGHUP', onHangUp);
  }
}

/** serveProcess's gateway and picker, from their start to their stop; `onStarted` gets the gateway once it runs. */
async function serveWith(
  c: ServeConfig,
  worker: typeof cluster.worker | undefined,
  log: (m: string) => void,
  onStarted: (s: Awaited<ReturnType<typeof startGateway>>) => void,
): Promise<void> {
  if (c.workers.length === 0 && !c.discover)
    log(
      'warning: no workers (--worker, CONTEXTFORGE_WORKERS, the config file, --discover); add them with POST /admin/workers',
    );
  // before anything runs: a bad certificate stops the process with nothing left running
  const tls =
    c.eppPort === undefined
      ? undefined
      : (await import('./epp-tls-run.js')).eppTls(serveEppTlsSettings(c), SERVE_EPP_TLS_FLAGS);
  const started = await startGateway(c, log, { maxRequestsPerClient: c.maxRequestsPerClient });
  const { gateway, describe, close } = started;
  onStarted(started);
  const start = () => startPicker(gateway, c, { host: c.host, port: c.eppPort, log, tls: tls?.tls });
  const picker =
    c.eppPort === undefined ? await start() : await listening(`--host ${c.host} --epp-port ${c.eppPort}`, start, close);
  const address = await listening(
    `--host ${c.host} --port ${c.port}`,
    () => gateway.app.listen({ host: c.host, port: c.port }),
    async () => {
      await picker.close();
      await close();
    },
  );
  // the stop signals are taken before the start is announced: one sent as soon as the line is read
  // (a supervisor, a test) would otherwise end the process by the signal's default action
  const stopped = new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
    if (!worker) return;
    // the primary is gone (killed, say): no more connections come and nothing relays the state,
    // but the requests in flight finish within the grace. Node's own handler would exit at once
    // on a disconnect it did not ask for; marking it expected lets this one drain first.
    worker.exitedAfterDisconnect = true;
    if (!process.connected) return resolve();
    process.once('disconnect', resolve);
  });
  // with several processes the primary says where they serve, once all of them do
  log(
    `contextforge-router ${worker ? 'process' : 'serving on'} ${address}${picker.eppPort === undefined ? '' : `, endpoint picker (ext_proc gRPC, ${tls?.describe ?? 'plaintext'}) on port ${picker.eppPort}`} (${describe})`,
  );
  await stopped;
  await picker.close();
  await close();
  if (worker) process.exit(0);
}

/**
 * Binds a listening socket; an address that cannot be taken (in use, not this host's, not
 * allowed) stops the command with the flags that chose it, not a stack trace.
 */
export async function listening<T>(
  flags: string,
  bind: () => Promise<T>,
  closeStarted: () => Promise<void>,
): Promise<T> {
  try {
    return await bind();
  } catch (err) {
    // what is already running (timers, the other socket) would keep the process alive
    await closeStarted().catch(() => {});
    throw new RangeError(`${flags}: cannot listen: ${(err as Error).message.split('\n')[0]}`, { cause: err });
  }
}

/** This gateway process's IPC channel to the primary. */
function processChannel() {
  return {
    send: (m: ClusterMessage | ProcessMetricsMessage) => {
      // the primary stopping may close the channel after the check: drop the message (EPIPE
      // goes to the callback, not to an 'error' that would stop this process mid-shutdown)
      if (process.connected) process.send!(m, undefined, undefined, () => {});
    },
    onMessage: (listener: (m: unknown) => void) => void process.on('message', listener),
    offMessage: (listener: (m: unknown) => void) => void process.off('message', listener),
    onClose: (listener: () => void) => {
      if (!process.connected) queueMicrotask(listener);
      else process.once('disconnect', listener);
    },
  };
}

function readTemplate(file: string): string {
  try {
    return readRegularFile(file, MAX_CHAT_TEMPLATE_BYTES);
  } catch (err) {
    throw new RangeError(`--chat-template: cannot read ${quotedText(file)}: ${fileErrorMessage(err, file)}`, {
      cause: err,
    });
  }
}
