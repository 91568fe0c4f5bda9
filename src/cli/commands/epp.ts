export type { PickerConfig } from '../../epp/run-picker.js';
import { InvalidArgumentError, type Command } from 'commander';
import { startPicker, type PickerConfig } from '../../epp/run-picker.js';
import { parseDiscoverySpec } from '../../server/dns-discovery.js';
import { intOption } from '../options.js';
import { addSettingOptions, resolveServeConfig, SERVE_SETTINGS, startGateway, type ServeConfig, type Setting } from './serve.js';
export { startPicker };

const portNumber = (flag: string) => (v: string) => {
  const n = intOption(flag, 0)(v);
  if (n > 65535) throw new InvalidArgumentError(`${flag} must be <= 65535, got ${n}`);
  return n;
};

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
    if (eq <= 0 || name === '' || !Number.isInteger(priority)) throw new InvalidArgumentError(`--objectives: '${part}' is not NAME=INTEGER`);
    out.set(name, priority);
  }
  return out;
};

const fraction = (flag: string) => (v: string) => {
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n) || n <= 0 || n > 1) throw new InvalidArgumentError(`${flag} must be in (0, 1], got '${v}'`);
  return n;
};

export const PICKER_SETTINGS: readonly Setting[] = [
  { key: 'discover', arg: '<spec>', help: 'find engines by DNS (a headless Service): dns=NAME,port=N[,events-port=N][,replay-port=N][,interval-ms=N][,models=M1;M2]', parse: discover },
  { key: 'objectives', arg: '<list>', help: 'endpoint picker: priority of each inference objective (x-gateway-inference-objective), NAME=PRIORITY[,…]; negative priorities are shed with 429 when the pool is saturated', parse: objectives },
  { key: 'shed-queue-depth', arg: '<n>', help: 'endpoint picker: waiting requests at which a worker counts as saturated', parse: intOption('--shed-queue-depth', 1), default: 5 },
  { key: 'shed-kv-usage', arg: '<fraction>', help: 'endpoint picker: KV-cache usage at which a worker counts as saturated', parse: fraction('--shed-kv-usage'), default: 0.8 },
  { key: 'epp-fallbacks', arg: '<n>', help: 'endpoint picker: fallback endpoints listed after the chosen one', parse: intOption('--epp-fallbacks', 0), default: 2 },
];

export const EPP_PORT_SETTING: Setting = { key: 'epp-port', arg: '<n>', help: 'also serve the Envoy ext_proc endpoint picker (gRPC) on this port', parse: portNumber('--epp-port') };

const EPP_SETTINGS: readonly Setting[] = [
  ...SERVE_SETTINGS.map((s) => (s.key === 'port' ? { ...s, help: 'ext_proc gRPC port (0: any free port)', default: 9002 } : s)),
  { key: 'metrics-port', arg: '<n>', help: 'HTTP port for /metrics, /healthz, /readyz and /admin (0: any free port)', parse: portNumber('--metrics-port'), default: 9090 },
  ...PICKER_SETTINGS,
];

export function registerEppCommand(program: Command): void {
  const cmd = program
    .command('epp')
    .description('run the endpoint picker of an Envoy-based gateway (Gateway API Inference Extension, ext_proc gRPC): the same router as serve, endpoints are the workers\' host:port');
  addSettingOptions(cmd, EPP_SETTINGS);
  cmd.action(async () => {
    const c = resolveServeConfig(cmd, process.env, EPP_SETTINGS) as ServeConfig & PickerConfig & { metricsPort: number };
    const log = (m: string) => process.stderr.write(`${m}\n`);
    if (c.workers.length === 0 && !c.discover) log('warning: no workers (--worker, CONTEXTFORGE_WORKERS, the config file, --discover); add them with POST /admin/workers');
    // the HTTP side serves metrics, health and admin only: clients reach the engines through the gateway
    const { gateway, describe } = await startGateway(c, log, { openAiRoutes: false });
    const picker = await startPicker(gateway, c, { host: c.host, port: c.port, log });
    const address = await gateway.app.listen({ host: c.host, port: c.metricsPort });
    log(`contextforge-router endpoint picker (ext_proc gRPC) on ${c.host}:${String(picker.eppPort)}, metrics and admin on ${address} (${describe})`);
    await new Promise<void>((resolve) => {
      process.once('SIGINT', resolve);
      process.once('SIGTERM', resolve);
    });
    await picker.close();
    await gateway.close();
  });
}
