import type {
  HeaderValue,
  HeaderValueOption,
  ProcessingRequest,
  ProcessingResponse,
  ProtoStruct,
  ProtoValue,
} from './proto.js';
import { isUtf8 } from 'node:buffer';
import { plainToStruct } from './proto.js';

/**
 * The Gateway API Inference Extension's endpoint-picker protocol on top of Envoy's ext_proc
 * (its docs/proposals/004-endpoint-picker-protocol): the names Envoy and the picker agree on,
 * and the messages the picker sends. Pure functions, no I/O.
 */

/** Request header and dynamic-metadata key naming the chosen endpoints, `ip:port[,ip:port…]`. */
export const DESTINATION_ENDPOINT_KEY = 'x-gateway-destination-endpoint';
/** Namespace of the dynamic metadata the picker answers in. */
export const DESTINATION_ENDPOINT_NAMESPACE = 'envoy.lb';
/** Key (in the envoy.lb filter metadata of the response phase) of the endpoint that served the request. */
export const DESTINATION_ENDPOINT_SERVED_KEY = 'x-gateway-destination-endpoint-served';
/** Namespace and key of the subset hint: the endpoints the picker may choose from. */
export const SUBSET_HINT_NAMESPACE = 'envoy.lb.subset_hint';
export const SUBSET_HINT_KEY = 'x-gateway-destination-endpoint-subset';
/** Request headers the picker reads. */
export const MODEL_NAME_REWRITE_HEADER = 'x-gateway-model-name-rewrite';
export const INFERENCE_OBJECTIVE_HEADER = 'x-gateway-inference-objective';
export const REQUEST_ID_HEADER = 'x-request-id';
/**
 * Largest body chunk the picker sends back: some Envoy builds cap a streamed chunk at 64 KiB,
 * and the reference picker keeps a margin below it (62,000 bytes).
 */
export const BODY_CHUNK_BYTES = 62_000;

/**
 * Most bytes of names and values one request_headers message may carry: above Envoy's own
 * default bound (max_request_headers_kb, 60 KiB), far below the message limit.
 */
export const MAX_REQUEST_HEADER_BYTES = 64 * 1024;

/** Bytes of the names and values of `headers`: what the picker holds of them. */
export function headerBytes(headers: readonly HeaderValue[]): number {
  let n = 0;
  for (const h of headers) {
    n += typeof h.key === 'string' ? Buffer.byteLength(h.key) : 0;
    n += h.raw_value && h.raw_value.length > 0 ? h.raw_value.length : Buffer.byteLength(h.value ?? '');
  }
  return n;
}

/** A header's value: Envoy sends it in raw_value (bytes), older builds in value. */
function headerText(h: HeaderValue): string {
  return h.raw_value && h.raw_value.length > 0 ? Buffer.from(h.raw_value).toString('utf8') : (h.value ?? '');
}

/**
 * Header values by lower-case name. A repeated header reads as one comma-joined value, as HTTP
 * folds it; `repeated`, when given, gets each repeated header's values one by one. Bytes are
 * read as UTF-8; `notUtf8`, when given, gets the names of the headers whose bytes are not (their
 * values hold U+FFFD in place of what could not be read).
 */
export function readHeaders(
  req: ProcessingRequest['request_headers'],
  repeated?: Map<string, string[]>,
  notUtf8?: Set<string>,
): Map<string, string> {
  const out = new Map<string, string>();
  for (const h of req?.headers?.headers ?? []) {
    if (typeof h.key !== 'string') continue;
    const value = headerText(h);
    const key = h.key.toLowerCase();
    if (notUtf8 && h.raw_value && h.raw_value.length > 0 && !isUtf8(h.raw_value)) notUtf8.add(key);
    const prior = out.get(key);
    out.set(key, prior === undefined ? value : `${prior},${value}`);
    if (prior !== undefined && repeated) {
      const values = repeated.get(key);
      if (values) values.push(value);
      else repeated.set(key, [prior, value]);
    }
  }
  return out;
}

/**
 * The HTTP status of the response phase, from the `:status` pseudo-header Envoy puts in the
 * response headers (undefined when absent or not a status).
 */
export function readResponseStatus(req: ProcessingRequest): number | undefined {
  for (const h of req.response_headers?.headers?.headers ?? []) {
    if (h.key !== ':status') continue;
    const value = headerText(h).trim();
    return /^[1-5]\d\d$/.test(value) ? Number(value) : undefined;
  }
  return undefined;
}

