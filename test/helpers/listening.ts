import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';

/** Starts `server` on a free loopback port: its URL, and a close that cuts its open connections first. */
export async function listening(server: Server): Promise<{ url: string; close: () => Promise<void> }> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
