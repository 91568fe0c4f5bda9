import type { Command } from 'commander';
import { isPythonHashSeed, PYTHON_HASH_SEED_RULE } from '../../core/router/options-schema.js';
import { quotedText } from '../../core/shown-text.js';
import { VLLM_HASH_ALGOS, type VllmHashAlgo } from '../../core/vllm-block-hash.js';
import { ChatTokenizer } from '../../engines/chat-tokenizer.js';
import { isAdapterName, MockEngine, offsetEndpointPort } from '../../engines/mock-engine.js';
import { InvalidArgumentError } from 'commander';
import { intOption, positiveNumberOption } from '../options.js';

/** Most KV blocks of the whole engine (every rank's cache is allocated up front). */
const MAX_KV_BLOCKS = 2 ** 24;

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
    .action(
      async (o: {
        port: number;
        host: string;
        model: string;
        blockSize: number;
        kvBlocks: number;
        events?: string;
        replay?: string;
        prefillTokS: number;
        decodeTokS: number;
        tokenizer?: string;
        maxModelLen?: number;
        dataParallelSize: number;
        loraModules?: string;
        blockHash: string;
        pythonHashSeed?: string;
        prefixCachingHashAlgo?: string;
      }) => {
        if (o.replay && !o.events) throw new RangeError('--replay needs --events');
        if (o.blockHash !== 'mock' && o.blockHash !== 'vllm')
          throw new RangeError(`--block-hash must be 'vllm' or 'mock', got ${quotedText(o.blockHash)}`);
        const algo = o.prefixCachingHashAlgo;
        if (algo !== undefined && !(VLLM_HASH_ALGOS as readonly string[]).includes(algo))
          throw new RangeError(
            `--prefix-caching-hash-algo must be one of ${VLLM_HASH_ALGOS.join(', ')} (got ${quotedText(algo)})`,
          );
        if (algo !== undefined && o.blockHash !== 'vllm')
          process.stderr.write('warning: --prefix-caching-hash-algo has no effect without --block-hash vllm\n');
        // the seed only keys vLLM's block hashes: said, as for the algorithm (PYTHONHASHSEED may be
        // set in the environment for other programs, so only the flag is)
        if (o.pythonHashSeed !== undefined && o.blockHash !== 'vllm')
          process.stderr.write('warning: --python-hash-seed has no effect without --block-hash vllm\n');
        const pythonHashSeed = o.pythonHashSeed ?? process.env.PYTHONHASHSEED;
        if (pythonHashSeed !== undefined && o.blockHash === 'vllm' && !isPythonHashSeed(pythonHashSeed))
          throw new RangeError(
            `${o.pythonHashSeed === undefined ? 'PYTHONHASHSEED' : '--python-hash-seed'} ${PYTHON_HASH_SEED_RULE} (got ${quotedText(pythonHashSeed)})`,
          );
        if (o.blockHash === 'vllm' && !pythonHashSeed)
          throw new RangeError(
            '--block-hash vllm needs --python-hash-seed N or the PYTHONHASHSEED environment variable',
          );
        for (const [flag, endpoint] of [
          ['--events', o.events],
          ['--replay', o.replay],
        ] as const) {
          const port = Number(/:(\d+)$/.exec(endpoint ?? '')?.[1]);
          if (endpoint?.startsWith('tcp://') && port + o.dataParallelSize - 1 > 65535)
            throw new RangeError(
              `${flag} ${endpoint}: rank ${o.dataParallelSize - 1} would publish on port ${port + o.dataParallelSize - 1}, over 65535`,
            );
        }
        if (o.kvBlocks * o.dataParallelSize > MAX_KV_BLOCKS)
          throw new RangeError(
            `--kv-blocks × --data-parallel-size must be at most ${MAX_KV_BLOCKS} (every rank's KV blocks are held in memory), got ${o.kvBlocks * o.dataParallelSize}`,
          );
        const loraModules = o.loraModules === undefined ? [] : o.loraModules.split(',').map((x) => x.trim());
        if (loraModules.some((m) => m === '')) throw new RangeError('--lora-modules has an empty name');
        if (new Set(loraModules).size !== loraModules.length)
          throw new RangeError('--lora-modules names an adapter twice');
        for (const name of loraModules) {
          if (name === o.model)
            throw new RangeError(`--lora-modules: ${quotedText(name)} is the model's name (--model), not an adapter's`);
          if (!isAdapterName(name))
            throw new RangeError(
              `--lora-modules: ${quotedText(name)} is not a usable adapter name (1 to 128 letters, digits or _ . : / -)`,
            );
        }
        const tokenizer =
          o.tokenizer === undefined ? undefined : ChatTokenizer.load(o.tokenizer, { source: '--tokenizer' });
        // built before the listening starts: what the engine refuses in its options is not a listen error
        const mock = new MockEngine({
          port: o.port,
          host: o.host,
          model: o.model,
          blockSize: o.blockSize,
          kvBlocks: o.kvBlocks,
          maxModelLen: o.maxModelLen,
          events: o.events,
          replay: o.replay,
          prefillTokS: o.prefillTokS,
          decodeTokS: o.decodeTokS,
          tokenizer,
          dataParallelSize: o.dataParallelSize,
          loraModules,
          blockHash: o.blockHash as 'mock' | 'vllm',
          pythonHashSeed,
          prefixCachingHashAlgo: algo as VllmHashAlgo | undefined,
        });
        const engine = await startEngine(o, () => mock.start());
        // listening for the stop signals before saying where it serves: a supervisor may send
        // one as soon as it reads that line, and it must close the engine, not kill the process
        const stopped = new Promise<void>((resolve) => {
          const stop = () => resolve();
          process.once('SIGINT', stop);
          process.once('SIGTERM', stop);
        });
        process.stderr.write(
          `mock engine '${o.model}' on http://${o.host}:${engine.port}` +
            (o.events
              ? `, KV events on ${engine.eventsEndpoints.join(' ')}${o.replay ? ` (replay ${engine.replayEndpoint})` : ''}`
              : '') +
            (o.dataParallelSize > 1 ? `, ${o.dataParallelSize} data-parallel ranks` : '') +
            (loraModules.length > 0 ? `, LoRA adapters ${loraModules.join(', ')}` : '') +
            '\n',
        );
        await stopped;
        await engine.close();
      },
    );
}

/**
 * The engine started; an address it cannot take (in use, not this host's, a name that does not
 * resolve) stops the command with the flag that chose it, not a stack trace. ZeroMQ's errors
 * carry the endpoint they failed on (rank r's: the flag's port + r).
 */
async function startEngine(
  o: { host: string; port: number; events?: string; replay?: string; dataParallelSize: number },
  start: () => Promise<MockEngine>,
): Promise<MockEngine> {
  try {
    return await start();
  } catch (err) {
    const message = (err as Error).message.split('\n')[0];
    // (Node's listen errors carry an address too: the host, without a scheme)
    const endpoint = (err as { address?: unknown }).address;
    if (typeof endpoint !== 'string' || !/^(tcp|ipc|inproc):\/\//.test(endpoint))
      throw new RangeError(`--host ${o.host} --port ${o.port}: cannot listen: ${message}`, { cause: err });
    const ranks = Array.from({ length: o.dataParallelSize }, (_, r) => r);
    const replay = o.replay !== undefined && ranks.some((r) => offsetEndpointPort(o.replay!, r) === endpoint);
    const flag = replay ? `--replay ${o.replay}` : `--events ${o.events}`;
    throw new RangeError(`${flag}: cannot bind ${endpoint}: ${message}`, { cause: err });
  }
}
