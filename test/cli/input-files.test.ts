import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  MAX_CHAT_TEMPLATE_BYTES,
  MAX_TOKENIZER_CONFIG_BYTES,
  MAX_TOKENIZER_JSON_BYTES,
} from '../../src/engines/bounded-file.js';
import { CLI } from '../helpers/cli-entry.js';

const fixture = fileURLToPath(new URL('../fixtures/tokenizer/', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'cf-input-files-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** The CLI run to its end; a read that hangs is killed at the deadline (status null, not 2). */
function cli(args: string[]) {
  return spawnSync(process.execPath, [...CLI, ...args], {
    encoding: 'utf8',
    timeout: 60_000,
    killSignal: 'SIGKILL',
  });
}

/** A sparse file of `bytes` bytes: past every limit without writing them. */
function sparse(name: string, bytes: number): string {
  const file = join(dir, name);
  writeFileSync(file, '');
  truncateSync(file, bytes);
  return file;
}

/** A named pipe no one writes to: opening it for reading blocks unless refused first. */
function fifo(name: string): string {
  const file = join(dir, name);
  const made = spawnSync('mkfifo', [file]);
  assert.equal(made.status, 0, String(made.stderr));
  return file;
}

const serve = (...args: string[]) =>
  cli(['serve', '--port', '42011', '--worker', 'id=w0,url=http://127.0.0.1:1', ...args]);

test('serve --chat-template refuses a file over the limit and one that is not a regular file', () => {
  // (with the tokenizer it is used with: without it, a warning says it does nothing)
  const withTemplate = (file: string) =>
    serve('--tokenize', 'tokenizer', '--tokenizer', fixture, '--tokenizer-threads', '0', '--chat-template', file);
  const big = sparse('big.jinja', MAX_CHAT_TEMPLATE_BYTES + 1);
  const tooBig = withTemplate(big);
  assert.equal(tooBig.status, 2, tooBig.stderr);
  assert.equal(
    tooBig.stderr,
    `error: --chat-template: cannot read '${big}': is larger than ${MAX_CHAT_TEMPLATE_BYTES} bytes\n`,
  );
  const pipe = fifo('template.fifo');
  const piped = withTemplate(pipe);
  assert.equal(piped.status, 2, piped.stderr);
  assert.equal(piped.stderr, `error: --chat-template: cannot read '${pipe}': is not a regular file\n`);
});

test('serve --tokenizer refuses a tokenizer.json, tokenizer_config.json or chat_template.jinja past its limit', () => {
  const big = sparse('tokenizer.json', MAX_TOKENIZER_JSON_BYTES + 1);
  for (const threads of ['0', '1']) {
    const r = serve('--tokenize', 'tokenizer', '--tokenizer-threads', threads, '--tokenizer', big);
    assert.equal(r.status, 2, r.stderr);
    assert.match(
      r.stderr,
      new RegExp(`--tokenizer: cannot read '${big}': is larger than ${MAX_TOKENIZER_JSON_BYTES} bytes`),
    );
    assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
  }
  const model = join(dir, 'model');
  mkdirSync(model);
  copyFileSync(join(fixture, 'tokenizer.json'), join(model, 'tokenizer.json'));
  // each file of the model's folder past its own limit, the others as they are
  const pastLimit = (name: string, limit: number, label: string) => {
    const file = join(model, name);
    writeFileSync(file, '');
    truncateSync(file, limit + 1);
    const r = serve('--tokenize', 'tokenizer', '--tokenizer-threads', '0', '--tokenizer', model);
    assert.equal(r.status, 2, r.stderr);
    assert.equal(r.stderr, `error: --tokenizer (${label}): cannot read '${file}': is larger than ${limit} bytes\n`);
    rmSync(file);
  };
  pastLimit('tokenizer_config.json', MAX_TOKENIZER_CONFIG_BYTES, 'tokenizer config');
  pastLimit('chat_template.jinja', MAX_CHAT_TEMPLATE_BYTES, 'chat template');
});

test('serve and mock-engine --tokenizer refuse a file that is not a regular file', () => {
  const pipe = fifo('tokenizer.fifo');
  const r = serve('--tokenize', 'tokenizer', '--tokenizer-threads', '0', '--tokenizer', pipe);
  assert.equal(r.status, 2, r.stderr);
  assert.equal(r.stderr, `error: --tokenizer: cannot read '${pipe}': is not a regular file\n`);
  const m = cli(['mock-engine', '--port', '0', '--tokenizer', pipe]);
  assert.equal(m.status, 2, m.stderr);
  assert.equal(m.stderr, `error: --tokenizer: cannot read '${pipe}': is not a regular file\n`);
});

test('serve and epp --config refuse a pipe or a directory rather than wait for a writer', () => {
  const pipe = fifo('router.fifo.yaml');
  for (const command of ['serve', 'epp']) {
    const r = cli([command, '--config', pipe, '--print-config']);
    assert.equal(r.status, 2, `${command}: ${r.error?.message ?? r.stderr}`);
    assert.equal(r.stderr, `error: --config ${pipe}: is not a regular file\n`);
  }
  const viaEnv = spawnSync(process.execPath, [...CLI, 'serve', '--print-config'], {
    encoding: 'utf8',
    timeout: 60_000,
    killSignal: 'SIGKILL',
    env: { ...process.env, CONTEXTFORGE_CONFIG: pipe },
  });
  assert.equal(viaEnv.status, 2, viaEnv.error?.message ?? viaEnv.stderr);
  assert.equal(viaEnv.stderr, `error: CONTEXTFORGE_CONFIG ${pipe}: is not a regular file\n`);
  const r = cli(['serve', '--config', dir, '--print-config']);
  assert.equal(r.status, 2, r.stderr);
  assert.equal(r.stderr, `error: --config ${dir}: is not a regular file\n`);
});
