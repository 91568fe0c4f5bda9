/**
 * Every setting of `serve` and `epp`, declared once as a zod schema (type, default, range)
 * with one line of help each. Each setting's flag is its name in kebab case (`--block-size`),
 * its environment variable CONTEXTFORGE_ + the flag in capitals, and its config-file key the
 * flag's name or its camelCase name (the router's options, by their `new KVAwareRouter()`
 * names, also under `router:`). The router's own options come from the router's schema.
 */
import { z } from 'zod';
import { ROUTER_SETTINGS_HELP, ROUTER_SETTINGS_SCHEMA } from '../../core/router/options-schema.js';
import {
  DEFAULT_BUFFERED_ANSWER_LIMIT,
  DEFAULT_BUFFERED_BODY_LIMIT,
  MAX_BODY_LIMIT,
} from '../../server/body-budget.js';
import { DEFAULT_HEALTH_CHECK_TIMEOUT_MS } from '../../engines/health.js';
import { DEFAULT_METRICS_INTERVAL_MS } from '../../engines/metrics/scraper.js';
import { DEFAULT_STALL_TIMEOUT_MS } from '../../engines/metrics/stall.js';
import {
  ADMIN_TOKEN_PATTERN,
  ADMIN_TOKEN_RULE,
  MAX_ADMIN_TOKEN_LENGTH,
  MIN_ADMIN_TOKEN_LENGTH,
} from '../../server/admin-auth.js';
import { DEFAULT_MIN_BODY_RATE, DEFAULT_MIN_BODY_RATE_GRACE_MS } from '../../server/body-rate.js';
import { DEFAULT_MAX_CLIENT_CONNECTIONS, MAX_CLIENT_CONNECTIONS } from '../../server/client-connections.js';
import { MAX_REQUESTS_PER_CLIENT } from '../../server/client-requests.js';
import { REQUEST_LIMITS_SCHEMA } from '../../server/request-limits.js';
import { MAX_MEDIA_DOMAINS, normalizeMediaDomain } from '../../server/media-domains.js';
import { TIMEOUTS_SCHEMA, timerMs } from '../../server/timeouts.js';
import { DEFAULT_ENGINE_CONNECTIONS, MAX_ENGINE_CONNECTIONS } from '../../server/connection-slots.js';
import { MAX_REDIS_DB, parseRedisUrl } from '../../state/redis-url.js';
import { KEY_ENV_PATTERN } from '../../server/worker-input.js';

export interface SettingHelp {
  /** The flag's argument; '' for a switch (on when given; environment and file: true/false). */
  arg: string;
  help: string;
  /** Redacted by --print-config. */
  secret?: boolean;
}

const port = () => z.int().min(0).max(65535);

function usableStateUrl(spec: string): boolean {
  if (spec === 'memory') return true;
  try {
    const { port, db } = parseRedisUrl(spec);
    // parseRedisUrl refuses a database past MAX_REDIS_DB
    return port !== undefined && port >= 1 && port <= 65535 && db !== undefined;
  } catch {
    return false;
  }
}
/** Whether a URL has a non-empty query or fragment (`memory`, no URL, has neither). */
function hasQueryOrFragment(spec: string): boolean {
  try {
    const u = new URL(spec);
    return u.search !== '' || u.hash !== '';
  } catch {
    return false;
  }
}
/** What is wrong with an entry of --allowed-media-domains, or undefined when it is usable. */
function mediaDomainProblem(entry: string): string | undefined {
  try {
    normalizeMediaDomain(entry);
    return undefined;
  } catch (err) {
    return (err as Error).message;
  }
}
const positiveInt = () => z.int().min(1);
const text = () => z.string().min(1).max(4096);

/** The router's options serve takes (all but indexMode, which serve chooses from its workers unless set). */
const { indexMode: _indexMode, ...routerShape } = ROUTER_SETTINGS_SCHEMA.shape;
void _indexMode;
export const ROUTER_SETTING_KEYS = Object.keys(routerShape) as (keyof typeof routerShape)[];

