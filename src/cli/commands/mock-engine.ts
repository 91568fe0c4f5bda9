import type { Command } from 'commander';
import { quotedText } from '../../core/shown-text.js';
import { VLLM_HASH_ALGOS } from '../../core/vllm-block-hash.js';
import { MAX_KV_BLOCKS } from '../../engine-model/limits.js';
import { InvalidArgumentError } from 'commander';
import { intOption, pathOption, positiveNumberOption } from '../options.js';
import type { MockEngineFlags } from './mock-engine-run.js';

/** A non-empty text flag of at most `max` characters. */
const textOption = (flag: string, max: number) => (value: string) => {
  if (value.trim() === '' || value.length > max)
    throw new InvalidArgumentError(`${flag} must be 1 to ${max} characters, not blank`);
  return value;
};

/** A ZeroMQ endpoint to bind: tcp://HOST:PORT (PORT * for any free one) or ipc://PATH. */
const bindEndpointOption = (flag: string) => (value: string) => {
  const port = /^tcp:\/\/\S+:(\d{1,5}|\*)$/.exec(value)?.[1];
  const ok = port === undefined ? /^ipc:\/\/\S+$/.test(value) : port === '*' || (+port >= 1 && +port <= 65535);
  if (!ok || value.length > 2048)
    throw new InvalidArgumentError(
      `${flag} must be tcp://HOST:PORT (PORT 1-65535 or *) or ipc://PATH, got ${quotedText(value)}`,
    );
  // ZeroMQ takes no credentials in an endpoint: a password there would only be printed back
  if (/^tcp:\/\/[^/]*@/.test(value)) throw new InvalidArgumentError(`${flag} must not hold a user name or password`);
  return value;
};

export function registerMockEngineCommand(program: Command): void {
  program
    .command('mock-engine')
    .description('run a mock vLLM-compatible engine: OpenAI API, /tokenize, /metrics and KV events over ZeroMQ')
    .option('--port <n>', 'HTTP port', intOption('--port', 0, 65535), 9001)
    .option('--host <addr>', 'HTTP address', textOption('--host', 253), '127.0.0.1')
    .option('--model <name>', 'model name served', textOption('--model', 512), 'mock')
    .option('--block-size <n>', 'tokens per KV block', intOption('--block-size', 1, 2 ** 16), 16)
    .option('--kv-blocks <n>', 'KV cache capacity in blocks', intOption('--kv-blocks', 1, MAX_KV_BLOCKS), 4096)
    .option(
      '--max-model-len <n>',
      'longest request (prompt + max_tokens) served; longer ones get HTTP 400 (default 131072, capped by the KV)',
      intOption('--max-model-len', 1, 2 ** 20),
    )
    .option(
      '--events <endpoint>',
      'bind a KV-event PUB socket here (e.g. tcp://127.0.0.1:5557)',
      bindEndpointOption('--events'),
    )
    .option('--replay <endpoint>', 'bind the KV-event replay ROUTER socket here', bindEndpointOption('--replay'))
    .option(
      '--prefill-tok-s <n>',
      'prefill speed, tokens/s',
      positiveNumberOption('--prefill-tok-s', { min: 1, max: 1e9 }),
      20_000,
    )
    .option(
      '--decode-tok-s <n>',
      'decode speed per request, tokens/s',
      positiveNumberOption('--decode-tok-s', { min: 1, max: 1e9 }),
      200,
    )
    .option(
      '--tokenizer <path>',
      "the model's tokenizer.json (or its directory, with tokenizer_config.json); default: a word-level mock tokenizer",
      pathOption('--tokenizer'),
    )
    .option(
      '--data-parallel-size <n>',
      "engine cores, each with its own KV cache; rank r publishes on the events (and replay) port + r, and a request's X-data-parallel-rank header picks its rank",
      intOption('--data-parallel-size', 1, 64),
      1,
    )
    .option(
      '--lora-modules <names>',
      'LoRA adapters served beside the model, comma-separated; /v1/models lists them with the model as parent',
    )
    .option(
      '--block-hash <kind>',
      "'vllm': publish vLLM's block hashes (by --prefix-caching-hash-algo) seeded from --python-hash-seed or PYTHONHASHSEED (default: a per-process seed)",
      'mock',
    )
    .option('--python-hash-seed <seed>', "the PYTHONHASHSEED vLLM's block hashes are seeded with (--block-hash vllm)")
    .option(
      '--prefix-caching-hash-algo <name>',
      `vLLM's block hash (${VLLM_HASH_ALGOS.join(', ')}; --block-hash vllm). Default sha256_cbor, as serve's`,
    )
    // the engine, its tokenizer and ZeroMQ are loaded only to run them
    .action(async (o: MockEngineFlags) => (await import('./mock-engine-run.js')).runMockEngine(o));
}
