import { existsSync, statSync } from 'node:fs';
import { basename } from 'node:path';
import { loadMooncakeTrace, type TraceRequest } from './trace.js';

/** Loads a trace by path: a Mooncake JSONL file (optionally .gz). */
export async function loadTrace(path: string): Promise<{ name: string; requests: TraceRequest[] }> {
  if (!existsSync(path)) throw new RangeError(`--trace: no such file: ${path}`);
  if (statSync(path).isDirectory()) throw new RangeError(`--trace: ${path} is a directory; give a .jsonl or .jsonl.gz file`);
  return { name: basename(path), requests: await loadMooncakeTrace(path) };
}