const gatewayShape = {
  // a host name or an IP address (IPv6 without brackets, as listen() takes it)
  host: z
    .string()
    .regex(/^[A-Za-z0-9._:%-]{1,253}$/, { error: 'must be a host name or an IP address, such as 0.0.0.0 or ::' })
    .default('127.0.0.1'),
  port: port().default(8080),
  ...routerShape,
  indexMode: z.enum(['auto', 'precise', 'approximate']).default('auto'),
  tokenize: z.enum(['auto', 'text', 'tokenizer', 'engine']).default('auto'),
  tokenizer: text().optional(),
  tokenizerThreads: z.int().min(0).max(256).optional(),
  // (tokenizer-pool.ts DEFAULT_TOKENIZE_TIMEOUT_MS)
  tokenizeTimeoutMs: timerMs(1).default(5000),
  processes: z.int().min(1).max(256).default(1),
  chatTemplate: text().optional(),
  chatRendering: z.enum(['vllm', 'sglang']).default('vllm'),
  // what the gateway's AdminToken takes, checked here so that the message names the setting
  adminToken: z
    .string()
    .min(MIN_ADMIN_TOKEN_LENGTH)
    .max(MAX_ADMIN_TOKEN_LENGTH)
    .refine((t) => t.trim() === t, { error: 'must not begin or end with whitespace' })
    .refine((t) => ADMIN_TOKEN_PATTERN.test(t), { error: ADMIN_TOKEN_RULE })
    .optional(),
  adminTokenFile: text().optional(),
  publicRouteApi: z.boolean().default(false),
  apiKeysFile: text().optional(),
  cachedTokensHeader: z.boolean().default(false),
  forwardKvTransferParams: z.boolean().default(false),
  forwardCustomLogitProcessor: z.boolean().default(false),
  engineKeyEnvs: z
    .array(z.string().regex(KEY_ENV_PATTERN, { error: 'must be a variable name, NAME* or *' }))
    .max(256)
    .default([]),
  // each entry as the gateway normalises it (media-domains.ts), so a bad one stops the start
  allowedMediaDomains: z
    .array(
      z.string().refine((e) => mediaDomainProblem(e) === undefined, {
        error: (issue) => `must be a host name or an IP address: ${mediaDomainProblem(issue.input as string)}`,
      }),
    )
    .max(MAX_MEDIA_DOMAINS)
    .default([]),
  // the gateway's limits and timeouts as the gateway declares them
  ...REQUEST_LIMITS_SCHEMA.shape,
  headersTimeoutMs: TIMEOUTS_SCHEMA.shape.headersTimeoutMs,
  requestTimeoutMs: TIMEOUTS_SCHEMA.shape.requestTimeoutMs,
  connectionTimeoutMs: TIMEOUTS_SCHEMA.shape.connectionTimeoutMs,
  firstByteTimeoutMs: TIMEOUTS_SCHEMA.shape.firstByteTimeoutMs,
  state: z
    .string()
    // a query or fragment (?db=3) would be ignored: the state would land on database 0
    .refine((s) => !hasQueryOrFragment(s), {
      error:
        'must not have a query or fragment (the store reads neither): put the database in the path, redis://HOST:PORT/DB',
      abort: true,
    })
    .regex(/^(memory|redis:\/\/[^/\s]+(\/\d+)?)$/, { error: 'must be memory or redis://HOST:PORT[/DB]' })
    // the URL as the store will read it; the message never shows it (it may hold a password)
    .refine(usableStateUrl, {
      error: `must be memory or redis://HOST:PORT[/DB] with a port from 1 to 65535 and a database from 0 to ${MAX_REDIS_DB}`,
    })
    .default('memory'),
  statePrefix: text().default('contextforge:'),
  bodyLimit: z
    .int()
    .min(1024)
    .max(MAX_BODY_LIMIT)
    .default(16 * 1024 * 1024),
  bufferedBodyLimit: z.int().min(1024).default(DEFAULT_BUFFERED_BODY_LIMIT),
  minBodyRate: z.int().min(0).default(DEFAULT_MIN_BODY_RATE),
  minBodyRateGraceMs: timerMs(1).default(DEFAULT_MIN_BODY_RATE_GRACE_MS),
  maxClientConnections: z.int().min(1).max(MAX_CLIENT_CONNECTIONS).default(DEFAULT_MAX_CLIENT_CONNECTIONS),
  bufferedAnswerLimit: z.int().min(1024).default(DEFAULT_BUFFERED_ANSWER_LIMIT),
  maxRetries: z.int().min(0).max(16).default(2),
  engineConnections: z.int().min(1).max(MAX_ENGINE_CONNECTIONS).default(DEFAULT_ENGINE_CONNECTIONS),
  upstreamTimeoutMs: TIMEOUTS_SCHEMA.shape.interChunkTimeoutMs,
  metricsIntervalMs: timerMs(0).default(DEFAULT_METRICS_INTERVAL_MS),
  healthIntervalMs: timerMs(0).default(2000),
  healthTimeoutMs: timerMs(1).default(DEFAULT_HEALTH_CHECK_TIMEOUT_MS),
  stallTimeoutMs: timerMs(0).default(DEFAULT_STALL_TIMEOUT_MS),
  breakerFailures: positiveInt().default(3),
  breakerCooldownMs: timerMs(1).default(5000),
  panicRouting: z.boolean().default(true),
  shutdownGraceMs: timerMs(0).default(25_000),
};

