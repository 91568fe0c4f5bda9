/**
 * `serve --allowed-media-domains` (CONTEXTFORGE_ALLOWED_MEDIA_DOMAINS, allowedMediaDomains in the
 * config file): host names separated by commas or spaces, empty for no restriction; an entry
 * that is no host name (a URL, a port, a wildcard) stops serve at start, naming the entry.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { resolveServe } from '../helpers/serve-config.js';
import { serveExit } from '../helpers/serve-exit.js';

test('the list from the flag, the environment and the config file; empty or unset is none', () => {
  assert.deepEqual(resolveServe([]).config.allowedMediaDomains, []);
  assert.deepEqual(resolveServe(['--allowed-media-domains', '']).config.allowedMediaDomains, []);
  assert.deepEqual(
    resolveServe(['--allowed-media-domains', 'a.example, B.example 10.0.0.7']).config.allowedMediaDomains,
    ['a.example', 'B.example', '10.0.0.7'],
  );
  assert.deepEqual(
    resolveServe([], { CONTEXTFORGE_ALLOWED_MEDIA_DOMAINS: 'a.example,b.example' }).config.allowedMediaDomains,
    ['a.example', 'b.example'],
  );
  const dir = mkdtempSync(join(tmpdir(), 'cf-media-domains-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(file, 'allowed-media-domains: [a.example, "::1"]\n');
  assert.deepEqual(resolveServe(['--config', file]).config.allowedMediaDomains, ['a.example', '::1']);
});

test('a bad entry stops serve at start with exit code 2, naming the flag and the entry', async () => {
  const cases: Array<[string[], Record<string, string>, RegExp]> = [
    [
      ['--allowed-media-domains', 'a.example,*.b.example'],
      {},
      /--allowed-media-domains: allowedMediaDomains\[1\] must be a host name or an IP address: "\*\.b\.example": list each host name exactly \(subdomains are not matched/,
    ],
    [['--allowed-media-domains', 'https://a.example'], {}, /"https:\/\/a\.example" is a URL: list its host name alone/],
    [
      [],
      { CONTEXTFORGE_ALLOWED_MEDIA_DOMAINS: 'a.example:443' },
      /"a\.example:443": list the host name without a port/,
    ],
  ];
  for (const [args, env, message] of cases) {
    const saved = { ...process.env };
    Object.assign(process.env, env);
    try {
      const { code, stderr } = await serveExit(['--port', '0', ...args]);
      assert.equal(code, 2, stderr);
      assert.match(stderr, message);
    } finally {
      for (const k of Object.keys(env)) if (saved[k] === undefined) delete process.env[k];
    }
  }
});
