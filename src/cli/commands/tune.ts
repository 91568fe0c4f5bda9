import type { Command } from 'commander';
import { MAX_SEED } from '../../core/rng.js';
import { quotedText } from '../../core/shown-text.js';
import { loadTrace } from '../../sim/load-trace.js';
import { renderRouterOptions, renderWeightsConfig, tuneCostWeights } from '../../sim/tune.js';
import { intOption, positiveNumberOption, SIM_LIMITS } from '../options.js';

export function registerTuneCommand(program: Command): void {
  program
    .command('tune')
    .description("search the cost policy's weights on part of a trace, check them on the rest, print a config block")
    .requiredOption('--trace <file>', 'trace (as for simulate)')
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
    .action(
      async (flags: {
        trace: string;
        workers: number;
        speed: number;
        trials: number;
        trainFraction: number;
        seed: number;
        format: string;
      }) => {
        if (!['yaml', 'options', 'json'].includes(flags.format))
          throw new RangeError(`--format must be yaml, options or json, got ${quotedText(flags.format)}`);
        if (flags.trainFraction >= 1) throw new RangeError('--train-fraction must be below 1');
        const { name, requests } = await loadTrace(flags.trace);
        if (requests.length < 2) throw new RangeError('--trace needs at least 2 requests to hold some out');
        const result = tuneCostWeights(requests, {
          workers: flags.workers,
          speed: flags.speed,
          trials: flags.trials,
          trainFraction: flags.trainFraction,
          seed: flags.seed,
          onTrial: (i, n) => process.stderr.isTTY && process.stderr.write(`\rtrial ${i}/${n}`),
        });
        if (process.stderr.isTTY) process.stderr.write('\n');
        const out =
          flags.format === 'json'
            ? `${JSON.stringify(result)}\n`
            : flags.format === 'options'
              ? renderRouterOptions(result)
              : renderWeightsConfig(name, result);
        process.stdout.write(out);
      },
    );
}
