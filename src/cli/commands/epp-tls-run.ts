import { shownText } from '../../core/shown-text.js';
import type { EppServerOptions } from '../../epp/server.js';
import { readTlsIdentity, selfSignedIdentity } from '../../epp/tls.js';
import { EPP_TLS_FLAGS, type EppTlsFlags, type EppTlsSettings } from '../config/epp-tls.js';

/** How often the reload flag (--enable-cert-reload, --epp-enable-cert-reload) re-reads the certificate directory. */
export const CERT_RELOAD_INTERVAL_MS = 10_000;

/**
 * The ext_proc port's TLS from its settings (checkEppTlsSettings has checked they go
 * together), and how to describe it: the certificate directory's pair (checked now: a bad one
 * stops the command before anything runs), else a self-signed certificate; none with TLS off.
 */
export function eppTls(
  c: EppTlsSettings,
  flags: EppTlsFlags = EPP_TLS_FLAGS,
): {
  tls: EppServerOptions['tls'];
  describe: string;
} {
  if (!c.secureServing) return { tls: undefined, describe: 'plaintext' };
  if (c.certPath === undefined) return { tls: { identity: selfSignedIdentity() }, describe: 'TLS, self-signed' };
  const identity = readTlsIdentity(c.certPath, flags.certPath);
  return {
    tls: {
      identity,
      reload: c.enableCertReload ? { certPath: c.certPath, intervalMs: CERT_RELOAD_INTERVAL_MS } : undefined,
    },
    describe: `TLS, ${shownText(c.certPath)}${c.enableCertReload ? ' reloaded' : ''}`,
  };
}
