import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { Command } from 'commander';
import { credentials } from '@grpc/grpc-js';
import { selfSignedIdentity } from '../../src/epp/tls.js';
import { registerEppCommand } from '../../src/cli/commands/epp.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { parseDiscoverySpec } from '../../src/cli/commands/epp.js';
import { EnvoyRole } from '../epp/envoy-role.js';
import { resolveEpp } from '../helpers/epp-config.js';
import { CLI } from '../helpers/cli-entry.js';
import { resolveServe } from '../helpers/serve-config.js';
import { pickerStaleMs } from '../../src/epp/run-picker.js';

const engines: MockEngine[] = [];
after(async () => {
  for (const e of engines) await e.close();
});

/** Starts a CLI command and resolves once its stderr matches `ready`. */
async function start(args: string[], ready: RegExp) {
  const child = spawn(process.execPath, [...CLI, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  const match = await new Promise<RegExpExecArray>((resolve, reject) => {
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
      const m = ready.exec(stderr);
      if (m) resolve(m);
    });
    child.once('exit', (code) => reject(new Error(`exited ${code}: ${stderr}`)));
  });
  return { child, match, stderr: () => stderr };
}

async function stop(child: ReturnType<typeof spawn>): Promise<number | null> {
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  return exited;
}

/** epp's startup line: the ext_proc port's TLS, its port, the health port, the HTTP address. */
const EPP_READY =
  /ext_proc gRPC, ([^)]+)\) on [\d.]+:(\d+), gRPC health \(plaintext\) on [\d.]+:(\d+), metrics and admin on (http:\/\/[\d.]+:\d+)/;

/** serve's startup line with --epp-port: the HTTP address, the ext_proc port's TLS, its port. */
const SERVE_READY = /serving on (http:\/\/[\d.]+:\d+), endpoint picker \(ext_proc gRPC, ([^)]+)\) on port (\d+)/;

/** epp on any free ports (ext_proc, metrics, health) with `extra` flags and one worker at `enginePort`. */
const eppArgs = (enginePort: number, ...extra: string[]) => [
  'epp',
  '--port',
  '0',
  '--metrics-port',
  '0',
  '--health-port',
  '0',
  ...extra,
  '--worker',
  `id=m0,url=http://127.0.0.1:${enginePort}`,
];

/** A TLS client that does not verify the picker's certificate, as the Inference Extension's gateways. */
const tlsNoVerify = () => credentials.createSsl(null, null, null, { rejectUnauthorized: false });

