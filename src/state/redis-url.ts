import type { RedisOptions } from 'ioredis';
import { quotedText } from '../core/shown-text.js';

/** The highest database a redis:// URL may name (SELECT takes a 32-bit signed index). */
export const MAX_REDIS_DB = 2_147_483_647;

/** redis://[user:password@]host[:port][/db] → ioredis options; anything else (a query or fragment too) is a RangeError. */
export function parseRedisUrl(spec: string): Pick<RedisOptions, 'host' | 'port' | 'db' | 'username' | 'password'> {
  let u: URL;
  try {
    u = new URL(spec);
  } catch {
    throw new RangeError(`state: ${quotedText(spec)} is not a redis:// URL`);
  }
  if (u.protocol !== 'redis:') throw new RangeError(`state: ${quotedText(spec)} is not a redis:// URL`);
  // not shown: a query may hold a password
  if (u.search !== '' || u.hash !== '')
    throw new RangeError(
      'state: the redis:// URL has a query or fragment, which the store does not read: put the database in the path, redis://HOST:PORT/DB',
    );
  const port = u.port === '' ? 6379 : Number(u.port);
  const dbPath = u.pathname.replace(/^\//, '');
  if (!/^\d*$/.test(dbPath))
    throw new RangeError(`state: database ${quotedText(dbPath)} in ${quotedText(spec)} is not a number`);
  const db = dbPath === '' ? 0 : Number(dbPath);
  if (db > MAX_REDIS_DB) throw new RangeError(`state: database ${dbPath} of the redis:// URL is past ${MAX_REDIS_DB}`);
  return {
    host: u.hostname.replace(/^\[|\]$/g, '') || '127.0.0.1',
    port,
    db,
    username: u.username ? decodeURIComponent(u.username) : undefined,
    password: u.password ? decodeURIComponent(u.password) : undefined,
  };
}
