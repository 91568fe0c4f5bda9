import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { credentials, makeGenericClientConstructor, type ClientDuplexStream } from '@grpc/grpc-js';
import { request } from 'undici';
import {
  extProcService,
  structToPlain,
  type HeaderValueOption,
  type ProcessingRequest,
  type ProcessingResponse,
} from '../../src/epp/proto.js';
import {
  DESTINATION_ENDPOINT_KEY,
  DESTINATION_ENDPOINT_NAMESPACE,
  DESTINATION_ENDPOINT_SERVED_KEY,
  SUBSET_HINT_KEY,
  SUBSET_HINT_NAMESPACE,
} from '../../src/epp/protocol.js';
import { statusNumber } from './http-status.js';

/**
 * A small HTTP proxy that does an Envoy gateway's job in front of an endpoint picker, the way
 * the Gateway API Inference Extension configures Envoy: each request's headers and body go to
 * the picker over ext_proc (FULL_DUPLEX_STREAMED, body chunks as they arrive), the picker's
 * header and body answers are applied, the request is sent to the first endpoint of
 * x-gateway-destination-endpoint and, on a connection failure or a 5xx, to the next ones in
 * order; the served endpoint goes back to the picker in the response phase, and the response
 * body streams through the picker to the client. Not Envoy: what it checks is the protocol,
 * not Envoy's own code.
 */
export interface LoopbackEnvoy {
  url: string;
  /** Requests that needed a fallback endpoint. */
  fallbacks: number;
  close(): Promise<void>;
}

type Call = ClientDuplexStream<ProcessingRequest, ProcessingResponse>;

