import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

// docs/server.md's /metrics list is where an operator looks a series up: it names every metric
// the gateway registers (the picker's own, contextforge_epp_*, in docs/kubernetes.md).

const root = fileURLToPath(new URL('../../', import.meta.url));

function sourceFiles(dir: string): string[] {
  return readdirSync(join(root, dir), { withFileTypes: true }).flatMap((d) =>
    d.isDirectory() ? sourceFiles(join(dir, d.name)) : d.name.endsWith('.ts') ? [join(dir, d.name)] : [],
  );
}

function registeredMetrics(): string[] {
  const names = new Set<string>();
  for (const file of sourceFiles('src')) {
    for (const m of readFileSync(join(root, file), 'utf8').matchAll(/name: '(contextforge_\w+)'/g)) names.add(m[1]);
  }
  return [...names].sort();
}

test('every metric the code registers is named in the docs', () => {
  const metrics = registeredMetrics();
  assert.ok(metrics.length >= 30, `the metrics are found in src/ (${metrics.length})`);
  const server = readFileSync(join(root, 'docs/server.md'), 'utf8');
  const kubernetes = readFileSync(join(root, 'docs/kubernetes.md'), 'utf8');
  const named = (doc: string, name: string) => new RegExp(`\`${name}[\`{]`).test(doc);
  const missing = metrics.filter((m) => !named(m.startsWith('contextforge_epp_') ? kubernetes : server, m));
  assert.deepEqual(missing, [], 'metrics not named in docs/server.md (contextforge_epp_*: docs/kubernetes.md)');
});

test("docs/kubernetes.md's metrics list names the per-worker stall and media-URL refusal counters", () => {
  const kubernetes = readFileSync(join(root, 'docs/kubernetes.md'), 'utf8');
  for (const name of ['contextforge_worker_stalls_total', 'contextforge_media_url_refusals_total']) {
    assert.match(kubernetes, new RegExp(`\`${name}[\`{]`), `${name} in docs/kubernetes.md`);
  }
});
