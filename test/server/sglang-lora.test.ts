import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, describe, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';

// SGLang selects a request's LoRA adapter from `model: "base:adapter"` or from the body's
// `lora_path` (the adapter in `model` first), and refuses a bare adapter name as `model`
// (python/sglang/srt/entrypoints/openai/serving_base.py, _parse_model_parameter and
// _resolve_lora_path). Its radix cache keeps an adapter's blocks apart from the base model's, so
// the router must key such a request by that adapter: keyed as the base model it would count the
// base model's blocks as cached (a false hit) and miss the adapter's.
const cleanup: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanup.reverse()) await c();
});
const adminToken = 'sglang-lora-admin-token';
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = Record<string, any>;

/** An engine answering /v1/models as SGLang does: its model, then each adapter with `parent` = the model. */
async function sglangModels(ids: Array<{ id: string; parent?: string }>): Promise<string> {
  const server = createServer((req, res) => {
    if (req.url === '/v1/models') {
      const data = ids.map((m) => ({
        id: m.id,
        object: 'model',
        created: 0,
        owned_by: 'sglang',
        root: m.parent === undefined ? m.id : `/loras/${m.id}`,
        parent: m.parent ?? null,
        max_model_len: m.parent === undefined ? 4096 : null,
      }));
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data }));
      return;
    }
    res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  cleanup.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

const post = (base: string, path: string, body: unknown) =>
  fetch(`${base}${path}`, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
  });

const stored = (tokens: number[], loraName: string | null, hashes: number[]) => ({
  type: 'BlockStored',
  block_hashes: hashes,
  parent_block_hash: null,
  token_ids: tokens,
  block_size: 4,
  lora_id: null,
  medium: 'GPU',
  lora_name: loraName,
});

const ADAPTER_TOKENS = [1, 2, 3, 4, 5, 6, 7, 8];
const BASE_TOKENS = [101, 102, 103, 104, 105, 106, 107, 108];

/**
 * A gateway whose one worker lists `models` as SGLang does; its index holds the adapter `ad1`'s
 * blocks for ADAPTER_TOKENS and the base model's for BASE_TOKENS.
 */
async function gatewayWithAdapterBlocks(models: Array<{ id: string; parent?: string }>) {
  const url = await sglangModels(models);
  const gateway = await createGateway({
    adminToken,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    router: new KVAwareRouter({ blockSize: 4, indexMode: 'precise', speculativeBlocks: 0 }),
    tokenize: 'engine',
    workers: [{ id: 's', url }],
  });
  cleanup.push(() => gateway.close());
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  await until(() => gateway.connections.loraOf('ad1') === 'ad1', "the worker's adapters read");
  const events = [stored(ADAPTER_TOKENS, 'ad1', [11, 12]), stored(BASE_TOKENS, null, [21, 22])];
  assert.equal((await post(base, '/admin/events', { worker: 's', events })).status, 200);
  const cached = async (body: Json, tokens: number[]) => {
    const res = await post(base, '/v1/route', { ...body, prompt: [...tokens, 9] });
    assert.equal(res.status, 200);
    return ((await res.json()) as Json).cachedTokens as number;
  };
  return { cached };
}

describe("SGLang's ways of naming a LoRA adapter key a request's blocks by that adapter", () => {
  test('model "base:adapter": the adapter\'s blocks match, the base model\'s do not', async () => {
    const { cached } = await gatewayWithAdapterBlocks([{ id: 'm' }, { id: 'ad1', parent: 'm' }]);
    assert.equal(await cached({ model: 'm:ad1' }, ADAPTER_TOKENS), 8, "the adapter's blocks");
    assert.equal(await cached({ model: 'm:ad1' }, BASE_TOKENS), 0, "no false hit on the base model's blocks");
    // SGLang strips both parts (_parse_model_parameter)
    assert.equal(await cached({ model: ' m : ad1 ' }, ADAPTER_TOKENS), 8);
    // an empty adapter part is the base model
    assert.equal(await cached({ model: 'm:' }, BASE_TOKENS), 8);
    assert.equal(await cached({ model: 'm:' }, ADAPTER_TOKENS), 0);
  });

  test('lora_path on the OpenAI routes names the adapter; the adapter in model wins over it', async () => {
    const { cached } = await gatewayWithAdapterBlocks([{ id: 'm' }, { id: 'ad1', parent: 'm' }]);
    assert.equal(await cached({ model: 'm', lora_path: 'ad1' }, ADAPTER_TOKENS), 8, "the adapter's blocks");
    assert.equal(await cached({ model: 'm', lora_path: 'ad1' }, BASE_TOKENS), 0, 'no false hit');
    // one entry per prompt in SGLang's list form: the first prompt's keys the chain
    assert.equal(await cached({ model: 'm', lora_path: ['ad1'] }, ADAPTER_TOKENS), 8);
    // a null or empty entry is the base model, as SGLang reads it
    assert.equal(await cached({ model: 'm', lora_path: [null] }, BASE_TOKENS), 8);
    assert.equal(await cached({ model: 'm', lora_path: '' }, BASE_TOKENS), 8);
    // model's adapter first (_resolve_lora_path)
    assert.equal(await cached({ model: 'm:ad1', lora_path: 'other' }, ADAPTER_TOKENS), 8);
  });

  test("the base model and vLLM's bare adapter name keep their keys", async () => {
    const { cached } = await gatewayWithAdapterBlocks([{ id: 'm' }, { id: 'ad1', parent: 'm' }]);
    assert.equal(await cached({ model: 'm' }, BASE_TOKENS), 8);
    assert.equal(await cached({ model: 'm' }, ADAPTER_TOKENS), 0);
    assert.equal(await cached({ model: 'ad1' }, ADAPTER_TOKENS), 8);
  });

  test('a model whose own name has a colon, listed by a worker, is that model, not base:adapter', async () => {
    const { cached } = await gatewayWithAdapterBlocks([{ id: 'llama3:8b' }, { id: 'ad1', parent: 'llama3:8b' }]);
    assert.equal(await cached({ model: 'llama3:8b' }, BASE_TOKENS), 8);
    assert.equal(await cached({ model: 'llama3:8b' }, ADAPTER_TOKENS), 0);
  });
});