/** A value of a filter-metadata namespace, or undefined. */
export function metadataValue(req: ProcessingRequest, namespace: string, key: string): ProtoValue | undefined {
  const ns: ProtoStruct | undefined = req.metadata_context?.filter_metadata?.[namespace];
  return ns?.fields?.[key];
}

/** The subset hint as read: its endpoints, and what in it could not be read, if anything. */
export interface SubsetHint {
  /** The listed endpoints (possibly none), at most `maxEntries`. */
  endpoints: string[];
  /**
   * What was left out, as a phrase after the hint's key ("is a number, not ..."): a value that
   * is neither a list nor a string, list entries that are not strings, entries past the bound.
   */
  problem: string | undefined;
}

/**
 * The subset hint: undefined when Envoy set none (every endpoint is eligible), else the listed
 * endpoints (possibly none) and what could not be read. The value may be a list of strings or
 * one comma-separated string; list entries may themselves be comma-separated. Bounded: at most
 * `maxEntries` entries are read. Whatever could not be read names no endpoint: the picker may
 * choose only from what the hint lists (the protocol's MUST), so an unreadable hint leaves
 * fewer endpoints eligible, never more.
 */
export function readSubsetHintWithProblem(req: ProcessingRequest, maxEntries = 4096): SubsetHint | undefined {
  const v = metadataValue(req, SUBSET_HINT_NAMESPACE, SUBSET_HINT_KEY);
  if (v === undefined) return undefined;
  const out: string[] = [];
  let cut = false;
  /** The list has more entries than the bound (whatever they hold). */
  let longList = false;
  // reads no further than the bound: a hint of millions of entries costs what one of maxEntries does
  const add = (s: string) => {
    let start = 0;
    while (start <= s.length) {
      let end = s.indexOf(',', start);
      if (end < 0) end = s.length;
      const t = s.slice(start, end).trim();
      start = end + 1;
      if (t === '') continue;
      if (out.length === maxEntries) {
        cut = true;
        return;
      }
      out.push(t);
    }
  };
  let problem: string | undefined;
  if (v.kind === 'stringValue' && typeof v.stringValue === 'string') add(v.stringValue);
  else if (v.kind === 'listValue') {
    const values = v.listValue?.values ?? [];
    let others = 0;
    for (let i = 0; i < values.length && !cut && !longList; i++) {
      // more entries than the bound: the rest are not looked at, whatever they hold
      if (i === maxEntries) longList = true;
      else {
        const item = values[i];
        if (item.kind === 'stringValue' && typeof item.stringValue === 'string') add(item.stringValue);
        else others++;
      }
    }
    if (others > 0)
      problem = `has ${others} ${others === 1 ? 'entry' : 'entries'} that ${others === 1 ? 'is' : 'are'} not an ip:port string`;
  } else problem = `is ${valueKindName(v.kind)}, not a list of ip:port strings`;
  if (longList) problem = `has more than ${maxEntries} entries; only the first ${maxEntries} are read`;
  else if (cut) problem = `names more than ${maxEntries} endpoints; only the first ${maxEntries} are read`;
  else if (out.length === 0 && problem === undefined) problem = 'lists no endpoint';
  return { endpoints: out, problem };
}

/** The subset hint's endpoints (see readSubsetHintWithProblem), or undefined when Envoy set none. */
export function readSubsetHint(req: ProcessingRequest, maxEntries = 4096): string[] | undefined {
  return readSubsetHintWithProblem(req, maxEntries)?.endpoints;
}

/** A protobuf Value's kind in words. */
function valueKindName(kind: ProtoValue['kind']): string {
  switch (kind) {
    case 'nullValue':
      return 'null';
    case 'numberValue':
      return 'a number';
    case 'boolValue':
      return 'a boolean';
    case 'structValue':
      return 'a struct';
    default:
      return 'empty';
  }
}

/** The endpoint Envoy reports it sent the request to (response phase), or undefined. */
export function readServedEndpoint(req: ProcessingRequest): string | undefined {
  const v = metadataValue(req, DESTINATION_ENDPOINT_NAMESPACE, DESTINATION_ENDPOINT_SERVED_KEY);
  return v?.kind === 'stringValue' && v.stringValue ? v.stringValue.trim() : undefined;
}

/**
 * Splits `host:port` (IPv6 hosts in brackets) into its parts; a bare host has port undefined.
 * Hosts are compared in lower case without brackets.
 */
