import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { validate, ValidationSeverity } from 'dockerfile-utils';

// The Dockerfile, linted (dockerfile-utils, the Dockerfile language server's validator, every
// check at error severity) and held to the image's rules: multi-stage, production dependencies
// only in the runtime stage, an unprivileged user, the files the CLI needs at run time.

const root = new URL('../../', import.meta.url).pathname;
const dockerfile = readFileSync(`${root}Dockerfile`, 'utf8');

test('dockerfile-utils finds nothing, every rule an error', () => {
  const E = ValidationSeverity.ERROR;
  const problems = validate(dockerfile, {
    deprecatedMaintainer: E, directiveCasing: E, emptyContinuationLine: E, instructionCasing: E,
    instructionCmdMultiple: E, instructionEntrypointMultiple: E, instructionHealthcheckMultiple: E,
    instructionJSONInSingleQuotes: E, instructionWorkdirRelative: E,
  });
  assert.deepEqual(problems.map((p) => `line ${p.range.start.line + 1}: ${p.message}`), []);
});

/** Instructions per stage, continuation lines joined, comments dropped. */
function stages(text: string): Array<{ from: string; lines: string[] }> {
  const joined = text.replace(/\\\n/g, ' ').split('\n').map((l) => l.trim()).filter((l) => l !== '' && !l.startsWith('#'));
  const out: Array<{ from: string; lines: string[] }> = [];
  for (const l of joined) {
    if (/^FROM\s/i.test(l)) out.push({ from: l, lines: [] });
    else if (out.length > 0) out[out.length - 1].lines.push(l);
  }
  return out;
}

test('multi-stage: the build stage compiles, the runtime stage installs production dependencies only and runs unprivileged', () => {
  const s = stages(dockerfile);
  assert.ok(s.length >= 2, 'at least a build and a runtime stage');
  const build = s[0];
  const runtime = s[s.length - 1];
  assert.ok(build.lines.some((l) => /npm run build/.test(l)), 'the build stage compiles');
  assert.ok(runtime.lines.some((l) => /^RUN .*npm ci .*--omit=dev/.test(l)), 'the runtime stage runs npm ci --omit=dev');
  assert.ok(!runtime.lines.some((l) => /^RUN .*npm (ci|install)(?!.*--omit=dev)/.test(l)), 'no full install in the runtime stage');
  assert.ok(runtime.lines.some((l) => /^COPY --from=\S+ \/app\/dist/.test(l)), 'the compiled code comes from the build stage');
  const user = runtime.lines.filter((l) => /^USER\s/.test(l)).pop();
  assert.ok(user && !/^USER\s+(root|0)(:|\s|$)/.test(user), `the runtime stage ends as a non-root user (${user ?? 'none'})`);
  // numeric, so the kubelet can check runAsNonRoot without a runAsUser; 1000:1000 is the
  // official Node image's `node` user and group, and the chart's runAsUser/runAsGroup
  assert.match(user, /^USER\s+1000:1000$/, 'the runtime user is numeric (uid:gid)');
  // the CLI reads proto/ (the endpoint picker) and package.json (--version) at run time
  assert.ok(runtime.lines.some((l) => /^COPY proto /.test(l)), 'proto/ is in the image');
  assert.ok(runtime.lines.some((l) => /^COPY package\.json/.test(l)), 'package.json is in the image');
  assert.ok(!/^ADD\s+https?:/im.test(dockerfile), 'nothing is downloaded with ADD');
  const entry = runtime.lines.find((l) => /^ENTRYPOINT/.test(l));
  assert.match(entry ?? '', /dist\/cli\/main\.js/);
});

test('the build context leaves out what the image does not need, keeps what it does', () => {
  const ignore = readFileSync(`${root}.dockerignore`, 'utf8').split('\n').map((l) => l.trim());
  for (const p of ['node_modules', 'dist', '.git']) assert.ok(ignore.includes(p), `${p} is ignored`);
  for (const p of ['src', 'proto', 'package.json', 'package-lock.json', 'tsconfig.json']) assert.ok(!ignore.includes(p), `${p} is sent`);
});
