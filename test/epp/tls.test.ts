/**
 * The endpoint picker's ext_proc port over TLS (as the Inference Extension's gateways connect
 * to a picker), its plaintext gRPC health port (kubelet gRPC probes speak no TLS), and the
 * server's overall health, the service named ''.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'node:tls';
import { createPrivateKey, X509Certificate } from 'node:crypto';
import { after, test } from 'node:test';
import { credentials, makeGenericClientConstructor, status as grpcStatus } from '@grpc/grpc-js';
import { extProcService } from '../../src/epp/proto.js';
import type { ExtProcClient } from './harness.js';
import { startEppServer, type EppServer, type EppServerOptions } from '../../src/epp/server.js';
import { readTlsIdentity, selfSignedIdentity, type TlsIdentity } from '../../src/epp/tls.js';
import { EnvoyRole } from './envoy-role.js';
import { until } from '../helpers/wait.js';

const ENDPOINT = '10.0.0.1:8000';
const open: Array<{ close(): unknown }> = [];
const dirs: string[] = [];
after(async () => {
  for (const o of open.reverse()) await o.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function start(o: Partial<EppServerOptions> = {}): Promise<EppServer> {
  const server = await startEppServer({
    host: '127.0.0.1',
    port: 0,
    bodyLimit: 1 << 20,
    picker: {
      pick: () => ({
        ok: true,
        endpoints: [ENDPOINT],
        inFlight: { served: () => undefined, refused: () => {}, firstByte: () => {}, end: () => {} },
      }),
    },
    ready: () => true,
    readinessIntervalMs: 10,
    ...o,
  });
  open.push({ close: () => server.close(0) });
  return server;
}

/** A TLS client that does not verify the picker's certificate (as Istio's insecureSkipVerify). */
const tlsNoVerify = () => credentials.createSsl(null, null, null, { rejectUnauthorized: false });

function role(address: string, creds = credentials.createInsecure()): EnvoyRole {
  const envoy = new EnvoyRole(address, creds);
  open.push(envoy);
  return envoy;
}

/** The certificate a TLS handshake on `port` presents (ALPN h2, as a gRPC client). */
function presentedCertificate(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port, rejectUnauthorized: false, ALPNProtocols: ['h2'] }, () => {
      resolve(socket.getPeerX509Certificate()!.fingerprint256);
      socket.destroy();
    });
    socket.once('error', reject);
  });
}

function certDir(identity: TlsIdentity): string {
  const dir = mkdtempSync(join(tmpdir(), 'epp-tls-'));
  dirs.push(dir);
  writeFileSync(join(dir, 'tls.crt'), identity.cert);
  writeFileSync(join(dir, 'tls.key'), identity.key);
  return dir;
}

test('a self-signed identity is a certificate and its key', () => {
  const id = selfSignedIdentity();
  const cert = new X509Certificate(id.cert);
  assert.ok(cert.checkPrivateKey(createPrivateKey(id.key)));
  assert.ok(new Date(cert.validTo).getTime() > Date.now() + 365 * 24 * 3600 * 1000, 'valid for years');
  assert.notEqual(selfSignedIdentity().cert, id.cert, 'each start its own key');
});

test('with TLS, a TLS client (not verifying) gets through and a plaintext client does not', async () => {
  const server = await start({ tls: { identity: selfSignedIdentity() } });
  const address = `127.0.0.1:${server.port}`;
  const secure = role(address, tlsNoVerify());
  assert.equal(await secure.healthStatus('readiness'), 'SERVING');
  const out = await secure.request({ headers: { ':path': '/v1/completions' }, body: '{"prompt":"hi"}' });
  assert.equal(out.kind === 'routed' && out.headerValue, ENDPOINT);
  if (out.kind === 'routed') await out.stream.end();
  const plain = role(address);
  await assert.rejects(plain.healthStatus('liveness', 5000), /UNAVAILABLE|DEADLINE_EXCEEDED|14|4/);
});

test('without TLS the port stays plaintext', async () => {
  const server = await start();
  assert.equal(await role(`127.0.0.1:${server.port}`).healthStatus('liveness'), 'SERVING');
});

