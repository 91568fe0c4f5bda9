import cluster from 'node:cluster';
import { Option, type Command } from 'commander';
import type { z } from 'zod';
import { isPythonHashSeed, PYTHON_HASH_SEED_RULE } from '../../core/router/options-schema.js';
import { quotedText } from '../../core/shown-text.js';
import { sharedEndpoint, sharedEndpointMessage } from '../../server/engine-deployments.js';
import { connectionTimeoutProblem } from '../../server/timeouts.js';
import type { PickerConfig } from '../../epp/run-picker.js';
import type { WorkerRecord } from '../../state/state-store.js';
import { checkPickerWorkerHosts } from '../../epp/worker-hosts.js';
import { scrapeGapMs } from '../../engines/metrics/scraper.js';
import { checkEppTlsSettings, SERVE_EPP_TLS_FLAGS, type EppTlsSettings } from '../config/epp-tls.js';
import { printConfig } from '../config/print-config.js';
import { addSettingOptions, resolveSettings, setOtherThanDefault, type ResolvedSettings } from '../config/resolve.js';
import { EPP_SCHEMA, GATEWAY_SCHEMA, SERVE_HELP, SERVE_SCHEMA } from '../config/settings.js';

export { envName } from '../config/settings.js';
export { parseWorkerSpec } from '../config/resolve.js';

type WithWorkers<T> = Omit<T, 'objectives'> & { workers: WorkerRecord[]; objectives?: ReadonlyMap<string, number> };
/** A gateway's settings as serve and epp resolve them. */
export type GatewayConfig = WithWorkers<z.output<typeof GATEWAY_SCHEMA>> & Partial<PickerConfig>;
export type ServeConfig = WithWorkers<z.output<typeof SERVE_SCHEMA>>;
export type EppConfig = WithWorkers<z.output<typeof EPP_SCHEMA>>;

/**
 * Resolves the settings of `schema` (serve's or epp's): flag, then environment, then config
 * file, then default; checks the combinations no single setting can.
 */
