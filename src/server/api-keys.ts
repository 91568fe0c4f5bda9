/**
 * Client API keys and tenants. With a keys file, every OpenAI request must carry
 * `Authorization: Bearer KEY` (what OpenAI clients send as their api key); each key names a
 * tenant. Requests of different tenants never share KV: the tenant is folded into the
 * `cache_salt` sent to the engine (vLLM keys its prefix cache on it) and into the root of the
 * router's block hashes, so one tenant can neither reuse nor probe another's prompts.
 */
import { createHash } from 'node:crypto';
import { fileErrorMessage, quotedText, shownText } from '../core/shown-text.js';
import { readRegularFile } from '../engines/bounded-file.js';
import { parseBoundedYaml } from '../engines/bounded-yaml.js';

/** Largest keys file read (about 100,000 keys). */
export const MAX_API_KEYS_FILE_BYTES = 16 * 1024 * 1024;
/** Most values a keys file holds: a key and a tenant for each of 100,000 keys, and room. */
export const MAX_API_KEYS_FILE_VALUES = 250_000;

/** Tenant names: short, and free of the separator used in salts. */
export const TENANT_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const MIN_KEY_LENGTH = 16;

export class ApiKeys {
  /** SHA-256 of the key → tenant: lookups never compare the secret itself. */
  private readonly byDigest = new Map<string, string>();
  /** The tenants the keys name. */
  private readonly tenants = new Set<string>();

  /** `keys`: API key → tenant name. */
  constructor(keys: Readonly<Record<string, string>> | ReadonlyMap<string, string>) {
    const entries = keys instanceof Map ? [...keys.entries()] : Object.entries(keys);
    if (entries.length === 0) throw new RangeError('the API keys file lists no keys');
    for (const [key, tenant] of entries) {
      if (typeof key !== 'string' || key.length < MIN_KEY_LENGTH)
        throw new RangeError(`an API key is shorter than ${MIN_KEY_LENGTH} characters`);
      if (/\s/.test(key)) throw new RangeError('an API key contains whitespace');
      if (typeof tenant !== 'string' || !TENANT_NAME.test(tenant))
        throw new RangeError(`tenant ${quotedText(String(tenant))} must match ${TENANT_NAME.source}`);
      this.byDigest.set(digest(key), tenant);
      this.tenants.add(tenant);
    }
  }

  /** Whether a key of the file names `tenant`. */
  hasTenant(tenant: string): boolean {
    return this.tenants.has(tenant);
  }

  get size(): number {
    return this.byDigest.size;
  }

  /** The tenant of an `Authorization: Bearer KEY` header, or undefined. */
  tenantOf(authorization: string | string[] | undefined): string | undefined {
    const id = this.keyIdOf(authorization);
    return id === undefined ? undefined : this.byDigest.get(id);
  }

  /**
   * What tells the key of an `Authorization: Bearer KEY` header apart from the others when it is
   * one of them (its digest: the key itself is not kept), or undefined.
   */
  keyIdOf(authorization: string | string[] | undefined): string | undefined {
    if (typeof authorization !== 'string' || authorization.length > 4096) return undefined;
    const m = /^Bearer +(\S+)\s*$/i.exec(authorization);
    if (!m) return undefined;
    const id = digest(m[1]);
    return this.byDigest.has(id) ? id : undefined;
  }
}

function digest(key: string): string {
  return createHash('sha256').update(key).digest('base64');
}

/**
 * Reads a keys file: a YAML (or JSON) mapping of API key → tenant name,
 * `sk-live-0123456789abcdef: team-a`. A file readable by others is refused.
 */
export function loadApiKeysFile(file: string): ApiKeys {
  let raw: unknown;
  try {
    // a pipe or device could block or never end: a keys file is a regular file of bounded size,
    // read as readRegularFile checks it (through the opened file: nothing swapped in between)
    const text = readRegularFile(file, MAX_API_KEYS_FILE_BYTES, (st) => {
      if ((st.mode & 0o077) !== 0)
        throw new RangeError(`is readable by others (mode ${(st.mode & 0o777).toString(8)}); chmod 600 it`);
    });
    raw = parseBoundedYaml(text, MAX_API_KEYS_FILE_VALUES);
  } catch (err) {
    throw new RangeError(`--api-keys-file ${shownText(file)}: ${fileErrorMessage(err, file)}`, { cause: err });
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw))
    throw new RangeError(`--api-keys-file ${shownText(file)}: must be a mapping of API key to tenant name`);
  try {
    return new ApiKeys(raw as Record<string, string>);
  } catch (err) {
    throw new RangeError(`--api-keys-file ${shownText(file)}: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * The cache salt of a tenant's request: `tenant/<name>` followed by the client's own salt if it
 * sent one. Tenant names cannot contain '/', so no client salt makes one tenant's salt equal
 * another's.
 */
export function tenantCacheSalt(tenant: string, clientSalt: string | undefined): string {
  return clientSalt === undefined ? `tenant/${tenant}` : `tenant/${tenant}/${clientSalt}`;
}

/**
 * A workflow or content-anchor id as the router keeps it for a tenant's request: `tenant/<name>/<id>`.
 * The router's tables are keyed by these ids; unscoped, one tenant's request naming another's
 * anchor would be scored (and shown, with the cached-tokens header) as holding that tenant's KV,
 * and its workflow step would move the other tenant's workflow.
 */
export function tenantScopedId(tenant: string, id: string): string {
  return `tenant/${tenant}/${id}`;
}
