import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { CLI } from '../helpers/cli-entry.js';

const cli = (args: string[]) => spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8', timeout: 60_000 });

/** A run of `simulate` on `trace` with one worker and `policy`, and `args`; it must succeed. */
function simulate(trace: string, policy: string, args: string[]) {
  const r = cli(['simulate', '--trace', trace, '--workers', '1', '--policies', policy, ...args]);
  assert.equal(r.status, 0, r.stderr);
  return r;
}

/** Each request's cached tokens in a run of `simulate ARGS` (its --assignments lines). */
function cachedTokens(trace: string, args: string[]): number[] {
  const dir = mkdtempSync(join(tmpdir(), 'cf-judge-roles-'));
  try {
    const out = join(dir, 'a.jsonl');
    simulate(trace, 'cost', ['--no-progress', '--assignments', out, ...args]);
    return readFileSync(out, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { request: number; cachedTokens: number })
      .sort((a, b) => a.request - b.request)
      .map((l) => l.cachedTokens);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("a trace's agent_role isolates the requests of the roles --judge-roles names", () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-judge-trace-'));
  try {
    const trace = join(dir, 't.jsonl');
    const line = (t: number, role?: string) =>
      JSON.stringify({
        timestamp: t,
        input_length: 1000,
        output_length: 5,
        hash_ids: [1, 2],
        ...(role ? { agent_role: role } : {}),
      });
    writeFileSync(trace, [line(0), line(2000, 'critic'), line(4000, 'writer')].join('\n') + '\n');
    // without judge roles a role changes nothing: both later requests find the first one's full block
    assert.deepEqual(cachedTokens(trace, []), [0, 512, 512]);
    // the critic, a judge, reuses nothing; the writer does
    assert.deepEqual(cachedTokens(trace, ['--judge-roles', 'judge, critic']), [0, 0, 512]);
    // given twice, the flag names the roles of both
    assert.deepEqual(cachedTokens(trace, ['--judge-roles', 'critic', '--judge-roles', 'judge']), [0, 0, 512]);
    // and the bounds count it as an isolated line: nothing a policy could not reach
    const bound = (args: string[]) => {
      const r = simulate(trace, 'seed', ['--format', 'json', ...args]);
      return (JSON.parse(r.stdout) as { bounds: { infiniteCacheHitRate: number } }).bounds.infiniteCacheHitRate;
    };
    assert.equal(bound([]), 0.3413); // 1,024 of 3,000 prompt tokens, as the JSON rounds it
    assert.equal(bound(['--judge-roles', 'critic']), 0.1707); // the writer's 512 alone
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('--judge-roles is refused with a message naming it when a role is empty or too long', () => {
  for (const [value, message] of [
    ['critic,', /--judge-roles must be comma-separated roles, got 'critic,'/],
    [`${'r'.repeat(1025)}`, /--judge-roles: a role must be at most 1024 bytes of UTF-8, got 1025 characters/],
  ] as const) {
    const r = cli(['simulate', '--trace', 'workflows:1', '--judge-roles', value]);
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, message);
  }
});