const gatewayHelp: Record<Exclude<keyof typeof gatewayShape, keyof typeof routerShape>, SettingHelp> = {
  host: { arg: '<addr>', help: 'listen address' },
  port: { arg: '<n>', help: 'listen port (0: any free port)' },
  indexMode: {
    arg: '<mode>',
    help: "auto (precise when the engines' KV events are used, else approximate), precise or approximate",
  },
  tokenize: {
    arg: '<mode>',
    help: "how prompts are hashed: auto (engine when a worker has events=, else text), text, tokenizer (--tokenizer) or engine (the worker's /tokenize); token-id prompts are hashed as tokens in every mode",
  },
  tokenizer: { arg: '<path>', help: 'tokenizer.json, or the model directory holding it and tokenizer_config.json' },
  tokenizerThreads: {
    arg: '<n>',
    help: 'worker threads tokenizing for --tokenize tokenizer (0: on the event loop; default: cores per process, less one, at least 1)',
  },
  tokenizeTimeoutMs: {
    arg: '<ms>',
    help: 'deadline of each request on the tokenizer threads, counted from its arrival, its wait for a thread included: a request without its token ids by then is routed on its text (one still waiting is never tokenized); a thread that works on one request this long (a prompt the tokenizer is very slow on, such as a long run of whitespace, or a chat template that loops) is replaced, and the requests queued on it go to the replacement (not with --tokenizer-threads 0)',
  },
  processes: {
    arg: '<n>',
    help: 'gateway processes sharing the port and routing as one router (state memory: shared through the primary process; redis: through Redis)',
  },
  chatTemplate: { arg: '<file>', help: "a Jinja chat template replacing the tokenizer config's" },
  chatRendering: {
    arg: '<engine>',
    help: "whose rules turn a chat into prompt tokens for --tokenize tokenizer: vllm (vLLM's) or sglang (SGLang's: parts joined with a space, reasoning_content kept, …); the router hashes a request before it picks a worker, so this is the whole fleet's setting, not a worker's: a fleet mixing vLLM and SGLang engines gets the other's tokens wrong",
  },
  adminToken: {
    arg: '<token>',
    help: 'bearer token for /admin and /v1/route (prefer CONTEXTFORGE_ADMIN_TOKEN or --admin-token-file: flags show in the process list)',
    secret: true,
  },
  adminTokenFile: {
    arg: '<file>',
    help: 'file holding the admin token; created with a random token (mode 0600, missing directories 0700) when absent',
  },
  publicRouteApi: { arg: '', help: '/v1/route without the admin token (it reveals what is cached)' },
  apiKeysFile: {
    arg: '<file>',
    help: 'YAML mapping of client API key to tenant; requests then need a key, and tenants never share KV',
  },
  cachedTokensHeader: {
    arg: '',
    help: 'add x-contextforge-cached-tokens to responses (it reveals what is cached)',
  },
  forwardKvTransferParams: {
    arg: '<true|false>',
    help: "forward a client's kv_transfer_params and ec_transfer_params (vLLM), bootstrap_host/port/room and the other KV-transfer fields (SGLang), which direct an engine's disaggregated KV transfer; removed by default",
  },
  forwardCustomLogitProcessor: {
    arg: '<true|false>',
    help: "forward a client's custom_logit_processor (SGLang: a pickled class an engine started with --enable-custom-logit-processor runs) and logits_processors (vLLM: names an engine with --logits-processor-pattern imports and constructs), code the engines would run for the gateway's clients; removed by default",
  },
  engineKeyEnvs: {
    arg: '<list>',
    help: 'environment variables (NAME, PREFIX* or *) that workers added while the router runs (admin API, another replica) may name as their engine key, besides those configured workers name; CONTEXTFORGE_* never',
  },
  allowedMediaDomains: {
    arg: '<list>',
    help: "the only hosts a chat's media URLs (image_url, audio_url, video_url, input_image) may name, as vLLM's --allowed-media-domains: exact host names or IP addresses, separated by commas (subdomains are not matched; names compared as URL() reads them, in lower case and punycode); with a list, a URL naming another host, or of a scheme other than http, https and data (file: included), is a 400 naming the field; the endpoint picker checks SGLang's /generate image_data, video_data and audio_data the same way and refuses strings SGLang could read as local files. Redirects the engine follows are its own setting (vLLM: VLLM_MEDIA_URL_ALLOW_REDIRECTS=0). Empty: no restriction",
  },
  maxIdBytes: {
    arg: '<n>',
    help: "longest workflow id, agent role, anchor id and cache_salt (UTF-8 bytes); model, user, request_id, rid, session_id, lora_path and extra_key take 4 ×; the router's own bound on the ids it is handed (its maxIdBytes) follows it",
  },
  maxAnchors: { arg: '<n>', help: 'most content anchors per request' },
  maxJsonDepth: { arg: '<n>', help: 'deepest nesting of a JSON body (at most 1000)' },
  maxJsonContainers: { arg: '<n>', help: 'most arrays and objects in a JSON body (counted before it is parsed)' },
  maxJsonObjectMembers: {
    arg: '<n>',
    help: 'most members of any one object in a JSON body (counted before it is parsed; arrays are not bounded by it)',
  },
  maxGrammarBytes: {
    arg: '<bytes>',
    help: "largest constraint an engine compiles for a request: a regex, grammar or JSON schema (vLLM's structured_outputs and guided_*, response_format, SGLang's regex, ebnf, json_schema and structural_tag), a string in UTF-8 bytes, an object as compact JSON",
  },
  maxChoices: {
    arg: '<n>',
    help: 'most choices a request may ask for: n and best_of each (sequences an engine runs for it)',
  },
  maxStopSequences: {
    arg: '<n>',
    help: 'most stop strings, stop_regex patterns, bad_words and stop_token_ids in a request (each string at most 4 × --max-id-bytes UTF-8 bytes)',
  },
  maxLogprobs: {
    arg: '<n>',
    help: "most log probabilities a request may ask for at each token: logprobs (completions), top_logprobs (chat), prompt_logprobs (vLLM), top_logprobs_num (SGLang) and the token ids of SGLang's token_ids_logprob and vLLM's logprob_token_ids each",
  },
  maxPrompts: {
    arg: '<n>',
    help: "most prompts in a request: a completion's prompt and prompt_embeds lists together, SGLang's /generate text, input_ids or input_embeds batch (each runs as a request of its own in the engine; keep it near the engine's --max-num-seqs)",
  },
  headersTimeoutMs: { arg: '<ms>', help: "time for a client to send a request's headers" },
  requestTimeoutMs: { arg: '<ms>', help: 'time for a client to send a whole request (headers and body)' },
  connectionTimeoutMs: {
    arg: '<ms>',
    help: 'a client connection idle this long is closed (not while its request, read whole, waits for its answer to begin: retries may take several --upstream-timeout-ms); more than --upstream-timeout-ms, as a client reading an answer waits that long between its parts (raised 30 s past it when not set)',
  },
  firstByteTimeoutMs: {
    arg: '<ms>',
    help: "wait for a streamed answer's first whole event beyond the engine's expected queue time, then retry elsewhere",
  },
  state: {
    arg: '<store>',
    help: 'shared state: memory (this replica only) or redis://HOST:PORT[/DB] (replicas share it)',
    secret: true,
  },
  statePrefix: { arg: '<prefix>', help: "prefix of the shared state's Redis keys (one per fleet)" },
  bodyLimit: {
    arg: '<bytes>',
    help: `largest request body (at most ${MAX_BODY_LIMIT}, about 512 MiB: a body is parsed as one string)`,
  },
  bufferedBodyLimit: {
    arg: '<bytes>',
    help: 'most request-body bytes held at once over all requests (gateway and endpoint picker, whose streams count their request headers too; at least --body-limit); a request whose body does not fit gets 503 with retry-after',
  },
  minBodyRate: {
    arg: '<bytes/s>',
    help: 'least average rate of a request body once --min-body-rate-grace-ms have passed since its headers (0: none); a slower body is cut with 408 and its bytes go back to --buffered-body-limit',
  },
  minBodyRateGraceMs: { arg: '<ms>', help: 'time a request body may take before --min-body-rate is checked' },
  maxClientConnections: {
    arg: '<n>',
    help: "most client connections held at once per process, on the HTTP port and on the endpoint picker's gRPC port each (idle keep-alive ones count); on the HTTP port one more takes the place of the connection idle the longest (no request in progress), and when none is idle, as on the gRPC port, it is closed as it is accepted, unanswered: keep clients' and engines' connections together under the descriptor limit (ulimit -n)",
  },
  bufferedAnswerLimit: {
    arg: '<bytes>',
    help: 'most bytes of complete (non-streamed) engine answers gathered at once over all requests, so that one cut short can be retried; an answer that does not fit passes through as it comes',
  },
  maxRetries: { arg: '<n>', help: 'retries on other workers before the first byte' },
  engineConnections: {
    arg: '<n>',
    help: "most connections the gateway keeps to one engine (a stream holds one until it ends); requests beyond it wait in the gateway, where the router's load signals do not see them: keep it above the engine's --max-num-seqs (vLLM) or --max-running-requests (SGLang), so they queue in the engine",
  },
  upstreamTimeoutMs: {
    arg: '<ms>',
    help: 'longest gap between two whole events of a streamed answer (after the first), longest wait for a non-streamed answer, and for the rest of any answer that is no event stream after its first byte',
  },
  metricsIntervalMs: { arg: '<ms>', help: 'load-metrics scrape interval (0: off)' },
  healthIntervalMs: { arg: '<ms>', help: 'active health-check interval, GET /health (0: off)' },
  healthTimeoutMs: {
    arg: '<ms>',
    help: "longest wait for one /health answer, whatever the interval (SGLang's /health generates a token first and takes a second or more; two probes in a row without an answer take a worker out)",
  },
  stallTimeoutMs: {
    arg: '<ms>',
    help: "hold a worker out of rotation when its engine's metrics show no progress this long (its token counters, running and waiting counts and KV usage all still) while requests of the gateway wait on it and it reports requests running or waiting: a hung engine loop whose /health and /metrics still answer; back as soon as they move (0: off; needs the metrics scrape and an engine exporting vLLM's or SGLang's token counters). vLLM and SGLang move them with every scheduler step or prefill chunk: the default minute is well past one step, even of a long prompt prefilled whole",
  },
  breakerFailures: { arg: '<n>', help: "consecutive failures that open a worker's circuit" },
  breakerCooldownMs: { arg: '<ms>', help: 'how long an open circuit keeps a worker out' },
  panicRouting: {
    arg: '<true|false>',
    help: 'when no worker is in rotation for a request, route it over the workers held out only because their health check or metrics scrape timed out, instead of answering 503 (never over a worker whose probe got an error status or a refused connection, an open circuit or a draining worker; /readyz and the gRPC readiness of the endpoint picker stay ready meanwhile; the OpenAI routes and the endpoint picker alike)',
  },
  shutdownGraceMs: {
    arg: '<ms>',
    help: 'on SIGTERM or SIGINT, how long requests in flight may finish before their connections are cut (new ones get 503 meanwhile)',
  },
};

