/**
 * The reference proxy for bench:proxy: the least a Node HTTP proxy does, so that the router's
 * figures can be read against what any Node proxy achieves on the same machine. A node:http
 * server takes each request, reads its body, sends method, path, content-type and body to one
 * upstream over an undici Pool (dispatch with a handler, as the router sends its requests), and
 * answers with the upstream's status, content-type and body (gathered, then written once with
 * its length, as the router writes a non-streamed answer).
 *
 * Deliberately left out, because the router does them and a bare proxy need not: routing (one
 * upstream, no choice), parsing or checking the request body, API keys, metrics, retries and
 * circuit breaking, timeouts beyond undici's defaults, passing a stream through as it arrives (a
 * streamed answer reaches the client whole), other request and response headers, and cancelling
 * the upstream request when the client goes away. An upstream failure is answered 502.
 *
 *   node --import tsx bench/reference-proxy.ts --upstream http://127.0.0.1:8001 [--port 0] [--host 127.0.0.1]
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Pool, type Dispatcher } from 'undici';
import { benchFlags, intFlag } from './stats.js';

const flags = benchFlags(process.argv.slice(2), { upstream: 'value', port: 'value', host: 'value' });
const upstream = flags.get('upstream');
if (typeof upstream !== 'string') {
  process.stderr.write('error: --upstream URL is required (the engine to forward to)\n');
  process.exit(2);
}
const port = intFlag(flags, 'port', 0);
const host = flags.get('host');
let origin: string;
try {
  origin = new URL(upstream).origin;
} catch {
  process.stderr.write(`error: --upstream '${upstream}' is not a URL\n`);
  process.exit(2);
}

// the router's pool settings (src/server/worker-connections.ts)
const pool = new Pool(origin, { connections: 256, keepAliveTimeout: 30_000 });

/** The upstream's answer to one request, gathered and written to the client once complete. */
class Relay implements Dispatcher.DispatchHandler {
  private status = 502;
  private contentType = 'application/json';
  private readonly parts: Buffer[] = [];

  constructor(private readonly res: ServerResponse) {}

  onConnect(): void {}

  onHeaders(statusCode: number, rawHeaders: Buffer[]): boolean {
    if (statusCode < 200) return true;
    this.status = statusCode;
    for (let i = 0; i < rawHeaders.length; i += 2) {
      if (rawHeaders[i].toString('latin1').toLowerCase() === 'content-type') {
        this.contentType = rawHeaders[i + 1].toString('latin1');
      }
    }
    return true;
  }

  onData(chunk: Buffer): boolean {
    this.parts.push(chunk);
    return true;
  }

  onComplete(): void {
    const payload = this.parts.length === 1 ? this.parts[0] : Buffer.concat(this.parts);
    this.res.writeHead(this.status, { 'content-type': this.contentType, 'content-length': String(payload.length) });
    this.res.end(payload);
  }

  onError(): void {
    if (this.res.headersSent) this.res.destroy();
    else this.res.writeHead(502, { 'content-type': 'text/plain' }).end('upstream failed');
  }
}

function handle(req: IncomingMessage, res: ServerResponse): void {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const headers: Record<string, string> = {};
    const type = req.headers['content-type'];
    if (type !== undefined) headers['content-type'] = type;
    const method = req.method ?? 'GET';
    pool.dispatch(
      {
        path: req.url ?? '/',
        method: method as Dispatcher.HttpMethod,
        headers,
        body: method === 'GET' || method === 'HEAD' ? null : chunks.length === 1 ? chunks[0] : Buffer.concat(chunks),
      },
      new Relay(res),
    );
  });
  req.on('error', () => {});
}

const server = createServer(handle);
// as the router's server: longer than clients keep idle connections, so it never closes one first
server.keepAliveTimeout = 72_000;
server.listen(port, typeof host === 'string' ? host : '127.0.0.1', () => {
  const a = server.address() as AddressInfo;
  process.stderr.write(`reference proxy on http://${a.address}:${a.port}\n`);
});
for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.once(signal, () => {
    server.close();
    server.closeAllConnections();
    void pool.close().finally(() => process.exit(0));
  });
}