export function splitEndpoint(endpoint: string): { host: string; port: string | undefined } {
  const e = endpoint.trim();
  if (e.startsWith('[')) {
    const close = e.indexOf(']');
    if (close < 0) return { host: e.toLowerCase(), port: undefined };
    const rest = e.slice(close + 1);
    return {
      host: e.slice(1, close).toLowerCase(),
      port: rest.startsWith(':') && rest.length > 1 ? rest.slice(1) : undefined,
    };
  }
  const colons = e.split(':').length - 1;
  if (colons === 1) {
    const i = e.indexOf(':');
    return { host: e.slice(0, i).toLowerCase(), port: e.slice(i + 1) || undefined };
  }
  // no colon: a bare host; several: an unbracketed IPv6 address without port
  return { host: e.toLowerCase(), port: undefined };
}

/** `host:port` for an engine base URL, brackets around IPv6 hosts (the form Envoy routes on). */
export function endpointOfUrl(url: string): string {
  const u = new URL(url);
  const port = u.port || (u.protocol === 'https:' ? '443' : '80');
  return `${u.hostname}:${port}`;
}

/** Whether `endpoint` (host:port) is one the subset names (an entry without a port allows every port). */
export function inSubset(endpoint: string, subset: readonly string[]): boolean {
  const e = splitEndpoint(endpoint);
  for (const entry of subset) {
    const s = splitEndpoint(entry);
    if (s.host === e.host && (s.port === undefined || s.port === e.port)) return true;
  }
  return false;
}

const header = (key: string, value: string): HeaderValueOption => ({
  header: { key, raw_value: Buffer.from(value, 'utf8') },
  // the picker's word replaces anything a client sent under the same name
  append_action: 'OVERWRITE_IF_EXISTS_OR_ADD',
});

/**
 * The request_headers response that routes the request: clears Envoy's route cache (the
 * header may select the route), sets the destination header and the identical value in
 * dynamic_metadata["envoy.lb"], plus any extra headers (content-length of a rewritten body).
 */
export function routingHeadersResponse(
  endpoints: readonly string[],
  extraHeaders: Record<string, string> = {},
  removeHeaders: readonly string[] = [],
): ProcessingResponse {
  if (endpoints.length === 0) throw new RangeError('endpoints must name at least one endpoint');
  const value = endpoints.join(',');
  const set = [header(DESTINATION_ENDPOINT_KEY, value)];
  for (const [k, v] of Object.entries(extraHeaders)) set.push(header(k, v));
  return {
    request_headers: {
      response: {
        clear_route_cache: true,
        header_mutation: {
          set_headers: set,
          remove_headers: removeHeaders.length > 0 ? [...removeHeaders] : undefined,
        },
      },
    },
    dynamic_metadata: plainToStruct({ [DESTINATION_ENDPOINT_NAMESPACE]: { [DESTINATION_ENDPOINT_KEY]: value } }),
  };
}

/**
 * The body as streamed_response chunks of at most BODY_CHUNK_BYTES, for the request or the
 * response direction; with `endOfStream` the last chunk carries it (an empty body is one empty
 * chunk then). Without it an empty body yields no message: an empty answer says nothing.
 */
export function streamedBodyResponses(
  direction: 'request_body' | 'response_body',
  body: Buffer,
  endOfStream: boolean,
  chunkBytes = BODY_CHUNK_BYTES,
): ProcessingResponse[] {
  const out: ProcessingResponse[] = [];
  if (body.length === 0) {
    if (endOfStream) out.push(streamed(direction, body, true));
    return out;
  }
  for (let start = 0; start < body.length; start += chunkBytes) {
    const end = Math.min(body.length, start + chunkBytes);
    out.push(streamed(direction, body.subarray(start, end), endOfStream && end === body.length));
  }
  return out;
}

/**
 * The answers to `messages` request-body messages in the modes where Envoy takes one answer per
 * message (STREAMED, BUFFERED, BUFFERED_PARTIAL), which replace the body with `replacement`:
 * each answer stands for its message, so the last carries all of the replacement and the ones
 * before clear theirs. Without a replacement every answer changes nothing. Made one at a time as
 * they are taken: a body in many messages costs one answer at a time, not an array of them all
 * held until the last is sent.
 */
export function* perMessageBodyResponses(messages: number, replacement?: Buffer): Generator<ProcessingResponse> {
  for (let i = 0; i < messages; i++) {
    if (replacement === undefined) yield continueResponse('request_body');
    else if (i < messages - 1) yield { request_body: { response: { body_mutation: { clear_body: true } } } };
    else yield { request_body: { response: { body_mutation: { body: replacement } } } };
  }
}