/** `dns=NAME,port=N[,events-port=N][,replay-port=N][,interval-ms=N][,models=a;b]` as a record. */
export const DISCOVERY_SCHEMA = z
  .strictObject({
    dns: z.string().regex(/^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$/, { error: 'must be a host name' }),
    port: z.int().min(1).max(65535),
    eventsPort: z.int().min(1).max(65535).optional(),
    replayPort: z.int().min(1).max(65535).optional(),
    intervalMs: timerMs(100).default(5000),
    models: z.array(z.string().min(1).max(512)).max(1024).optional(),
  })
  .refine((d) => d.replayPort === undefined || d.eventsPort !== undefined, {
    error: 'replayPort needs eventsPort',
  });

const pickerShape = {
  discover: DISCOVERY_SCHEMA.optional(),
  objectives: z.record(z.string().min(1).max(256), z.int()).optional(),
  shedQueueDepth: positiveInt().default(5),
  shedKvUsage: z.number().gt(0).max(1).default(0.8),
  shedMetricsStaleMs: timerMs(1).optional(),
  eppFallbacks: z.int().min(0).max(64).default(2),
};

const pickerHelp: Record<keyof typeof pickerShape, SettingHelp> = {
  discover: {
    arg: '<spec>',
    help: 'find engines by DNS (a headless Service): dns=NAME,port=N[,events-port=N][,replay-port=N][,interval-ms=N][,models=M1;M2]',
  },
  objectives: {
    arg: '<list>',
    help: 'endpoint picker: priority of each inference objective (x-gateway-inference-objective), NAME=PRIORITY[,…]; negative priorities are shed with 429 when the pool is saturated',
  },
  shedQueueDepth: { arg: '<n>', help: 'endpoint picker: waiting requests at which a worker counts as saturated' },
  shedKvUsage: { arg: '<fraction>', help: 'endpoint picker: KV-cache usage at which a worker counts as saturated' },
  shedMetricsStaleMs: {
    arg: '<ms>',
    help: "endpoint picker: age of a worker's last metrics reading past which it counts as saturated, as does a worker not read yet (default: the scrape interval plus twice the scrape timeout, plus one more interval, at least 4000: 4000 at the default interval; more than the interval plus twice the timeout when set; unused with --metrics-interval-ms 0)",
  },
  eppFallbacks: { arg: '<n>', help: 'endpoint picker: fallback endpoints listed after the chosen one' },
};

