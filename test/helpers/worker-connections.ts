import { WorkerHealth } from '../../src/engines/health.js';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { KVAwareRouter } from '../../src/index.js';
import { WorkerConnections } from '../../src/server/worker-connections.js';

/**
 * A round-robin router and the WorkerConnections over it with no health check, metrics scrape or
 * model listing of their own: the test gives the verdicts through `health`.
 */
export function quietConnections(): { router: KVAwareRouter; health: WorkerHealth; connections: WorkerConnections } {
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const health = new WorkerHealth(router);
  const connections = new WorkerConnections({
    router,
    applier: new KvEventApplier(router),
    health,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    modelsIntervalMs: 0,
    log: () => {},
    env: {},
  });
  return { router, health, connections };
}

/**
 * Puts a request for `model` unanswered on worker `id` (a stand-in: no connection carries it);
 * returns how many times it has been told to move since. `listedOnly`: it was retried after an
 * engine's model-not-found 404 (UnansweredRequest.listedOnly); `promptTokens`: its prompt's token
 * count, known (UnansweredRequest.promptTokens).
 */
export function keptRequest(
  connections: WorkerConnections,
  id: string,
  model: string | undefined,
  listedOnly = false,
  promptTokens?: number,
): () => number {
  let moved = 0;
  connections.get(id)!.unanswered.add({
    model,
    failedWorkers: new Set(),
    listedOnly,
    promptTokens,
    outputTokens: undefined,
    lastAttempt: false,
    workerOut: () => moved++,
  });
  return () => moved;
}
