import type { Command } from 'commander';
import { MAX_SEED } from '../../core/rng.js';
import type { TuneFlags } from './tune-run.js';
import { intOption, pathOption, positiveNumberOption, SIM_LIMITS } from '../options.js';

export function registerTuneCommand(program: Command): void {
  program
    .command('tune')
    .description("search the cost policy's weights on part of a trace, check them on the rest, print a config block")
    .requiredOption('--trace <file>', 'trace (as for simulate)', pathOption('--trace'))
    .option('--workers <n>', 'engines in the cluster', intOption('--workers', 1, SIM_LIMITS.workers), 8)
    .option('--speed <x>', 'arrival-rate multiplier', positiveNumberOption('--speed', SIM_LIMITS.speed), 1)
    .option('--trials <n>', 'simulations the search may run', intOption('--trials', 1, 1000), 30)
    .option(
      '--train-fraction <f>',
      'share of requests (by arrival) to search on',
      positiveNumberOption('--train-fraction'),
      0.6,
    )
    .option('--seed <n>', 'search seed', intOption('--seed', 0, MAX_SEED), 7)
    .option(
      '--format <yaml|options|json>',
      'yaml: a commented serve --config block; options: the router options as JSON (for --config and new KVAwareRouter()); json: the whole search',
      'yaml',
    )
    // the simulator and the search are loaded only to run them
    .action(async (flags: TuneFlags) => (await import('./tune-run.js')).runTune(flags));
}
