import type { DnsDiscoverySpec } from '../../server/dns-discovery.js';
import { quotedText } from '../../core/shown-text.js';
import { MAX_TIMER_MS } from '../../server/timeouts.js';
import { specFields } from '../options.js';

/** The text forms of the endpoint picker's settings (flags and environment), shared by `epp` and `serve`. */

const DISCOVERY_KEYS = ['dns', 'port', 'events-port', 'replay-port', 'interval-ms', 'models'] as const;

/** Parses `dns=NAME,port=N[,events-port=N][,replay-port=N][,interval-ms=N][,models=a;b]`. */
export function parseDiscoverySpec(spec: string): DnsDiscoverySpec {
  const fields = specFields('--discover', spec, DISCOVERY_KEYS);
  const where = `--discover ${quotedText(spec)}`;
  const port = (key: string, required: boolean): number | undefined => {
    const v = fields[key];
    if (v === undefined || v === '') {
      if (required) throw new RangeError(`${where}: ${key} is required`);
      return undefined;
    }
    const n = Number(v);
    if (!/^\d+$/.test(v) || n < 1 || n > 65535)
      throw new RangeError(`${where}: ${key} must be a port (1-65535), got ${quotedText(v)}`);
    return n;
  };
  const dns = fields.dns;
  if (!dns || !/^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$/.test(dns))
    throw new RangeError(`${where}: dns must be a host name`);
  const intervalText = fields['interval-ms'];
  const interval = intervalText === undefined ? 5000 : /^\d+$/.test(intervalText) ? Number(intervalText) : NaN;
  // a timer's longest delay: past it Node would resolve the name again at once, over and over
  if (!Number.isInteger(interval) || interval < 100 || interval > MAX_TIMER_MS)
    throw new RangeError(
      `${where}: interval-ms must be an integer from 100 to ${MAX_TIMER_MS}, got ${quotedText(intervalText ?? '')}`,
    );
  const eventsPort = port('events-port', false);
  const replayPort = port('replay-port', false);
  if (replayPort !== undefined && eventsPort === undefined)
    throw new RangeError(`${where}: replay-port needs events-port`);
  const models = fields.models
    ? fields.models
        .split(';')
        .map((m) => m.trim())
        .filter(Boolean)
    : undefined;
  return { dns, port: port('port', true)!, eventsPort, replayPort, intervalMs: interval, models };
}

/** NAME=PRIORITY[,NAME=PRIORITY…]: inference objectives and their priorities (negative: sheddable). */
export function parseObjectives(v: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const part of v.split(',')) {
    const eq = part.lastIndexOf('=');
    const name = part.slice(0, eq).trim();
    const text = part.slice(eq + 1).trim();
    // decimal digits only: '' is not 0, nor 0x10 sixteen
    if (eq <= 0 || name === '' || !/^[-+]?\d+$/.test(text))
      throw new RangeError(`--objectives: ${quotedText(part)} is not NAME=INTEGER`);
    if (Object.hasOwn(out, name)) throw new RangeError(`--objectives: ${quotedText(name)} is given twice`);
    out[name] = Number(text);
  }
  return out;
}
