import cluster from 'node:cluster';
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command, InvalidArgumentError, Option } from 'commander';
import { parse as parseYaml } from 'yaml';
import { POLICY_NAMES, resolveCostWeights, type CostWeights, type PolicyOptions } from '../../core/policies/index.js';
import { KVAwareRouter } from '../../core/router/index.js';
import { createGateway, type GatewayOptions, type GatewayWorker } from '../../server/gateway.js';
import { startPicker, type PickerConfig } from '../../epp/run-picker.js';
import { EPP_PORT_SETTING, PICKER_SETTINGS } from './picker-settings.js';
import { ChatTokenizer } from '../../engines/chat-tokenizer.js';
import { defaultTokenizerThreads, TokenizerPool } from '../../engines/tokenizer-pool.js';
import { ClusterRelay, ClusterStateStore, type ClusterMessage } from '../../state/cluster-state-store.js';
import { createStateStore } from '../../state/create-state-store.js';
import type { StateStore } from '../../state/state-store.js';
import { intOption, specFields } from '../options.js';
import { checkApiKeyEnv, checkHttpUrl, checkWorkerId } from '../../server/worker-input.js';
import { DEFAULT_REQUEST_LIMITS } from '../../server/request-limits.js';
import { DEFAULT_TIMEOUTS } from '../../server/timeouts.js';
import { resolveAdminToken } from '../../server/admin-auth.js';
import { loadApiKeysFile } from '../../server/api-keys.js';

const WORKER_KEYS = [
  'id',
  'url',
  'events',
  'replay',
  'metrics',
  'models',
  'cla',
  'dp-size',
  'block-size',
  'api-key-env',
] as const;

/** A --worker SPEC: id=ID,url=BASE_URL[,events=ZMQ][,replay=ZMQ][,metrics=URL][,models=M1;M2][,cla=G1;G2][,dp-size=N][,block-size=N][,api-key-env=VAR] */
export function parseWorkerSpec(spec: string): GatewayWorker {
  return workerFrom(specFields('--worker', spec, WORKER_KEYS), `--worker '${spec}'`);
}

/** A worker from spec fields or a config entry; lists may be `a;b` strings or arrays. */
function workerFrom(fields: Record<string, unknown>, where: string): GatewayWorker {
  for (const key of Object.keys(fields)) {
    if (!(WORKER_KEYS as readonly string[]).includes(key))
      throw new RangeError(`${where}: unknown key '${key}' (known: ${WORKER_KEYS.join(', ')})`);
  }
  const str = (key: string): string | undefined => {
    const v = fields[key];
    if (v === undefined || v === null || v === '') return undefined;
    if (typeof v !== 'string') throw new RangeError(`${where}: ${key} must be a string`);
    return v;
  };
  const list = (key: string): string[] | undefined => {
    const v = fields[key];
    if (v === undefined || v === null || v === '') return undefined;
    if (typeof v === 'string') return v.split(';').map((s) => s.trim());
    if (Array.isArray(v)) return v.map(String);
    if (typeof v === 'number') return [String(v)];
    throw new RangeError(`${where}: ${key} must be a list`);
  };
  const id = str('id');
  const url = str('url');
  if (!id || !url) throw new RangeError(`${where}: id and url are required`);
  checkWorkerId(id, `${where}: id`);
  checkHttpUrl(url, `${where}: url`);
  const apiKeyEnv = str('api-key-env');
  if (apiKeyEnv !== undefined) checkApiKeyEnv(apiKeyEnv, `${where}: api-key-env`);
  const claGroups = list('cla')?.map((g) => {
    const n = Number(g);
    if (g === '' || !Number.isInteger(n) || n < 0)
      throw new RangeError(`${where}: cla group '${g}' is not a non-negative integer`);
    return n;
  });
  const events = str('events');
  const replay = str('replay');
  if (replay && !events) throw new RangeError(`${where}: replay needs events`);
  const models = list('models');
  if (models?.some((m) => m === '')) throw new RangeError(`${where}: models has an empty name`);
  const positive = (key: string, max: number): number | undefined => {
    const v = fields[key];
    if (v === undefined || v === null || v === '') return undefined;
    const n = typeof v === 'number' ? v : Number(v);
    if (!Number.isInteger(n) || n < 1 || n > max || (typeof v === 'string' && !/^\d+$/.test(v.trim())))
      throw new RangeError(`${where}: ${key} must be an integer from 1 to ${max}, got '${String(v)}'`);
    return n;
  };
  const dpSize = positive('dp-size', 64);
  const blockSize = positive('block-size', 1 << 16);
  if (dpSize !== undefined && dpSize > 1 && events !== undefined && !/:\d+$/.test(events))
    throw new RangeError(`${where}: dp-size needs events as tcp://host:port (rank r publishes on the port + r)`);
  const out: GatewayWorker = { id, url, claGroups, models, events, replay, metrics: str('metrics') };
  if (dpSize !== undefined) out.dpSize = dpSize;
  if (blockSize !== undefined) out.blockSize = blockSize;
  if (apiKeyEnv !== undefined) out.apiKeyEnv = apiKeyEnv;
  return out;
}