test("the overall health service '' follows readiness, on the picker's port and the health port", async () => {
  let ready = false;
  const server = await start({ ready: () => ready, healthPort: 0, tls: { identity: selfSignedIdentity() } });
  assert.ok(server.healthPort !== undefined && server.healthPort !== server.port);
  const probe = role(`127.0.0.1:${server.healthPort}`);
  const main = role(`127.0.0.1:${server.port}`, tlsNoVerify());
  for (const envoy of [probe, main]) {
    assert.equal(await envoy.healthStatus(''), 'NOT_SERVING');
    assert.equal(await envoy.healthStatus('liveness'), 'SERVING');
    assert.equal(await envoy.healthStatus('readiness'), 'NOT_SERVING');
  }
  ready = true;
  await until(async () => (await probe.healthStatus('')) === 'SERVING', "'' SERVING");
  for (const envoy of [probe, main]) {
    assert.equal(await envoy.healthStatus(''), 'SERVING');
    assert.equal(await envoy.healthStatus('readiness'), 'SERVING');
    assert.equal(await envoy.healthStatus('envoy.service.ext_proc.v3.ExternalProcessor'), 'SERVING');
  }
  // the health port serves health only, in plaintext
  const Ctor = makeGenericClientConstructor(extProcService(), 'ExternalProcessor');
  const bare = new Ctor(`127.0.0.1:${server.healthPort}`, credentials.createInsecure()) as unknown as ExtProcClient;
  open.push(bare);
  const call = bare.Process();
  const status = await new Promise<number>((resolve) => call.on('error', (e: { code: number }) => resolve(e.code)));
  assert.equal(status, grpcStatus.UNIMPLEMENTED);
});

test('a health port that cannot be bound fails the start and leaves the picker port closed', async () => {
  const first = await start({ healthPort: 0 });
  // a port of this test's range: free again after the failed start
  const port = 47_601;
  await assert.rejects(start({ port, healthPort: first.healthPort }), /EADDRINUSE|address already in use/);
  const again = await start({ port });
  assert.equal(again.port, port);
});

test('a certificate directory is read, and reloaded when asked', async () => {
  const a = selfSignedIdentity();
  const dir = certDir(a);
  assert.deepEqual(readTlsIdentity(dir, '--cert-path'), a);
  const logs: string[] = [];
  const server = await start({
    tls: { identity: a, reload: { certPath: dir, intervalMs: 20 } },
    log: (m) => logs.push(m),
  });
  const fingerprint = (id: TlsIdentity) => new X509Certificate(id.cert).fingerprint256;
  assert.equal(await presentedCertificate(server.port), fingerprint(a));
  // a half-written pair (a new certificate, the old key) is not taken
  const b = selfSignedIdentity();
  writeFileSync(join(dir, 'tls.crt'), b.cert);
  await until(() => logs.some((m) => /--cert-path.*not reloaded/.test(m)), 'the refused reload logged');
  assert.equal(await presentedCertificate(server.port), fingerprint(a));
  writeFileSync(join(dir, 'tls.key'), b.key);
  await until(async () => (await presentedCertificate(server.port)) === fingerprint(b), 'the new certificate');
  assert.equal(await role(`127.0.0.1:${server.port}`, tlsNoVerify()).healthStatus('liveness'), 'SERVING');
});

test('bad certificate files are refused with a message naming the flag', () => {
  const good = selfSignedIdentity();
  const other = selfSignedIdentity();
  const missing = mkdtempSync(join(tmpdir(), 'epp-tls-'));
  dirs.push(missing);
  assert.throws(
    () => readTlsIdentity(missing, '--cert-path'),
    (err: Error) => {
      assert.ok(err instanceof RangeError);
      assert.match(err.message, /^--cert-path: .*tls\.crt/);
      assert.doesNotMatch(err.message, /\n/);
      return true;
    },
  );
  assert.throws(
    () => readTlsIdentity(certDir({ cert: 'not a certificate', key: good.key }), '--cert-path'),
    /^RangeError: --cert-path: .*tls\.crt.*not a PEM certificate/,
  );
  assert.throws(
    () => readTlsIdentity(certDir({ cert: good.cert, key: 'garbage' }), '--cert-path'),
    /^RangeError: --cert-path: .*tls\.key.*not a PEM private key/,
  );
  assert.throws(
    () => readTlsIdentity(certDir({ cert: good.cert, key: other.key }), '--cert-path'),
    /^RangeError: --cert-path: .*does not match/,
  );
});
