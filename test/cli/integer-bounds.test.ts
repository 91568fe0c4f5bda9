import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { z } from 'zod';
import { intOption } from '../../src/cli/options.js';
import { parseWorkerSpec } from '../../src/cli/commands/serve.js';
import { KVAwareRouter } from '../../src/index.js';
import { firstIssue } from '../../src/core/schema-issues.js';
import { CLI } from '../helpers/cli-entry.js';
import { resolveServe } from '../helpers/serve-config.js';

function cli(args: string[]) {
  return spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8' });
}

/** Past 2^53 (1e20, twenty nines), the integers' own bound in zod, 2^53 - 1, was named instead. */
const HUGE = ['1e20', '99999999999999999999'];

test("a number past 2^53 is refused with the setting's own bound, not 2^53 - 1, from a flag, a variable or a file", () => {
  for (const huge of HUGE) {
    for (const [args, bound] of [
      [['--port', huge], '--port must be <= 65535'],
      [['--epp-port', huge], '--epp-port must be <= 65535'],
      [['--health-interval-ms', huge], '--health-interval-ms must be <= 2147483647'],
      [['--shutdown-grace-ms', huge], '--shutdown-grace-ms must be <= 2147483647'],
      [['--upstream-timeout-ms', huge], '--upstream-timeout-ms must be <= 2147483647'],
      [['--prediction-ttl-ms', huge], '--prediction-ttl-ms must be <= 2147483647'],
      [['--port', `-${huge}`], '--port must be >= 0'],
    ] as const) {
      assert.throws(
        () => resolveServe([...args]),
        (err: Error) => err.message.includes(`${bound} (got `) && !err.message.includes('9007199254740991'),
        args.join(' '),
      );
    }
    assert.throws(() => resolveServe([], { CONTEXTFORGE_PORT: huge }), /--port must be <= 65535 \(got /);
  }
  const dir = mkdtempSync(join(tmpdir(), 'cfr-bounds-'));
  try {
    for (const [yaml, message] of [
      ['port: 1e20\n', /^RangeError: --config \S+: port must be <= 65535 \(got 100000000000000000000\)$/],
      ['health-interval-ms: 1e20\n', /: health-interval-ms must be <= 2147483647 \(got /],
      ['router:\n  predictionTtlMs: 1e20\n', /: router\.predictionTtlMs must be <= 2147483647 \(got /],
      ['discover: {dns: e, port: 1, intervalMs: 1e20}\n', /: discover\.intervalMs must be <= 2147483647 \(got /],
      ['workers: [{id: a, url: "http://h:1", dpSize: 1e20}]\n', /: workers\[0\]: dpSize must be <= 64 \(got /],
    ] as const) {
      const file = join(dir, 'router.yaml');
      writeFileSync(file, yaml);
      assert.throws(() => resolveServe(['--config', file]), message, yaml);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  assert.throws(() => parseWorkerSpec('id=a,url=http://h:1,dp-size=99999999999999999999'), /dpSize must be <= 64/);
  // the router's constructor reports its options the same way
  assert.throws(() => new KVAwareRouter({ predictionTtlMs: 1e20 }), /predictionTtlMs must be <= 2147483647/);
});

test('firstIssue keeps the first issue when no bound of the schema follows the integers’ own', () => {
  const issues = z.int().min(1).safeParse(1e20).error!.issues;
  assert.equal(firstIssue(issues), issues[0]);
  const bounded = z.int().min(1).max(10).safeParse(1e20).error!.issues;
  assert.equal(bounded.length, 2);
  assert.equal(firstIssue(bounded), bounded[1]);
});

test("--discover's interval-ms is a timer's delay: at most 2147483647, named by the spec's own key", () => {
  for (const ms of ['2147483648', '99999999999999999999'])
    assert.throws(
      () => resolveServe(['--discover', `dns=e,port=1,interval-ms=${ms}`]),
      new RegExp(
        `--discover 'dns=e,port=1,interval-ms=${ms}': interval-ms must be an integer from 100 to 2147483647, got '${ms}'`,
      ),
    );
  assert.equal(
    resolveServe(['--discover', 'dns=e,port=1,interval-ms=2147483647']).config.discover?.intervalMs,
    2 ** 31 - 1,
  );
});

test('an integer flag past 2^53 names its bound and the digits given, not "must be an integer"', () => {
  const port = intOption('--port', 0, 65535);
  assert.throws(
    () => port('99999999999999999999'),
    /^InvalidArgumentError: --port must be <= 65535, got '99999999999999999999'$/,
  );
  assert.throws(() => port('-99999999999999999999'), /--port must be >= 0, got '-99999999999999999999'$/);
  assert.throws(() => port('70000'), /--port must be <= 65535, got 70000$/);
  assert.throws(() => port('1e3'), /--port must be an integer, got '1e3'$/);
  assert.equal(port('65535'), 65535);
  // every command: the message names the flag and its bound, exit status 2
  for (const [args, message] of [
    [['mock-engine', '--port', '99999999999999999999'], "--port must be <= 65535, got '99999999999999999999'"],
    [
      ['simulate', '--trace', 'workflows:1', '--event-delay-ms', '99999999999999999999'],
      '--event-delay-ms must be <= 86400000',
    ],
    [
      ['serve', '--port', '99999999999999999999', '--print-config'],
      '--port must be <= 65535 (got 100000000000000000000)',
    ],
    [['epp', '--health-port', '1e20', '--print-config'], '--health-port must be <= 65535 (got 100000000000000000000)'],
  ] as const) {
    const r = cli([...args]);
    assert.equal(r.status, 2, r.stderr);
    assert.ok(r.stderr.includes(message), `${args.join(' ')}: ${r.stderr}`);
  }
});