/**
 * Every setting of `serve`, once: its flag, its environment variable (CONTEXTFORGE_ + the flag
 * in capitals) and its config-file key (the flag without dashes) all come from this table, so
 * the three can never disagree. Precedence: flag, then environment, then config file, then
 * the default.
 */
export interface Setting {
  key: string;
  /** The flag's argument; '' for a switch (on when given; environment and file: true/false, 1/0). */
  arg: string;
  help: string;
  parse: (value: string) => unknown;
  default?: unknown;
  /**
   * Also accepted in the config file under this key (the KVAwareRouter option's name, so a
   * `tune` block or router options paste in unchanged). Such a setting takes a mapping in the
   * file and a JSON or YAML flow mapping on the command line and in the environment.
   */
  optionKey?: string;
}

const choice = (flag: string, allowed: readonly string[]) => (v: string) => {
  if (!allowed.includes(v)) throw new InvalidArgumentError(`${flag} must be one of ${allowed.join(', ')}, got '${v}'`);
  return v;
};
const text = (flag: string) => (v: string) => {
  if (v === '') throw new InvalidArgumentError(`${flag} must not be empty`);
  return v;
};
const port = (v: string) => {
  const n = intOption('--port', 0)(v);
  if (n > 65535) throw new InvalidArgumentError(`--port must be <= 65535, got ${n}`);
  return n;
};
const processes = (v: string) => {
  const n = intOption('--processes', 1)(v);
  if (n > 256) throw new InvalidArgumentError(`--processes must be <= 256, got ${n}`);
  return n;
};
const threads = (v: string) => {
  const n = intOption('--tokenizer-threads', 0)(v);
  if (n > 256) throw new InvalidArgumentError(`--tokenizer-threads must be <= 256, got ${n}`);
  return n;
};
const bool = (flag: string) => (v: string) => {
  if (/^(true|1|yes|on)$/i.test(v)) return true;
  if (/^(false|0|no|off)$/i.test(v)) return false;
  throw new InvalidArgumentError(`${flag} must be true or false, got '${v}'`);
};
const state = (v: string) => {
  if (v !== 'memory' && !/^redis:\/\/[^/\s]+(\/\d+)?$/.test(v))
    throw new InvalidArgumentError(`--state must be memory or redis://HOST:PORT[/DB], got '${v}'`);
  return v;
};

/** A JSON / YAML flow mapping (`{"recompute": 2}`, `{recompute: 2}`) passed to `check`. */
const mapping = (flag: string, check: (value: Record<string, unknown>) => unknown) => (v: string) => {
  let parsed: unknown;
  try {
    parsed = parseYaml(v);
  } catch (err) {
    throw new InvalidArgumentError(
      `${flag} must be a mapping such as '{"key": 1}': ${(err as Error).message.split('\n')[0]}`,
    );
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))
    throw new InvalidArgumentError(`${flag} must be a mapping such as '{"key": 1}', got '${v}'`);
  try {
    return check(parsed as Record<string, unknown>);
  } catch (err) {
    throw new InvalidArgumentError(`${flag}: ${(err as Error).message}`);
  }
};
const costWeights = mapping('--cost-weights', (m) => {
  resolveCostWeights(m as Partial<CostWeights>); // names the bad key
  return m;
});
const POLICY_OPTION_KEYS = ['dynamo', 'sglang', 'llmd'];
const policyOptions = mapping('--policy-options', (m) => {
  for (const [k, v] of Object.entries(m)) {
    if (!POLICY_OPTION_KEYS.includes(k))
      throw new RangeError(
        `unknown policy '${k}' (options exist for: ${POLICY_OPTION_KEYS.join(', ')}; the cost policy's are --cost-weights)`,
      );
    if (v === null || typeof v !== 'object' || Array.isArray(v))
      throw new RangeError(`${k} must be a mapping of that policy's options`);
  }
  return m;
});

