import assert from 'node:assert/strict';
import {
  credentials,
  makeGenericClientConstructor,
  type ChannelCredentials,
  type ClientDuplexStream,
  type Client,
} from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { protoPath as healthProtoPath } from 'grpc-health-check';
import { loadPackageDefinition } from '@grpc/grpc-js';
import {
  extProcService,
  PROTO_LOADER_OPTIONS,
  structToPlain,
  type ProcessingRequest,
  type ProcessingResponse,
  type ProtoStruct,
  type ProtoValue,
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
 * Envoy's side of an ext_proc stream, as strict as Envoy's ext_proc filter in
 * FULL_DUPLEX_STREAMED mode: every ordering rule the endpoint-picker protocol sets is an
 * assertion here, so a picker that breaks one fails the test that drives it.
 *
 *  1. nothing arrives before the request's last body chunk (or its end_of_stream headers);
 *  2. the first answer is the request_headers response or an immediate_response;
 *  3. the request_headers response clears the route cache, sets x-gateway-destination-endpoint
 *     once, and dynamic_metadata["envoy.lb"] carries the identical value; no body mutation;
 *  4. then, for a request with a body, only request_body answers, each a streamed_response of
 *     at most 62,000 bytes, never empty unless it is the end, exactly one end_of_stream, last;
 *     a header-only request gets no body answer;
 *  5. an immediate_response is the last message, and the stream then closes with OK;
 *  6. response phase: exactly one response_headers answer to the response headers, then the
 *     response body echoed as streamed_response chunks, one end_of_stream, last;
 *  7. after Envoy half-closes, the picker closes the stream with OK and sends nothing more.
 */

/** The protocol's chunk limit, written out here so the picker's own constant cannot move it. */
const BODY_CHUNK_BYTES = 62_000;

const HOST_PORT = /^(\[[0-9a-fA-F:.]+\]|[^,:\s[\]]+):\d{1,5}$/;

export interface RequestSpec {
  headers?: Record<string, string>;
  /** The body (absent: a header-only request, end_of_stream on the headers). */
  body?: Buffer | string;
  /** Bytes per body chunk Envoy sends (default 16 KiB, Envoy's read size). */
  chunkBytes?: number;
  /** The subset hint as a list of values, or as one string. */
  subset?: string[] | string | { value: ProtoValue };
  protocolConfig?: ProcessingRequest['protocol_config'];
}

export type RequestOutcome =
  | {
      kind: 'routed';
      endpoints: string[];
      headerValue: string;
      setHeaders: Map<string, string>;
      /** The request headers the picker's answer removes. */
      removedHeaders: string[];
      body: Buffer;
      stream: PickerStream;
    }
  | { kind: 'immediate'; status: number; body: string; headers: Map<string, string>; details?: string };

interface Inbox {
  messages: ProcessingResponse[];
  ended: boolean;
  error: Error | undefined;
  waiters: Array<() => void>;
}

export class EnvoyRole {
  private readonly client: Client & { Process(): ClientDuplexStream<ProcessingRequest, ProcessingResponse> };
  private readonly health: Client & {
    Check(
      req: { service: string },
      options: { deadline?: number },
      cb: (err: Error | null, res?: { status: string }) => void,
    ): void;
  };

  /** `creds`: plaintext by default; a TLS picker takes credentials.createSsl(). */
  constructor(
    readonly address: string,
    creds: ChannelCredentials = credentials.createInsecure(),
  ) {
    const Ctor = makeGenericClientConstructor(extProcService(), 'ExternalProcessor');
    this.client = new Ctor(address, creds) as unknown as EnvoyRole['client'];
    const hpkg = loadPackageDefinition(loadSync(healthProtoPath, PROTO_LOADER_OPTIONS)) as unknown as {
      grpc: {
        health: {
          v1: {
            Health: new (a: string, c: ChannelCredentials, o: object) => EnvoyRole['health'];
          };
        };
      };
    };
    // the same channel: a health round trip is ordered after everything sent before it
    this.health = new hpkg.grpc.health.v1.Health(address, creds, {
      channelOverride: this.client.getChannel(),
    });
  }

  close(): void {
    this.client.close();
  }

  /** gRPC health status of a service ('liveness', 'readiness', the ExternalProcessor, '' the server's). */
  healthStatus(service: string, deadlineMs = 30_000): Promise<string> {
    return new Promise((resolve, reject) =>
      this.health.Check({ service }, { deadline: Date.now() + deadlineMs }, (err, res) =>
        err ? reject(err) : resolve(res!.status),
      ),
    );
  }

  /** One request through the request phase, every rule checked. */
  async request(spec: RequestSpec): Promise<RequestOutcome> {
    const call = this.client.Process();
    const inbox: Inbox = { messages: [], ended: false, error: undefined, waiters: [] };
    const wake = () => inbox.waiters.splice(0).forEach((w) => w());
    call.on('data', (m: ProcessingResponse) => {
      inbox.messages.push(m);
      wake();
    });
    call.on('end', () => {
      inbox.ended = true;
      wake();
    });
    call.on('error', (e: Error) => {
      inbox.error = e;
      inbox.ended = true;
      wake();
    });
    call.on('status', () => {});
    const headerList = Object.entries({
      ':method': 'POST',
      ':path': '/v1/completions',
      ':authority': 'gateway',
      'content-type': 'application/json',
      ...(spec.headers ?? {}),
    }).map(([key, value]) => ({ key, raw_value: Buffer.from(value) }));
    const body = spec.body === undefined ? undefined : Buffer.isBuffer(spec.body) ? spec.body : Buffer.from(spec.body);
    const metadata_context =
      spec.subset === undefined
        ? undefined
        : {
            filter_metadata: {
              [SUBSET_HINT_NAMESPACE]: {
                fields: {
                  [SUBSET_HINT_KEY]:
                    typeof spec.subset === 'string'
                      ? { stringValue: spec.subset }
                      : Array.isArray(spec.subset)
                        ? { listValue: { values: spec.subset.map((s) => ({ stringValue: s })) } }
                        : spec.subset.value,
                },
              } as ProtoStruct,
            },
          };
    call.write({
      request_headers: { headers: { headers: headerList }, end_of_stream: body === undefined },
      metadata_context,
      protocol_config: spec.protocolConfig,
    });
    if (body !== undefined) {
      const step = spec.chunkBytes ?? 16 * 1024;
      const pieces: Buffer[] = [];
      for (let i = 0; i < body.length; i += step) pieces.push(body.subarray(i, i + step));
      if (pieces.length === 0) pieces.push(Buffer.alloc(0));
      for (let i = 0; i < pieces.length; i++) {
        const last = i === pieces.length - 1;
        if (last) {
          // rule 1: a health round trip on the same connection orders everything the picker
          // wrote while handling the earlier chunks before its answer
          await this.healthStatus('liveness');
          assert.equal(
            inbox.messages.length,
            0,
            `rule 1: the picker answered before the request body ended: ${describe(inbox.messages[0])}`,
          );
          assert.ok(!inbox.ended, 'rule 1: the picker closed the stream before the request body ended');
        }
        call.write({ request_body: { body: pieces[i], end_of_stream: last } });
      }
    }
    const next = async (what: string): Promise<ProcessingResponse> => {
      const deadline = Date.now() + 10_000;
      while (inbox.messages.length === 0) {
        if (inbox.ended)
          assert.fail(`the picker ended the stream (${inbox.error?.message ?? 'OK'}) while Envoy waited for ${what}`);
        if (Date.now() > deadline) assert.fail(`no ${what} within 10 s`);
        await new Promise<void>((r) => {
          const t = setTimeout(r, 200);
          inbox.waiters.push(() => {
            clearTimeout(t);
            r();
          });
        });
      }
      return inbox.messages.shift()!;
    };
    const first = await next('the request_headers response');
    if (first.response === 'immediate_response') {
      const ir = first.immediate_response!;
      // rule 5: last message, clean close
      await waitEnded(inbox);
      assert.equal(
        inbox.messages.length,
        0,
        `rule 5: messages after the immediate_response: ${inbox.messages.map(describe).join(', ')}`,
      );
      assert.equal(
        inbox.error,
        undefined,
        `rule 5: the stream closed with an error after the immediate_response: ${inbox.error?.message}`,
      );
      call.end();
      return {
        kind: 'immediate',
        status: statusNumber(ir.status.code),
        body: Buffer.from(ir.body ?? []).toString(),
        headers: headerMap(ir.headers?.set_headers),
        details: ir.details,
      };
    }
    // rule 2 and 3
    assert.equal(
      first.response,
      'request_headers',
      `rule 2: the first answer must be request_headers, got ${describe(first)}`,
    );
    const common = first.request_headers?.response ?? {};
    assert.equal(common.clear_route_cache, true, 'rule 3: clear_route_cache must be true');
    assert.ok(
      common.status === undefined || common.status === 'CONTINUE',
      `rule 3: status must be CONTINUE, got ${String(common.status)}`,
    );
    assert.equal(common.body_mutation, undefined, 'rule 3: the headers response must not mutate the body');
    const destHeaders = (common.header_mutation?.set_headers ?? []).filter(
      (h) => h.header.key.toLowerCase() === DESTINATION_ENDPOINT_KEY,
    );
    assert.equal(destHeaders.length, 1, `rule 3: ${DESTINATION_ENDPOINT_KEY} must be set exactly once`);
    const headerValue = headerText(destHeaders[0].header);
    const meta = structToPlain(first.dynamic_metadata)[DESTINATION_ENDPOINT_NAMESPACE] as
      Record<string, unknown> | undefined;
    assert.ok(
      meta && typeof meta === 'object',
      `rule 3: dynamic_metadata must have the ${DESTINATION_ENDPOINT_NAMESPACE} namespace`,
    );
    assert.equal(
      meta[DESTINATION_ENDPOINT_KEY],
      headerValue,
      'rule 3: the header and dynamic_metadata must carry the identical value',
    );
    const endpoints = headerValue.split(',');
    for (const e of endpoints) assert.match(e, HOST_PORT, `rule 3: '${e}' is not ip:port`);
    assert.equal(new Set(endpoints).size, endpoints.length, `rule 3: an endpoint is listed twice in '${headerValue}'`);
    const setHeaders = headerMap(common.header_mutation?.set_headers);
    // rule 4
    const echoed: Buffer[] = [];
    if (
      body !== undefined &&
      (spec.protocolConfig?.request_body_mode ?? 'FULL_DUPLEX_STREAMED') === 'FULL_DUPLEX_STREAMED'
    ) {
      for (;;) {
        const m = await next('the echoed request body');
        assert.equal(m.response, 'request_body', `rule 4: expected a request_body answer, got ${describe(m)}`);
        const mut = m.request_body?.response?.body_mutation;
        assert.equal(
          mut?.mutation,
          'streamed_response',
          `rule 4: a request_body answer must be a streamed_response, got ${describe(m)}`,
        );
        const sr = mut!.streamed_response!;
        const chunk = Buffer.from(sr.body ?? []);
        assert.ok(
          chunk.length <= BODY_CHUNK_BYTES,
          `rule 4: a body chunk of ${chunk.length} bytes is over ${BODY_CHUNK_BYTES}`,
        );
        assert.ok(
          chunk.length > 0 || sr.end_of_stream === true,
          'rule 4: an empty body chunk that does not end the stream',
        );
        echoed.push(chunk);
        if (sr.end_of_stream) break;
      }
    }
    await this.healthStatus('liveness');
    assert.equal(
      inbox.messages.length,
      0,
      `rule 4: unexpected messages after the request phase: ${inbox.messages.map(describe).join(', ')}`,
    );
    return {
      kind: 'routed',
      endpoints,
      headerValue,
      setHeaders,
      removedHeaders: common.header_mutation?.remove_headers ?? [],
      body: Buffer.concat(echoed),
      stream: new PickerStream(call, inbox, next, this),
    };
  }
}

export interface ResponseSpec {
  /** The endpoint Envoy reports it used (absent: not reported). */
  served?: string;
  headers?: Record<string, string>;
  /** Response body chunks as the engine sent them (absent: a response without body). */
  chunks?: Array<Buffer | string>;
  /** The picker may change the body (its length, where chunks end): send every chunk, then read to end_of_stream. */
  bodyChanges?: boolean;
}

/** The response phase of a routed request, on the same stream. */
export class PickerStream {
  constructor(
    private readonly call: ClientDuplexStream<ProcessingRequest, ProcessingResponse>,
    private readonly inbox: Inbox,
    private readonly next: (what: string) => Promise<ProcessingResponse>,
    private readonly envoy: EnvoyRole,
  ) {}

  /** Sends the response headers (and optionally the body) and checks rule 6; resolves to what the picker changed. */
  async respond(
    spec: ResponseSpec,
  ): Promise<{ setHeaders: Map<string, string>; removedHeaders: string[]; body: Buffer }> {
    const hasBody = spec.chunks !== undefined && spec.chunks.length > 0;
    const setHeaders = await this.respondHeaders(spec, hasBody);
    const removedHeaders = this.removedHeaders;
    const body = hasBody ? await this.respondBody(spec.chunks!, spec.bodyChanges) : Buffer.alloc(0);
    return { setHeaders, removedHeaders, body };
  }

  /** The headers the last response_headers answer removed. */
  removedHeaders: string[] = [];

  /** The response headers alone; `bodyFollows` false ends the response with them. */
  async respondHeaders(spec: ResponseSpec, bodyFollows: boolean): Promise<Map<string, string>> {
    const metadata_context =
      spec.served === undefined
        ? undefined
        : {
            filter_metadata: {
              [DESTINATION_ENDPOINT_NAMESPACE]: {
                fields: { [DESTINATION_ENDPOINT_SERVED_KEY]: { stringValue: spec.served } },
              } as ProtoStruct,
            },
          };
    const headerList = Object.entries({
      ':status': '200',
      'content-type': 'text/event-stream',
      ...(spec.headers ?? {}),
    }).map(([key, value]) => ({ key, raw_value: Buffer.from(value) }));
    this.call.write({
      response_headers: { headers: { headers: headerList }, end_of_stream: !bodyFollows },
      metadata_context,
    });
    const h = await this.next('the response_headers answer');
    assert.equal(h.response, 'response_headers', `rule 6: expected the response_headers answer, got ${describe(h)}`);
    this.removedHeaders = h.response_headers?.response?.header_mutation?.remove_headers ?? [];
    return headerMap(h.response_headers?.response?.header_mutation?.set_headers);
  }

  /**
   * The response body, chunk by chunk, the last with end_of_stream; resolves to the echoed body.
   * With `bodyChanges` every chunk is sent first and the answers read until end_of_stream.
   */
  async respondBody(chunkList: Array<Buffer | string>, bodyChanges = false): Promise<Buffer> {
    const echoed: Buffer[] = [];
    let sawEos = false;
    const chunks = chunkList.map((c) => (Buffer.isBuffer(c) ? c : Buffer.from(c)));
    if (bodyChanges)
      chunks.forEach((c, i) => this.call.write({ response_body: { body: c, end_of_stream: i === chunks.length - 1 } }));
    for (let i = 0; i < chunks.length; i++) {
      const last = i === chunks.length - 1;
      if (!bodyChanges) this.call.write({ response_body: { body: chunks[i], end_of_stream: last } });
      // full duplex: the echo of each chunk may come at once (streaming to the client)
      let got = 0;
      while (bodyChanges ? last && !sawEos : got < chunks[i].length || (last && !sawEos)) {
        const m = await this.next('the echoed response body');
        assert.equal(m.response, 'response_body', `rule 6: expected a response_body answer, got ${describe(m)}`);
        const sr = m.response_body?.response?.body_mutation?.streamed_response;
        assert.ok(sr, `rule 6: a response_body answer must be a streamed_response, got ${describe(m)}`);
        const b = Buffer.from(sr.body ?? []);
        assert.ok(
          b.length <= BODY_CHUNK_BYTES,
          `rule 6: a body chunk of ${b.length} bytes is over ${BODY_CHUNK_BYTES}`,
        );
        assert.ok(!sr.end_of_stream || last, 'rule 6: end_of_stream before the last response chunk');
        assert.ok(b.length > 0 || sr.end_of_stream, 'rule 6: an empty response chunk that does not end the stream');
        got += b.length;
        echoed.push(b);
        if (sr.end_of_stream) {
          sawEos = true;
          break;
        }
      }
    }
    return Buffer.concat(echoed);
  }

  /** Envoy half-closes (the HTTP exchange is over or was abandoned); rule 7. */
  async end(): Promise<void> {
    this.call.end();
    await waitEnded(this.inbox);
    assert.equal(
      this.inbox.messages.length,
      0,
      `rule 7: messages after the exchange: ${this.inbox.messages.map(describe).join(', ')}`,
    );
    assert.equal(this.inbox.error, undefined, `rule 7: the stream closed with an error: ${this.inbox.error?.message}`);
  }

  /** Envoy resets the stream (client went away). */
  cancel(): void {
    this.call.cancel();
  }

  get envoyRole(): EnvoyRole {
    return this.envoy;
  }
}

async function waitEnded(inbox: Inbox): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!inbox.ended) {
    if (Date.now() > deadline) assert.fail('the picker did not close the stream within 10 s');
    await new Promise<void>((r) => {
      const t = setTimeout(r, 200);
      inbox.waiters.push(() => {
        clearTimeout(t);
        r();
      });
    });
  }
}

function describe(m: ProcessingResponse | undefined): string {
  if (!m) return 'nothing';
  return JSON.stringify(m, (_k, v: unknown) =>
    v && typeof v === 'object' && (v as { type?: string }).type === 'Buffer'
      ? `<${((v as { data: number[] }).data ?? []).length} bytes>`
      : v,
  ).slice(0, 300);
}

function headerText(h: { value?: string; raw_value?: Buffer | Uint8Array }): string {
  return h.raw_value && h.raw_value.length > 0 ? Buffer.from(h.raw_value).toString() : (h.value ?? '');
}

function headerMap(
  list: Array<{ header: { key: string; value?: string; raw_value?: Buffer | Uint8Array } }> | undefined,
): Map<string, string> {
  const out = new Map<string, string>();
  for (const h of list ?? []) out.set(h.header.key.toLowerCase(), headerText(h.header));
  return out;
}
