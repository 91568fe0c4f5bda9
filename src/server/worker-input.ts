/**
 * Checks of a worker as an operator gives it (flags, config file, admin API): its id, its
 * URLs, its engine API key's variable name. URLs may carry credentials (`http://u:p@host`);
 * they are used but never shown: listings and logs print `redactUrl()`.
 */

import { z } from 'zod';
import { describeIssue, firstIssue, issueError } from '../core/schema-issues.js';
import { redactUserinfo } from '../core/shown-text.js';
import { MAX_BLOCK_SIZE } from '../core/validate.js';
import {
  MAX_MODEL_NAME_LENGTH,
  MAX_WORKER_CLA_GROUPS,
  MAX_WORKER_MODELS,
  MAX_WORKER_URL_LENGTH,
} from '../core/worker-registry.js';
export { splitCredentials } from '../engines/url-credentials.js';
import type { WorkerRecord } from '../state/state-store.js';

/** Worker ids: what fits in a metric label, a log line and a URL path segment. */
export const WORKER_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$/;
/** Environment variable names for engine API keys. */
export const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
/**
 * Variables an engine key may never be read from: the router's own settings (CONTEXTFORGE_*),
 * among them the admin token and the state URL with its password.
 */
const ROUTER_VARS = /^CONTEXTFORGE_/i;
/** An entry of --engine-key-envs: a variable's name, a prefix ending in `*`, or `*` alone (any). */
export const KEY_ENV_PATTERN = /^(?:[A-Za-z_][A-Za-z0-9_]{0,127}\*?|\*)$/;
/** A URL's longest (a worker's, its metrics', its events'): the router's own bound on a worker's URL. */
const MAX_URL_LENGTH = MAX_WORKER_URL_LENGTH;

export function checkWorkerId(id: unknown, where = 'worker id'): string {
  if (typeof id !== 'string' || !WORKER_ID.test(id))
    throw new RangeError(`${where} must match ${WORKER_ID.source} (letters, digits, . _ : -; at most 64)`);
  return id;
}

/** Spaces, control characters and backslashes: what URL() strips, drops or reads as `/`. */
// eslint-disable-next-line no-control-regex -- the characters refused
const REWRITTEN_CHARACTER = /[\x00-\x20\x7f\\]/;

/**
 * An http(s) URL without query or fragment; `what` names the field in the message. The URL is
 * kept as written (listings show it, the credentials are split from it), so what WHATWG URL()
 * would read otherwise than written is refused, as a chat's media URLs are (media-domains.ts),
 * where other parsers may read it as another URL: leading or trailing spaces and control
 * characters (stripped), a tab or line break anywhere (dropped), a backslash (read as `/`), a
 * scheme not followed by exactly `//` (`http:host`, `http:/host` and `http:///host` are all read
 * as `http://host/`), a `%` in the host (decoded: `loc%61lhost` is localhost).
 */
