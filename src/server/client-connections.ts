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
 *
 * On the HTTP/1.1 listener (IdleClosingCap) a connection that arrives at the cap takes the
 * place of the connection idle the longest, as nginx reuses its idle keep-alive connections
 * when its worker_connections run out: otherwise a client could hold the cap's worth of
 * keep-alive connections idle and have every other client refused until their keep-alive
 * timeouts fire. Only when no connection is idle is the newcomer refused. A connection is idle
 * when no request of it is in progress and none has begun:
 * - from the moment it is accepted until its first byte is read (nothing of it has been read:
 *   closing it loses nothing the gateway had), and
 * - from the moment its last answer has been written whole, its request read whole and the
 *   connection kept alive, until the next byte is read.
 * A byte read since is a request begun: its headers may be half received, and closing it would
 * cut a request the client is sending. It is not idle, nor is a connection whose answer is
 * being written (a stream in flight), whose request body is still arriving, or which is
 * closing after its answer (whose client may still be reading it). A connection whose headers
 * never complete is closed by the headers timeout. Bytes that reached the gateway before the
 * connection went idle, with no request made of them yet (a pipelining client's next request
 * cut between two reads), are not seen: such a connection counts as idle. Nor are bytes still
 * on their way, as they are when a client reuses a keep-alive connection the moment a keep-alive
 * timeout closes it: clients anticipate a close before any answer (RFC 9112 §9.3.1), and no
 * request of such a connection had reached the gateway, so it can be sent again.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Server, Socket } from 'node:net';

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

/** A net.Server's count of its connections, the one `maxConnections` is checked against. */
type CountingServer = Server & { _connections: number };

/**
 * Caps an HTTP/1.1 server's connections at `limit`, closing the connection idle the longest to
 * make room for a new one (the module's comment says which are idle); a new connection is
 * refused, as capClientConnections refuses it, only when none is. The server calls
 * requestStarted() for each request it serves.
 *
 * Node refuses a connection at accept when `maxConnections` are open, before any code sees it.
 * It is kept at `limit` plus the idle connections: a connection past `limit` is accepted as long
 * as one may be idle, and takes its place. The idle connections are kept in the order they went
 * idle, so the longest idle is the first: a connection leaves them when a request of its begins,
 * and one whose bytes came in while it sat there is dropped when the cap comes to it. Nothing
 * per accept depends on the number of connections. When every connection that seemed idle had
 * begun a request, the newcomer Node accepted is closed here, before anything of it is read
 * (Node's server has given it a parser, freed as it closes), and counted as refused.
 */
export class IdleClosingCap {
  /** The connections idle, longest idle first, with the bytes read from each when it went idle. */
  private readonly idle = new Map<Socket, number>();
  /** The requests of each connection being served: responses not closed yet. */
  private readonly serving = new WeakMap<Socket, number>();
  /** Connections whose close takes them out of `idle`. */
  private readonly watched = new WeakSet<Socket>();

  constructor(
    private readonly server: Server,
    private readonly limit: number,
    private readonly on: { refused: () => void; idleClosed: () => void },
  ) {
    capClientConnections(server, limit, on.refused);
    // before the HTTP server's own listener: a connection refused here is closed before it is read
    server.prependListener('connection', (socket: Socket) => this.accepted(socket));
  }

  /** A request of `req`'s connection is served until `res` closes: the connection is not idle until then. */
  requestStarted(req: IncomingMessage, res: ServerResponse): void {
    const socket = req.socket;
    this.leaveIdle(socket);
    this.serving.set(socket, (this.serving.get(socket) ?? 0) + 1);
    res.once('close', () => {
      const left = (this.serving.get(socket) ?? 1) - 1;
      this.serving.set(socket, left);
      // its connection is idle once its last answer went out whole on a connection kept alive
      // (one closing after its answer is no longer writable: its client may still be reading it)
      // and its request was read whole (the rest of a body would still be arriving)
      if (left > 0 || socket.destroyed || !socket.writable || !res.writableFinished || !req.complete) return;
      this.enterIdle(socket);
    });
  }

  private accepted(socket: Socket): void {
    // Node has counted it: past the limit only while a connection may be idle
    if ((this.server as CountingServer)._connections > this.limit && !this.closeLongestIdle()) {
      // each connection that seemed idle had begun a request
      socket.destroy();
      this.on.refused();
      return;
    }
    // idle until its first byte is read
    this.enterIdle(socket);
  }

  /** Closes the connection idle the longest; false when none is. */
  private closeLongestIdle(): boolean {
    for (const [socket, bytesRead] of this.idle) {
      this.idle.delete(socket);
      // a request has begun on it since it went idle
      if (socket.destroyed || socket.bytesRead !== bytesRead) continue;
      // destroyed now (Node counts it out at once), not ended: its place is needed now
      socket.destroy();
      this.on.idleClosed();
      this.fit();
      return true;
    }
    this.fit();
    return false;
  }

  /** `socket` goes idle now: it comes last, the longest idle are closed first. */
  private enterIdle(socket: Socket): void {
    if (!this.watched.has(socket)) {
      this.watched.add(socket);
      socket.once('close', () => this.leaveIdle(socket));
    }
    this.idle.delete(socket);
    this.idle.set(socket, socket.bytesRead);
    this.fit();
  }

  private leaveIdle(socket: Socket): void {
    if (this.idle.delete(socket)) this.fit();
  }

  /** One connection past the limit is accepted for each that may be idle. */
  private fit(): void {
    this.server.maxConnections = this.limit + this.idle.size;
  }
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