/**
 * Most request-body messages one stream may send before its body ends. Envoy passes a body on
 * in the pieces it reads it in: a read of the downstream connection (HTTP/1, up to 16 KiB) or
 * one HTTP/2 or HTTP/3 DATA frame (16 KiB by default, the client's choice), so the default
 * 16 MiB body limit is some 1,024 messages, and 65,536 allows bodies in pieces of 256 bytes.
 * Empty messages count too: a peer could otherwise send millions of them, each free of the body
 * limit and the body budget, each owed an answer in the modes that answer every message.
 */
export const MAX_BODY_MESSAGES = 65_536;

function streamed(direction: 'request_body' | 'response_body', body: Buffer, endOfStream: boolean): ProcessingResponse {
  return { [direction]: { response: { body_mutation: { streamed_response: { body, end_of_stream: endOfStream } } } } };
}

/**
 * A local reply instead of the upstream: the status, an OpenAI-style JSON error body, and its
 * content type. `details` lands in Envoy's access log (%RESPONSE_CODE_DETAILS%), so it has no spaces.
 */
export function immediateResponse(
  status: number,
  message: string,
  param: string | null = null,
  extraHeaders: Record<string, string> = {},
  code: string | null = null,
): ProcessingResponse {
  const type = status >= 500 ? 'server_error' : status === 429 ? 'rate_limit_error' : 'invalid_request_error';
  const body = Buffer.from(JSON.stringify({ error: { message, type, param, code } }));
  const set = [header('content-type', 'application/json')];
  for (const [k, v] of Object.entries(extraHeaders)) set.push(header(k, v));
  return {
    immediate_response: {
      status: { code: status },
      headers: { set_headers: set },
      body,
      details: `contextforge_epp_${status}`,
    },
  };
}

/** A body or headers answer that changes nothing (the modes that expect one answer per message). */
export function continueResponse(kind: 'request_body' | 'response_body' | 'response_headers'): ProcessingResponse {
  return { [kind]: { response: {} } };
}

/**
 * Gives the client back the model name it asked for when the request went to the engine under
 * another one (x-gateway-model-name-rewrite), as the reference picker does: every
 * `"model":"ENGINE"` (or `"model": "ENGINE"`) in the response body becomes the client's name.
 * It works on the body as it streams: bytes at the end of a chunk that could begin a match are
 * held back for the next chunk (fewer than one match's length), so a name split between two
 * chunks is caught too.
 */
export class ModelNameRestorer {
  private readonly patterns: Array<{ from: Buffer; to: Buffer }>;
  private held: Buffer = Buffer.alloc(0);

  constructor(engineModel: string, clientModel: string) {
    const from = JSON.stringify(engineModel);
    const to = JSON.stringify(clientModel);
    this.patterns = ['"model":', '"model": '].map((key) => ({
      from: Buffer.from(key + from),
      to: Buffer.from(key + to),
    }));
  }

  /** What to send on for this chunk of the response body; with `end`, everything held back too. */
  push(chunk: Buffer, end: boolean): Buffer {
    let body = this.held.length > 0 ? Buffer.concat([this.held, chunk]) : chunk;
    for (const p of this.patterns) body = replaceAll(body, p.from, p.to);
    const keep = end ? 0 : this.partialMatchAtEnd(body);
    this.held = Buffer.from(body.subarray(body.length - keep));
    return body.subarray(0, body.length - keep);
  }

  /** Length of the longest end of `body` that is the start of a pattern (and not all of one). */
  private partialMatchAtEnd(body: Buffer): number {
    let longest = 0;
    for (const { from } of this.patterns) {
      for (let n = Math.min(from.length - 1, body.length); n > longest; n--) {
        if (body.compare(from, 0, n, body.length - n) === 0) {
          longest = n;
          break;
        }
      }
    }
    return longest;
  }
}

function replaceAll(body: Buffer, from: Buffer, to: Buffer): Buffer {
  let at = body.indexOf(from);
  if (at < 0) return body;
  const parts: Buffer[] = [];
  let start = 0;
  while (at >= 0) {
    parts.push(body.subarray(start, at), to);
    start = at + from.length;
    at = body.indexOf(from, start);
  }
  parts.push(body.subarray(start));
  return Buffer.concat(parts);
}
