import { connect, type Socket } from 'node:net';
import { until } from './wait.js';

/** A client connection of raw bytes to a local server, and everything it received (latin1: one character a byte). */
export interface RawClient {
  socket: Socket;
  received: () => string;
  closed: () => boolean;
}

/** Connects to 127.0.0.1:`port`; resolves once connected, rejects if the connection closes first. */
export async function rawClient(port: number): Promise<RawClient> {
  const socket = connect(port, '127.0.0.1');
  let received = '';
  let closed = false;
  socket.on('data', (d: Buffer) => (received += d.toString('latin1')));
  socket.on('error', () => {});
  socket.on('close', () => (closed = true));
  await new Promise<void>((r, reject) => {
    socket.once('connect', () => r());
    socket.once('close', () => reject(new Error('the connection closed before it was made')));
  });
  return { socket, received: () => received, closed: () => closed };
}

/** Writes `raw` on a new connection to `port`; resolves once the server closed it, with what it received. */
export async function exchangeUntilClosed(port: number, raw: string): Promise<string> {
  const client = await rawClient(port);
  try {
    client.socket.write(raw);
    await until(client.closed, `the connection to close after ${JSON.stringify(raw.slice(0, 40))}`);
    return client.received();
  } finally {
    client.socket.destroy();
  }
}
