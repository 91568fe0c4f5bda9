import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type GatewayWorker } from '../../src/server/gateway.js';

/** What an admin API call answered: its status, its body, and the error the body names, if any. */
export interface AdminAnswer {
  status: number;
  text: string;
  error?: { message: string; param: string | null };
}

/** A caller of the gateway's admin API at `base` with `token`, a JSON body when given. */
export function adminCaller(base: string, token: string) {
  return async (method: string, path: string, body?: unknown): Promise<AdminAnswer> => {
    const res = await fetch(`${base}${path}`, {
      method,
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, text, error: (JSON.parse(text) as Pick<AdminAnswer, 'error'>).error };
  };
}

/**
 * A gateway in precise mode (4-token blocks) with an admin token, on a free loopback port, in
 * front of `workers` that it neither scrapes nor probes; `call` calls its admin API.
 */
export async function adminGateway(adminToken: string, workers: GatewayWorker[]) {
  const gateway = await createGateway({
    adminToken,
    router: new KVAwareRouter({ blockSize: 4, indexMode: 'precise' }),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    workers,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return { gateway, call: adminCaller(base, adminToken), close: () => gateway.close() };
}
