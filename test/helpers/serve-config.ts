import { Command } from 'commander';
import { registerServeCommand, resolveConfig } from '../../src/cli/commands/serve.js';
import { SERVE_SCHEMA } from '../../src/cli/config/settings.js';

/**
 * Resolves `serve`'s settings from a command line and the given environment variables (set
 * on process.env for the call, as commander reads them there) without running serve.
 */
export function resolveServe(args: string[], env: Record<string, string> = {}) {
  const saved = { ...process.env };
  Object.assign(process.env, env);
  try {
    const program = new Command().exitOverride().configureOutput({ writeErr: () => {} });
    registerServeCommand(program);
    const serve = program.commands.find((c) => c.name() === 'serve')!;
    let out: ReturnType<typeof resolveConfig<typeof SERVE_SCHEMA>> | undefined;
    serve.action(() => {
      out = resolveConfig(serve, process.env, SERVE_SCHEMA);
    });
    program.parse(['node', 'contextforge-router', 'serve', ...args]);
    return out!;
  } finally {
    for (const k of Object.keys(env)) if (saved[k] === undefined) delete process.env[k];
    Object.assign(process.env, saved);
  }
}