const routerHelp = Object.fromEntries(
  ROUTER_SETTING_KEYS.map((k) => {
    const inner = unwrapSchema(routerShape[k]);
    const args: Record<string, string> = {
      object: '<mapping>',
      array: '<list>',
      number: '<n>',
      boolean: '<true|false>',
      enum: '<name>',
    };
    const arg = args[inner.def.type] ?? '<text>';
    return [k, { arg, help: ROUTER_SETTINGS_HELP[k] }];
  }),
) as Record<keyof typeof routerShape, SettingHelp>;

/** What every gateway (serve, epp) runs on. */
export const GATEWAY_SCHEMA = z.strictObject(gatewayShape);

export const SERVE_SCHEMA = z.strictObject({
  ...gatewayShape,
  // the OpenAI routes' alone: epp serves none (its clients are the gateway's proxies)
  maxRequestsPerClient: z.int().min(0).max(MAX_REQUESTS_PER_CLIENT).default(0),
  ...pickerShape,
  eppPort: port().optional(),
  eppSecureServing: z.boolean().default(false),
  eppCertPath: text().optional(),
  eppEnableCertReload: z.boolean().default(false),
});
export const SERVE_HELP: Readonly<Record<keyof typeof SERVE_SCHEMA.shape, SettingHelp>> = {
  ...gatewayHelp,
  ...routerHelp,
  maxRequestsPerClient: {
    arg: '<n>',
    help: `most requests one client may have in flight at once on /v1/completions and /v1/chat/completions, per process (0: no limit; at most ${MAX_REQUESTS_PER_CLIENT}); a client is its API key when the request carries a valid one (--api-keys-file), else its connection's address (IPv6 by its /64; X-Forwarded-For is not read: behind a proxy every client without a key is the proxy); one more is answered 429 with retry-after`,
  },
  ...pickerHelp,
  eppPort: { arg: '<n>', help: 'also serve the Envoy ext_proc endpoint picker (gRPC) on this port' },
  eppSecureServing: {
    arg: '<true|false>',
    help: "serve --epp-port over TLS, as epp's --secure-serving: with the certificate in --epp-cert-path, else a self-signed one made at start (one per process with --processes); default false: plaintext (h2c)",
  },
  eppCertPath: {
    arg: '<dir>',
    help: 'directory holding tls.crt and tls.key (a kubernetes.io/tls Secret mounted) for --epp-secure-serving',
  },
  eppEnableCertReload: {
    arg: '',
    help: 're-read --epp-cert-path every 10 s and serve a changed certificate to new connections (a pair that does not check is logged and not taken)',
  },
};

