import { quotedText } from '../../core/shown-text.js';
import { loadTrace, namingTrace } from '../../sim/load-trace.js';
import { ENGINE_DEFAULTS } from '../../engine-model/config.js';
import { checkClusterKvBlocks } from '../options.js';
import { renderRouterOptions, renderWeightsConfig, tuneCostWeights } from '../../sim/tune.js';

export interface TuneFlags {
  trace: string;
  workers: number;
  speed: number;
  trials: number;
  trainFraction: number;
  seed: number;
  format: string;
}

/** `tune` with its flags parsed: the search, and its result on stdout. */
export async function runTune(flags: TuneFlags): Promise<void> {
  if (!['yaml', 'options', 'json'].includes(flags.format))
    throw new RangeError(`--format must be yaml, options or json, got ${quotedText(flags.format)}`);
  if (flags.trainFraction >= 1) throw new RangeError('--train-fraction must be below 1');
  const { name, requests } = await loadTrace(flags.trace);
  if (requests.length < 2) throw new RangeError('--trace needs at least 2 requests to hold some out');
  // tune's engines have the default KV: the cluster's blocks are bounded as simulate's are
  checkClusterKvBlocks(
    flags.workers,
    [ENGINE_DEFAULTS.kvTokens],
    requests[0].blockSize,
    `--workers (${ENGINE_DEFAULTS.kvTokens} KV tokens each)`,
  );
  const result = namingTrace(flags.trace, () =>
    tuneCostWeights(requests, {
      workers: flags.workers,
      speed: flags.speed,
      trials: flags.trials,
      trainFraction: flags.trainFraction,
      seed: flags.seed,
      onTrial: (i, n) => process.stderr.isTTY && process.stderr.write(`\rtrial ${i}/${n}`),
    }),
  );
  if (process.stderr.isTTY) process.stderr.write('\n');
  const out =
    flags.format === 'json'
      ? `${JSON.stringify(result)}\n`
      : flags.format === 'options'
        ? renderRouterOptions(result)
        : renderWeightsConfig(name, result);
  process.stdout.write(out);
}
