import type { Command } from 'commander';
import { KVAwareRouter } from '../../core/router.js';
import { KvEventApplier } from '../../engines/kv-events/applier.js';
import { KvEventSubscriber } from '../../engines/kv-events/subscriber.js';
import { MetricsScraper } from '../../engines/metrics/scraper.js';
import { createGateway, type GatewayWorker } from '../../server/gateway.js';
import { intOption } from '../options.js';

/** A --worker SPEC: id=ID,url=BASE_URL[,events=ZMQ][,replay=ZMQ][,metrics=URL][,cla=G1;G2] */
export interface WorkerSpec extends GatewayWorker {
  events?: string;
  replay?: string;
  metrics?: string;
}

export function parseWorkerSpec(spec: string): WorkerSpec {
  const fields = new Map<string, string>();
  for (const part of spec.split(',')) {
    const eq = part.indexOf('=');
    if (eq <= 0) throw new RangeError(`--worker '${spec}': '${part}' is not key=value`);
    const key = part.slice(0, eq).trim();
    if (!['id', 'url', 'events', 'replay', 'metrics', 'cla'].includes(key)) throw new RangeError(`--worker '${spec}': unknown key '${key}'`);
    fields.set(key, part.slice(eq + 1).trim());
  }
  const id = fields.get('id');
  const url = fields.get('url');
  if (!id || !url) throw new RangeError(`--worker '${spec}': id and url are required`);
  if (!/^https?:\/\//.test(url)) throw new RangeError(`--worker '${spec}': url must start with http:// or https://`);
  const cla = fields.get('cla');
  const claGroups = cla?.split(';').map((g) => {
    const n = Number(g);
    if (!Number.isInteger(n) || n < 0) throw new RangeError(`--worker '${spec}': cla group '${g}' is not a non-negative integer`);
    return n;
  });
  if (fields.get('replay') && !fields.get('events')) throw new RangeError(`--worker '${spec}': replay needs events`);
  return { id, url, claGroups, events: fields.get('events'), replay: fields.get('replay'), metrics: fields.get('metrics') };
}

export function registerServeCommand(program: Command): void {
  program
    .command('serve')
    .description('run the OpenAI-compatible routing gateway in front of the engines')
    .option('--host <addr>', 'listen address', '127.0.0.1')
    .option('--port <n>', 'listen port', intOption('--port', 0), 8080)
    .option('--policy <name>', 'routing policy', 'cost')
    .option('--block-size <n>', 'tokens per KV block (the engines\')', intOption('--block-size', 1), 16)
    .option('--tokenize <mode>', 'how prompts are hashed: text, or engine (the worker\'s /tokenize); tokenizer: not yet', 'text')
    .option('--worker <spec>', 'id=ID,url=URL[,events=ZMQ][,replay=ZMQ][,metrics=URL][,cla=G1;G2] (repeatable)', (v: string, all: string[]) => [...all, v], [] as string[])
    .option('--admin-token <token>', 'bearer token for /admin (without it: loopback clients only)')
    .option('--state <store>', 'shared state: memory (redis: not yet)', 'memory')
    .option('--config <file>', 'router.yaml (not yet)')
    .action(async (o: { host: string; port: number; policy: string; blockSize: number; tokenize: string; worker: string[]; adminToken?: string; state: string; config?: string }) => {
      if (o.tokenize !== 'text' && o.tokenize !== 'engine') throw new RangeError(`--tokenize ${o.tokenize} is not supported; use text or engine`);
      if (o.state !== 'memory') throw new RangeError(`--state ${o.state} is not supported yet; use memory`);
      if (o.config) throw new RangeError('--config is not supported yet; pass flags');
      const workers = o.worker.map(parseWorkerSpec);
      const log = (m: string) => process.stderr.write(`${m}\n`);
      // KV events carry token ids: only requests hashed from token ids can match them
      const eventsUsable = o.tokenize !== 'text';
      if (!eventsUsable && workers.some((w) => w.events)) {
        log('warning: KV events are ignored with --tokenize text (they carry token ids, text requests are hashed from text); use --tokenize engine');
      }
      const precise = eventsUsable && workers.some((w) => w.events);
      const router = new KVAwareRouter({ policy: o.policy, blockSize: o.blockSize, indexMode: precise ? 'precise' : 'approximate' });
      const applier = new KvEventApplier(router);
      const gateway = await createGateway({ router, workers, adminToken: o.adminToken, applier, tokenize: o.tokenize as 'text' | 'engine' });
      const subscribers = workers
        .filter((w) => eventsUsable && w.events)
        .map((w) => new KvEventSubscriber({ workerId: w.id, endpoint: w.events!, replayEndpoint: w.replay, applier, log }).start());
      const scraper = new MetricsScraper(router, workers.map((w) => ({ workerId: w.id, url: w.metrics ?? `${w.url.replace(/\/+$/, '')}/metrics` })), { log }).start();
      const address = await gateway.app.listen({ host: o.host, port: o.port });
      log(`contextforge-router serving on ${address} (policy ${o.policy}, ${workers.length} workers, ${precise ? 'precise' : 'approximate'} index)`);
      await new Promise<void>((resolve) => {
        process.once('SIGINT', resolve);
        process.once('SIGTERM', resolve);
      });
      scraper.stop();
      await Promise.all(subscribers.map((s) => s.close()));
      await gateway.close();
    });
}