export const SERVE_SETTINGS: readonly Setting[] = [
  { key: 'host', arg: '<addr>', help: 'listen address', parse: text('--host'), default: '127.0.0.1' },
  { key: 'port', arg: '<n>', help: 'listen port (0: any free port)', parse: port, default: 8080 },
  {
    key: 'policy',
    arg: '<name>',
    help: `routing policy (${POLICY_NAMES.join(', ')})`,
    parse: choice('--policy', POLICY_NAMES),
    default: 'cost',
  },
  {
    key: 'cost-weights',
    arg: '<mapping>',
    help: "the cost policy's weights, e.g. '{recompute: 2}' (what `tune` prints; config key costWeights)",
    parse: costWeights,
    optionKey: 'costWeights',
  },
  {
    key: 'policy-options',
    arg: '<mapping>',
    help: "peer policies' options, e.g. '{dynamo: {prefillLoadScale: 2}}' (config key policyOptions)",
    parse: policyOptions,
    optionKey: 'policyOptions',
  },
  {
    key: 'block-size',
    arg: '<n>',
    help: "tokens per KV block (the engines')",
    parse: intOption('--block-size', 1),
    default: 16,
  },
  {
    key: 'tokenize',
    arg: '<mode>',
    help: "how prompts are hashed: auto (engine when a worker has events=, else text), text, tokenizer (--tokenizer) or engine (the worker's /tokenize); token-id prompts are hashed as tokens in every mode",
    parse: choice('--tokenize', ['auto', 'text', 'tokenizer', 'engine']),
    default: 'auto',
  },
  {
    key: 'block-hash',
    arg: '<kind>',
    help: "how blocks are keyed: router (its own hash of the token ids, chained through the events) or vllm (vLLM's sha256_cbor hash: needs --python-hash-seed or PYTHONHASHSEED equal to the engines' and their --prefix-caching-hash-algo sha256_cbor)",
    parse: choice('--block-hash', ['router', 'vllm']),
    default: 'router',
  },
  {
    key: 'python-hash-seed',
    arg: '<seed>',
    help: 'the PYTHONHASHSEED the vLLM engines run with (--block-hash vllm; default: the PYTHONHASHSEED environment variable)',
    parse: text('--python-hash-seed'),
  },
  {
    key: 'tokenizer',
    arg: '<path>',
    help: 'tokenizer.json, or the model directory holding it and tokenizer_config.json',
    parse: text('--tokenizer'),
  },
  {
    key: 'tokenizer-threads',
    arg: '<n>',
    help: 'worker threads tokenizing for --tokenize tokenizer (0: on the event loop; default: cores per process, less one, at least 1)',
    parse: threads,
  },
  {
    key: 'processes',
    arg: '<n>',
    help: 'gateway processes sharing the port and routing as one router (state memory: shared through the primary process; redis: through Redis)',
    parse: processes,
    default: 1,
  },
  {
    key: 'chat-template',
    arg: '<file>',
    help: "a Jinja chat template replacing the tokenizer config's",
    parse: text('--chat-template'),
  },
  {
    key: 'admin-token',
    arg: '<token>',
    help: 'bearer token for /admin and /v1/route (prefer CONTEXTFORGE_ADMIN_TOKEN or --admin-token-file: flags show in the process list)',
    parse: text('--admin-token'),
  },
  {
    key: 'admin-token-file',
    arg: '<file>',
    help: 'file holding the admin token; created with a random token (mode 0600) when absent',
    parse: text('--admin-token-file'),
  },
  {
    key: 'public-route-api',
    arg: '',
    help: '/v1/route without the admin token (it reveals what is cached)',
    parse: bool('--public-route-api'),
    default: false,
  },
  {
    key: 'api-keys-file',
    arg: '<file>',
    help: 'YAML mapping of client API key to tenant; requests then need a key, and tenants never share KV',
    parse: text('--api-keys-file'),
  },
  {
    key: 'cached-tokens-header',
    arg: '',
    help: 'add x-contextforge-cached-tokens to responses (it reveals what is cached)',
    parse: bool('--cached-tokens-header'),
    default: false,
  },
  {
    key: 'max-id-bytes',
    arg: '<n>',
    help: 'longest workflow id, agent role, anchor id and cache_salt (UTF-8 bytes)',
    parse: intOption('--max-id-bytes', 1),
    default: DEFAULT_REQUEST_LIMITS.maxIdBytes,
  },
  {
    key: 'max-anchors',
    arg: '<n>',
    help: 'most content anchors per request',
    parse: intOption('--max-anchors', 1),
    default: DEFAULT_REQUEST_LIMITS.maxAnchors,
  },
  {
    key: 'max-json-depth',
    arg: '<n>',
    help: 'deepest nesting of a JSON body',
    parse: intOption('--max-json-depth', 1),
    default: DEFAULT_REQUEST_LIMITS.maxJsonDepth,
  },
  {
    key: 'headers-timeout-ms',
    arg: '<ms>',
    help: "time for a client to send a request's headers",
    parse: intOption('--headers-timeout-ms', 1),
    default: DEFAULT_TIMEOUTS.headersTimeoutMs,
  },
  {
    key: 'request-timeout-ms',
    arg: '<ms>',
    help: 'time for a client to send a whole request (headers and body)',
    parse: intOption('--request-timeout-ms', 1),
    default: DEFAULT_TIMEOUTS.requestTimeoutMs,
  },
  {
    key: 'connection-timeout-ms',
    arg: '<ms>',
    help: 'a client connection idle this long is closed',
    parse: intOption('--connection-timeout-ms', 1),
    default: DEFAULT_TIMEOUTS.connectionTimeoutMs,
  },
  {
    key: 'first-byte-timeout-ms',
    arg: '<ms>',
    help: "wait for an engine's first byte beyond its expected queue time, then retry elsewhere",
    parse: intOption('--first-byte-timeout-ms', 1),
    default: DEFAULT_TIMEOUTS.firstByteTimeoutMs,
  },
  {
    key: 'state',
    arg: '<store>',
    help: 'shared state: memory (this replica only) or redis://HOST:PORT[/DB] (replicas share it)',
    parse: state,
    default: 'memory',
  },
  {
    key: 'state-prefix',
    arg: '<prefix>',
    help: "prefix of the shared state's Redis keys (one per fleet)",
    parse: text('--state-prefix'),
    default: 'contextforge:',
  },
  {
    key: 'body-limit',
    arg: '<bytes>',
    help: 'largest request body',
    parse: intOption('--body-limit', 1024),
    default: 16 * 1024 * 1024,
  },
  {
    key: 'max-retries',
    arg: '<n>',
    help: 'retries on other workers before the first byte',
    parse: intOption('--max-retries', 0),
    default: 2,
  },
  {
    key: 'upstream-timeout-ms',
    arg: '<ms>',
    help: 'longest gap between two chunks of an engine answer (after the first byte)',
    parse: intOption('--upstream-timeout-ms', 1),
    default: DEFAULT_TIMEOUTS.interChunkTimeoutMs,
  },
  {
    key: 'metrics-interval-ms',
    arg: '<ms>',
    help: 'load-metrics scrape interval (0: off)',
    parse: intOption('--metrics-interval-ms', 0),
    default: 1000,
  },
  {
    key: 'health-interval-ms',
    arg: '<ms>',
    help: 'active health-check interval, GET /health (0: off)',
    parse: intOption('--health-interval-ms', 0),
    default: 2000,
  },
  {
    key: 'breaker-failures',
    arg: '<n>',
    help: "consecutive failures that open a worker's circuit",
    parse: intOption('--breaker-failures', 1),
    default: 3,
  },
  {
    key: 'breaker-cooldown-ms',
    arg: '<ms>',
    help: 'how long an open circuit keeps a worker out',
    parse: intOption('--breaker-cooldown-ms', 1),
    default: 5000,
  },
];

