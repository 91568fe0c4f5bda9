import type { Command } from 'commander';
import { startPicker } from '../../epp/run-picker.js';
import { addSettingOptions } from '../config/resolve.js';
import { EPP_HELP, EPP_SCHEMA } from '../config/settings.js';
import { listening, resolveConfig, startGateway } from './serve.js';

export { parseDiscoverySpec } from '../config/picker-text.js';

/**
 * `epp`'s settings (as resolveConfig resolves them). The picker runs in one process: --processes,
 * which a config or environment shared with serve may set, is named in a warning and left at 1
 * (it also sizes the tokenizer threads of each process).
 */
export function resolveEppConfig(cmd: Command, env: NodeJS.ProcessEnv = process.env) {
  const { config, resolved } = resolveConfig(cmd, env, EPP_SCHEMA);
  if (config.processes > 1) {
    resolved.warnings.push(
      `--processes ${config.processes} has no effect on epp: it runs one process (run more epp replicas, sharing --state redis://…, instead)`,
    );
    config.processes = 1;
  }
  return { config, resolved };
}

export function registerEppCommand(program: Command): void {
  const cmd = program
    .command('epp')
    .description(
      "run the endpoint picker of an Envoy-based gateway (Gateway API Inference Extension, ext_proc gRPC): the same router as serve, endpoints are the workers' host:port",
    );
  addSettingOptions(cmd, EPP_SCHEMA.shape, EPP_HELP);
  cmd.action(async () => {
    const { config: c, resolved } = resolveEppConfig(cmd);
    const log = (m: string) => process.stderr.write(`${m}\n`);
    for (const w of resolved.warnings) log(`warning: ${w}`);
    if (c.workers.length === 0 && !c.discover)
      log(
        'warning: no workers (--worker, CONTEXTFORGE_WORKERS, the config file, --discover); add them with POST /admin/workers',
      );
    // the HTTP side serves metrics, health and admin only: clients reach the engines through the gateway
    const { gateway, describe, close } = await startGateway(c, log, { openAiRoutes: false });
    const picker = await listening(
      `--host ${c.host} --port ${c.port}`,
      () => startPicker(gateway, c, { host: c.host, port: c.port, log }),
      close,
    );
    const address = await listening(
      `--host ${c.host} --metrics-port ${c.metricsPort}`,
      () => gateway.app.listen({ host: c.host, port: c.metricsPort }),
      async () => {
        await picker.close();
        await close();
      },
    );
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
