import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { after, describe, test } from 'node:test';
import { computeBounds } from '../../src/sim/bounds.js';
import { loadRagpulse, prefixBlockIds } from '../../src/sim/ragpulse.js';
import { simulate } from '../../src/sim/simulator.js';
import { loadMooncakeTrace, MAX_TRACE_LINE_CHARS, type TraceRequest } from '../../src/sim/trace.js';

const fixture = (name: string) => fileURLToPath(new URL(`../fixtures/${name}`, import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'cf-trace-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;
const write = (content: string | Buffer, ext = '.jsonl') => {
  const path = join(dir, `t${files++}${ext}`);
  writeFileSync(path, content);
  return path;
};
const line = (fields: Record<string, unknown>) =>
  JSON.stringify({ timestamp: 0, input_length: 1024, output_length: 8, hash_ids: [1, 2], ...fields });

describe('Mooncake trace loader, hostile files', () => {
  const head = readFileSync(fixture('mooncake-conversation-head300.jsonl'), 'utf8');

  test('a BOM, CRLF or CR line ends load the same requests as the plain file', async () => {
    const plain = await loadMooncakeTrace(write(head));
    assert.equal(plain.length, 300);
    for (const variant of [`\uFEFF${head}`, head.replace(/\n/g, '\r\n'), head.replace(/\n/g, '\r')]) {
      assert.deepEqual(await loadMooncakeTrace(write(variant)), plain);
    }
    assert.deepEqual(
      await loadMooncakeTrace(write(gzipSync(`\uFEFF${head.replace(/\n/g, '\r\n')}`), '.jsonl.gz')),
      plain,
    );
  });

  test('a .gz cut short after whole lines names the file and the line it stopped at', async () => {
    const gz = gzipSync(head);
    const path = write(gz.subarray(0, gz.length >> 1), '.jsonl.gz');
    await assert.rejects(loadMooncakeTrace(path), (e: unknown) => {
      assert.ok(e instanceof RangeError, String(e));
      assert.match(e.message, new RegExp(`^cannot read ${path} at line \\d+ \\(not gzip, or cut short\\?\\): `));
      return true;
    });
  });

  test('a truncated or garbage .gz is a RangeError naming the file', async () => {
    const gz = gzipSync(head);
    for (const content of [gz.subarray(0, gz.length >> 1), Buffer.from('not gzip at all, just text\n'.repeat(20))]) {
      const path = write(content, '.jsonl.gz');
      await assert.rejects(
        loadMooncakeTrace(path),
        (e: unknown) => e instanceof RangeError && e.message.includes(path) && /gzip/.test(e.message),
      );
    }
  });

  test('a line longer than the bound is an error naming it, the rest unread', async () => {
    const path = write(`${line({})}\n{"hash_ids": [${'1,'.repeat(MAX_TRACE_LINE_CHARS / 2)}1]}\n${line({})}\n`);
    await assert.rejects(loadMooncakeTrace(path), (e: unknown) => {
      assert.ok(e instanceof Error && e.name === 'TraceFormatError', String(e));
      assert.ok(e.message.startsWith(`${path} line 2: longer than`), e.message);
      return true;
    });
  });

  test('token counts must be whole numbers within the bound, named by line', async () => {
    for (const bad of [1024.5, 1e12]) {
      await assert.rejects(
        loadMooncakeTrace(write(`${line({})}\n\n${line({ input_length: bad })}\n`)),
        /t\d+\.jsonl line 3: "input_length" must be a whole number of tokens/,
      );
      await assert.rejects(
        loadMooncakeTrace(write(`${line({ output_length: bad })}\n`)),
        /t\d+\.jsonl line 1: "output_length" must be a whole number of tokens/,
      );
      await assert.rejects(
        loadMooncakeTrace(write(`${line({ block_size: bad })}\n`)),
        /t\d+\.jsonl line 1: "block_size" must be a whole number of tokens/,
      );
    }
  });

  test('every line error names the file, the line and the field', async () => {
    const cases: Array<[string, string]> = [
      ['{"timestamp": 0,', 'line 2: not valid JSON'],
      ['[1]', 'line 2: not a JSON object'],
      [line({ session_id: '' }), 'line 2: "session_id" must be a non-empty string or a number'],
      [
        line({ block_size: 128, hash_ids: [1, 2, 3, 4, 5, 6, 7, 8] }),
        'line 2: "block_size" 128 differs from 512 (line 1): a trace has one block size',
      ],
      // more anchors than the simulated router takes: refused when read, not mid-replay
      [
        line({ anchors: Array.from({ length: 4097 }, (_, i) => `a${i}`), anchor_lengths: new Array(4097).fill(0) }),
        'line 2: "anchors" names 4097 anchors, more than the 4096 a request may name',
      ],
    ];
    for (const [bad, message] of cases) {
      const path = write(`${line({})}\n${bad}\n${line({})}\n`);
      await assert.rejects(loadMooncakeTrace(path), (e: unknown) => {
        assert.ok(e instanceof RangeError, String(e));
        assert.equal(e.message, `${path} ${message}`);
        return true;
      });
    }
  });
});

describe('RAGPulse loader, hostile directories', () => {
  const sample = fixture('ragpulse-sample');
  const copy = (edit: (d: string) => void) => {
    const d = join(dir, `rp${files++}`);
    cpSync(sample, d, { recursive: true });
    edit(d);
    return d;
  };
  const editLine = (d: string, file: string, n: number, replace: (s: string) => string) => {
    const lines = readFileSync(join(d, file), 'utf8').split('\n');
    lines[n - 1] = replace(lines[n - 1]);
    writeFileSync(join(d, file), lines.join('\n'));
  };

  test('malformed lines of the trace and side files are errors naming the file, line and field', async () => {
    const cases: Array<[string, number, (s: string) => string, RegExp]> = [
      ['1_sys_prompt.jsonl', 3, () => '{"sys_prompt_id": 8310,', /1_sys_prompt\.jsonl line 3: not valid JSON/],
      ['1_sys_prompt.jsonl', 3, () => '{"sys_prompt_id": "x", "token_length": 4}', /line 3: "sys_prompt_id"/],
      ['3_history.jsonl', 2, (s) => s.replace(/"token_length": \d+/, '"token_length": 1e15'), /line 2: "token_length"/],
      ['0_trace.jsonl', 2, () => '[1, 2]', /0_trace\.jsonl line 2: not a JSON object/],
      // a chunk its side file does not list: no length to count it by
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace('"sys_prompt": [8302', '"sys_prompt": [987654321'),
        /line 2: "hash_ids\.sys_prompt" names chunk 987654321, which 1_sys_prompt\.jsonl does not list$/,
      ],
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace('"passages_ids": [6124', '"passages_ids": [987654321'),
        /line 2: "hash_ids\.passages_ids" names chunk 987654321, which 2_passages\.jsonl does not list$/,
      ],
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace('"passages_ids": [6124', `"passages_ids": [${'6124, '.repeat(4097)}6124`),
        /line 2: "hash_ids\.passages_ids" names \d+ passages, more than the 4096 a request may name$/,
      ],
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace('"user_input": [26922]', '"user_input": [26922, 987654321]'),
        /line 2: "hash_ids\.user_input" names chunk 987654321, which 4_user_input\.jsonl does not list$/,
      ],
      ['0_trace.jsonl', 2, () => 'null', /0_trace\.jsonl line 2: not a JSON object/],
      ['0_trace.jsonl', 2, (s) => s.replace('"timestamp": "93", ', ''), /line 2: "timestamp"/],
      ['0_trace.jsonl', 2, (s) => s.replace('"timestamp": "93"', '"timestamp": "soon"'), /line 2: "timestamp"/],
      ['0_trace.jsonl', 2, (s) => s.replace('"input_length": 3167, ', ''), /line 2: "input_length"/],
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace('"input_length": 3167', '"input_length": 0'),
        /line 2: "input_length" must be a whole number of tokens from 1 to 16777216$/,
      ],
      ['0_trace.jsonl', 2, (s) => s.replace('"sys_prompt": [', '"sys_prompt": [-3, '), /line 2: "hash_ids.sys_prompt"/],
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace('"hash_ids": {', '"hash_ids": {"history": 5, "x": {}, '),
        /line 2: "hash_ids/,
      ],
      ['0_trace.jsonl', 2, (s) => s.replace('"hash_ids": {', '"hash_ids": [1], "x": {'), /line 2: "hash_ids" must be/],
      // the format's five components and no other: an object member's name is no exception
      ...['constructor', '__proto__', 'toString', 'hasOwnProperty', 'bogus'].map(
        (key): [string, number, (s: string) => string, RegExp] => [
          '0_trace.jsonl',
          2,
          (s) => s.replace('"hash_ids": {', `"hash_ids": {"${key}": [1], `),
          new RegExp(
            `line 2: "hash_ids" has the key '${key}', which is no RAGPulse component \\(sys_prompt, passages_ids, history, user_input, web_search\\)$`,
          ),
        ],
      ),
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace('"hash_ids": {', `"hash_ids": {"${'k'.repeat(10_000)}": [], `),
        /line 2: "hash_ids" has the key 'k+…' \(10000 characters\), which is no RAGPulse component/,
      ],
      ['0_trace.jsonl', 2, (s) => `\n\n${s.slice(0, 20)}`, /0_trace\.jsonl line 4: not valid JSON/],
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace(/"session_id": "[^"]*"/, '"session_id": ""'),
        /0_trace\.jsonl line 2: "session_id" must be a non-empty string$/,
      ],
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace(/"session_id": "[^"]*"/, `"session_id": "${'s'.repeat(1025)}"`),
        /0_trace\.jsonl line 2: "session_id" must be at most 1024 bytes of UTF-8, got 1025 characters$/,
      ],
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace('"input_length": 3167', '"input_length": 10'),
        /0_trace\.jsonl line 2: its passages \(hash_ids\.passages_ids, lengths from 2_passages\.jsonl\) add up to \d+ tokens, more than "input_length" \(10\)$/,
      ],
    ];
    for (const [file, n, replace, expected] of cases) {
      const d = copy((d) => editLine(d, file, n, replace));
      await assert.rejects(loadRagpulse(d), (e: unknown) => {
        assert.ok(e instanceof RangeError, String(e));
        assert.match(e.message, expected);
        // the file as it was opened, its directory included: the directory is what --trace named
        assert.ok(e.message.startsWith(`${join(d, file)} line `), e.message);
        return true;
      });
    }
  });

  test('a malformed line of a gzipped file names the .gz file', async () => {
    const d = copy((d) => {
      editLine(d, '0_trace.jsonl', 3, (s) => s.slice(0, 20));
      writeFileSync(join(d, '0_trace.jsonl.gz'), gzipSync(readFileSync(join(d, '0_trace.jsonl'))));
      rmSync(join(d, '0_trace.jsonl'));
    });
    await assert.rejects(loadRagpulse(d), (e: unknown) => {
      assert.ok(e instanceof RangeError, String(e));
      assert.equal(e.message, `${join(d, '0_trace.jsonl.gz')} line 3: not valid JSON`);
      return true;
    });
  });

  test('a huge chunk length is refused naming the line, and gives no more prefix blocks than the prompt holds', async () => {
    // the first request's system prompt begins with chunk 8302: a prompt of 3,112 tokens cannot
    // hold it (it was read cut to the prompt, without a word)
    const d = copy((d) =>
      editLine(d, '1_sys_prompt.jsonl', 1, () => '{"sys_prompt_id": 8302, "token_length": 16000000}'),
    );
    await assert.rejects(
      loadRagpulse(d),
      (e: unknown) =>
        e instanceof RangeError &&
        e.message ===
          `${join(d, '0_trace.jsonl')} line 1: its chunks (lengths from the side files) add up to 16002591 tokens (sys_prompt 16000949, passages_ids 1624, history 11, user_input 7, web_search 0), more than "input_length" (3112)`,
    );
    // the prefix blocks are still cut to the prompt before that check
    const ids = prefixBlockIds(
      { sys_prompt: [8302], history: [] },
      { sys_prompt: new Map([[8302, 16_000_000]]), history: new Map() },
      64,
      Math.floor(3112 / 64),
    );
    assert.equal(ids.length, Math.floor(3112 / 64));
  });

  test('inconsistent RAGPulse files are refused naming the file and line', async () => {
    const cases: Array<[string, number, (s: string) => string, string, string]> = [
      // chunks adding up past the prompt: the system prompt and history alone, or with the rest
      [
        '0_trace.jsonl',
        2,
        (s) =>
          s
            .replace('"input_length": 3167', '"input_length": 1400')
            .replace(/"passages_ids": \[[^\]]*\]/, '"passages_ids": []'),
        '0_trace.jsonl',
        'line 2: its chunks (lengths from the side files) add up to 1485 tokens (sys_prompt 1461, passages_ids 0, history 11, user_input 13, web_search 0), more than "input_length" (1400)',
      ],
      [
        '0_trace.jsonl',
        2,
        (s) => s.replace('"input_length": 3167', '"input_length": 3159'),
        '0_trace.jsonl',
        'line 2: its chunks (lengths from the side files) add up to 3160 tokens (sys_prompt 1461, passages_ids 1675, history 11, user_input 13, web_search 0), more than "input_length" (3159)',
      ],
      // one id listed twice with two lengths (the same length twice is only a repeat)
      [
        '3_history.jsonl',
        3,
        (s) => `${s}\n{"history_id": 15200, "token_length": 12}`,
        '3_history.jsonl',
        'line 4: "history_id" 15200 is listed with "token_length" 12, and with 11 on line 1',
      ],
      // a timestamp string Number() reads, but not in decimal digits
      ...['0x10', '0b1', '0o7', 'Infinity', '1_000'].map(
        (ts): [string, number, (s: string) => string, string, string] => [
          '0_trace.jsonl',
          2,
          (s) => s.replace('"timestamp": "93"', `"timestamp": "${ts}"`),
          '0_trace.jsonl',
          `line 2: "timestamp" must be a non-negative number of seconds, in decimal digits, got '${ts}'`,
        ],
      ),
    ];
    for (const [file, n, replace, named, message] of cases) {
      const d = copy((d) => editLine(d, file, n, replace));
      await assert.rejects(loadRagpulse(d), (e: unknown) => {
        assert.ok(e instanceof RangeError, String(e));
        assert.equal(e.message, `${join(d, named)} ${message}`);
        return true;
      });
    }
    // decimal timestamps as strings or numbers, with blanks around, and a side file repeating an
    // id with its length, read as before
    const plain = await loadRagpulse(sample);
    for (const ts of ['"93"', '" 93 "', '93', '"93.0"', '"9.3e1"']) {
      const d = copy((d) => {
        editLine(d, '0_trace.jsonl', 2, (s) => s.replace('"timestamp": "93"', `"timestamp": ${ts}`));
        editLine(d, '3_history.jsonl', 3, (s) => `${s}\n{"history_id": 15200, "token_length": 11}`);
      });
      assert.deepEqual(await loadRagpulse(d), plain, ts);
    }
  });

  test('a request is numbered by its line in the trace file, blank lines included (--assignments "request")', async () => {
    const plain = await loadRagpulse(sample);
    // a blank line before the second line moves every later request one line down
    const d = copy((d) => editLine(d, '0_trace.jsonl', 2, (s) => `\n${s}`));
    const shifted = await loadRagpulse(d);
    assert.deepEqual(
      shifted.map((r) => r.index),
      plain.map((r) => (r.index >= 1 ? r.index + 1 : r.index)),
    );
  });

  test('BOM and CRLF variants load the same requests', async () => {
    const plain = await loadRagpulse(sample);
    const d = copy((d) => {
      for (const f of readdirSync(d).filter((f) => f.endsWith('.jsonl'))) {
        const text = readFileSync(join(d, f), 'utf8');
        writeFileSync(join(d, f), `\uFEFF${text.replace(/\n/g, '\r\n')}`);
      }
    });
    assert.deepEqual(await loadRagpulse(d), plain);
  });
});