export const envName = (key: string) => `CONTEXTFORGE_${key.toUpperCase().replace(/-/g, '_')}`;
const camel = (key: string) => key.replace(/-([a-z])/g, (_m, c: string) => c.toUpperCase());

export interface ServeConfig {
  host: string;
  port: number;
  policy: string;
  costWeights?: Partial<CostWeights>;
  policyOptions?: Omit<PolicyOptions, 'costWeights'>;
  blockSize: number;
  tokenize: 'auto' | 'text' | 'tokenizer' | 'engine';
  blockHash: 'router' | 'vllm';
  pythonHashSeed?: string;
  tokenizer?: string;
  tokenizerThreads?: number;
  processes: number;
  chatTemplate?: string;
  adminToken?: string;
  adminTokenFile?: string;
  publicRouteApi: boolean;
  apiKeysFile?: string;
  cachedTokensHeader: boolean;
  maxIdBytes: number;
  maxAnchors: number;
  maxJsonDepth: number;
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  connectionTimeoutMs: number;
  firstByteTimeoutMs: number;
  state: string;
  statePrefix: string;
  bodyLimit: number;
  maxRetries: number;
  upstreamTimeoutMs: number;
  metricsIntervalMs: number;
  healthIntervalMs: number;
  breakerFailures: number;
  breakerCooldownMs: number;
  workers: GatewayWorker[];
}

