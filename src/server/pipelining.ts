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
 *
 * A client may close the connection while answers wait their turn on it. Node closes the
 * response being written (it has the connection) but never the ones queued behind it: they
 * never get the connection, so they never emit 'close', and everything that waits for a
 * response to close (the engine request aborted for a client gone, the router's in-flight
 * ticket, the request body's and the gathered answer's bytes given back, the request counted)
 * would wait for ever. closeWithConnection() closes them with their connection.
 *
 * The gateway closes the connection itself after a refusal has gone out: the requests behind it
 * (refused too, their answers waiting their turn) close with it unanswered, but their client did
 * not leave. refusedOn() tells them from those of a client that closed the connection, so that
 * they are counted with the status they were answered with, not as clients that left (499).
 * So it does after any answer that closes the connection (closeAfterLastAnswer): Node writes
 * none of the answers queued behind it, and would still parse and hand over requests that were
 * sent after it, and give one the connection it is closing.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';

/**
 * Requests served at once on one connection. Clients that pipeline at all (few: browsers, curl
 * and undici's default do not, and none should pipeline a POST) send a handful; 16 leaves them
 * room while bounding what one connection can ask of the engines.
 */
export const MAX_PIPELINED_REQUESTS = 16;

/** A response as Node's server keeps it: `_closed` once it has emitted 'close' (Node's emitCloseNT sets it). */
type ClosableResponse = ServerResponse & { _closed?: boolean };

export class PipelinedRequests {
  /** Connections that had a request refused, with its response: closing after it, nothing more is served. */
  private readonly refused = new WeakMap<Duplex, ServerResponse>();
  /** Per connection: the responses of its requests that have not closed yet (the requests being served). */
  private readonly open = new WeakMap<Duplex, Set<ServerResponse>>();
  /** Connections whose last answer was written (closeAfterLastAnswer). */
  private readonly closedAfterAnswer = new WeakSet<Duplex>();

  /**
   * Closes `res` with its request's connection if the connection closes first: a response queued
   * behind another (pipelined) never gets the connection, and Node never closes it. It closes as
   * one whose client left: destroyed (nothing written to it is kept or sent), unfinished, 'close'
   * emitted once. Called for every request before anything else listens to its response.
   */
  closeWithConnection(req: IncomingMessage, res: ServerResponse): void {
    this.track(req.socket, res);
  }

  /** Counts `res` among its connection's open responses until it closes; the connection's responses. */
  private track(socket: Duplex, res: ServerResponse): Set<ServerResponse> {
    const responses = this.openOn(socket);
    if (!responses.has(res)) {
      responses.add(res);
      res.once('close', () => responses.delete(res));
    }
    return responses;
  }

  /** The connection's open responses, tracked from the first request on it. */
  private openOn(socket: Duplex): Set<ServerResponse> {
    const responses = this.open.get(socket);
    if (responses !== undefined) return responses;
    const created = new Set<ServerResponse>();
    this.open.set(socket, created);
    // before Node's own listeners: the queued requests give up (those waiting for a connection
    // to an engine leave the wait) before the answer that had the connection frees anything
    socket.prependOnceListener('close', () => {
      this.open.delete(socket);
      for (const queued of created) closeQueued(queued);
      created.clear();
    });
    // (a connection closed already has emitted its 'close': Node hands over no request from it)
    return created;
  }

  /** Whether `req` may be served now: false when MAX_PIPELINED_REQUESTS of its connection are. */
  admit(req: IncomingMessage, res: ServerResponse): boolean {
    const socket = req.socket;
    if (this.refused.has(socket)) return false;
    const responses = this.track(socket, res);
    // the requests before this one whose answers have not closed
    if (responses.size - 1 >= MAX_PIPELINED_REQUESTS) {
      this.refused.set(socket, res);
      return false;
    }
    return true;
  }

  /**
   * `socket` had its last answer (one that says `Connection: close`) written: nothing after it on
   * the connection is served (RFC 9112 §9.6). The requests behind it, in flight or answered and
   * waiting their turn, close now, unanswered: their engine requests stop, and none of them is
   * ever given the connection. Node hands over no later request served (closedAfterLastAnswer).
   */
  closeAfterLastAnswer(socket: Duplex): void {
    this.closedAfterAnswer.add(socket);
    const responses = this.open.get(socket);
    if (responses === undefined) return;
    // (a Set's iteration goes on past the entries each close deletes)
    for (const queued of responses) closeQueued(queued);
  }

  /**
   * Whether `socket` had its last answer written (closeAfterLastAnswer): a request Node hands over
   * from it now was sent after that answer, and is neither served nor answered.
   */
  closedAfterLastAnswer(socket: Duplex): boolean {
    return this.closedAfterAnswer.has(socket);
  }

  /**
   * Whether `socket` had a request refused and the refusal went out whole, or had its last answer
   * written: the gateway closes the connection after it, and the responses still queued on it
   * close because of that, not because their client left (it was still there when the answer
   * was written).
   */
  refusedOn(socket: Duplex): boolean {
    return this.closedAfterAnswer.has(socket) || this.refused.get(socket)?.writableFinished === true;
  }
}

/**
 * Closes a response whose connection closed before it got it. The response that has the
 * connection (`res.socket` set) is Node's to close, as is one that finished (Node closes it on
 * the next tick): neither is touched.
 */
function closeQueued(res: ClosableResponse): void {
  if (res.socket || res.writableFinished || res._closed === true) return;
  res.destroy();
  // as Node closes a response (emitCloseNT): once
  res._closed = true;
  res.emit('close');
}