describe('replaying a trace the simulator cannot replay', () => {
  const req = (index: number, timestamp: number, blockSize = 512): TraceRequest => ({
    index,
    timestamp,
    inputLength: 1024,
    outputLength: 4,
    hashIds: [index],
    blockSize,
  });

  test('an arrival beyond the span limit is refused at once, not scraped through', () => {
    assert.throws(() => simulate([req(0, 0), req(1, 1e300)], { workers: 2, policy: 'round-robin' }), /31 days/);
    // the span counts at the replay speed
    assert.throws(
      () => simulate([req(0, 0), req(1, 3_600_000)], { workers: 2, policy: 'round-robin', speed: 1e-3 }),
      /31 days/,
    );
  });

  test('answers that run past the span limit stop the replay, naming the longest output', () => {
    // one request answering 16 million tokens over a 16-million-token context decodes for months;
    // scraped once a day, the replay reaches the limit in a few hundred events
    const long: TraceRequest = { ...req(0, 0), outputLength: 16_000_000 };
    assert.throws(
      () =>
        simulate(
          [req(1, 0), long].map((r, i) => ({ ...r, index: i })),
          {
            workers: 1,
            policy: 'round-robin',
            scrapeIntervalMs: 86_400_000,
            engine: { kvTokens: 16_777_216, maxModelLen: 16_777_216 },
          },
        ),
      (e: unknown) =>
        e instanceof RangeError &&
        /^the replay runs past the 2678400000 ms \(31 days\) a replay may cover .*the longest, trace line 2, has an output of 16000000 tokens\)$/.test(
          e.message,
        ),
    );
  });

  test('timestamps out of order or not finite, and mixed block sizes, name the line', () => {
    const run = (trace: TraceRequest[]) => () => simulate(trace, { workers: 2, policy: 'round-robin' });
    assert.throws(run([req(0, 10), req(1, 5)]), /trace line 2: timestamp 5/);
    assert.throws(run([req(0, 0), req(1, NaN)]), /trace line 2: timestamp NaN/);
    assert.throws(run([req(0, 0), req(1, 1, 128)]), /trace line 2: block size 128 differs from 512/);
    assert.throws(() => computeBounds([req(0, 0), req(1, 1, 128)]), /trace line 2: block size 128/);
  });
});
