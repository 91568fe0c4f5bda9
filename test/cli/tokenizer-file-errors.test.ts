import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { escapedText } from '../../src/core/shown-text.js';
import { CLI } from '../helpers/cli-entry.js';

const dir = mkdtempSync(join(tmpdir(), 'cf-tokenizer-errors-'));

function cli(args: string[]) {
  return spawnSync(process.execPath, [...CLI, ...args], {
    encoding: 'utf8',
    timeout: 60_000,
    killSignal: 'SIGKILL',
  });
}

// what a terminal would act on: control characters (BEL, ESC…), C1 controls, line separators
// eslint-disable-next-line no-control-regex -- the characters looked for
const UNPRINTABLE = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u2028\u2029]/;

test('a tokenizer file that is not JSON is named by its flag, with a short escaped excerpt', () => {
  const binary = join(dir, 'bin.dat');
  const bytes = Buffer.alloc(4096);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 37 + 7) % 256;
  bytes[0] = 0x07; // BEL, then ESC [ 2 J: a terminal would ring and clear the screen
  bytes.write('\u001b[2J', 1, 'latin1');
  writeFileSync(binary, bytes);
  const runs = [
    ['serve', '--port', '0', '--tokenize', 'tokenizer', '--tokenizer-threads', '0', '--tokenizer', binary],
    ['serve', '--port', '0', '--tokenize', 'tokenizer', '--tokenizer-threads', '1', '--tokenizer', binary],
    ['mock-engine', '--port', '0', '--tokenizer', binary],
  ];
  for (const args of runs) {
    const r = cli(args);
    assert.equal(r.status, 2, r.stderr);
    const error = r.stderr.split('\n').find((l) => l.startsWith('error: ')) ?? '';
    assert.ok(error.startsWith(`error: --tokenizer: cannot read '${binary}': `), r.stderr);
    assert.doesNotMatch(r.stderr, UNPRINTABLE, JSON.stringify(r.stderr));
    assert.ok(error.length < 400, `${error.length} characters`);
  }
});

test('escapedText escapes what a terminal would act on and bounds the text', () => {
  assert.equal(escapedText('a\u0007b\u001b[2Jc\u0085d\u2028e'), 'a\\x07b\\x1b[2Jc\\x85d\\u2028e');
  assert.equal(escapedText('tab\there\nline'), 'tab\\x09here\\x0aline');
  assert.equal(escapedText('x'.repeat(300), 10), `${'x'.repeat(10)}… (300 characters)`);
  assert.equal(escapedText('plain text, ünïcode'), 'plain text, ünïcode');
});
