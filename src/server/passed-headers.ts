/**
 * The client's headers an engine reads to name and trace a request, forwarded as they came:
 * `x-request-id`, which vLLM takes as the request's id (its logs, its metrics, and its answer's
 * own `x-request-id` with --enable-request-id-headers), and W3C Trace Context's `traceparent` and
 * `tracestate`, which vLLM's OpenTelemetry tracing (--otlp-traces-endpoint) continues. No other
 * header of the client's reaches an engine. Each is bounded, and the two that hold one value
 * must be given once: a request that breaks either is refused before any routing. The client's
 * x-request-id, when valid, also comes back on every answer the gateway writes itself
 * (carryRequestId).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';

/**
 * Longest x-request-id, traceparent or tracestate forwarded, in bytes (Node reads header bytes
 * as Latin-1: one character a byte): 1 KiB, as a Via and a body's `request_id` (by default). A
 * traceparent of today's version is 55 bytes; W3C Trace Context asks that at least 512 bytes of a
 * tracestate be passed on (and OpenTelemetry's JavaScript API reads no longer one).
 */
export const MAX_PASSED_HEADER_BYTES = 1024;

/** A refused header: the message, and the header's name as the error's `param`. */
export class PassedHeaderRejection {
  constructor(
    readonly message: string,
    readonly param: string,
  ) {}
}

/**
 * The client's x-request-id, traceparent and tracestate to forward to the engine (undefined when
 * the request has none: the common case allocates nothing), or why they are refused: one over
 * MAX_PASSED_HEADER_BYTES, or an x-request-id or traceparent given on more than one line (Node
 * joins a repeated header's lines with ", ", which would be read as one odd id; W3C Trace
 * Context gives two traceparents no meaning). A tracestate's lines join as one list, as RFC 9110
 * §5.3 combines them. An empty value is not forwarded.
 */
export function passedHeaders(
  headers: Readonly<Record<string, string | string[] | undefined>>,
  raw: IncomingMessage | undefined,
): Record<string, string> | PassedHeaderRejection | undefined {
  const requestId = headers['x-request-id'];
  const traceparent = headers.traceparent;
  const tracestate = headers.tracestate;
  if (requestId === undefined && traceparent === undefined && tracestate === undefined) return undefined;
  const out: Record<string, string> = {};
  return (
    pass(out, 'x-request-id', requestId, true, raw) ??
    pass(out, 'traceparent', traceparent, true, raw) ??
    pass(out, 'tracestate', tracestate, false, raw) ??
    out
  );
}

/** Adds the header `name` of `value` to `out` (unless absent or empty); the rejection when it is refused. */
function pass(
  out: Record<string, string>,
  name: string,
  value: string | readonly string[] | undefined,
  singleValue: boolean,
  raw: IncomingMessage | undefined,
): PassedHeaderRejection | undefined {
  if (value === undefined) return undefined;
  // a source built by hand may give a header as the list of its lines
  const text = typeof value === 'string' ? value : value.join(', ');
  if (text.length > MAX_PASSED_HEADER_BYTES)
    return new PassedHeaderRejection(`the ${name} header is longer than ${MAX_PASSED_HEADER_BYTES} bytes`, name);
  if (singleValue && repeated(name, value, raw))
    return new PassedHeaderRejection(`the ${name} header must be given once`, name);
  if (text !== '') out[name] = text;
  return undefined;
}

/** The header was given on more than one line; only a value holding ", " (Node's join) is looked at further. */
function repeated(name: string, value: string | readonly string[], raw: IncomingMessage | undefined): boolean {
  if (typeof value !== 'string') return value.length > 1;
  if (!value.includes(', ') || raw === undefined) return false;
  return (raw.headersDistinct[name]?.length ?? 0) > 1;
}

/** What a response header's value may hold as it is (what Node writes): tab, space, visible ASCII, obs-text. */
const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]+$/;

/** A header value of tab, space and visible ASCII only: the same bytes in any encoding Node writes a head in. */
const ASCII_VALUE = /^[\t\x20-\x7e]*$/;