/** Reads router.yaml (YAML or JSON): the settings' keys plus `workers`, a list of worker entries. */
export function readConfigFile(file: string, settings: readonly Setting[] = SERVE_SETTINGS): Record<string, unknown> {
  let raw: unknown;
  try {
    raw = parseYaml(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new RangeError(`--config ${file}: ${(err as Error).message.split('\n')[0]}`, { cause: err });
  }
  if (raw === null || raw === undefined) return {};
  if (typeof raw !== 'object' || Array.isArray(raw))
    throw new RangeError(`--config ${file}: the top level must be a mapping of settings`);
  const known = new Set([...settings.map((s) => s.key), 'workers']);
  const byOptionKey = new Map(settings.filter((s) => s.optionKey).map((s) => [s.optionKey!, s.key]));
  for (const key of Object.keys(raw)) {
    const alias = byOptionKey.get(key);
    if (alias !== undefined) {
      if ((raw as Record<string, unknown>)[alias] !== undefined)
        throw new RangeError(`--config ${file}: give ${key} or ${alias}, not both`);
      continue;
    }
    if (!known.has(key))
      throw new RangeError(
        `--config ${file}: unknown key '${key}' (known: ${[...known, ...byOptionKey.keys()].join(', ')})`,
      );
  }
  return raw as Record<string, unknown>;
}

/**
 * Resolves the settings from the parsed command (flags and environment, which commander
 * read) and the config file. Workers: --worker flags if any, else CONTEXTFORGE_WORKERS
 * (specs separated by whitespace), else the config's `workers`.
 */
export function resolveServeConfig(
  cmd: Command,
  env: NodeJS.ProcessEnv = process.env,
  settings: readonly Setting[] = SERVE_SETTINGS,
): ServeConfig {
  const values = cmd.opts<Record<string, unknown>>();
  const configFile = values.config as string | undefined;
  const file = configFile ? readConfigFile(configFile, settings) : {};
  const out: Record<string, unknown> = {};
  for (const s of settings) {
    const name = camel(s.key);
    const source = cmd.getOptionValueSource(name);
    const fromFile = file[s.key] ?? (s.optionKey !== undefined ? file[s.optionKey] : undefined);
    if ((source === undefined || source === 'default') && fromFile !== undefined && fromFile !== null) {
      try {
        out[name] = s.parse(typeof fromFile === 'object' ? JSON.stringify(fromFile) : String(fromFile));
      } catch (err) {
        throw new RangeError(`--config ${configFile}: ${s.key}: ${(err as Error).message}`, { cause: err });
      }
    } else if (s.arg === '' && source === 'env') {
      // commander turns a set variable into true: read its value instead
      try {
        out[name] = s.parse(env[envName(s.key)] ?? '');
      } catch (err) {
        throw new RangeError(`${envName(s.key)}: ${(err as Error).message}`, { cause: err });
      }
    } else out[name] = values[name];
  }
  let workers: GatewayWorker[];
  const flagWorkers = values.worker as string[];
  const envWorkers = env.CONTEXTFORGE_WORKERS?.trim();
  if (flagWorkers.length > 0) workers = flagWorkers.map(parseWorkerSpec);
  else if (envWorkers) workers = envWorkers.split(/\s+/).map(parseWorkerSpec);
  else {
    const list = file.workers ?? [];
    if (!Array.isArray(list)) throw new RangeError(`--config ${configFile}: workers must be a list`);
    workers = list.map((w, i) => {
      const where = `--config ${configFile}: workers[${i}]`;
      if (typeof w === 'string') return parseWorkerSpec(w);
      if (w === null || typeof w !== 'object' || Array.isArray(w))
        throw new RangeError(`${where} must be a mapping or a SPEC string`);
      return workerFrom(w as Record<string, unknown>, where);
    });
  }
  const ids = new Set<string>();
  for (const w of workers) {
    if (ids.has(w.id)) throw new RangeError(`worker id '${w.id}' is given twice`);
    ids.add(w.id);
  }
  const config = { ...out, workers } as unknown as ServeConfig;
  if (config.tokenize === 'tokenizer' && !config.tokenizer)
    throw new RangeError('--tokenize tokenizer needs --tokenizer PATH (tokenizer.json or its model directory)');
  if (config.blockHash === 'vllm') {
    config.pythonHashSeed ??= env.PYTHONHASHSEED === '' ? undefined : env.PYTHONHASHSEED;
    if (config.pythonHashSeed === undefined)
      throw new RangeError(
        "--block-hash vllm needs the engines' PYTHONHASHSEED: --python-hash-seed N or the PYTHONHASHSEED environment variable (vLLM's block hashes are random without it)",
      );
    if (config.tokenize === 'text')
      throw new RangeError(
        '--block-hash vllm hashes token ids: it needs --tokenize auto, tokenizer or engine, not text',
      );
  }
  return config;
}

/** The settings' flags (each also read from its environment variable), --config and --worker. */
export function addSettingOptions(cmd: Command, settings: readonly Setting[]): void {
  cmd.addOption(
    new Option('--config <file>', 'router.yaml: every setting below by its flag name, plus workers').env(
      envName('config'),
    ),
  );
  for (const s of settings) {
    const o =
      s.arg === ''
        ? new Option(`--${s.key}`, s.help).env(envName(s.key))
        : new Option(`--${s.key} ${s.arg}`, s.help).env(envName(s.key)).argParser(s.parse);
    cmd.addOption(s.default === undefined ? o : o.default(s.default));
  }
  cmd.option(
    '--worker <spec>',
    'id=ID,url=URL[,events=ZMQ][,replay=ZMQ][,metrics=URL][,models=M1;M2][,cla=G1;G2][,dp-size=N][,block-size=N][,api-key-env=VAR] (repeatable; env CONTEXTFORGE_WORKERS: specs separated by spaces)',
    (v: string, all: string[]) => [...all, v],
    [] as string[],
  );
}

export function registerServeCommand(program: Command): void {
  const cmd = program.command('serve').description('run the OpenAI-compatible routing gateway in front of the engines');
  const settings = [...SERVE_SETTINGS, ...PICKER_SETTINGS, EPP_PORT_SETTING];
  addSettingOptions(cmd, settings);
  cmd.action(async () => {
    const c = resolveServeConfig(cmd, process.env, settings);
    await runServe(c as ServeConfig & PickerConfig & { eppPort?: number });
  });
}

/**
 * The tokenize mode `auto` stands for: the engine's /tokenize when a worker publishes KV
 * events (they carry token ids, so only requests hashed from token ids can match them) or
 * vLLM block hashes are asked for; text otherwise.
 */
export function resolveTokenizeMode(
  c: Pick<ServeConfig, 'tokenize' | 'workers' | 'blockHash'> & { discover?: PickerConfig['discover'] },
): 'text' | 'tokenizer' | 'engine' {
  if (c.tokenize !== 'auto') return c.tokenize;
  return c.blockHash === 'vllm' || c.workers.some((w) => w.events) || c.discover?.eventsPort !== undefined
    ? 'engine'
    : 'text';
}

/** The router, its shared state and the gateway, as `serve` (each of its processes) and `epp` run them. */
export async function startGateway(
  config: ServeConfig & Partial<PickerConfig>,
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
  const chatTemplate = c.chatTemplate === undefined ? undefined : readTemplate(c.chatTemplate);
  const tokenizerThreads = c.tokenizerThreads ?? defaultTokenizerThreads(c.processes ?? 1);
  const promptTokenizer =
    c.tokenize !== 'tokenizer'
      ? undefined
      : tokenizerThreads === 0
        ? ChatTokenizer.load(c.tokenizer!, { chatTemplate })
        : await TokenizerPool.start({ path: c.tokenizer!, chatTemplate, threads: tokenizerThreads, log });
  const precise = eventsUsable && (c.workers.some((w) => w.events) || discoveredEvents);
  const router = new KVAwareRouter({
    policy: c.policy,
    costWeights: c.costWeights,
    policyOptions: c.policyOptions,
    blockSize: c.blockSize,
    indexMode: precise ? 'precise' : 'approximate',
    blockHash: c.blockHash,
    pythonHashSeed: c.pythonHashSeed,
  });
  // the admin token: configured (flag, CONTEXTFORGE_ADMIN_TOKEN, config), else the token file,
  // else a random one written to a private default file the operator can read
  const admin = resolveAdminToken({ token: c.adminToken, tokenFile: c.adminTokenFile ?? defaultAdminTokenFile() });
  if (admin.origin === 'generated') log(`admin token generated and written to ${admin.file} (mode 0600)`);
  else if (admin.origin === 'file') log(`admin token read from ${admin.file}`);
  const apiKeys = c.apiKeysFile ? loadApiKeysFile(c.apiKeysFile) : undefined;
  if (apiKeys) log(`client API keys: ${apiKeys.size} (requests without one get 401)`);
  // several processes share what they learn: through the primary, or through Redis
  const state: StateStore =
    worker && c.state === 'memory'
      ? new ClusterStateStore({ replicaId: String(worker.id), channel: processChannel() })
      : createStateStore(c.state, { prefix: c.statePrefix });
  const gateway = await createGateway({
    state,
    router,
    workers: c.workers,
    adminToken: admin.token,
    tokenize: c.tokenize,
    promptTokenizer,
    kvEvents: eventsUsable,
    publicRouteApi: c.publicRouteApi,
    apiKeys,
    cachedTokensHeader: c.cachedTokensHeader,
    limits: { maxIdBytes: c.maxIdBytes, maxAnchors: c.maxAnchors, maxJsonDepth: c.maxJsonDepth },
    timeouts: {
      headersTimeoutMs: c.headersTimeoutMs,
      requestTimeoutMs: c.requestTimeoutMs,
      connectionTimeoutMs: c.connectionTimeoutMs,
      firstByteTimeoutMs: c.firstByteTimeoutMs,
      interChunkTimeoutMs: c.upstreamTimeoutMs,
    },
    bodyLimit: c.bodyLimit,
    maxRetries: c.maxRetries,
    upstreamTimeoutMs: c.upstreamTimeoutMs,
    metricsIntervalMs: c.metricsIntervalMs,
    healthCheckIntervalMs: c.healthIntervalMs,
    breakerFailures: c.breakerFailures,
    breakerCooldownMs: c.breakerCooldownMs,
    log,
    ...extra,
  });
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
  const describe = `policy ${c.policy}, ${c.workers.length} workers, tokenize ${c.tokenize}${tokenizing}, ${precise ? 'precise' : 'approximate'} index, block hash ${c.blockHash}, state ${stateName}`;
  const close = async () => {
    await gateway.close();
    if (promptTokenizer instanceof TokenizerPool) await promptTokenizer.close();
  };
  return { gateway, describe, close };
}

type ServeCommandConfig = ServeConfig & PickerConfig & { eppPort?: number };

async function runServe(config: ServeCommandConfig): Promise<void> {
  if (config.processes > 1 && cluster.isPrimary)
    return runPrimary({ ...config, tokenize: resolveTokenizeMode(config) });
  if (!cluster.isWorker) return serveProcess(config);
  // a gateway process that cannot start says why and exits (its IPC channel would keep it alive)
  try {
    await serveProcess(config);
  } catch (err) {
    process.stderr.write(`[process ${String(cluster.worker!.id)}] error: ${(err as Error).message}\n`);
    process.exit(1);
  }
}

/** One gateway process (and its endpoint picker, with --epp-port): alone, or one of `--processes N`. */
async function serveProcess(c: ServeCommandConfig): Promise<void> {
  const worker = cluster.isWorker ? cluster.worker! : undefined;
  const log = (m: string) => process.stderr.write(worker ? `[process ${String(worker.id)}] ${m}\n` : `${m}\n`);
  if (c.workers.length === 0 && !c.discover)
    log(
      'warning: no workers (--worker, CONTEXTFORGE_WORKERS, the config file, --discover); add them with POST /admin/workers',
    );
  const { gateway, describe, close } = await startGateway(c, log);
  const picker = await startPicker(gateway, c, { host: c.host, port: c.eppPort, log });
  const address = await gateway.app.listen({ host: c.host, port: c.port });
  // with several processes the primary says where they serve, once all of them do
  log(
    `contextforge-router ${worker ? 'process' : 'serving on'} ${address}${picker.eppPort === undefined ? '' : `, endpoint picker (ext_proc gRPC) on port ${picker.eppPort}`} (${describe})`,
  );
  await new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
    // the primary is gone: no more connections come, and nothing relays the state
    if (worker) process.once('disconnect', resolve);
  });
  await picker.close();
  await close();
  if (worker) process.exit(0);
}

