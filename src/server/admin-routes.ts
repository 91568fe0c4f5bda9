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
import { SharedStateUnanswered, type StateStore, type WorkerRecord } from '../state/state-store.js';
import { adminRequestProblem, authorizationProblem, type AdminToken } from './admin-auth.js';
import { openAiError } from './openai-request.js';
import type { PostedEvents } from './posted-events.js';
import { clientMessage } from './request-limits.js';
import { sharedEndpoint, sharedEndpointMessage } from './engine-deployments.js';
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
  /** A worker's deadline (ms) for a streamed answer's first byte, as learned so far. */
  firstByteDeadlineMs?(workerId: string): number;
  /**
   * Adds a worker here and in the shared state; throws WorkerChangeRefused (409) for an id held
   * already. A promise when the shared state decides worker changes
   * (StateStore.orderWorkerChange()): it rejects with WorkerChangeRefused for the shared state's
   * refusal, SharedStateUnanswered when it did not answer.
   */
  addWorker(w: WorkerRecord): void | Promise<void>;
  /** Removes a worker here and from the shared state; false when unknown. */
  removeWorker(id: string): boolean | Promise<boolean>;
  /** Drains (true) or resumes (false) a worker here and in the shared state; false when unknown. */
  drainWorker(id: string, draining: boolean): boolean | Promise<boolean>;
  /**
   * Present when the shared state decides worker changes: resolves once every change it
   * answered before is applied here, so a read shows them (rejects with SharedStateUnanswered).
   */
  syncWorkers?(): Promise<void>;
}

/** The shared state refused an admin worker change: answered with its status and message. */
export class WorkerChangeRefused extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param?: string,
  ) {
    super(message);
    this.name = 'WorkerChangeRefused';
  }
}

/** Answers what the shared state refused or did not answer; undefined for any other error. */
function sharedStateAnswer(reply: FastifyReply, err: unknown) {
  if (err instanceof WorkerChangeRefused) return openAiError(reply, err.status, err.message, err.param);
  if (err instanceof SharedStateUnanswered) return openAiError(reply, 503, err.message);
  return undefined;
}

/** Runs `change`; what the shared state refused or did not answer is answered, anything else thrown. */
async function sharedChange<T>(reply: FastifyReply, change: () => T | Promise<T>, answer: (r: T) => unknown) {
  let result: T;
  try {
    result = await change();
  } catch (err) {
    const answered = sharedStateAnswer(reply, err);
    if (answered === undefined) throw err;
    return answered;
  }
  return answer(result);
}

export const adminRoutes: FastifyPluginAsync<AdminRoutesOptions> = async (admin, options) => {
  const { router, connections, health, state, postedEvents, addWorker, removeWorker, drainWorker, syncWorkers } =
    options;
  admin.addHook('onRequest', requireAdmin(options.adminToken));
  admin.get('/admin/workers', async (_req, reply) => {
    // every change some process answered is applied here first
    if (syncWorkers) {
      const answered = await sharedChange(reply, syncWorkers, () => undefined);
      if (answered !== undefined) return answered;
    }
    return listWorkers();
  });
  const listWorkers = () => ({
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
        ...(options.firstByteDeadlineMs ? { firstByteDeadlineMs: options.firstByteDeadlineMs(w.id) } : {}),
        waitingRequests: w.waitingRequests,
        runningRequests: w.runningRequests,
        indexEntries: router.index.entriesFor(w.slot),
        claGroups: [...w.claGroups],
      };
    }),
  });
  admin.post('/admin/workers', async (req, reply) => {
    let record: WorkerRecord;
    try {
      record = parseWorkerRecord(req.body, 'worker');
    } catch (err) {
      return openAiError(reply, 400, clientMessage(err, 'the worker is malformed'), workerErrorField(err));
    }
    // an engine publishes one event stream: a worker on one another worker has is refused
    const shared = sharedEndpoint(record, connections.records());
    if (shared !== undefined) return openAiError(reply, 409, sharedEndpointMessage(shared), shared.field);
    // an id held already is refused by addWorker (WorkerChangeRefused): by this replica's view, or
    // by the shared state's when it decides worker changes
    try {
      await addWorker(record);
    } catch (err) {
      const answered = sharedStateAnswer(reply, err);
      if (answered !== undefined) return answered;
      // the router is full: the request is sound, the state refuses it
      if (err instanceof WorkerLimitError) return openAiError(reply, 409, err.message, err.field);
      // out of ZeroMQ sockets: the request is sound, the process cannot take it until some close
      if (err instanceof SocketLimitError) return openAiError(reply, 503, err.message, 'events');
      if (err instanceof KeyEnvError) return openAiError(reply, 400, err.message, err.field);
      // an endpoint ZeroMQ refuses names its field (WorkerConnections.add)
      if (err instanceof RangeError || err instanceof TypeError)
        return openAiError(reply, 400, clientMessage(err, 'the worker is malformed'), workerErrorField(err));
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
    return sharedChange(
      reply,
      () => removeWorker(id),
      (removed) => (removed ? { removed: id } : openAiError(reply, 404, `no worker '${id}'`, 'id')),
    );
  });
  admin.post('/admin/workers/:id/drain', async (req, reply) => {
    const { id } = req.params as { id: string };
    // every rank of it (a rank's id names its worker), in every replica
    return sharedChange(
      reply,
      () => drainWorker(id, true),
      (known) => (known ? { draining: id } : openAiError(reply, 404, `no worker '${id}'`, 'id')),
    );
  });
  admin.post('/admin/workers/:id/resume', async (req, reply) => {
    const { id } = req.params as { id: string };
    return sharedChange(
      reply,
      () => drainWorker(id, false),
      (known) => (known ? { resumed: id } : openAiError(reply, 404, `no worker '${id}'`, 'id')),
    );
  });
  admin.get('/admin/stats', async () => ({ ...router.getStats(), state: state.stats() }));
  // KV events as JSON, for engines that cannot publish over ZeroMQ: vLLM's field names
  admin.post('/admin/events', async (req, reply) => {
    const b = req.body as { worker?: unknown; events?: unknown } | null;
    // a field the gateway does not read is refused, not ignored: a sender meaning something by
    // it (vLLM's data_parallel_rank, where a rank is named `worker: "ID#r"`) would be misread
    const unknown =
      b !== null && typeof b === 'object' && !Array.isArray(b)
        ? Object.keys(b).find((k) => !EVENTS_BODY_KEYS.has(k))
        : undefined;
    if (unknown !== undefined) {
      const field = unknown.slice(0, 64);
      return openAiError(reply, 400, `unknown field ${JSON.stringify(field)}: the body is {worker, events}`, field);
    }
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

/** The fields of a POST /admin/events body. */
const EVENTS_BODY_KEYS = new Set(['worker', 'events']);

/** An onRequest hook for the admin endpoints (and /v1/route unless it is public). */
export function requireAdmin(token: AdminToken) {
  return async (req: FastifyRequest, reply: FastifyReply) => {
    const problem = adminRequestProblem(req.method, req.headers) ?? authorizationProblem(req.raw);
    if (problem) return openAiError(reply, problem.status, problem.message, problem.param);
    if (!token.matches(req.headers.authorization))
      return openAiError(reply, 401, 'this endpoint needs the admin token (Authorization: Bearer TOKEN)');
  };
}
