/**
 * Checks of a worker as an operator gives it (flags, config file, admin API): its id, its
 * URLs, its engine API key's variable name. URLs may carry credentials (`http://u:p@host`);
 * they are used but never shown: listings and logs print `redactUrl()`.
 */

/** Worker ids: what fits in a metric label, a log line and a URL path segment. */
export const WORKER_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$/;
/** Environment variable names for engine API keys. */
export const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
/** Variables an engine key may never be read from: the router's own secrets. */
const FORBIDDEN_KEY_VARS = new Set(['CONTEXTFORGE_ADMIN_TOKEN']);
const MAX_URL_LENGTH = 2048;

export function checkWorkerId(id: unknown, where = 'worker id'): string {
  if (typeof id !== 'string' || !WORKER_ID.test(id))
    throw new RangeError(`${where} must match ${WORKER_ID.source} (letters, digits, . _ : -; at most 64)`);
  return id;
}

/** An http(s) URL without query or fragment; `what` names the field in the message. */
export function checkHttpUrl(url: unknown, what: string): string {
  if (typeof url !== 'string' || url.length > MAX_URL_LENGTH)
    throw new RangeError(`${what} must be an http(s) URL of at most ${MAX_URL_LENGTH} characters`);
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new RangeError(`${what} must start with http:// or https:// (not a URL)`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:')
    throw new RangeError(`${what} must start with http:// or https://`);
  if (u.search !== '' || u.hash !== '') throw new RangeError(`${what} must not have a query or fragment`);
  return url;
}

/** A ZeroMQ endpoint the subscriber can connect to. */
export function checkZmqEndpoint(endpoint: unknown, what: string): string {
  if (typeof endpoint !== 'string' || endpoint.length > MAX_URL_LENGTH || !/^(tcp|ipc):\/\/\S+$/.test(endpoint))
    throw new RangeError(`${what} must be a tcp:// or ipc:// endpoint`);
  return endpoint;
}

export function checkApiKeyEnv(name: unknown, what = 'api-key-env'): string {
  if (typeof name !== 'string' || !ENV_NAME.test(name))
    throw new RangeError(`${what} must be an environment variable name`);
  if (FORBIDDEN_KEY_VARS.has(name)) throw new RangeError(`${what} may not name ${name}`);
  return name;
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
    return url.replace(/\/\/[^/@]*@/, '//***@');
  }
}

/** The Authorization header an engine started with `--api-key` expects (vLLM: a bearer token). */
export function engineAuthorization(apiKey: string | undefined): string | undefined {
  return apiKey === undefined || apiKey === '' ? undefined : `Bearer ${apiKey}`;
}

/**
 * A base URL without its credentials, and the Basic authorization they stand for: HTTP
 * clients (fetch, undici) refuse or ignore URLs with credentials, so they travel as a header.
 */
export function splitCredentials(url: string): { url: string; authorization?: string } {
  const u = new URL(url);
  if (u.username === '' && u.password === '') return { url };
  const authorization = `Basic ${Buffer.from(`${decodeURIComponent(u.username)}:${decodeURIComponent(u.password)}`).toString('base64')}`;
  u.username = '';
  u.password = '';
  return { url: u.toString(), authorization };
}