test('contextforge-router epp serves ext_proc over TLS and gRPC health, metrics on HTTP, no OpenAI API there', async () => {
  const e = await new MockEngine({}).start();
  engines.push(e);
  const { child, match } = await start(eppArgs(e.port, '--objectives', 'batch=-1,chat=0'), EPP_READY);
  assert.equal(match[1], 'TLS, self-signed');
  const envoy = new EnvoyRole(`127.0.0.1:${match[2]}`, tlsNoVerify());
  // kubelet gRPC probes: plaintext, on the health port
  const probe = new EnvoyRole(`127.0.0.1:${match[3]}`);
  const plaintext = new EnvoyRole(`127.0.0.1:${match[2]}`);
  try {
    for (const role of [envoy, probe]) {
      assert.equal(await role.healthStatus('liveness'), 'SERVING');
      assert.equal(await role.healthStatus('readiness'), 'SERVING');
      assert.equal(await role.healthStatus(''), 'SERVING');
      assert.equal(await role.healthStatus('envoy.service.ext_proc.v3.ExternalProcessor'), 'SERVING');
    }
    await assert.rejects(plaintext.healthStatus('liveness', 5000), 'no plaintext on the TLS port');
    const out = await envoy.request({
      headers: { ':path': '/v1/completions' },
      body: JSON.stringify({ model: 'mock', prompt: 'hello' }),
    });
    assert.equal(out.kind === 'routed' && out.headerValue, `127.0.0.1:${e.port}`);
    if (out.kind === 'routed') await out.stream.end();
    const metrics = await (await fetch(`${match[4]}/metrics`)).text();
    assert.match(metrics, /contextforge_epp_requests_total\{outcome="routed"\} 1/);
    // the response timeout is a series of its own, not a second outcome of the stream
    assert.match(metrics, /^contextforge_epp_response_timeouts_total 0$/m);
    assert.equal((await fetch(`${match[4]}/readyz`)).status, 200);
    const proxy = await fetch(`${match[4]}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"prompt":"x"}',
    });
    assert.equal(proxy.status, 404, 'the picker does not proxy: clients go through the gateway');
  } finally {
    envoy.close();
    probe.close();
    plaintext.close();
  }
  assert.equal(await stop(child), 0);
});

test('epp --secure-serving false serves ext_proc in plaintext (h2c)', async () => {
  const e = await new MockEngine({}).start();
  engines.push(e);
  const { child, match } = await start(eppArgs(e.port, '--secure-serving', 'false'), EPP_READY);
  assert.equal(match[1], 'plaintext');
  const envoy = new EnvoyRole(`127.0.0.1:${match[2]}`);
  try {
    assert.equal(await envoy.healthStatus(''), 'SERVING');
    const out = await envoy.request({ headers: {}, body: JSON.stringify({ prompt: 'hi' }) });
    assert.equal(out.kind === 'routed' && out.headerValue, `127.0.0.1:${e.port}`);
    if (out.kind === 'routed') await out.stream.end();
  } finally {
    envoy.close();
  }
  assert.equal(await stop(child), 0);
});

test('epp --cert-path serves the certificate given; a bad one stops epp (exit 2) with one line naming the flag', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'epp-cli-tls-'));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const identity = selfSignedIdentity('picker.example');
  writeFileSync(join(dir, 'tls.crt'), identity.cert);
  writeFileSync(join(dir, 'tls.key'), identity.key);
  const e = await new MockEngine({}).start();
  engines.push(e);
  const args = ['epp', '--port', '0', '--metrics-port', '0', '--health-port', '0'];
  const { child, match } = await start(eppArgs(e.port, '--cert-path', dir), EPP_READY);
  assert.match(match[1], /^TLS, /);
  // the certificate presented is the one given, and a client trusting it gets through
  const envoy = new EnvoyRole(
    `127.0.0.1:${match[2]}`,
    credentials.createSsl(Buffer.from(identity.cert), null, null, { checkServerIdentity: () => undefined }),
  );
  try {
    assert.equal(await envoy.healthStatus('readiness'), 'SERVING');
  } finally {
    envoy.close();
  }
  assert.equal(await stop(child), 0);

  const other = selfSignedIdentity();
  for (const [files, message] of [
    [{}, /^error: --cert-path: cannot read .*tls\.crt.*ENOENT/],
    [{ 'tls.crt': 'junk' }, /^error: --cert-path: .*tls\.crt.* is not a PEM certificate/],
    [{ 'tls.crt': identity.cert, 'tls.key': other.key }, /^error: --cert-path: .*tls\.key.* does not match/],
  ] as Array<[Record<string, string>, RegExp]>) {
    const bad = mkdtempSync(join(tmpdir(), 'epp-cli-tls-'));
    after(() => rmSync(bad, { recursive: true, force: true }));
    for (const [name, text] of Object.entries(files)) writeFileSync(join(bad, name), text);
    if (!files['tls.key']) writeFileSync(join(bad, 'tls.key'), identity.key);
    const r = spawnSync(process.execPath, [...CLI, ...args, '--cert-path', bad], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, message);
    assert.equal(r.stderr.trimEnd().split('\n').length, 1, r.stderr);
  }
  const reload = spawnSync(process.execPath, [...CLI, ...args, '--enable-cert-reload'], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  assert.equal(reload.status, 2, reload.stderr);
  assert.match(reload.stderr, /^error: --enable-cert-reload needs --cert-path/);
});

test('serve --epp-port runs the gateway and the picker in one process', async () => {
  const e = await new MockEngine({}).start();
  engines.push(e);
  const { child, match } = await start(
    ['serve', '--port', '0', '--epp-port', '0', '--worker', `id=m0,url=http://127.0.0.1:${e.port}`],
    SERVE_READY,
  );
  assert.equal(match[2], 'plaintext', 'serve --epp-port serves plaintext unless asked');
  const envoy = new EnvoyRole(`127.0.0.1:${match[3]}`);
  try {
    const res = await fetch(`${match[1]}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }),
    });
    assert.equal(res.status, 200);
    const out = await envoy.request({ headers: {}, body: JSON.stringify({ prompt: 'hi' }) });
    assert.equal(out.kind, 'routed');
    if (out.kind === 'routed') await out.stream.end();
  } finally {
    envoy.close();
  }
  assert.equal(await stop(child), 0);
});

test('serve --epp-secure-serving serves the picker over TLS: self-signed, or --epp-cert-path; a bad pair stops serve', async () => {
  const e = await new MockEngine({}).start();
  engines.push(e);
  const serveArgs = (...extra: string[]) => [
    'serve',
    '--port',
    '0',
    '--epp-port',
    '0',
    '--epp-secure-serving',
    'true',
    ...extra,
    '--worker',
    `id=m0,url=http://127.0.0.1:${e.port}`,
  ];
  const dir = mkdtempSync(join(tmpdir(), 'serve-epp-tls-'));
  const identity = selfSignedIdentity('serve-epp-test');
  writeFileSync(join(dir, 'tls.crt'), identity.cert);
  writeFileSync(join(dir, 'tls.key'), identity.key);
  try {
    for (const [extra, shown] of [
      [[], /^TLS, self-signed$/],
      [['--epp-cert-path', dir, '--epp-enable-cert-reload'], /^TLS, .*serve-epp-tls-.* reloaded$/],
    ] as const) {
      const { child, match } = await start(serveArgs(...extra), SERVE_READY);
      assert.match(match[2], shown);
      const envoy = new EnvoyRole(`127.0.0.1:${match[3]}`, tlsNoVerify());
      const plaintext = new EnvoyRole(`127.0.0.1:${match[3]}`);
      try {
        const out = await envoy.request({ headers: {}, body: JSON.stringify({ prompt: 'hi' }) });
        assert.equal(out.kind, 'routed');
        if (out.kind === 'routed') await out.stream.end();
        await assert.rejects(plaintext.healthStatus('liveness', 5000), 'no plaintext on the TLS port');
      } finally {
        envoy.close();
        plaintext.close();
      }
      assert.equal(await stop(child), 0);
    }
    const bad = spawnSync(process.execPath, [...CLI, ...serveArgs('--epp-cert-path', join(dir, 'missing'))], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    assert.equal(bad.status, 2, bad.stderr);
    assert.match(bad.stderr, /error: --epp-cert-path: cannot read .*tls\.crt/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("serve's --epp-port TLS flags are checked as epp's, and named when there is no --epp-port", () => {
  const { config } = resolveServe([]);
  assert.equal(config.eppSecureServing, false);
  assert.equal(config.eppEnableCertReload, false);
  assert.throws(
    () => resolveServe(['--epp-port', '0', '--epp-enable-cert-reload']),
    /^RangeError: --epp-enable-cert-reload needs --epp-cert-path/,
  );
  // only --tokenize tokenizer reads the tokenizer and the template: otherwise they are named as doing nothing
  assert.deepEqual(
    resolveServe(['--tokenizer', '/nonexistent/tok.json', '--chat-template', '/x.jinja']).resolved.warnings,
    [
      '--tokenizer has no effect without --tokenize tokenizer (the mode is auto)',
      '--chat-template has no effect without --tokenize tokenizer (the mode is auto)',
    ],
  );
  assert.deepEqual(resolveServe(['--tokenize', 'tokenizer', '--tokenizer', '/t']).resolved.warnings, []);
  // one engine listed twice (credentials neither compared nor shown)
  assert.deepEqual(
    resolveServe(['--worker', 'id=a,url=http://u:secret@10.0.0.1:8000', '--worker', 'id=b,url=http://10.0.0.1:8000/'])
      .resolved.warnings,
    [
      "workers 'a' and 'b' have the same URL http://10.0.0.1:8000: one engine listed twice gets twice its share (a data-parallel engine is listed once, with dp-size)",
    ],
  );
  assert.deepEqual(
    resolveServe(['--worker', 'id=a,url=http://10.0.0.1:8000', '--worker', 'id=b,url=http://10.0.0.1:8001']).resolved
      .warnings,
    [],
  );
  assert.deepEqual(resolveServe(['--epp-port', '0', '--epp-cert-path', '/x']).resolved.warnings, [
    '--epp-cert-path has no effect with --epp-secure-serving false',
  ]);
  assert.deepEqual(resolveServe(['--epp-secure-serving', 'true']).resolved.warnings, [
    '--epp-secure-serving has no effect without --epp-port',
  ]);
});

test('bad epp flags are refused with a message naming the flag (in process), and the CLI exits non-zero', () => {
  const parse = (args: string[]) => {
    let err = '';
    const program = new Command().exitOverride().configureOutput({ writeErr: (s) => (err += s), writeOut: () => {} });
    registerEppCommand(program);
    program.commands.forEach((c) =>
      c.exitOverride().configureOutput({ writeErr: (s) => (err += s), writeOut: () => {} }),
    );
    assert.throws(() => program.parse(['node', 'contextforge-router', 'epp', ...args]), args.join(' '));
    return err;
  };
  for (const [args, message] of [
    [['--port', '70000'], /--port must be <= 65535/],
    [['--metrics-port', '-1'], /--metrics-port must be >= 0/],
    [['--objectives', 'batch'], /--objectives: 'batch' is not NAME=INTEGER/],
    [['--shed-kv-usage', '1.5'], /--shed-kv-usage must be <= 1 \(got 1.5\)/],
    [['--discover', 'dns=vllm,port=x'], /port must be a port/],
    [['--discover', 'port=8000'], /dns must be a host name/],
  ] as Array<[string[], RegExp]>)
    assert.match(parse(args), message);
  const r = spawnSync(process.execPath, [...CLI, 'epp', '--epp-fallbacks', 'two'], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--epp-fallbacks must be an integer/);
});

test('--discover specs', () => {
  assert.deepEqual(parseDiscoverySpec('dns=vllm.default.svc,port=8000,events-port=5557,interval-ms=2000,models=a;b'), {
    dns: 'vllm.default.svc',
    port: 8000,
    eventsPort: 5557,
    replayPort: undefined,
    intervalMs: 2000,
    models: ['a', 'b'],
  });
  assert.throws(() => parseDiscoverySpec('dns=vllm,port=8000,replay-port=5558'), /replay-port needs events-port/);
  assert.throws(() => parseDiscoverySpec('dns=vllm,port=8000,colour=red'), /unknown key 'colour'/);
});

test('epp runs one process: --processes above 1 is named in a warning and not used to size anything', () => {
  const { config, resolved } = resolveEpp(['--processes', '4']);
  assert.equal(config.processes, 1);
  assert.deepEqual(
    resolved.warnings.filter((w) => w.includes('--processes')),
    [
      '--processes 4 has no effect on epp: it runs one process (run more epp replicas, sharing --state redis://…, instead)',
    ],
  );
  assert.deepEqual(
    resolveEpp([]).resolved.warnings.filter((w) => w.includes('--processes')),
    [],
  );
});

test("serve's proxy settings given to epp are named in a warning: Envoy forwards the requests", () => {
  const proxy = (w: string) => w.includes('has no effect on epp: it sets how serve forwards');
  assert.deepEqual(resolveEpp([]).resolved.warnings.filter(proxy), []);
  // a file or environment shared with serve sets them for serve
  assert.deepEqual(resolveEpp([], { CONTEXTFORGE_MAX_RETRIES: '4' }).resolved.warnings.filter(proxy), []);
  const given = resolveEpp(['--max-retries', '5', '--upstream-timeout-ms', '30000', '--cached-tokens-header']);
  assert.deepEqual(
    given.resolved.warnings.filter(proxy),
    [
      '--max-retries has no effect on epp: it sets how serve forwards requests, which Envoy forwards here',
      '--upstream-timeout-ms has no effect on epp: it sets how serve forwards requests, which Envoy forwards here',
      '--cached-tokens-header has no effect on epp: it sets how serve forwards requests, which Envoy forwards here',
    ].sort((a, b) => order(a) - order(b)),
  );
});

/** Where a warning's setting stands in epp's list of serve's proxy settings. */
function order(warning: string): number {
  return [
    '--cached-tokens-header',
    '--max-retries',
    '--first-byte-timeout-ms',
    '--upstream-timeout-ms',
    '--buffered-answer-limit',
  ].findIndex((f) => warning.startsWith(`${f} `));
}

test('--shed-metrics-stale-ms: the default follows the scrape interval; a value a healthy scrape reaches is refused', () => {
  assert.equal(resolveEpp([]).config.shedMetricsStaleMs, undefined);
  assert.equal(
    pickerStaleMs(resolveEpp([]).config),
    4000,
    'interval 200 + twice the 500 ms timeout + 200, at least 4000',
  );
  assert.equal(pickerStaleMs(resolveEpp(['--metrics-interval-ms', '100']).config), 4000);
  assert.equal(pickerStaleMs(resolveEpp(['--metrics-interval-ms', '1500']).config), 6000, '1500 + twice 1500 + 1500');
  assert.equal(pickerStaleMs(resolveEpp(['--metrics-interval-ms', '0']).config), undefined, 'no scrapes: not used');
  assert.equal(pickerStaleMs(resolveEpp(['--shed-metrics-stale-ms', '1201']).config), 1201);
  assert.throws(
    () => resolveEpp(['--shed-metrics-stale-ms', '1200']),
    /--shed-metrics-stale-ms \(1200\) must be more than 1200 ms/,
  );
  const everySecond = ['--metrics-interval-ms', '1000'];
  assert.equal(pickerStaleMs(resolveEpp([...everySecond, '--shed-metrics-stale-ms', '3001']).config), 3001);
  assert.throws(
    () => resolveEpp([...everySecond, '--shed-metrics-stale-ms', '3000']),
    /--shed-metrics-stale-ms \(3000\) must be more than 3000 ms/,
  );
  assert.deepEqual(
    resolveEpp(['--metrics-interval-ms', '0', '--shed-metrics-stale-ms', '500']).resolved.warnings.filter((w) =>
      w.includes('--shed-metrics-stale-ms'),
    ),
    ['--shed-metrics-stale-ms has no effect with --metrics-interval-ms 0 (no metrics are read)'],
  );
});

test('a static worker whose URL names a host, not an IP address, is refused: Envoy is sent ip:port', () => {
  for (const url of ['http://vllm-0:8000', 'http://localhost:8000', 'http://vllm.default.svc:8000'])
    assert.throws(
      () => resolveEpp(['--worker', `id=w0,url=${url}`]),
      (err: Error) =>
        err instanceof RangeError &&
        /^--worker w0: the endpoint picker sends Envoy ip:port, and '[^']+' is no IP address: give the engine's IP address \(url=http:\/\/10\.0\.0\.5:8000\), or find engines by DNS with --discover$/.test(
          err.message,
        ),
    );
  for (const url of ['http://10.0.0.5:8000', 'http://[fd00::5]:8000', 'https://127.0.0.1'])
    assert.equal(resolveEpp(['--worker', `id=w0,url=${url}`]).config.workers.length, 1);
  // serve names the hosts it proxies to by name; with --epp-port the picker sends them to Envoy
  assert.equal(resolveServe(['--worker', 'id=w0,url=http://vllm-0:8000']).config.workers.length, 1);
  assert.throws(
    () => resolveServe(['--epp-port', '9002', '--worker', 'id=w0,url=http://vllm-0:8000']),
    /^RangeError: --worker w0: the endpoint picker sends Envoy ip:port, and 'vllm-0' is no IP address/,
  );
  const r = spawnSync(process.execPath, [...CLI, 'epp', '--worker', 'id=w0,url=http://vllm-0:8000'], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--worker w0: the endpoint picker sends Envoy ip:port/);
});

test("epp serves TLS and a plaintext health port by default, as the Inference Extension's pickers", () => {
  const { config } = resolveEpp([]);
  assert.equal(config.secureServing, true);
  assert.equal(config.healthPort, 9003);
  assert.equal(config.certPath, undefined);
  assert.equal(config.enableCertReload, false);
  assert.equal(resolveEpp(['--secure-serving', 'false']).config.secureServing, false);
  assert.equal(resolveEpp(['--secure-serving=false']).config.secureServing, false);
});