export function resolveConfig<S extends typeof SERVE_SCHEMA | typeof EPP_SCHEMA>(
  cmd: Command,
  env: NodeJS.ProcessEnv,
  schema: S,
): { config: WithWorkers<z.output<S>>; resolved: ResolvedSettings<z.output<S>> } {
  const resolved = resolveSettings(cmd, env, schema);
  const { objectives, ...values } = resolved.values;
  const config = {
    ...values,
    objectives: objectives === undefined ? undefined : new Map(Object.entries(objectives)),
    workers: resolved.workers,
  } as WithWorkers<z.output<S>>;
  if (config.bufferedBodyLimit < config.bodyLimit) {
    // a body limit raised past the default budget raises the budget with it, unless it was set
    if (resolved.origins.bufferedBodyLimit !== 'default')
      throw new RangeError(
        `--buffered-body-limit (${config.bufferedBodyLimit}) must be at least --body-limit (${config.bodyLimit}): a body at the limit could never be read`,
      );
    config.bufferedBodyLimit = config.bodyLimit;
    (resolved.values as { bufferedBodyLimit: number }).bufferedBodyLimit = config.bodyLimit;
  }
  // a client waiting for an answer is idle up to the upstream (inter-chunk) timeout
  const connection = { connectionTimeoutMs: config.connectionTimeoutMs, interChunkTimeoutMs: config.upstreamTimeoutMs };
  const problem = connectionTimeoutProblem(
    connection,
    resolved.origins.connectionTimeoutMs !== 'default',
    '--connection-timeout-ms',
    '--upstream-timeout-ms',
  );
  if (problem !== undefined) throw new RangeError(problem);
  config.connectionTimeoutMs = connection.connectionTimeoutMs;
  (resolved.values as { connectionTimeoutMs: number }).connectionTimeoutMs = connection.connectionTimeoutMs;
  checkPickerSettings(
    schema === EPP_SCHEMA || (config as { eppPort?: number }).eppPort !== undefined,
    config,
    resolved,
  );
  if (schema === SERVE_SCHEMA)
    checkServeEppTls(config as unknown as ServeConfig, resolved as unknown as ResolvedSettings<ServeConfig>);
  if (config.tokenize === 'tokenizer' && !config.tokenizer)
    throw new RangeError('--tokenize tokenizer needs --tokenizer PATH (tokenizer.json or its model directory)');
  // one engine listed twice gets twice its share of the requests, and its KV is learnt twice
  const urlOwner = new Map<string, string>();
  for (const w of config.workers) {
    let url: string;
    try {
      // compared and shown without credentials, which are never printed
      const u = new URL(w.url);
      u.username = '';
      u.password = '';
      url = u.href.replace(/\/+$/, '');
    } catch {
      continue;
    }
    const first = urlOwner.get(url);
    if (first === undefined) urlOwner.set(url, w.id);
    else
      resolved.warnings.push(
        `workers '${first}' and '${w.id}' have the same URL ${url}: one engine listed twice gets twice its share (a data-parallel engine is listed once, with dp-size)`,
      );
  }
  // an engine publishes one event stream: a second worker on it would be credited with its blocks
  for (let i = 1; i < config.workers.length; i++) {
    const shared = sharedEndpoint(config.workers[i], config.workers.slice(0, i));
    if (shared !== undefined) throw new RangeError(`${workersSource(resolved)}: ${sharedEndpointMessage(shared)}`);
  }
  // only --tokenize tokenizer reads them: given with another mode, the path is never even checked
  if (config.tokenize !== 'tokenizer') {
    if (config.tokenizer !== undefined)
      resolved.warnings.push(`--tokenizer has no effect without --tokenize tokenizer (the mode is ${config.tokenize})`);
    if (config.chatTemplate !== undefined)
      resolved.warnings.push(
        `--chat-template has no effect without --tokenize tokenizer (the mode is ${config.tokenize})`,
      );
    if (setOtherThanDefault(resolved, schema, 'chatRendering'))
      resolved.warnings.push(
        `--chat-rendering has no effect without --tokenize tokenizer (the mode is ${config.tokenize})`,
      );
  }
  // the algorithm only keys blocks in vllm mode; a shared config or environment may set it for
  // routers in either mode, so it is a warning, as KV events with --tokenize text are
  if (config.blockHash !== 'vllm' && setOtherThanDefault(resolved, schema, 'prefixCachingHashAlgo'))
    resolved.warnings.push('--prefix-caching-hash-algo has no effect without --block-hash vllm');
  if (config.blockHash !== 'vllm' && config.pythonHashSeed !== undefined)
    resolved.warnings.push('--python-hash-seed has no effect without --block-hash vllm');
  if (config.blockHash === 'vllm') {
    if (config.pythonHashSeed === undefined && env.PYTHONHASHSEED) {
      if (!isPythonHashSeed(env.PYTHONHASHSEED))
        throw new RangeError(
          `PYTHONHASHSEED (for --block-hash vllm) ${PYTHON_HASH_SEED_RULE} (got ${quotedText(env.PYTHONHASHSEED)})`,
        );
      config.pythonHashSeed = env.PYTHONHASHSEED;
      // --print-config shows it with the others
      (resolved.values as { pythonHashSeed?: string }).pythonHashSeed = env.PYTHONHASHSEED;
      resolved.origins.pythonHashSeed = 'env';
    }
    if (config.pythonHashSeed === undefined)
      throw new RangeError(
        "--block-hash vllm needs the engines' PYTHONHASHSEED: --python-hash-seed N or the PYTHONHASHSEED environment variable (vLLM's block hashes are random without it)",
      );
    if (config.tokenize === 'text')
      throw new RangeError(
        '--block-hash vllm hashes token ids: it needs --tokenize auto, tokenizer or engine, not text',
      );
  }
  return { config, resolved };
}

/** Where the workers were given: the flag, the variable or the config file. */
function workersSource(resolved: ResolvedSettings<object>): string {
  return {
    flag: '--worker',
    env: 'CONTEXTFORGE_WORKERS',
    file: `--config ${resolved.configFile ?? ''}: workers`,
    default: '',
  }[resolved.workersOrigin];
}

