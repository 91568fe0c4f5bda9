import type { Command } from 'commander';
import { startPicker, type PickerConfig } from '../../epp/run-picker.js';
import { PICKER_SETTINGS, portNumber } from './picker-settings.js';
import {
  addSettingOptions,
  resolveServeConfig,
  SERVE_SETTINGS,
  startGateway,
  type ServeConfig,
  type Setting,
} from './serve.js';

export { parseDiscoverySpec } from './picker-settings.js';

const EPP_SETTINGS: readonly Setting[] = [
  ...SERVE_SETTINGS.map((s) =>
    s.key === 'port' ? { ...s, help: 'ext_proc gRPC port (0: any free port)', default: 9002 } : s,
  ),
  {
    key: 'metrics-port',
    arg: '<n>',
    help: 'HTTP port for /metrics, /healthz, /readyz and /admin (0: any free port)',
    parse: portNumber('--metrics-port'),
    default: 9090,
  },
  ...PICKER_SETTINGS,
];

export function registerEppCommand(program: Command): void {
  const cmd = program
    .command('epp')
    .description(
      "run the endpoint picker of an Envoy-based gateway (Gateway API Inference Extension, ext_proc gRPC): the same router as serve, endpoints are the workers' host:port",
    );
  addSettingOptions(cmd, EPP_SETTINGS);
  cmd.action(async () => {
    const c = resolveServeConfig(cmd, process.env, EPP_SETTINGS) as ServeConfig &
      PickerConfig & { metricsPort: number };
    const log = (m: string) => process.stderr.write(`${m}\n`);
    if (c.workers.length === 0 && !c.discover)
      log(
        'warning: no workers (--worker, CONTEXTFORGE_WORKERS, the config file, --discover); add them with POST /admin/workers',
      );
    // the HTTP side serves metrics, health and admin only: clients reach the engines through the gateway
    const { gateway, describe, close } = await startGateway(c, log, { openAiRoutes: false });
    const picker = await startPicker(gateway, c, { host: c.host, port: c.port, log });
    const address = await gateway.app.listen({ host: c.host, port: c.metricsPort });
    log(
      `contextforge-router endpoint picker (ext_proc gRPC) on ${c.host}:${String(picker.eppPort)}, metrics and admin on ${address} (${describe})`,
    );
    await new Promise<void>((resolve) => {
      process.once('SIGINT', resolve);
      process.once('SIGTERM', resolve);
    });
    await picker.close();
    await close();
  });
}
