/**
 * `serve --print-config` and `epp --print-config`: the effective configuration, each value with
 * where it came from (default, file, env, flag), secrets redacted. The YAML form is itself a
 * config file.
 */
import { Document, isMap, isScalar, type Pair, type Scalar } from 'yaml';
import { redactUrl } from '../../server/worker-input.js';
import type { WorkerRecord } from '../../state/state-store.js';
import type { Origin, ResolvedSettings } from './resolve.js';
import { kebab, secretSetting } from './settings.js';

const SECRET = '<redacted>';

/** A value as it may be shown: secrets hidden, credentials in URLs masked. */
export function redactSetting(key: string, value: unknown): unknown {
  if (key === 'state' && typeof value === 'string') return redactUrl(value);
  if (secretSetting(key)) return SECRET;
  return value;
}

function redactWorker(w: WorkerRecord): WorkerRecord {
  return { ...w, url: redactUrl(w.url), ...(w.metrics === undefined ? {} : { metrics: redactUrl(w.metrics) }) };
}

export function printConfig(resolved: ResolvedSettings<Record<string, unknown>>, format: 'yaml' | 'json'): string {
  const entries: [string, unknown, Origin][] = [];
  for (const [key, origin] of Object.entries(resolved.origins)) {
    const value = resolved.values[key];
    if (value === undefined) continue;
    entries.push([key, redactSetting(key, value), origin]);
  }
  const workers = resolved.workers.map(redactWorker);
  if (format === 'json') {
    const settings = Object.fromEntries(entries.map(([k, v, from]) => [kebab(k), { value: v, from }]));
    return `${JSON.stringify({ settings, workers: { value: workers, from: resolved.workersOrigin } }, null, 2)}\n`;
  }
  const doc = new Document(
    Object.fromEntries([...entries.map(([k, v]) => [kebab(k), v] as const), ['workers', workers] as const]),
  );
  doc.commentBefore = ` effective configuration${resolved.configFile ? ` (config file ${resolved.configFile})` : ''}; each value's source after it`;
  const origins = new Map<string, Origin>(entries.map(([k, , from]) => [kebab(k), from]));
  origins.set('workers', resolved.workersOrigin);
  if (isMap(doc.contents)) {
    for (const pair of doc.contents.items as Pair<Scalar, unknown>[]) {
      const key = isScalar(pair.key) ? String(pair.key.value) : '';
      const from = origins.get(key);
      if (from === undefined) continue;
      const node = pair.value as { comment?: string; commentBefore?: string } | null;
      if (node && isScalar(node)) node.comment = ` ${from}`;
      else if (isScalar(pair.key)) pair.key.commentBefore = ` ${key}: ${from}`;
    }
  }
  return doc.toString({ lineWidth: 0 });
}