export const EPP_SCHEMA = z.strictObject({
  ...gatewayShape,
  port: port().default(9002),
  metricsPort: port().default(9090),
  healthPort: port().default(9003),
  secureServing: z.boolean().default(true),
  certPath: text().optional(),
  enableCertReload: z.boolean().default(false),
  ...pickerShape,
});
/** serve's proxy settings, which epp takes (a config shared with serve may set them) and does not use. */
export const PROXY_SETTINGS = [
  'cachedTokensHeader',
  'maxRetries',
  'firstByteTimeoutMs',
  'upstreamTimeoutMs',
  'bufferedAnswerLimit',
] as const satisfies readonly (keyof typeof gatewayHelp)[];

export const EPP_HELP: Readonly<Record<keyof typeof EPP_SCHEMA.shape, SettingHelp>> = {
  ...gatewayHelp,
  ...Object.fromEntries(
    PROXY_SETTINGS.map((k) => [
      k,
      { ...gatewayHelp[k], help: `serve's, no effect on epp (Envoy forwards the requests): ${gatewayHelp[k].help}` },
    ]),
  ),
  ...routerHelp,
  ...pickerHelp,
  processes: {
    arg: '<n>',
    help: 'has no effect on epp, which runs one process (run more epp replicas sharing --state instead); a value above 1 is named in a warning',
  },
  port: { arg: '<n>', help: 'ext_proc gRPC port (0: any free port)' },
  metricsPort: { arg: '<n>', help: 'HTTP port for /metrics, /healthz, /readyz and /admin (0: any free port)' },
  healthPort: {
    arg: '<n>',
    help: "plaintext gRPC health port (liveness, readiness, '' and the ExternalProcessor's name, as on the ext_proc port) for Kubernetes gRPC probes, which speak no TLS (0: any free port)",
  },
  secureServing: {
    arg: '<true|false>',
    help: "serve the ext_proc port over TLS, as the Inference Extension's gateways connect to a picker: with the certificate in --cert-path, else a self-signed one made at start; false: plaintext (h2c)",
  },
  certPath: {
    arg: '<dir>',
    help: 'directory holding tls.crt and tls.key (a kubernetes.io/tls Secret mounted) for --secure-serving',
  },
  enableCertReload: {
    arg: '',
    help: 're-read --cert-path every 10 s and serve a changed certificate to new connections (a pair that does not check is logged and not taken)',
  },
};

/** A schema without its default / optional wrappers: what the value itself must be. */
export function unwrapSchema(schema: z.ZodType): z.ZodType {
  let s = schema as z.ZodType & { def: { innerType?: z.ZodType } };
  while (s.def.innerType !== undefined) s = s.def.innerType as typeof s;
  return s;
}

/** Whether the setting is a secret (redacted by --print-config; no message repeats its value). */
export function secretSetting(key: string): boolean {
  const help = (Object.hasOwn(SERVE_HELP, key) ? SERVE_HELP : EPP_HELP) as Readonly<Record<string, SettingHelp>>;
  return help[key]?.secret === true;
}

export const kebab = (key: string) => key.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
export const envName = (flag: string) => `CONTEXTFORGE_${flag.toUpperCase().replace(/-/g, '_')}`;
