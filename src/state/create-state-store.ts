import { quotedText } from '../core/shown-text.js';
import { RedisStateStore, type RedisStateOptions } from './redis-state-store.js';
import { MemoryStateStore, type StateStore } from './state-store.js';

/** `memory` (the default, one replica) or `redis://host:port[/db]` (replicas share state). */
export function createStateStore(spec: string, options: Omit<RedisStateOptions, 'url'> = {}): StateStore {
  if (spec === 'memory') return new MemoryStateStore();
  if (spec.startsWith('redis://')) return new RedisStateStore({ ...options, url: spec });
  throw new RangeError(`state must be memory or redis://HOST:PORT, got ${quotedText(spec)}`);
}
