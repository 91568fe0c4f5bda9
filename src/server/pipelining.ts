/**
 * Pipelined requests: an HTTP/1.1 client may send several requests on one connection before
 * the first is answered, and their answers must go back in the order they came. Node's server
 * hands each to the gateway as soon as it is parsed, so without this one connection would start
 * as many engine requests at once as it can pipeline (past the cap on client connections), and
 * every answer that completes behind a slower one would wait in memory, whole. Here a
 * connection's requests are served one after the other: each once the answer before it has
 * gone (or its connection closed), which is when its own answer could start anyway. At most
 * MAX_QUEUED_PIPELINED_REQUESTS wait behind the one served; the next one is refused (the
 * caller answers it, in its turn, and closes the connection after it), and so is every later
 * one on that connection, which would come after the close.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';

/**
 * Requests waiting behind the one served on a connection. Clients that pipeline at all (few:
 * browsers, curl and undici's default do not) send a handful; 16 leaves them room while one
 * connection's share of the engines stays one request.
 */
export const MAX_QUEUED_PIPELINED_REQUESTS = 16;

export class PipelinedRequests {
  /** Per connection with a request being served: the requests waiting behind it, in order. */
  private readonly waiting = new WeakMap<Duplex, (() => void)[]>();
  /** Connections that had a request refused: closing after its answer, nothing more is served. */
  private readonly refused = new WeakSet<Duplex>();

  /**
   * Calls `serve(req, res)` now when no earlier request of its connection is being served,
   * else once those before it have been; false (nothing called) when too many already wait.
   */
  admit(
    req: IncomingMessage,
    res: ServerResponse,
    serve: (req: IncomingMessage, res: ServerResponse) => void,
  ): boolean {
    const socket = req.socket;
    if (this.refused.has(socket)) return false;
    const queue = this.waiting.get(socket);
    if (queue === undefined) {
      this.waiting.set(socket, []);
      this.serve(socket, req, res, serve);
      return true;
    }
    if (queue.length >= MAX_QUEUED_PIPELINED_REQUESTS) {
      this.refused.add(socket);
      return false;
    }
    queue.push(() => this.serve(socket, req, res, serve));
    return true;
  }

  private serve(
    socket: Duplex,
    req: IncomingMessage,
    res: ServerResponse,
    serve: (req: IncomingMessage, res: ServerResponse) => void,
  ): void {
    res.once('close', () => this.next(socket));
    serve(req, res);
  }

  /** The answer being served on `socket` is done: the next request waiting there is served. */
  private next(socket: Duplex): void {
    const queue = this.waiting.get(socket);
    const following = socket.destroyed ? undefined : queue?.shift();
    // a connection gone takes the requests waiting on it with it
    if (following === undefined) this.waiting.delete(socket);
    else following();
  }
}