/** This gateway process's IPC channel to the primary. */
function processChannel() {
  return {
    send: (m: ClusterMessage) => {
      if (process.connected) process.send!(m);
    },
    onMessage: (listener: (m: unknown) => void) => void process.on('message', listener),
    offMessage: (listener: (m: unknown) => void) => void process.off('message', listener),
  };
}

/**
 * `serve --processes N`: the primary forks N gateway processes that share the listening port
 * (node:cluster hands out the connections), relays their state (ClusterRelay) unless Redis
 * holds it, restarts one that crashes, and stops them all on SIGINT/SIGTERM.
 */
async function runPrimary(c: ServeConfig): Promise<void> {
  const log = (m: string) => process.stderr.write(`${m}\n`);
  cluster.setupPrimary({ serialization: 'advanced' });
  // one admin token for every process: resolved (or generated) here, inherited through the environment
  const admin = resolveAdminToken({ token: c.adminToken, tokenFile: c.adminTokenFile ?? defaultAdminTokenFile() });
  if (admin.origin === 'generated') log(`admin token generated and written to ${admin.file} (mode 0600)`);
  process.env.CONTEXTFORGE_ADMIN_TOKEN = admin.token;
  const relay = c.state === 'memory' ? new ClusterRelay() : undefined;
  let stopping = false;
  const listening = new Set<number>();
  let announced = false;
  const failedToStart = new Promise<never>((_resolve, reject) => {
    const fork = () => {
      const worker = cluster.fork();
      const id = String(worker.id);
      relay?.add({
        id,
        send: (m) => {
          if (worker.isConnected()) worker.send(m);
        },
      });
      worker.on('message', (m: unknown) => relay?.receive(id, m));
      worker.on('listening', (address) => {
        listening.add(worker.id);
        if (announced || listening.size < c.processes) return;
        announced = true;
        const host =
          address.address && address.address.includes(':') ? `[${address.address}]` : address.address || c.host;
        log(
          `contextforge-router serving on http://${host}:${address.port} (${c.processes} processes, policy ${c.policy}, ${c.workers.length} workers, tokenize ${c.tokenize}, state ${c.state === 'memory' ? 'shared by the processes' : 'redis'})`,
        );
      });
      worker.on('exit', (code, signal) => {
        relay?.remove(id);
        const started = listening.delete(worker.id);
        if (stopping || (code === 0 && signal === null)) return;
        // one that never served is a configuration error: restarting would only repeat it
        if (!started)
          return reject(
            new RangeError(`a gateway process failed to start (exit ${signal ?? code}); its error is above`),
          );
        log(`gateway process ${id} stopped (${signal ?? `exit ${code}`}); starting another`);
        fork();
      });
    };
    for (let i = 0; i < c.processes; i++) fork();
  });
  const signalled = new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  try {
    await Promise.race([failedToStart, signalled]);
  } finally {
    stopping = true;
    await stopWorkers();
  }
}

/** Asks every gateway process to finish its requests and stop; kills those still there after 10 s. */
async function stopWorkers(): Promise<void> {
  const workers = Object.values(cluster.workers ?? {}).filter((w) => w !== undefined);
  await Promise.all(
    workers.map(
      (w) =>
        new Promise<void>((resolve) => {
          if (w.isDead()) return resolve();
          const timer = setTimeout(() => w.process.kill('SIGKILL'), 10_000);
          w.once('exit', () => {
            clearTimeout(timer);
            resolve();
          });
          w.process.kill('SIGTERM');
        }),
    ),
  );
}

/** Where a generated admin token goes when no file is named: a per-user private directory. */
function defaultAdminTokenFile(): string {
  const uid = typeof process.getuid === 'function' ? process.getuid() : 'user';
  return join(process.env.XDG_RUNTIME_DIR || tmpdir(), `contextforge-router-${uid}`, 'admin-token');
}

function readTemplate(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch (err) {
    throw new RangeError(`--chat-template: cannot read '${file}': ${(err as Error).message}`, { cause: err });
  }
}