/** The TLS of serve's --epp-port: as epp's, and named when there is no --epp-port for it. */
function checkServeEppTls(c: ServeConfig, resolved: ResolvedSettings<ServeConfig>): void {
  checkEppTlsSettings(serveEppTlsSettings(c), resolved.warnings, SERVE_EPP_TLS_FLAGS);
  if (c.eppPort !== undefined) return;
  const set = (['eppSecureServing', 'eppCertPath', 'eppEnableCertReload'] as const).filter((k) =>
    setOtherThanDefault(resolved, SERVE_SCHEMA, k),
  );
  if (set.length > 0)
    resolved.warnings.push(
      `${set.map((k) => SERVE_EPP_TLS_FLAGS[TLS_KEYS[k]]).join(', ')} ${set.length === 1 ? 'has' : 'have'} no effect without --epp-port`,
    );
}

const TLS_KEYS = {
  eppSecureServing: 'secureServing',
  eppCertPath: 'certPath',
  eppEnableCertReload: 'enableCertReload',
} as const;

/** serve's --epp-port TLS settings under the names epp gives them. */
export function serveEppTlsSettings(c: ServeConfig): EppTlsSettings {
  return { secureServing: c.eppSecureServing, certPath: c.eppCertPath, enableCertReload: c.eppEnableCertReload };
}

/**
 * The endpoint picker's settings, checked when it runs (`epp`, `serve --epp-port`): its static
 * workers' hosts and the staleness of metrics against the scrape interval.
 */
function checkPickerSettings(
  picks: boolean,
  config: WithWorkers<{ metricsIntervalMs: number; shedMetricsStaleMs?: number; eppPort?: number }>,
  resolved: ResolvedSettings<object>,
): void {
  if (!picks) return;
  checkPickerWorkerHosts(config.workers, workersSource(resolved));
  const stale = config.shedMetricsStaleMs;
  if (stale === undefined) return;
  if (config.metricsIntervalMs === 0)
    resolved.warnings.push('--shed-metrics-stale-ms has no effect with --metrics-interval-ms 0 (no metrics are read)');
  else {
    const gap = scrapeGapMs(config.metricsIntervalMs);
    if (stale <= gap)
      throw new RangeError(
        `--shed-metrics-stale-ms (${stale}) must be more than ${gap} ms: the scrape interval plus twice the scrape timeout, as old as a reading gets between two scrapes that succeed`,
      );
  }
}

/** `serve`'s settings from its parsed command line, the environment and the config file. */
export function resolveServeConfig(cmd: Command, env: NodeJS.ProcessEnv = process.env): ServeConfig {
  return resolveConfig(cmd, env, SERVE_SCHEMA).config;
}

/** serve's and epp's --print-config. */
export function printConfigOption(): Option {
  return new Option(
    '--print-config [format]',
    'print the effective configuration (yaml or json) with where each value came from, secrets redacted, and exit',
  ).choices(['yaml', 'json']);
}

export function registerServeCommand(program: Command): void {
  const cmd = program.command('serve').description('run the OpenAI-compatible routing gateway in front of the engines');
  addSettingOptions(cmd, SERVE_SCHEMA.shape, SERVE_HELP);
  cmd.addOption(printConfigOption());
  cmd.action(async () => {
    const { config, resolved } = resolveConfig(cmd, process.env, SERVE_SCHEMA);
    // the gateway processes of --processes N resolve the same settings again: the primary warns for them
    if (!cluster.isWorker) for (const w of resolved.warnings) process.stderr.write(`warning: ${w}\n`);
    const format = cmd.opts<{ printConfig?: string | true }>().printConfig;
    if (format !== undefined) {
      process.stdout.write(printConfig(resolved, format === 'json' ? 'json' : 'yaml'));
      return;
    }
    // the gateway and what it runs on are loaded only to run it
    await (await import('./serve-run.js')).runServe(config);
  });
}
