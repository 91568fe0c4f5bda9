#!/usr/bin/env node
import { Command, CommanderError } from 'commander';
import { readFileSync } from 'node:fs';
import { registerDemoCommand } from './commands/demo.js';
import { registerEppCommand } from './commands/epp.js';
import { registerLiveDemoCommand } from './commands/live-demo.js';
import { registerMockEngineCommand } from './commands/mock-engine.js';
import { registerServeCommand } from './commands/serve.js';
import { registerSimulateCommand } from './commands/simulate.js';
import { registerTuneCommand } from './commands/tune.js';
import { escapeUnprintableLines } from '../core/shown-text.js';
import { excessArgumentHint, shortenCommanderMessage } from './options.js';
import { reportOutputErrors } from './output.js';

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };

const program = new Command()
  .name('contextforge-router')
  .description('KV-cache-aware request router for LLM inference clusters')
  .version(pkg.version)
  // commander reports a bad flag itself; the exit status is decided below, as for every usage error
  .exitOverride()
  // (before the commands are added: they take the program's output settings as they are then)
  .configureOutput({
    // a control character that reached a message unescaped is shown escaped, not acted on
    outputError: (message, write) =>
      write(escapeUnprintableLines(excessArgumentHint(shortenCommanderMessage(message), process.argv.slice(2)))),
  });
// a reader that went away, a full disk: one handler for every command's output (and commander's help)
reportOutputErrors(process.stdout);
registerDemoCommand(program);
registerEppCommand(program);
registerLiveDemoCommand(program);
registerMockEngineCommand(program);
registerServeCommand(program);
registerSimulateCommand(program);
registerTuneCommand(program);

try {
  await program.parseAsync(process.argv);
} catch (err) {
  if (err instanceof CommanderError) {
    // already reported (a bad or unknown flag, a missing argument); help and --version exit 0
    process.exitCode = err.exitCode === 0 ? 0 : 2;
  } else {
    // Argument errors from the core (RangeError/TypeError) are the user's to fix: one line, exit 2.
    const usage = err instanceof RangeError || err instanceof TypeError;
    const message = usage ? (err as Error).message : ((err as Error).stack ?? String(err));
    process.stderr.write(`error: ${escapeUnprintableLines(message)}\n`);
    process.exitCode = usage ? 2 : 1;
  }
}
