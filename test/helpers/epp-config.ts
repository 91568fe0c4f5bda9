import { Command } from 'commander';
import { registerEppCommand, resolveEppConfig } from '../../src/cli/commands/epp.js';

/** Resolves `epp`'s settings from a command line (and `env`) as the command would, without running epp. */
export function resolveEpp(args: string[], env: NodeJS.ProcessEnv = {}) {
  const program = new Command().exitOverride().configureOutput({ writeErr: () => {} });
  registerEppCommand(program);
  const epp = program.commands.find((c) => c.name() === 'epp')!;
  let out: ReturnType<typeof resolveEppConfig> | undefined;
  epp.action(() => {
    out = resolveEppConfig(epp, env);
  });
  program.parse(['node', 'contextforge-router', 'epp', ...args]);
  return out!;
}