/**
 * Whether `id` can go back to the client in an x-request-id header as it is: not empty, within
 * MAX_PASSED_HEADER_BYTES, header-safe. Its bytes over 0x7f (obs-text, one character a byte as
 * Node reads them) go back byte for byte when the response's head is written as bytes
 * (writeHeadAsBytes, headBytes).
 */
export function answerableRequestId(id: string | undefined): id is string {
  return id !== undefined && id.length <= MAX_PASSED_HEADER_BYTES && HEADER_VALUE.test(id);
}

/**
 * The client's x-request-id the gateway's own answers carry back: undefined when it sent none,
 * or one passedHeaders refuses (too long, or on more than one line) or that a response header
 * cannot carry as it is.
 */
export function clientRequestId(req: IncomingMessage): string | undefined {
  const id = req.headers['x-request-id'];
  if (typeof id !== 'string' || !answerableRequestId(id) || repeated('x-request-id', id, req)) return undefined;
  return id;
}

/**
 * Sets the client's x-request-id (clientRequestId) on `res` as it arrives, so that every answer
 * the gateway writes itself — on the fast path, through Fastify, or refused before any route —
 * carries it back (writeHead merges it with the answer's own headers), byte for byte
 * (writeHeadAsBytes). An engine's answer carries the engine's x-request-id instead (forward.ts
 * takes this one off).
 */
export function carryRequestId(req: IncomingMessage, res: ServerResponse): void {
  const id = clientRequestId(req);
  if (id === undefined) return;
  res.setHeader('x-request-id', id);
  keepHeaderBytes(res, id);
}

/** Has `res`'s head go out byte for byte (writeHeadAsBytes) when the header `value` it holds is not all ASCII. */
export function keepHeaderBytes(res: ServerResponse, value: string): void {
  if (!ASCII_VALUE.test(value)) writeHeadAsBytes(res);
}

/** The client's x-request-id as a header line of an answer written on the raw socket ('' without one): to be written as bytes (headBytes). */
export function requestIdLine(req: IncomingMessage | undefined): string {
  const id = req && clientRequestId(req);
  return id === undefined ? '' : `X-Request-Id: ${id}\r\n`;
}

/**
 * An answer written on the raw socket as bytes: its head as Latin-1, one byte a character, as Node
 * read the header values it repeats, and its body as UTF-8. Written as one string (UTF-8), a
 * header byte over 0x7f would go out as two.
 */
export function headBytes(head: string, body: string): Buffer {
  return Buffer.concat([Buffer.from(head, 'latin1'), Buffer.from(body)]);
}

/** The responses writeHeadAsBytes has taken care of. */
const headsAsBytes = new WeakSet<ServerResponse>();

/**
 * Has `res`'s head go out byte for byte (Latin-1, one byte a character, as Node read the header
 * values it repeats), for a head that holds a character over 0x7f. Node writes a head in one
 * string with the first body bytes when those are a string (res.end(text), as Fastify and the
 * gateway's refusals write): in UTF-8, where each such character becomes two bytes. It writes the
 * head as Latin-1 when the first body bytes are a Buffer, or when there are none (end()). So every
 * string written to `res` is written as its bytes instead. (res.flushHeaders writes the head in
 * UTF-8 too; nothing here calls it.)
 */
export function writeHeadAsBytes(res: ServerResponse): void {
  if (headsAsBytes.has(res)) return;
  headsAsBytes.add(res);
  const out = res as unknown as Record<'write' | 'end', (chunk?: unknown, ...rest: unknown[]) => unknown>;
  const { write, end } = out;
  out.write = function (this: unknown, chunk?: unknown, ...rest: unknown[]) {
    return write.call(this, ...asBytes(chunk, rest));
  };
  out.end = function (this: unknown, chunk?: unknown, ...rest: unknown[]) {
    return end.call(this, ...asBytes(chunk, rest));
  };
}

/** A write's arguments with a string chunk made its bytes (in the encoding given, which then goes). */
function asBytes(chunk: unknown, rest: unknown[]): unknown[] {
  if (typeof chunk !== 'string') return [chunk, ...rest];
  const [encoding, ...after] = rest;
  return typeof encoding === 'string'
    ? [Buffer.from(chunk, encoding as BufferEncoding), ...after]
    : [Buffer.from(chunk), ...rest];
}
