import { accessSync, constants } from 'node:fs';
import { isAbsolute, join } from 'node:path';
import { status as GrpcStatus, type ServiceDefinition } from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import { EXT_PROC_PROTO, PROTO_DIR, extProcService } from './proto.js';

/**
 * Most fields a ProcessingRequest may hold, counted on the wire at every depth: each field
 * occurrence once (a header, its key and its value are three; an element of a list or an entry
 * of a map, and each field inside it, one each; unknown fields too). Decoding makes an object or
 * a value of each, before anything of the picker runs: 16 MiB of empty google.protobuf.Values
 * (2 bytes each) would be 8 million objects, seconds of blocked event loop and most of a GiB.
 * Envoy's most: 1,000 request headers (the picker answers 431 past MAX_HEADER_LINES) are 3,000
 * fields, a subset hint of 4,096 endpoints (what the picker reads of one) 8,192, its attributes
 * and metadata a few dozen more: 32,768 leaves that room twice over; a message at the bound
 * decodes in tens of milliseconds.
 */
export const MAX_MESSAGE_FIELDS = 32_768;

/**
 * Deepest nesting of messages in a ProcessingRequest (the request itself is depth 0). A subset
 * hint's endpoint is at depth 7 (metadata_context, its filter_metadata entry, the Struct, its
 * fields entry, the Value, the ListValue, its Value); each level of JSON nesting in metadata
 * adds three. 100 is protobuf's own default recursion limit (CodedInputStream's); counting a map
 * entry as a level, as the wire nests it, is stricter than protobufjs's decoder, which reads an
 * entry's value one level down: metadata nested past about 32 levels of JSON is refused here.
 */
export const MAX_MESSAGE_DEPTH = 100;

/**
 * Most bytes of a ProcessingRequest outside its body chunk (request_body or response_body's
 * `body`): headers, trailers, metadata and attributes. Envoy bounds a request's headers by the
 * HTTP connection manager's max_request_headers_kb: 60 KiB by default, 8,192 KiB at the most
 * (the response's by max_response_headers_kb, alike); the picker answers request headers over
 * MAX_REQUEST_HEADER_BYTES (64 KiB) with 431. 1 MiB is sixteen times Envoy's default, room for
 * headers up to it to get their 431 and for any metadata a gateway attaches; headers past it (an
 * Envoy configured above 1,024 KiB) end the stream RESOURCE_EXHAUSTED instead. Only the body
 * chunk may be larger (up to the body limit).
 */
export const MAX_NON_BODY_BYTES = 1024 * 1024;

export interface WireLimits {
  maxFields: number;
  maxDepth: number;
  maxNonBodyBytes: number;
}

export const DEFAULT_WIRE_LIMITS: WireLimits = {
  maxFields: MAX_MESSAGE_FIELDS,
  maxDepth: MAX_MESSAGE_DEPTH,
  maxNonBodyBytes: MAX_NON_BODY_BYTES,
};

/**
 * What the picker's deserializer hands the handler in place of a ProcessingRequest it refused to
 * decode: the handler ends the stream with `code`, naming the limit in `message`.
 */
export interface RefusedMessage {
  [REFUSED]: true;
  code: GrpcStatus;
  message: string;
}
export const REFUSED = Symbol('refused message');

export function isRefusedMessage(m: unknown): m is RefusedMessage {
  return typeof m === 'object' && m !== null && REFUSED in m;
}

// ------------------------------------------------------------------ the schema, compiled

/** How a known field's payload is read (as protobufjs reads it: by the schema, whatever its wire type). */
const enum Read {
  /** a 32-bit varint: int32, uint32, sint32, bool, an enum */
  Varint,
  /** a 64-bit varint: int64, uint64, sint64 */
  Varint64,
  Fixed32,
  Fixed64,
  /** string or bytes: a length, then as many bytes */
  Delimited,
  /** the body chunk: delimited, its bytes outside the non-body limit */
  Body,
  /** a message, or a map entry: delimited, then read against its own node */
  Message,
}

interface FieldRule {
  read: Read;
  /** A repeated scalar that protobufjs also reads packed (wire type 2): how each element is read. */
  packed?: Read;
  node?: SchemaNode;
}

interface SchemaNode {
  fields: Map<number, FieldRule>;
}

const BODY_TYPE = 'envoy.service.ext_proc.v3.HttpBody';

function scalarRead(type: string): Read {
  switch (protobuf.types.basic[type as keyof typeof protobuf.types.basic]) {
    case 0:
      return protobuf.types.long[type as keyof typeof protobuf.types.long] === undefined ? Read.Varint : Read.Varint64;
    case 1:
      return Read.Fixed64;
    case 5:
      return Read.Fixed32;
    default:
      return Read.Delimited;
  }
}

