/**
 * The cap on client connections a process holds at once. Without it the only bound is the
 * file-descriptor limit, which the gateway's own connections to the engines, its KV-event
 * sockets and Redis share: clients that open connections and keep them (idle keep-alive,
 * slow headers) could leave none for the engines.
 *
 * Over the cap a connection is closed as soon as it is accepted (Node's `maxConnections`):
 * nothing of it is read, no parser, buffer or timer is made for it, and the client sees the
 * connection closed at once (a connection error it may retry elsewhere), never a hang. It gets
 * no 503 with a JSON body: a client reliably reads an answer only when the server reads its
 * request first and closes after it (closing with the request unread resets the connection,
 * and the answer with it), so every refused connection would hold a descriptor and a parser
 * for a while past the cap, in the very flood the cap is for.
 */
import type { Server } from 'node:net';

/**
 * 16,384 connections: a quarter of a common descriptor limit (`ulimit -n` 65,536), which leaves
 * room for 16 engines' connections at the default `--engine-connections` (2048 each: 32,768)
 * and the KV-event and Redis sockets. A streamed answer holds one client connection and one
 * engine connection, so past a few engines the engines' connections, not the clients', bound
 * the requests in flight.
 */
export const DEFAULT_MAX_CLIENT_CONNECTIONS = 16_384;

/** The largest cap taken: 2^20, the highest descriptor limit common systems set (Kubernetes' containerd default). */
export const MAX_CLIENT_CONNECTIONS = 1_048_576;

/** `limit` when it is an integer from 1 to MAX_CLIENT_CONNECTIONS; a RangeError or TypeError naming it otherwise. */
export function checkMaxClientConnections(limit: number): number {
  if (typeof limit !== 'number' || !Number.isInteger(limit))
    throw new TypeError(`maxClientConnections must be an integer (got ${String(limit)})`);
  if (limit < 1 || limit > MAX_CLIENT_CONNECTIONS)
    throw new RangeError(`maxClientConnections must be from 1 to ${MAX_CLIENT_CONNECTIONS} (got ${limit})`);
  return limit;
}

/**
 * Caps `server`'s connections at `limit`: one more is closed as it is accepted, and
 * `onRefused` is called for it. The connections open and their requests are not touched.
 */
export function capClientConnections(server: Server, limit: number, onRefused: () => void): void {
  server.maxConnections = checkMaxClientConnections(limit);
  server.on('drop', onRefused);
}

/** Descriptors kept beside the client cap for the engines' connections, KV-event sockets, Redis and files. */
export const DESCRIPTOR_RESERVE = 256;

/**
 * The soft "Max open files" limit of a Linux `/proc/<pid>/limits` text; undefined when the text
 * does not say (another system) or says "unlimited".
 */
export function openFileLimit(limitsText: string): number | undefined {
  const m = /^Max open files\s+(\d+)/m.exec(limitsText);
  return m ? Number(m[1]) : undefined;
}

/**
 * A warning when the process's open-file limit cannot hold its client cap and the reserve: past
 * the limit the kernel refuses new sockets, to clients and engines alike, and nothing counts it
 * (the cap never refuses: it is not reached). Undefined when the limit holds them or is unknown.
 */
export function descriptorLimitWarning(limit: number | undefined, maxClientConnections: number): string | undefined {
  if (limit === undefined || limit >= maxClientConnections + DESCRIPTOR_RESERVE) return undefined;
  return `warning: the open-file limit (${limit}) is below --max-client-connections (${maxClientConnections}) plus ${DESCRIPTOR_RESERVE} for the engines, KV events and Redis: clients past the limit fail to connect before the cap refuses any, and the engines' connections fail with them; raise the limit (ulimit -n, the container's nofile) or lower --max-client-connections`;
}

/** The connections `server` holds now. */
export function openConnections(server: Server): Promise<number> {
  return new Promise((resolve) => server.getConnections((err, n) => resolve(err ? 0 : n)));
}
