import { isPythonHashSeed, PYTHON_HASH_SEED_RULE } from '../../core/router/options-schema.js';
import { quotedText } from '../../core/shown-text.js';
import { VLLM_HASH_ALGOS, type VllmHashAlgo } from '../../core/vllm-block-hash.js';
import { ChatTokenizer } from '../../engines/chat-tokenizer.js';
import { isAdapterName, MockEngine, offsetEndpointPort } from '../../engines/mock-engine.js';
import { MAX_KV_BLOCKS } from '../../engine-model/limits.js';

export interface MockEngineFlags {
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
}

/** `mock-engine` with its flags parsed: the engine, serving until SIGINT or SIGTERM. */
export async function runMockEngine(o: MockEngineFlags): Promise<void> {
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
    throw new RangeError('--block-hash vllm needs --python-hash-seed N or the PYTHONHASHSEED environment variable');
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
  if (new Set(loraModules).size !== loraModules.length) throw new RangeError('--lora-modules names an adapter twice');
  for (const name of loraModules) {
    if (name === o.model)
      throw new RangeError(`--lora-modules: ${quotedText(name)} is the model's name (--model), not an adapter's`);
    if (!isAdapterName(name))
      throw new RangeError(
        `--lora-modules: ${quotedText(name)} is not a usable adapter name (1 to 128 letters, digits or _ . : / -)`,
      );
  }
  const tokenizer = o.tokenizer === undefined ? undefined : ChatTokenizer.load(o.tokenizer, { source: '--tokenizer' });
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
