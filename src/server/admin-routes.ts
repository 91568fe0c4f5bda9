/**
 * The /admin API as a Fastify plugin: list, add, remove, drain and resume workers, router
 * stats, and KV events posted as JSON (for engines that cannot publish over ZeroMQ). Every
 * route needs the admin token, from a same-site `application/json` request (admin-auth.ts);
 * being on loopback grants nothing.
 */
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import type { KVAwareRouter } from '../core/router/index.js';
import type { WorkerHealth } from '../engines/health.js';
import { KvEventFormatError, readJsonEvents, type JsonEventsReader } from '../engines/kv-events/decode.js';
import type { StateStore, WorkerRecord } from '../state/state-store.js';
import { adminRequestProblem, authorizationProblem, type AdminToken } from './admin-auth.js';
import { openAiError } from './openai-request.js';
import type { PostedEvents } from './posted-events.js';
import { clientMessage } from './request-limits.js';
import { KeyEnvError, parseWorkerRecord, redactUrl, workerErrorField } from './worker-input.js';
import { SocketLimitError, WorkerLimitError, type WorkerConnections } from './worker-connections.js';

export interface AdminRoutesOptions {
  router: KVAwareRouter;
  connections: WorkerConnections;
  health: WorkerHealth;
  state: StateStore;
  /** Applies posted KV events (in slices, each worker's lists in turn). */
  postedEvents: PostedEvents;
  /** The admin bearer token. */
  adminToken: AdminToken;
  /** Adds a worker here and in the shared state. */
  addWorker(w: WorkerRecord): void;
  /** Removes a worker here and from the shared state; false when unknown. */
  removeWorker(id: string): boolean;
  /** Drains (true) or resumes (false) a worker here and in the shared state; false when unknown. */
  drainWorker(id: string, draining: boolean): boolean;
}

export const adminRoutes: FastifyPluginAsync<AdminRoutesOptions> = async (admin, options) => {
  const { router, connections, health, state, postedEvents, addWorker, removeWorker, drainWorker } = options;
  admin.addHook('onRequest', requireAdmin(options.adminToken));
  admin.get('/admin/workers', async () => ({
    workers: router.listWorkers().map((w) => {
      const c = connections.get(w.id);
      return {
        id: w.id,
        ...(c && c.rank !== null ? { worker: c.workerId, rank: c.rank } : {}),
        url: c ? redactUrl(c.record.url) : undefined,
        healthy: w.healthy,
        outOfRotation: health.reasons(w.id),
        draining: w.draining,
        kvUsage: w.load,
        models: c?.record.models ?? null,
        kvEvents: c?.subscriber?.stats ?? null,
        inFlightRequests: w.inFlightRequests,
        waitingRequests: w.waitingRequests,
        runningRequests: w.runningRequests,
        indexEntries: router.index.entriesFor(w.slot),
        claGroups: [...w.claGroups],
      };
    }),
  }));
  admin.post('/admin/workers', async (req, reply) => {
    let record: WorkerRecord;
    try {
      record = parseWorkerRecord(req.body, 'worker');
    } catch (err) {
      return openAiError(reply, 400, clientMessage(err, 'the worker is malformed'), workerErrorField(err));
    }
    if (connections.has(record.id)) return openAiError(reply, 409, `worker '${record.id}' exists`, 'id');
    try {
      addWorker(record);
    } catch (err) {
      // the router is full: the request is sound, the state refuses it
      if (err instanceof WorkerLimitError) return openAiError(reply, 409, err.message, err.field);
      // out of ZeroMQ sockets: the request is sound, the process cannot take it until some close
      if (err instanceof SocketLimitError) return openAiError(reply, 503, err.message, 'events');
      if (err instanceof KeyEnvError) return openAiError(reply, 400, err.message, err.field);
      if (err instanceof RangeError || err instanceof TypeError)
        return openAiError(reply, 400, clientMessage(err, 'the worker is malformed'));
      throw err;
    }
    return reply.code(201).send({ id: record.id });
  });
  admin.delete('/admin/workers/:id', async (req, reply) => {
    const { id } = req.params as { id: string };
    // a rank is not removed alone (the engine serves them all): removing the worker is asked by its own id
    const rankOf = connections.get(id)?.workerId;
    if (rankOf !== undefined && rankOf !== id)
      return openAiError(reply, 400, `'${id}' is a rank of worker '${rankOf}'; remove '${rankOf}'`, 'id');
    return removeWorker(id) ? { removed: id } : openAiError(reply, 404, `no worker '${id}'`);
  });
  admin.post('/admin/workers/:id/drain', async (req, reply) => {
    const { id } = req.params as { id: string };
    // every rank of it (a rank's id names its worker), in every replica
    return drainWorker(id, true) ? { draining: id } : openAiError(reply, 404, `no worker '${id}'`);
  });
  admin.post('/admin/workers/:id/resume', async (req, reply) => {
    const { id } = req.params as { id: string };
    return drainWorker(id, false) ? { resumed: id } : openAiError(reply, 404, `no worker '${id}'`);
  });
  admin.get('/admin/stats', async () => ({ ...router.getStats(), state: state.stats() }));
  // KV events as JSON, for engines that cannot publish over ZeroMQ: vLLM's field names
  admin.post('/admin/events', async (req, reply) => {
    const b = req.body as { worker?: unknown; events?: unknown } | null;
    if (!b || typeof b.worker !== 'string' || connections.get(b.worker) === undefined)
      return openAiError(
        reply,
        400,
        'events need the id of a known worker (ID#r for a data-parallel rank) in "worker"',
        'worker',
      );
    let reader: JsonEventsReader;
    try {
      reader = readJsonEvents(b.events);
    } catch (err) {
      if (err instanceof KvEventFormatError) return openAiError(reply, 400, err.message, 'events');
      throw err;
    }
    const worker = b.worker;
    const connection = connections.get(worker);
    // an event that cannot be read is skipped (listed with its reason), as on the ZeroMQ path
    const out = await postedEvents.apply(worker, reader, () => connections.get(worker) === connection);
    if ('refusedWaiting' in out) {
      void reply.header('retry-after', '1');
      return openAiError(
        reply,
        429,
        `${out.refusedWaiting} lists of events for worker '${worker}' are waiting to be applied; post this one again once they are (each answer says when its list applied)`,
        'worker',
      );
    }
    if ('removedAfter' in out)
      return openAiError(
        reply,
        409,
        `worker '${worker}' was removed while its events were applied (${out.removedAfter} of ${reader.count} applied)`,
        'worker',
      );
    // the other replicas' indexes take them too (the engine posted to whichever replica it reached)
    state.kvEventsPosted(worker, b.events);
    return { applied: out.applied, skipped: out.skipped };
  });
};

/** An onRequest hook for the admin endpoints (and /v1/route unless it is public). */
export function requireAdmin(token: AdminToken) {
  return async (req: FastifyRequest, reply: FastifyReply) => {
    const problem = adminRequestProblem(req.method, req.headers) ?? authorizationProblem(req.raw);
    if (problem) return openAiError(reply, problem.status, problem.message, problem.param);
    if (!token.matches(req.headers.authorization))
      return openAiError(reply, 401, 'this endpoint needs the admin token (Authorization: Bearer TOKEN)');
  };
}