export function checkHttpUrl(url: unknown, what: string): string {
  if (typeof url !== 'string' || url.length > MAX_URL_LENGTH)
    throw new RangeError(`${what} must be an http(s) URL of at most ${MAX_URL_LENGTH} characters`);
  if (REWRITTEN_CHARACTER.test(url))
    throw new RangeError(
      `${what} must not hold spaces, control characters or backslashes (URL parsers read them differently; percent-encode them)`,
    );
  if (/^https?:/i.test(url) && !/^https?:\/\/[^/]/i.test(url))
    throw new RangeError(`${what} must have exactly // after its scheme, then the host: http(s)://host:port`);
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    if (!/^https?:\/\//i.test(url)) throw new RangeError(`${what} must start with http:// or https:// (not a URL)`);
    // it does start so: say what else is wrong, the port being the part most often mistyped
    const port = /^https?:\/\/[^/?#]*:(\d+)(?:[/?#]|$)/i.exec(url)?.[1];
    if (port !== undefined && Number(port) > 65535) throw new RangeError(`${what} must have a port from 1 to 65535`);
    throw new RangeError(`${what} is not a valid URL`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:')
    throw new RangeError(`${what} must start with http:// or https://`);
  if (u.search !== '' || u.hash !== '') throw new RangeError(`${what} must not have a query or fragment`);
  if (hostOf(url).includes('%'))
    throw new RangeError(`${what} must not have a % in its host (URL parsers decode it or not)`);
  // the URL parser refuses ports past 65535; port 0 parses but nothing can be reached on it
  if (u.port === '0') throw new RangeError(`${what} must have a port from 1 to 65535`);
  // credentials travel decoded as a Basic authorization header (splitCredentials): checked here,
  // where the message can name the field, not where a request is first made
  if (!decodes(u.username) || !decodes(u.password))
    throw new RangeError(`${what} has a user name or password with a malformed percent-escape (write % as %25)`);
  return url;
}

/** The host (and port) of `url` as written: its authority after the last `@`, `url` starting with `scheme://`. */
function hostOf(url: string): string {
  const start = url.indexOf('//') + 2;
  const end = url.slice(start).search(/[/?#]/);
  const authority = end === -1 ? url.slice(start) : url.slice(start, start + end);
  return authority.slice(authority.lastIndexOf('@') + 1);
}

function decodes(text: string): boolean {
  try {
    decodeURIComponent(text);
    return true;
  } catch {
    return false;
  }
}

/**
 * A worker's URL: its engine's origin, `http(s)://[user:password@]host:port` (a trailing `/` is
 * allowed), as checkHttpUrl takes it, without a path. The gateway adds every path itself
 * (/v1/chat/completions, /v1/models, /tokenize, /health, /metrics) to the origin: the pool
 * forwarding the requests takes no path, so one given here could be honoured by some requests
 * and not others.
 */
export function checkWorkerUrl(url: unknown, what: string): string {
  checkHttpUrl(url, what);
  const path = new URL(url as string).pathname;
  if (path !== '/')
    throw new RangeError(
      `${what} must be the engine's origin without a path, http(s)://host:port (the router adds /v1/… itself); its path is ${JSON.stringify(path.length > 64 ? `${path.slice(0, 64)}…` : path)}`,
    );
  return url as string;
}

/**
 * The longest path of a Unix socket ZeroMQ connects to (`ipc://PATH`): sockaddr_un's sun_path
 * less its terminating NUL, 108 bytes on Linux, 104 on macOS and the BSDs. A longer one ZeroMQ
 * refuses ("File name too long").
 */
const MAX_IPC_PATH_BYTES = process.platform === 'linux' ? 107 : 103;
/**
 * A host ZeroMQ connects to: a name or an IPv4 address (letters, digits, `.`, `-`, `_`, starting
 * with a letter or digit), an IPv6 address (in brackets, with an optional zone after `%`, or
 * bare). ZeroMQ refuses a name starting otherwise, `*` (all interfaces, for binding only) and
 * anything not ASCII when it connects; a replay's endpoint is connected to only when a replay
 * is asked for, so it is checked here, as the events endpoint is.
 */
const ZMQ_HOST =
  /^(?:[A-Za-z0-9][A-Za-z0-9_.-]*|\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\]|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*)$/;

/**
 * A ZeroMQ endpoint the subscriber can connect to: `tcp://HOST:PORT` (ZeroMQ's
 * `tcp://SOURCE;HOST:PORT` too, SOURCE a host or interface with an optional port) or
 * `ipc://PATH`, as ZeroMQ reads it when it connects (see ZMQ_HOST, MAX_IPC_PATH_BYTES).
 */
export function checkZmqEndpoint(endpoint: unknown, what: string): string {
  if (typeof endpoint !== 'string' || endpoint.length > MAX_URL_LENGTH || !/^(tcp|ipc):\/\/\S+$/.test(endpoint))
    throw new RangeError(`${what} must be a tcp:// or ipc:// endpoint`);
  // ZeroMQ reads the endpoint as a C string: a NUL would end it there
  // eslint-disable-next-line no-control-regex -- the characters refused
  if (/[\x00-\x1f\x7f]/.test(endpoint)) throw new RangeError(`${what} must not hold control characters`);
  if (endpoint.startsWith('ipc://')) {
    if (Buffer.byteLength(endpoint) - 'ipc://'.length > MAX_IPC_PATH_BYTES)
      throw new RangeError(`${what} has a path longer than a Unix socket's (${MAX_IPC_PATH_BYTES} bytes)`);
    return endpoint;
  }
  // ZeroMQ has no credentials in an endpoint (it refuses one with '@' in its host): a password
  // there would only end up in messages and listings
  if (/^tcp:\/\/[^/]*@/.test(endpoint)) throw new RangeError(`${what} must not hold a user name or password`);
  const address = /^tcp:\/\/(?:([^;]+);)?(\S+):(\d{1,5})$/.exec(endpoint);
  if (address === null || Number(address[3]) < 1 || Number(address[3]) > 65535)
    throw new RangeError(`${what} must be tcp://HOST:PORT with a port from 1 to 65535`);
  const [, source, host] = address;
  if (host === '*' || source?.startsWith('*'))
    throw new RangeError(`${what} must name the engine's host: * (every interface) is for binding, not connecting`);
  if (!ZMQ_HOST.test(host) || (source !== undefined && !ZMQ_HOST.test(source.replace(/:\d{1,5}$/, ''))))
    throw new RangeError(`${what} must be tcp://HOST:PORT with HOST a host name or an IP address`);
  return endpoint;
}

export function checkApiKeyEnv(name: unknown, what = 'api-key-env'): string {
  if (typeof name !== 'string' || !ENV_NAME.test(name))
    throw new RangeError(`${what} must be an environment variable name`);
  if (ROUTER_VARS.test(name))
    throw new RangeError(`${what} may not name ${name}: the router's own settings (CONTEXTFORGE_*) are no engine key`);
  return name;
}

/** A worker's engine key that cannot be read: a variable it may not name, or one that is not set. */
export class KeyEnvError extends RangeError {
  readonly field = 'apiKeyEnv';
}

/**
 * The environment variables engine keys may be read from. A worker configured at start (flags,
 * config file) may name any but the router's own (the operator wrote it, on the router's host);
 * one added while the router runs (the admin API, another replica through the shared state)
 * only a variable a configured worker names or one `--engine-key-envs` lists: the admin token
 * alone must not read the router's environment, whose value would go as a bearer token to a URL
 * the caller chose.
 */
export class EngineKeyEnvs {
  private readonly names = new Set<string>();
  private readonly prefixes: string[] = [];

  /** `patterns`: names, prefixes ending in `*`, or `*` (any); see KEY_ENV_PATTERN. */
  constructor(patterns: readonly string[] = []) {
    for (const p of patterns) {
      if (typeof p !== 'string' || !KEY_ENV_PATTERN.test(p))
        throw new RangeError(
          `engine-key-envs: ${JSON.stringify(String(p).slice(0, 64))} is not a variable name, NAME* or *`,
        );
      if (p.endsWith('*')) this.prefixes.push(p.slice(0, -1));
      else this.names.add(p);
    }
  }

  /** A configured worker's variable: workers added later may name it too. */
  permit(name: string): void {
    this.names.add(name);
  }

  allows(name: string): boolean {
    if (this.names.has(name)) return true;
    for (const p of this.prefixes) if (name.startsWith(p)) return true;
    return false;
  }
}

/** The URL with any user name and password replaced by `***`, for display. */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.username === '' && u.password === '') return url;
    u.username = '***';
    u.password = '';
    return u.toString().replace(/\/$/, url.endsWith('/') ? '/' : '');
  } catch {
    return redactUserinfo(url);
  }
}

/** The Authorization header an engine started with `--api-key` expects (vLLM: a bearer token). */
export function engineAuthorization(apiKey: string | undefined): string | undefined {
  return apiKey === undefined || apiKey === '' ? undefined : `Bearer ${apiKey}`;
}

/**
 * Highest `dp-start-rank`: vLLM's --data-parallel-start-rank of a node, the first global rank
 * its API server serves.
 */
export const MAX_DP_START_RANK = 1023;

/** The fields of a `--worker` SPEC (and of a config-file entry) and the record field each one sets. */
export const WORKER_SPEC_KEYS = {
  id: 'id',
  url: 'url',
  events: 'events',
  replay: 'replay',
  metrics: 'metrics',
  models: 'models',
  cla: 'claGroups',
  'dp-size': 'dpSize',
  'dp-start-rank': 'dpStartRank',
  'block-size': 'blockSize',
  'api-key-env': 'apiKeyEnv',
} as const satisfies Record<string, keyof WorkerRecord>;

const refined = <T>(check: (v: unknown, what: string) => T) =>
  z.string().superRefine((v, ctx) => {
    try {
      check(v, 'it');
    } catch (err) {
      ctx.addIssue({ code: 'custom', message: (err as Error).message.replace(/^it /, ''), input: v });
    }
  });

/**
 * A worker as an operator gives it, in one place: `--worker` specs, `CONTEXTFORGE_WORKERS`,
 * config-file entries, `POST /admin/workers` and the shared state all go through it.
 */
export const WORKER_RECORD_SCHEMA = z
  .strictObject({
    id: refined(checkWorkerId),
    url: refined(checkWorkerUrl),
    claGroups: z.array(z.int().min(0)).max(MAX_WORKER_CLA_GROUPS).optional(),
    models: z.array(z.string().min(1).max(MAX_MODEL_NAME_LENGTH)).max(MAX_WORKER_MODELS).optional(),
    events: refined(checkZmqEndpoint).optional(),
    replay: refined(checkZmqEndpoint).optional(),
    metrics: refined(checkHttpUrl).optional(),
    apiKeyEnv: refined(checkApiKeyEnv).optional(),
    dpSize: z.int().min(1).max(64).optional(),
    dpStartRank: z.int().min(0).max(MAX_DP_START_RANK).optional(),
    blockSize: z.int().min(1).max(MAX_BLOCK_SIZE).optional(),
  })
  .superRefine((w, ctx) => {
    if (w.replay !== undefined && w.events === undefined)
      ctx.addIssue({ code: 'custom', path: ['replay'], message: 'needs events' });
    if (w.dpSize !== undefined && w.dpSize > 1 && w.events !== undefined && !/:\d+$/.test(w.events))
      ctx.addIssue({
        code: 'custom',
        path: ['dpSize'],
        message: 'needs events as tcp://host:port (rank r publishes on the port + r)',
      });
    // an engine serving one rank (vLLM turns --data-parallel-hybrid-lb with one local rank into
    // external load balancing) is a worker of its own, its events on that rank's port
    if (w.dpStartRank !== undefined && w.dpStartRank > 0 && (w.dpSize ?? 1) <= 1)
      ctx.addIssue({
        code: 'custom',
        path: ['dpStartRank'],
        message:
          "needs dpSize above 1 (the ranks S…S+L−1 of one API server); an engine serving one rank is a worker of its own, without either, its events on that rank's port",
      });
  });

/**
 * A worker record checked against the schema; `where` says where it came from (`--worker '…'`,
 * `--config f: workers[0]`). Absent (undefined or null) fields are dropped.
 */
export function parseWorkerRecord(value: unknown, where: string): WorkerRecord {
  const input =
    value !== null && typeof value === 'object' && !Array.isArray(value)
      ? Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined && v !== null))
      : value;
  const parsed = WORKER_RECORD_SCHEMA.safeParse(input, { error: describeIssue });
  if (!parsed.success) {
    const issue = firstIssue(parsed.error.issues);
    const err = issueError(issue, WORKER_RECORD_SCHEMA);
    err.message = `${where}: ${err.message}`;
    const field = issue.code === 'unrecognized_keys' ? issue.keys[0] : issue.path[0];
    throw Object.assign(err, { field: field === undefined ? undefined : String(field).slice(0, 64) });
  }
  return parsed.data;
}

/** The field a worker-record error names (the `param` of an HTTP 400), if any. */
export function workerErrorField(err: unknown): string | null {
  const field = (err as { field?: unknown } | null)?.field;
  return typeof field === 'string' ? field : null;
}
