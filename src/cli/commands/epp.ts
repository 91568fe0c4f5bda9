import type { Command } from 'commander';
import { addSettingOptions } from '../config/resolve.js';
import { EPP_HELP, EPP_SCHEMA, kebab, PROXY_SETTINGS } from '../config/settings.js';
import { checkEppTlsSettings } from '../config/epp-tls.js';
import { printConfig } from '../config/print-config.js';
import { printConfigOption, resolveConfig } from './serve.js';

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
    // --print-config shows what runs: read back, it warns of nothing
    (resolved.values as { processes: number }).processes = 1;
  }
  // Envoy forwards the requests, not this process: the settings of serve's proxy do nothing here.
  // Named when given as a flag, to epp itself; a file or environment shared with serve sets them
  // for serve (and epp's own --print-config lists them)
  for (const key of PROXY_SETTINGS) {
    if (resolved.origins[key] !== 'flag') continue;
    resolved.warnings.push(
      `--${kebab(key)} has no effect on epp: it sets how serve forwards requests, which Envoy forwards here`,
    );
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
  cmd.addOption(printConfigOption());
  cmd.action(async () => {
    const { config, resolved } = resolveEppConfig(cmd);
    checkEppTlsSettings(config, resolved.warnings);
    for (const w of resolved.warnings) process.stderr.write(`warning: ${w}\n`);
    const format = cmd.opts<{ printConfig?: string | true }>().printConfig;
    if (format !== undefined) {
      process.stdout.write(printConfig(resolved, format === 'json' ? 'json' : 'yaml'));
      return;
    }
    // the gateway, the picker, TLS and what they run on are loaded only to run them
    await (await import('./epp-run.js')).runEpp(config);
  });
}
