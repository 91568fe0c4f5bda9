/**
 * TLS of the endpoint picker's ext_proc port. The Gateway API Inference Extension's pickers
 * serve TLS by default, with a self-signed certificate made at start unless one is given
 * (a directory holding tls.crt and tls.key, as a kubernetes.io/tls Secret mounts them), and
 * the gateways connect to a picker with TLS, not verifying its certificate.
 */
import { createHash, createPrivateKey, generateKeyPairSync, randomBytes, X509Certificate } from 'node:crypto';
import { join } from 'node:path';
import { createSecureContext } from 'node:tls';
import { ServerCredentials } from '@grpc/grpc-js';
import forge from 'node-forge';
import { readRegularFile } from '../engines/bounded-file.js';
import { fileErrorMessage, shownText } from '../core/shown-text.js';

/** A certificate (chain) and its private key, PEM. */
export interface TlsIdentity {
  cert: string;
  key: string;
}

/** The files of a certificate directory, as a kubernetes.io/tls Secret names them. */
export const CERT_FILE = 'tls.crt';
export const KEY_FILE = 'tls.key';
/** Largest certificate or key file read (a chain of a few certificates is a few KiB). */
const MAX_PEM_BYTES = 1024 * 1024;
const SELF_SIGNED_YEARS = 10;

/**
 * A self-signed certificate for the picker and its new RSA key, valid for ten years from an
 * hour ago (clocks a little behind). Made at each start: nobody verifies it, it only encrypts.
 */
export function selfSignedIdentity(commonName = 'contextforge-router-epp'): TlsIdentity {
  const { publicKey, privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const key = privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  const cert = forge.pki.createCertificate();
  cert.publicKey = forge.pki.publicKeyFromPem(publicKey.export({ type: 'spki', format: 'pem' }) as string);
  // a positive serial number: the first byte below 0x80
  cert.serialNumber = `0${randomBytes(16).toString('hex').slice(1)}`;
  const now = Date.now();
  cert.validity.notBefore = new Date(now - 3600_000);
  cert.validity.notAfter = new Date(now + SELF_SIGNED_YEARS * 365 * 24 * 3600_000);
  const name = [
    { name: 'commonName', value: commonName },
    { name: 'organizationName', value: 'contextforge-router' },
  ];
  cert.setSubject(name);
  cert.setIssuer(name);
  cert.setExtensions([
    { name: 'basicConstraints', cA: false },
    { name: 'keyUsage', critical: true, digitalSignature: true, keyEncipherment: true },
    { name: 'extKeyUsage', serverAuth: true },
    { name: 'subjectAltName', altNames: [{ type: 2, value: commonName }] },
  ]);
  cert.sign(forge.pki.privateKeyFromPem(key), forge.md.sha256.create());
  return { cert: forge.pki.certificateToPem(cert), key };
}

/**
 * The certificate and key in `dir` (tls.crt, tls.key), checked: PEM, the key the certificate's,
 * usable by TLS. A problem is one line naming `where` (the flag) and the file.
 */
export function readTlsIdentity(dir: string, where: string): TlsIdentity {
  const read = (name: string) => {
    const file = join(dir, name);
    try {
      return readRegularFile(file, MAX_PEM_BYTES);
    } catch (err) {
      throw new RangeError(`${where}: cannot read ${shownText(file)}: ${fileErrorMessage(err, file)}`, { cause: err });
    }
  };
  const certFile = shownText(join(dir, CERT_FILE));
  const keyFile = shownText(join(dir, KEY_FILE));
  const identity = { cert: read(CERT_FILE), key: read(KEY_FILE) };
  let x509: X509Certificate;
  try {
    x509 = new X509Certificate(identity.cert);
  } catch (err) {
    throw new RangeError(`${where}: ${certFile} is not a PEM certificate (${firstLine(err)})`, { cause: err });
  }
  let key;
  try {
    key = createPrivateKey(identity.key);
  } catch (err) {
    throw new RangeError(`${where}: ${keyFile} is not a PEM private key (${firstLine(err)})`, { cause: err });
  }
  if (!x509.checkPrivateKey(key)) throw new RangeError(`${where}: ${keyFile} does not match the key of ${certFile}`);
  try {
    createSecureContext(identity);
  } catch (err) {
    throw new RangeError(`${where}: ${certFile} and ${keyFile} are not usable for TLS (${firstLine(err)})`, {
      cause: err,
    });
  }
  return identity;
}

const firstLine = (err: unknown) => String((err as Error).message).split('\n')[0];

/**
 * Server credentials for TLS whose certificate can be replaced while the server runs: new
 * connections get the new one, open connections keep theirs. No client certificate is asked.
 */
export class EppServerCredentials extends ServerCredentials {
  constructor(identity: TlsIdentity) {
    super({ requestCert: false }, { cert: identity.cert, key: identity.key });
  }

  replace(identity: TlsIdentity): void {
    this.updateSecureContextOptions({ cert: identity.cert, key: identity.key });
  }

  _equals(other: ServerCredentials): boolean {
    return other === this;
  }
}

/**
 * Re-reads `certPath` every `intervalMs` and hands a changed, valid pair to `replace`. A pair
 * that does not check (a Secret's files caught half updated, a wrong key) is logged once and
 * not taken: the picker keeps serving the certificate it has. Returns the stop function.
 */
export function watchTlsIdentity(
  certPath: string,
  current: TlsIdentity,
  intervalMs: number,
  replace: (identity: TlsIdentity) => void,
  log: (m: string) => void,
  where = '--cert-path',
): () => void {
  const digest = (cert: string, key: string) =>
    createHash('sha256').update(cert).update('\0').update(key).digest('hex');
  let served = digest(current.cert, current.key);
  let refused: string | undefined;
  const timer = setInterval(() => {
    let identity: TlsIdentity;
    try {
      identity = readTlsIdentity(certPath, where);
    } catch (err) {
      const message = (err as Error).message;
      if (message !== refused) log(`warning: ${message}: certificate not reloaded, the one in use stays`);
      refused = message;
      return;
    }
    refused = undefined;
    const seen = digest(identity.cert, identity.key);
    if (seen === served) return;
    served = seen;
    replace(identity);
    log(
      `${where} ${shownText(certPath)}: certificate reloaded (${new X509Certificate(identity.cert).subject.replace(/\n/g, ', ')})`,
    );
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}
