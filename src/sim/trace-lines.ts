import { createReadStream } from 'node:fs';
import { pipeline } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { escapeUnprintable } from '../core/shown-text.js';

/**
 * Longest line a trace file may hold, in characters: a Mooncake line of a 16M-token prompt in
 * 512-token blocks takes about 300 kB, so this only stops a file that is not a trace (or a
 * line without an end) from filling the memory.
 */
export const MAX_TRACE_LINE_CHARS = 16 * 1024 * 1024;

/**
 * Most requests a trace may hold, and most lines a RAGPulse side file may hold: every request
 * is held in memory for the whole replay, about 400 bytes for a Mooncake request of 24 blocks,
 * so a million take some 0.4 GB of Node's default heap (about 4 GB) and ten million would not
 * fit. The public traces hold at most 12,031 requests and the generated workloads at most
 * 40,000 (`workflows:10000`; `agentic:500` about 28,000), 25 times under it.
 */
export const MAX_TRACE_REQUESTS = 1_000_000;

/**
 * Most blank lines (empty, or spaces only) a trace file may hold: they are skipped, but each is
 * still read and split off, so a file of nothing else (a gzip of a gigabyte of line ends is a
 * few MB) would hold the reader for minutes while no request limit counts it. As many as the
 * requests a trace may hold leaves a blank line between every two requests.
 */
export const MAX_TRACE_BLANK_LINES = MAX_TRACE_REQUESTS;

/** The error for a trace file past MAX_TRACE_REQUESTS `records`: it names the file and the limit. */
export function tooManyRecords(file: string, records = 'requests'): RangeError {
  return new RangeError(
    `${escapeUnprintable(file)}: more than ${MAX_TRACE_REQUESTS} ${records}, the most a trace may hold (each is held in memory)`,
  );
}

/**
 * Most KV blocks a trace may hold in all: its hash ids plus the blocks of its content anchors
 * (ceil(tokens / block size) each), the blocks a replay derives keys for. Every request's hash
 * ids and derived block keys are held for the whole run: measured with process.memoryUsage()
 * on parsed traces, some 12–18 bytes of heap a hash id and 16 bytes of array buffers a key, so
 * 64 Mi blocks take about 1.2 GB of heap (under a third of Node's default 4 GB, leaving the
 * replay room) and 1 GB of buffers. The public traces hold at most a few hundred thousand
 * blocks; the largest generated workload, `agentic:500`, about 45 million.
 */
export const MAX_TRACE_BLOCKS = 64 * 1024 * 1024;

/**
 * A malformed line of a trace file: the message names the file (or `trace`; its control
 * characters escaped), the 1-based line and the field.
 */
export class TraceFormatError extends RangeError {
  constructor(
    /** 0-based line index. */
    readonly line: number,
    message: string,
    source = 'trace',
  ) {
    super(`${escapeUnprintable(source)} line ${line + 1}: ${message}`);
    this.name = 'TraceFormatError';
  }
}

/**
 * Counts the blocks of a trace line by line against MAX_TRACE_BLOCKS: `add` takes a line's
 * 0-based index and its blocks and throws a TraceFormatError naming the file (`source`), the
 * line and the limit at the line that crosses it.
 */
export function traceBlockCounter(source: string): (index: number, blocks: number) => void {
  let total = 0;
  return (index, blocks) => {
    total += blocks;
    if (total > MAX_TRACE_BLOCKS)
      throw new TraceFormatError(
        index,
        `the trace passes ${MAX_TRACE_BLOCKS} blocks (hash ids and content-anchor blocks), the most a trace may hold (each is held in memory)`,
        source,
      );
  };
}

/**
 * The lines of a text file, gunzipped if its name ends in `.gz`, with their 0-based indices
 * (blank lines included). `\n`, `\r\n` and a lone `\r` end a line; a leading byte-order mark is
 * dropped. A line over MAX_TRACE_LINE_CHARS, or a blank line past MAX_TRACE_BLANK_LINES, is a
 * TraceFormatError naming it (the rest of the file is not read); a file that cannot be read or decompressed is a RangeError naming it (and the line
 * it stopped in, past the first).
 */
export async function* traceLines(path: string, source = 'trace'): AsyncGenerator<{ text: string; index: number }> {
  const file = createReadStream(path);
  const input = path.endsWith('.gz') ? pipeline(file, createGunzip(), () => {}) : file;
  input.setEncoding('utf8');
  const ends = /\r\n?|\n/g;
  let pending = '';
  let index = 0;
  let first = true;
  let afterCr = false; // the previous chunk ended in \r: a \n starting this one belongs to it
  let blank = 0;
  const tooLong = () => new TraceFormatError(index, `longer than ${MAX_TRACE_LINE_CHARS} characters`, source);
  const tooManyBlank = () =>
    new TraceFormatError(
      index,
      `more than ${MAX_TRACE_BLANK_LINES} blank lines, the most a trace may hold (the file is read no further)`,
      source,
    );
  try {
    for await (const chunk of input as AsyncIterable<string>) {
      let s = chunk;
      if (first) {
        first = false;
        if (s.charCodeAt(0) === 0xfeff) s = s.slice(1);
      }
      let start = afterCr && s.charCodeAt(0) === 10 ? 1 : 0;
      afterCr = false;
      ends.lastIndex = start;
      for (let m = ends.exec(s); m !== null; m = ends.exec(s)) {
        const text = pending + s.slice(start, m.index);
        pending = '';
        if (text.length > MAX_TRACE_LINE_CHARS) throw tooLong();
        if (text.trim() === '' && ++blank > MAX_TRACE_BLANK_LINES) throw tooManyBlank();
        yield { text, index: index++ };
        start = m.index + m[0].length;
        if (m[0] === '\r' && start === s.length) afterCr = true;
      }
      pending += s.slice(start);
      if (pending.length > MAX_TRACE_LINE_CHARS) throw tooLong();
    }
  } catch (err) {
    if (err instanceof TraceFormatError) throw err;
    const gz = path.endsWith('.gz') ? ' (not gzip, or cut short?)' : '';
    // past whole lines: the line the reading stopped in
    const at = index > 0 ? ` at line ${index + 1}` : '';
    throw new RangeError(
      `cannot read ${escapeUnprintable(path)}${at}${gz}: ${escapeUnprintable((err as Error).message)}`,
      {
        cause: err,
      },
    );
  } finally {
    input.destroy();
  }
  if (pending.length > 0) yield { text: pending, index };
}
