import { InvalidArgumentError } from 'commander';
import type { DnsDiscoverySpec } from '../../server/dns-discovery.js';
import { intOption, specFields } from '../options.js';
import type { Setting } from './serve.js';

/** Settings of the endpoint picker and engine discovery, shared by `epp` and `serve` (kept apart from both: each imports it). */

export const portNumber = (flag: string) => (v: string) => {
  const n = intOption(flag, 0)(v);
  if (n > 65535) throw new InvalidArgumentError(`${flag} must be <= 65535, got ${n}`);
  return n;
};

const DISCOVERY_KEYS = ['dns', 'port', 'events-port', 'replay-port', 'interval-ms', 'models'] as const;

/** Parses `dns=NAME,port=N[,events-port=N][,replay-port=N][,interval-ms=N][,models=a;b]`. */
export function parseDiscoverySpec(spec: string): DnsDiscoverySpec {
  const fields = specFields('--discover', spec, DISCOVERY_KEYS);
  const port = (key: string, required: boolean): number | undefined => {
    const v = fields[key];
    if (v === undefined || v === '') {
      if (required) throw new RangeError(`--discover '${spec}': ${key} is required`);
      return undefined;
    }
    const n = Number(v);
    if (!/^\d+$/.test(v) || n < 1 || n > 65535)
      throw new RangeError(`--discover '${spec}': ${key} must be a port (1-65535), got '${v}'`);
    return n;
  };
  const dns = fields.dns;
  if (!dns || !/^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$/.test(dns))
    throw new RangeError(`--discover '${spec}': dns must be a host name`);
  const interval = fields['interval-ms'] === undefined ? 5000 : Number(fields['interval-ms']);
  if (!Number.isInteger(interval) || interval < 100)
    throw new RangeError(`--discover '${spec}': interval-ms must be an integer >= 100`);
  const eventsPort = port('events-port', false);
  const replayPort = port('replay-port', false);
  if (replayPort !== undefined && eventsPort === undefined)
    throw new RangeError(`--discover '${spec}': replay-port needs events-port`);
  const models = fields.models
    ? fields.models
        .split(';')
        .map((m) => m.trim())
        .filter(Boolean)
    : undefined;
  return { dns, port: port('port', true)!, eventsPort, replayPort, intervalMs: interval, models };
}

const discover = (v: string) => {
  try {
    return parseDiscoverySpec(v);
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
};

/** NAME=PRIORITY[,NAME=PRIORITY…]: inference objectives and their priorities (negative: sheddable). */
const objectives = (v: string) => {
  const out = new Map<string, number>();
  for (const part of v.split(',')) {
    const eq = part.lastIndexOf('=');
    const name = part.slice(0, eq).trim();
    const priority = Number(part.slice(eq + 1).trim());
    if (eq <= 0 || name === '' || !Number.isInteger(priority))
      throw new InvalidArgumentError(`--objectives: '${part}' is not NAME=INTEGER`);
    out.set(name, priority);
  }
  return out;
};

const fraction = (flag: string) => (v: string) => {
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n) || n <= 0 || n > 1)
    throw new InvalidArgumentError(`${flag} must be in (0, 1], got '${v}'`);
  return n;
};

export const PICKER_SETTINGS: readonly Setting[] = [
  {
    key: 'discover',
    arg: '<spec>',
    help: 'find engines by DNS (a headless Service): dns=NAME,port=N[,events-port=N][,replay-port=N][,interval-ms=N][,models=M1;M2]',
    parse: discover,
  },
  {
    key: 'objectives',
    arg: '<list>',
    help: 'endpoint picker: priority of each inference objective (x-gateway-inference-objective), NAME=PRIORITY[,…]; negative priorities are shed with 429 when the pool is saturated',
    parse: objectives,
  },
  {
    key: 'shed-queue-depth',
    arg: '<n>',
    help: 'endpoint picker: waiting requests at which a worker counts as saturated',
    parse: intOption('--shed-queue-depth', 1),
    default: 5,
  },
  {
    key: 'shed-kv-usage',
    arg: '<fraction>',
    help: 'endpoint picker: KV-cache usage at which a worker counts as saturated',
    parse: fraction('--shed-kv-usage'),
    default: 0.8,
  },
  {
    key: 'epp-fallbacks',
    arg: '<n>',
    help: 'endpoint picker: fallback endpoints listed after the chosen one',
    parse: intOption('--epp-fallbacks', 0),
    default: 2,
  },
];

export const EPP_PORT_SETTING: Setting = {
  key: 'epp-port',
  arg: '<n>',
  help: 'also serve the Envoy ext_proc endpoint picker (gRPC) on this port',
  parse: portNumber('--epp-port'),
};
