import type { Command } from 'commander';
import { ChatTokenizer } from '../../engines/chat-tokenizer.js';
import { MockEngine } from '../../engines/mock-engine.js';
import { intOption, positiveNumberOption } from '../options.js';

export function registerMockEngineCommand(program: Command): void {
  program
    .command('mock-engine')
    .description('run a mock vLLM-compatible engine: OpenAI API, /tokenize, /metrics and KV events over ZeroMQ')
    .option('--port <n>', 'HTTP port', intOption('--port', 0), 9001)
    .option('--host <addr>', 'HTTP address', '127.0.0.1')
    .option('--model <name>', 'model name served', 'mock')
    .option('--block-size <n>', 'tokens per KV block', intOption('--block-size', 1), 16)
    .option('--kv-blocks <n>', 'KV cache capacity in blocks', intOption('--kv-blocks', 1), 4096)
    .option(
      '--max-model-len <n>',
      'longest request (prompt + max_tokens) served; longer ones get HTTP 400 (default 131072, capped by the KV)',
      intOption('--max-model-len', 1),
    )
    .option('--events <endpoint>', 'bind a KV-event PUB socket here (e.g. tcp://127.0.0.1:5557)')
    .option('--replay <endpoint>', 'bind the KV-event replay ROUTER socket here')
    .option('--prefill-tok-s <n>', 'prefill speed, tokens/s', positiveNumberOption('--prefill-tok-s'), 20_000)
    .option('--decode-tok-s <n>', 'decode speed per request, tokens/s', positiveNumberOption('--decode-tok-s'), 200)
    .option(
      '--tokenizer <path>',
      "the model's tokenizer.json (or its directory, with tokenizer_config.json); default: a word-level mock tokenizer",
    )
    .option(
      '--data-parallel-size <n>',
      "engine cores, each with its own KV cache; rank r publishes on the events (and replay) port + r, and a request's X-data-parallel-rank header picks its rank",
      intOption('--data-parallel-size', 1),
      1,
    )
    .option(
      '--lora-modules <names>',
      'LoRA adapters served beside the model, comma-separated; /v1/models lists them with the model as parent',
    )
    .option(
      '--block-hash <kind>',
      "'vllm': publish vLLM's sha256_cbor block hashes seeded from --python-hash-seed or PYTHONHASHSEED (default: a per-process seed)",
      'mock',
    )
    .option('--python-hash-seed <seed>', "the PYTHONHASHSEED vLLM's block hashes are seeded with (--block-hash vllm)")
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
      }) => {
        if (o.replay && !o.events) throw new RangeError('--replay needs --events');
        if (o.blockHash !== 'mock' && o.blockHash !== 'vllm')
          throw new RangeError(`--block-hash must be 'vllm' or 'mock', got '${o.blockHash}'`);
        const pythonHashSeed = o.pythonHashSeed ?? process.env.PYTHONHASHSEED;
        if (o.blockHash === 'vllm' && !pythonHashSeed)
          throw new RangeError(
            '--block-hash vllm needs --python-hash-seed N or the PYTHONHASHSEED environment variable',
          );
        if (o.dataParallelSize > 64)
          throw new RangeError(`--data-parallel-size must be <= 64, got ${o.dataParallelSize}`);
        const loraModules =
          o.loraModules === undefined
            ? []
            : o.loraModules
                .split(',')
                .map((x) => x.trim())
                .filter(Boolean);
        const tokenizer = o.tokenizer === undefined ? undefined : ChatTokenizer.load(o.tokenizer);
        const engine = await new MockEngine({
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
        }).start();
        process.stderr.write(
          `mock engine '${o.model}' on http://${o.host}:${engine.port}` +
            (o.events
              ? `, KV events on ${engine.eventsEndpoints.join(' ')}${o.replay ? ` (replay ${engine.replayEndpoint})` : ''}`
              : '') +
            (o.dataParallelSize > 1 ? `, ${o.dataParallelSize} data-parallel ranks` : '') +
            (loraModules.length > 0 ? `, LoRA adapters ${loraModules.join(', ')}` : '') +
            '\n',
        );
        await new Promise<void>((resolve) => {
          const stop = () => resolve();
          process.once('SIGINT', stop);
          process.once('SIGTERM', stop);
        });
        await engine.close();
      },
    );
}
