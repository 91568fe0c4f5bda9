import type { Gateway } from '../server/gateway.js';
import type { RoutingBackend } from './router-picker.js';

/** The endpoint picker's view of a gateway: its router, state, metrics, workers and request parsing. */
export function gatewayRoutingBackend(gateway: Gateway): RoutingBackend {
  const { router, state, metrics, connections } = gateway;
  return {
    router,
    state,
    metrics,
    limits: gateway.limits,
    forwardKvTransferParams: gateway.forwardKvTransferParams,
    forwardCustomLogitProcessor: gateway.forwardCustomLogitProcessor,
    panic: gateway.panic,
    *workers() {
      for (const w of router.listWorkers()) {
        const c = connections.get(w.id);
        // the rank as the engine's API server takes it in X-data-parallel-rank
        if (c) yield { id: w.id, url: c.record.url, rank: c.headerRank };
      }
    },
    workersWithoutModel: (model) => connections.withoutModel(model),
    workersWithoutRoom: (without, model, promptTokens, outputTokens) =>
      connections.withoutRoom(without, model, promptTokens, outputTokens),
    prepare: (path, body, headers) => gateway.parseRequest(path, { body, headers }),
  };
}
