import { isIP } from 'node:net';

/**
 * Refuses a worker whose URL names its host by a DNS name: the endpoint picker sends Envoy
 * `ip:port` (the protocol's form; Envoy's original-destination and override-host load
 * balancing take an address), and a name resolved once at start would go stale as pods move,
 * which discovery (--discover) follows. `source` names where the workers were given.
 */
export function checkPickerWorkerHosts(workers: Iterable<{ id: string; url: string }>, source: string): void {
  for (const w of workers) {
    const host = new URL(w.url).hostname.replace(/^\[(.*)\]$/, '$1');
    if (isIP(host) === 0)
      throw new RangeError(
        `${source} ${w.id}: the endpoint picker sends Envoy ip:port, and '${host}' is no IP address: give the engine's IP address (url=http://10.0.0.5:8000), or find engines by DNS with --discover`,
      );
  }
}
