import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { resolveEpp } from '../helpers/epp-config.js';
import { resolveServe } from '../helpers/serve-config.js';

const dir = mkdtempSync(join(tmpdir(), 'cf-shared-config-'));
let n = 0;
const write = (text: string) => {
  const f = join(dir, `c${n++}.yaml`);
  writeFileSync(f, text);
  return f;
};

test("one config file serves both serve and epp: the other command's keys are named once and ignored", () => {
  const file = write('epp-port: 9002\nmetrics-port: 9091\nmax-retries: 3\nport: 8181\n');
  const serve = resolveServe(['--config', file]);
  assert.equal(serve.config.maxRetries, 3);
  assert.equal(serve.config.eppPort, 9002);
  assert.deepEqual(
    serve.resolved.warnings.filter((w) => /metrics-port/.test(w)),
    [`--config ${file}: metrics-port is a setting of epp, not of serve: ignored`],
  );
  const epp = resolveEpp(['--config', file]);
  assert.equal(epp.config.metricsPort, 9091);
  assert.equal(epp.config.port, 8181);
  assert.deepEqual(
    epp.resolved.warnings.filter((w) => /epp-port/.test(w)),
    [`--config ${file}: epp-port is a setting of serve, not of epp: ignored`],
  );
  // camelCase names too
  assert.match(
    resolveEpp(['--config', write('eppPort: 1\n')]).resolved.warnings.join('\n'),
    /eppPort is a setting of serve/,
  );
});

test('an unknown key stays an error, and the hint names the command that runs', () => {
  assert.throws(
    () => resolveEpp(['--config', write('colour: red\n')]),
    /unknown key 'colour' \(see epp --help for the settings\)/,
  );
  assert.throws(
    () => resolveServe(['--config', write('colour: red\n')]),
    /unknown key 'colour' \(see serve --help for the settings\)/,
  );
  // a value of the other command's key is not checked, but a bad value of a shared one is
  assert.throws(() => resolveEpp(['--config', write('epp-port: 9002\nmax-retries: -1\n')]), /max-retries must be >= 0/);
});
