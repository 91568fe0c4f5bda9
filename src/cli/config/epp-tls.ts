/**
 * The endpoint picker's TLS settings, as `epp` names them and as `serve` names them for its
 * --epp-port, and the combinations no single setting can check.
 */

/** The flags of the ext_proc port's TLS: epp's own, and serve's for --epp-port. */
export interface EppTlsFlags {
  secureServing: string;
  certPath: string;
  enableCertReload: string;
}
export const EPP_TLS_FLAGS: EppTlsFlags = {
  secureServing: '--secure-serving',
  certPath: '--cert-path',
  enableCertReload: '--enable-cert-reload',
};
export const SERVE_EPP_TLS_FLAGS: EppTlsFlags = {
  secureServing: '--epp-secure-serving',
  certPath: '--epp-cert-path',
  enableCertReload: '--epp-enable-cert-reload',
};

/** The ext_proc port's TLS settings, under whichever flags a command gives them. */
export interface EppTlsSettings {
  secureServing: boolean;
  certPath?: string;
  enableCertReload: boolean;
}

/**
 * The TLS settings that go together, checked before anything runs: the reload flag needs the
 * certificate directory (a self-signed certificate is never reloaded); a directory with TLS off
 * is named in a warning.
 */
export function checkEppTlsSettings(c: EppTlsSettings, warnings: string[], flags: EppTlsFlags = EPP_TLS_FLAGS): void {
  if (c.enableCertReload && c.certPath === undefined)
    throw new RangeError(
      `${flags.enableCertReload} needs ${flags.certPath} (a self-signed certificate is never reloaded)`,
    );
  if (!c.secureServing && c.certPath !== undefined)
    warnings.push(`${flags.certPath} has no effect with ${flags.secureServing} false`);
}
