import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import { fakeEngine, type FakeEngine } from '../faults/harness.js';

/** A gateway listening on a free loopback port in front of one engine that answers every completion. */
export interface GatewayOnEngine {
  engine: FakeEngine;
  gateway: Gateway;
  /** The gateway's port on 127.0.0.1. */
  port: number;
  /** Completions (POSTs) that reached the engine; the gateway's own reads, such as /v1/models, are not counted. */
  completions: () => number;
  /** Closes the gateway, cutting what is still in flight, then the engine. */
  close: () => Promise<void>;
}

/**
 * Starts an engine that reads each request whole and answers 200 with a small JSON completion
 * (with its Content-Length), and a round-robin gateway in front of it as worker `e0`, polling
 * neither health nor metrics. `options` add to (or replace) the gateway's options: body
 * limits, an admin token.
 */
export async function gatewayOnEngine(
  options: Omit<Partial<GatewayOptions>, 'router' | 'workers'> = {},
): Promise<GatewayOnEngine> {
  let completions = 0;
  const engine = await fakeEngine((req, res) => {
    if (req.method === 'POST') completions++;
    req.resume();
    req.on('end', () => {
      const text = '{"choices":[{"text":"ok"}]}';
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': text.length }).end(text);
    });
  });
  let gateway: Gateway | undefined;
  try {
    gateway = await createGateway({
      router: new KVAwareRouter({ policy: 'round-robin' }),
      workers: [{ id: 'e0', url: engine.url }],
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      ...options,
    });
    await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  } catch (err) {
    await gateway?.close(0);
    await engine.close();
    throw err;
  }
  const started = gateway;
  return {
    engine,
    gateway: started,
    port: (started.app.server.address() as { port: number }).port,
    completions: () => completions,
    close: async () => {
      await started.close(0);
      await engine.close();
    },
  };
}
