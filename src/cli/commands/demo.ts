import type { Command } from 'commander';
import { MAX_SEED } from '../../core/rng.js';
import { intOption } from '../options.js';
import type { DemoFlags } from './demo-run.js';

export function registerDemoCommand(program: Command): void {
  program
    .command('demo')
    .description('replay a scripted multi-agent workload through the core router, seed vs cost side by side')
    .option('--workers <n>', 'workers in the fleet', intOption('--workers', 1, 1024), 4)
    .option(
      '--workflows <n>',
      'retriever → summarizer → critic → responder workflows',
      intOption('--workflows', 1, 10_000),
      80,
    )
    .option('--seed <n>', 'workload random seed', intOption('--seed', 0, MAX_SEED), 7)
    .option('--policies <list>', 'comma-separated policies to compare', 'seed,cost')
    .option('--json', 'print one JSON object instead of tables')
    // the workload and the router are loaded only to run them
    .action(async (opts: DemoFlags) => (await import('./demo-run.js')).runDemo(opts));
}