class Inbox {
  private readonly queue: ProcessingResponse[] = [];
  private waiter: (() => void) | undefined;
  ended = false;
  error: Error | undefined;
  constructor(call: Call) {
    call.on('data', (m: ProcessingResponse) => {
      this.queue.push(m);
      this.waiter?.();
    });
    call.on('end', () => {
      this.ended = true;
      this.waiter?.();
    });
    call.on('error', (e: Error) => {
      this.error = e;
      this.ended = true;
      this.waiter?.();
    });
  }
  async next(timeoutMs = 10_000): Promise<ProcessingResponse> {
    const deadline = Date.now() + timeoutMs;
    while (this.queue.length === 0) {
      if (this.ended) throw new Error(`ext_proc stream ended: ${this.error?.message ?? 'OK'}`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no ext_proc message within ${timeoutMs} ms`);
      await new Promise<void>((r) => {
        const t = setTimeout(r, left); // the deadline, cleared when a message or the end arrives
        this.waiter = () => {
          clearTimeout(t);
          r();
        };
      });
      this.waiter = undefined;
    }
    return this.queue.shift()!;
  }
}

const HOP = new Set([
  'connection',
  'keep-alive',
  'transfer-encoding',
  'upgrade',
  'host',
  'content-length',
  'te',
  'trailer',
  'proxy-connection',
]);
const text = (h: HeaderValueOption['header']) =>
  h.raw_value && h.raw_value.length > 0 ? Buffer.from(h.raw_value).toString() : (h.value ?? '');

export async function startLoopbackEnvoy(options: {
  extProc: string;
  subset?: string[] | string;
}): Promise<LoopbackEnvoy> {
  const Ctor = makeGenericClientConstructor(extProcService(), 'ExternalProcessor');
  const client = new Ctor(options.extProc, credentials.createInsecure()) as unknown as {
    Process(): Call;
    close(): void;
  };
  const state = { fallbacks: 0 };

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const call = client.Process();
    const inbox = new Inbox(call);
    const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
    const headers = [
      { key: ':method', raw_value: Buffer.from(req.method ?? 'GET') },
      { key: ':path', raw_value: Buffer.from(req.url ?? '/') },
      { key: ':authority', raw_value: Buffer.from(req.headers.host ?? 'gateway') },
      ...Object.entries(req.headers)
        .filter(([k]) => k !== 'host')
        .map(([key, v]) => ({ key, raw_value: Buffer.from(Array.isArray(v) ? v.join(',') : (v ?? '')) })),
    ];
    const subset = options.subset;
    call.write({
      request_headers: { headers: { headers }, end_of_stream: !hasBody },
      metadata_context:
        subset === undefined
          ? undefined
          : {
              filter_metadata: {
                [SUBSET_HINT_NAMESPACE]: {
                  fields: {
                    [SUBSET_HINT_KEY]:
                      typeof subset === 'string'
                        ? { stringValue: subset }
                        : { listValue: { values: subset.map((s) => ({ stringValue: s })) } },
                  },
                },
              },
            },
      protocol_config: { request_body_mode: 'FULL_DUPLEX_STREAMED', response_body_mode: 'FULL_DUPLEX_STREAMED' },
    });
    // full duplex: body chunks go to the picker as they arrive, then an empty end_of_stream chunk
    const sending = (async () => {
      if (!hasBody) return;
      for await (const chunk of req) call.write({ request_body: { body: chunk as Buffer, end_of_stream: false } });
      call.write({ request_body: { body: Buffer.alloc(0), end_of_stream: true } });
    })();
    const first = await inbox.next();
    await sending;
    if (first.response === 'immediate_response') {
      const ir = first.immediate_response!;
      const code = statusNumber(ir.status.code);
      for (const h of ir.headers?.set_headers ?? []) res.setHeader(h.header.key, text(h.header));
      res.writeHead(code);
      res.end(Buffer.from(ir.body ?? []));
      call.end();
      return;
    }
    if (first.response !== 'request_headers') throw new Error(`expected request_headers, got ${first.response}`);
    const upstreamHeaders: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers)) if (!HOP.has(k) && typeof v === 'string') upstreamHeaders[k] = v;
    for (const h of first.request_headers?.response?.header_mutation?.set_headers ?? [])
      upstreamHeaders[h.header.key.toLowerCase()] = text(h.header);
    const destination = upstreamHeaders[DESTINATION_ENDPOINT_KEY];
    const meta = structToPlain(first.dynamic_metadata)[DESTINATION_ENDPOINT_NAMESPACE] as
      Record<string, string> | undefined;
    if (!destination || meta?.[DESTINATION_ENDPOINT_KEY] !== destination)
      throw new Error('the picker named no endpoint, or different ones in header and metadata');
    delete upstreamHeaders['content-length'];
    const body: Buffer[] = [];
    if (hasBody) {
      for (;;) {
        const m = await inbox.next();
        const sr = m.request_body?.response?.body_mutation?.streamed_response;
        if (!sr) throw new Error(`expected a streamed request body, got ${m.response}`);
        body.push(Buffer.from(sr.body ?? []));
        if (sr.end_of_stream) break;
      }
    }
    const payload = Buffer.concat(body);
    // walk the endpoints in order: a connection failure or a 5xx moves to the next
    let upstream: Awaited<ReturnType<typeof request>> | undefined;
    let served = '';
    const endpoints = destination.split(',');
    for (const [i, endpoint] of endpoints.entries()) {
      try {
        const r = await request(`http://${endpoint}${req.url}`, {
          method: req.method as 'POST',
          headers: upstreamHeaders,
          body: hasBody ? payload : undefined,
        });
        if (r.statusCode >= 500 && i < endpoints.length - 1) {
          await r.body.dump();
          continue;
        }
        upstream = r;
        served = endpoint;
        if (i > 0) state.fallbacks++;
        break;
      } catch {
        // connection refused: the next endpoint
      }
    }
    if (!upstream) {
      call.end();
      res.writeHead(503, { 'content-type': 'text/plain' });
      res.end('no healthy upstream');
      return;
    }
    const respHeaders = [
      { key: ':status', raw_value: Buffer.from(String(upstream.statusCode)) },
      ...Object.entries(upstream.headers).map(([key, v]) => ({
        key,
        raw_value: Buffer.from(Array.isArray(v) ? v.join(',') : String(v ?? '')),
      })),
    ];
    call.write({
      response_headers: { headers: { headers: respHeaders }, end_of_stream: false },
      metadata_context: {
        filter_metadata: {
          [DESTINATION_ENDPOINT_NAMESPACE]: { fields: { [DESTINATION_ENDPOINT_SERVED_KEY]: { stringValue: served } } },
        },
      },
    });
    const rh = await inbox.next();
    if (rh.response !== 'response_headers') throw new Error(`expected the response_headers answer, got ${rh.response}`);
    const out: Record<string, string> = {};
    for (const [k, v] of Object.entries(upstream.headers)) if (!HOP.has(k) && typeof v === 'string') out[k] = v;
    for (const h of rh.response_headers?.response?.header_mutation?.set_headers ?? [])
      out[h.header.key.toLowerCase()] = text(h.header);
    res.writeHead(upstream.statusCode, out);
    // response body through the picker: each echoed chunk goes to the client as it comes back
    const echo = (async () => {
      for (;;) {
        const m = await inbox.next();
        const sr = m.response_body?.response?.body_mutation?.streamed_response;
        if (!sr) throw new Error(`expected a streamed response body, got ${m.response}`);
        if (sr.body && sr.body.length > 0) res.write(Buffer.from(sr.body));
        if (sr.end_of_stream) return;
      }
    })();
    for await (const chunk of upstream.body)
      call.write({ response_body: { body: chunk as Buffer, end_of_stream: false } });
    call.write({ response_body: { body: Buffer.alloc(0), end_of_stream: true } });
    await echo;
    res.end();
    call.end();
  };

  const server: Server = createServer((req, res) => {
    handle(req, res).catch((err: Error) => {
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
      res.end(`loopback envoy: ${err.message}`);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    get fallbacks() {
      return state.fallbacks;
    },
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      client.close();
    },
  };
}
