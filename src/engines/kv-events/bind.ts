import type { Socket } from 'zeromq';

/** Attempts at a port of `*` before its bind's EADDRINUSE is given up on. */
const WILDCARD_BIND_ATTEMPTS = 20;

/**
 * Binds `socket` to `endpoint`. A port of `*` lets the kernel pick a free one, but libzmq
 * listens with SO_REUSEADDR, and Linux may then hand out a port an outgoing connection already
 * uses locally: listen() fails with EADDRINUSE though nothing listens there. Another pick
 * succeeds, so a wildcard bind tries again; a fixed port's EADDRINUSE is a real conflict and
 * is thrown at once.
 */
export async function bindEndpoint(socket: Socket, endpoint: string): Promise<void> {
  const wildcard = endpoint.endsWith(':*');
  for (let attempt = 1; ; attempt++) {
    try {
      await socket.bind(endpoint);
      return;
    } catch (err) {
      const inUse = (err as { code?: unknown } | null)?.code === 'EADDRINUSE';
      if (!wildcard || !inUse || attempt >= WILDCARD_BIND_ATTEMPTS) throw err;
    }
  }
}