function compile(type: protobuf.Type, nodes = new Map<protobuf.Type, SchemaNode>()): SchemaNode {
  const known = nodes.get(type);
  if (known) return known;
  const node: SchemaNode = { fields: new Map() };
  nodes.set(type, node);
  for (const field of type.fieldsArray) {
    field.resolve();
    const valueRule = (): FieldRule => {
      const t = field.resolvedType;
      if (t instanceof protobuf.Type) return { read: Read.Message, node: compile(t, nodes) };
      if (t instanceof protobuf.Enum) return { read: Read.Varint };
      if (field.name === 'body' && type.fullName === `.${BODY_TYPE}`) return { read: Read.Body };
      return { read: scalarRead(field.type) };
    };
    if (field instanceof protobuf.MapField) {
      // on the wire a map entry is a message: the key is field 1, the value field 2
      const entry: SchemaNode = {
        fields: new Map([
          [1, { read: scalarRead(field.keyType) }],
          [2, valueRule()],
        ]),
      };
      node.fields.set(field.id, { read: Read.Message, node: entry });
      continue;
    }
    const rule = valueRule();
    if (field.repeated && rule.read <= Read.Fixed64) rule.packed = rule.read;
    node.fields.set(field.id, rule);
  }
  return node;
}

// ------------------------------------------------------------------ the pass

/**
 * The pass's state: one module-level cursor and counters (a check runs to its end synchronously),
 * so reading a field allocates nothing.
 */
let buf: Uint8Array = new Uint8Array(0);
let pos = 0;
let fields = 0;
let bodyBytes = 0;
let limits: WireLimits = DEFAULT_WIRE_LIMITS;

const OK = 0;
const TOO_MANY_FIELDS = 1;
const TOO_DEEP = 2;
const MALFORMED = 3;
type Verdict = typeof OK | typeof TOO_MANY_FIELDS | typeof TOO_DEEP | typeof MALFORMED;

/**
 * Reads a varint from `pos` as protobufjs's uint32 reads it (its low 32 bits); -1 when it runs
 * past `end` or is one protobufjs would frame otherwise. protobufjs reads a 32-bit varint (a tag,
 * a length, an int32, a bool, an enum) as 5 bytes, or 10 when the fifth goes on, without looking
 * at the last five: one of 6 to 9 bytes is refused (`wide` false), so that this pass and the
 * decoder never part on where a field ends. A 64-bit one (`wide`) is read to its last byte.
 */
function varint(end: number, wide: boolean): number {
  let value = 0;
  for (let i = 0; i < 10; i++) {
    if (pos >= end) return -1;
    const b = buf[pos++];
    if (i < 4) value += (b & 0x7f) * SHIFTS[i];
    else if (i === 4) value += (b & 0x0f) * SHIFTS[4];
    if (b < 0x80) return !wide && i >= 5 && i <= 8 ? -1 : value;
  }
  return -1;
}
const SHIFTS = [1, 2 ** 7, 2 ** 14, 2 ** 21, 2 ** 28];

/** Skips a payload read as `read`, from `pos`; false when it runs past `end`. */
function skipScalar(read: Read, end: number): boolean {
  if (read === Read.Varint || read === Read.Varint64) return varint(end, read === Read.Varint64) >= 0;
  const width = read === Read.Fixed32 ? 4 : 8;
  if (end - pos < width) return false;
  pos += width;
  return true;
}

/** Skips an unknown field's payload by its wire type, as protobufjs's skipType does (a group with its fields). */
function skipUnknown(wireType: number, end: number, depth: number): Verdict {
  switch (wireType) {
    case 0:
      return varint(end, true) >= 0 ? OK : MALFORMED;
    case 1:
      return skipScalar(Read.Fixed64, end) ? OK : MALFORMED;
    case 5:
      return skipScalar(Read.Fixed32, end) ? OK : MALFORMED;
    case 2: {
      const len = varint(end, false);
      if (len < 0 || len > end - pos) return MALFORMED;
      pos += len;
      return OK;
    }
    case 3: {
      if (depth + 1 > limits.maxDepth) return TOO_DEEP;
      for (;;) {
        const tag = varint(end, false);
        if (tag < 0) return MALFORMED;
        if ((tag & 7) === 4) return OK;
        if (++fields > limits.maxFields) return TOO_MANY_FIELDS;
        const v = skipUnknown(tag & 7, end, depth + 1);
        if (v !== OK) return v;
      }
    }
    default:
      return MALFORMED;
  }
}

