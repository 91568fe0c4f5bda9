/**
 * Pipelined requests: an HTTP/1.1 client may send several requests on one connection before
 * the first is answered, and their answers must go back in the order they came. Node's server
 * hands each to the gateway as soon as it is parsed, so without a bound one connection would
 * start as many engine requests at once as it could pipeline (past the cap on client
 * connections), and every answer completed behind a slower one would wait in memory until its
 * turn. At most MAX_PIPELINED_REQUESTS are served at once on a connection; the next one is
 * refused (the caller answers it, in its turn, and closes the connection after it), and so is
 * every later one on that connection, which would come after the close.
 *
 * They are served at once, not one after the other: a request waiting for the one before it
 * to be answered would leave its body unread, and a request that has not arrived whole within
 * the request timeout is refused 408 (after the answers before it) and its connection closed.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';

/**
 * Requests served at once on one connection. Clients that pipeline at all (few: browsers, curl
 * and undici's default do not, and none should pipeline a POST) send a handful; 16 leaves them
 * room while bounding what one connection can ask of the engines.
 */
export const MAX_PIPELINED_REQUESTS = 16;

export class PipelinedRequests {
  /** Per connection: its requests being served (their answers not closed yet). */
  private readonly served = new WeakMap<Duplex, number>();
  /** Connections that had a request refused: closing after its answer, nothing more is served. */
  private readonly refused = new WeakSet<Duplex>();

  /** Whether `req` may be served now: false when MAX_PIPELINED_REQUESTS of its connection are. */
  admit(req: IncomingMessage, res: ServerResponse): boolean {
    const socket = req.socket;
    if (this.refused.has(socket)) return false;
    const n = this.served.get(socket) ?? 0;
    if (n >= MAX_PIPELINED_REQUESTS) {
      this.refused.add(socket);
      return false;
    }
    this.served.set(socket, n + 1);
    res.once('close', () => {
      const left = (this.served.get(socket) ?? 1) - 1;
      if (left > 0) this.served.set(socket, left);
      else this.served.delete(socket);
    });
    return true;
  }
}