/** Walks the message from `pos` to `end` against `node`. */
function walk(node: SchemaNode, end: number, depth: number): Verdict {
  if (depth > limits.maxDepth) return TOO_DEEP;
  while (pos < end) {
    const tag = varint(end, false);
    if (tag < 0) return MALFORMED;
    if (++fields > limits.maxFields) return TOO_MANY_FIELDS;
    const wireType = tag & 7;
    const rule = node.fields.get(tag >>> 3);
    if (rule === undefined) {
      if (wireType === 4) return MALFORMED;
      const v = skipUnknown(wireType, end, depth);
      if (v !== OK) return v;
      continue;
    }
    if (rule.packed !== undefined && wireType === 2) {
      const len = varint(end, false);
      if (len < 0 || len > end - pos) return MALFORMED;
      const stop = pos + len;
      // each element is a value of its own once decoded
      while (pos < stop) {
        if (++fields > limits.maxFields) return TOO_MANY_FIELDS;
        if (!skipScalar(rule.packed, stop)) return MALFORMED;
      }
      continue;
    }
    if (rule.read <= Read.Fixed64) {
      if (!skipScalar(rule.read, end)) return MALFORMED;
      continue;
    }
    const len = varint(end, false);
    if (len < 0 || len > end - pos) return MALFORMED;
    if (rule.read === Read.Message) {
      const v = walk(rule.node!, pos + len, depth + 1);
      if (v !== OK) return v;
    } else {
      if (rule.read === Read.Body) bodyBytes += len;
      pos += len;
    }
  }
  return OK;
}

/**
 * Checks a serialized message against the limits in one pass over its bytes, without decoding
 * it: undefined when it is within them, else the status and the message to end the stream with.
 */
export function checkWire(
  node: SchemaNode,
  bytes: Uint8Array,
  l: WireLimits = DEFAULT_WIRE_LIMITS,
): { code: GrpcStatus; message: string } | undefined {
  buf = bytes;
  pos = 0;
  fields = 0;
  bodyBytes = 0;
  limits = l;
  let verdict: Verdict;
  try {
    verdict = walk(node, bytes.length, 0);
  } finally {
    buf = new Uint8Array(0);
  }
  switch (verdict) {
    case TOO_MANY_FIELDS:
      return {
        code: GrpcStatus.RESOURCE_EXHAUSTED,
        message: `the message holds more than ${l.maxFields} fields (MAX_MESSAGE_FIELDS)`,
      };
    case TOO_DEEP:
      return {
        code: GrpcStatus.RESOURCE_EXHAUSTED,
        message: `the message nests messages deeper than ${l.maxDepth} (MAX_MESSAGE_DEPTH)`,
      };
    case MALFORMED:
      return { code: GrpcStatus.INVALID_ARGUMENT, message: 'the message is not a valid ProcessingRequest' };
  }
  if (bytes.length - bodyBytes > l.maxNonBodyBytes)
    return {
      code: GrpcStatus.RESOURCE_EXHAUSTED,
      message: `the message holds more than ${l.maxNonBodyBytes} bytes besides its body chunk (MAX_NON_BODY_BYTES)`,
    };
  return undefined;
}

let requestNode: SchemaNode | undefined;

/** The compiled schema of envoy.service.ext_proc.v3.ProcessingRequest (loaded once). */
export function processingRequestSchema(): SchemaNode {
  if (!requestNode) {
    const root = new protobuf.Root();
    // the include path as @grpc/proto-loader resolves it, so both read the same files
    root.resolvePath = (_origin, target) => {
      if (isAbsolute(target)) return target;
      const path = join(PROTO_DIR, target);
      try {
        accessSync(path, constants.R_OK);
        return path;
      } catch {
        // protobufjs's bundled well-known types (google/protobuf/struct.proto…) need no file
        return target;
      }
    };
    root.loadSync(EXT_PROC_PROTO, { keepCase: true });
    root.resolveAll();
    requestNode = compile(root.lookupType('envoy.service.ext_proc.v3.ProcessingRequest'));
  }
  return requestNode;
}

/**
 * The ExternalProcessor service definition with a deserializer that checks each request's wire
 * bytes against `limits` before protobufjs decodes them. A message over a limit, or one that does
 * not decode, comes to the handler as a RefusedMessage (grpc-js would end the stream INTERNAL on a
 * deserializer's error, naming nothing), so the handler ends the stream with a status that names
 * the limit, and counts it.
 */
export function guardedExtProcService(l: WireLimits = DEFAULT_WIRE_LIMITS): ServiceDefinition {
  const service = extProcService();
  const schema = processingRequestSchema();
  const process = service.Process;
  const decode = process.requestDeserialize;
  return {
    ...service,
    Process: {
      ...process,
      requestDeserialize: (bytes: Buffer): unknown => {
        const refused = checkWire(schema, bytes, l);
        if (refused) return { [REFUSED]: true, ...refused } satisfies RefusedMessage;
        try {
          return decode(bytes);
        } catch (err) {
          return {
            [REFUSED]: true,
            code: GrpcStatus.INVALID_ARGUMENT,
            message: `the message is not a valid ProcessingRequest: ${(err as Error).message}`,
          } satisfies RefusedMessage;
        }
      },
    },
  };
}
