import { fileURLToPath } from 'node:url';
import { loadSync, type Options } from '@grpc/proto-loader';
import { loadPackageDefinition, type ServiceDefinition } from '@grpc/grpc-js';

/**
 * Envoy's ext_proc messages as @grpc/proto-loader decodes them (snake_case keys, oneofs named
 * by a virtual field, bytes as Buffers, enums as their names). Only what the endpoint picker
 * reads or writes is typed; the protos live in proto/ at the package root.
 */
export const PROTO_DIR = fileURLToPath(new URL('../../proto/', import.meta.url));
export const EXT_PROC_PROTO = 'envoy/service/ext_proc/v3/external_processor.proto';
export const EXT_PROC_SERVICE = 'envoy.service.ext_proc.v3.ExternalProcessor';

export const PROTO_LOADER_OPTIONS: Options = {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: false,
  oneofs: true,
  includeDirs: [PROTO_DIR],
};

/**
 * google.protobuf.Value / Struct / ListValue as decoded: protobufjs's bundled well-known types
 * keep their camelCase JSON names (kind names the member that is set).
 */
export interface ProtoValue {
  kind?: 'nullValue' | 'numberValue' | 'stringValue' | 'boolValue' | 'structValue' | 'listValue';
  nullValue?: string | number;
  numberValue?: number;
  stringValue?: string;
  boolValue?: boolean;
  structValue?: ProtoStruct;
  listValue?: { values?: ProtoValue[] };
}
export interface ProtoStruct {
  fields?: Record<string, ProtoValue>;
}

export interface HeaderValue {
  key: string;
  value?: string;
  raw_value?: Buffer | Uint8Array;
}
export interface HeaderValueOption {
  header: HeaderValue;
  append_action?:
    'APPEND_IF_EXISTS_OR_ADD' | 'ADD_IF_ABSENT' | 'OVERWRITE_IF_EXISTS_OR_ADD' | 'OVERWRITE_IF_EXISTS' | number;
}
export interface HeaderMap {
  headers?: HeaderValue[];
}
export interface HttpHeaders {
  headers?: HeaderMap;
  end_of_stream?: boolean;
}
export interface HttpBody {
  body?: Buffer | Uint8Array;
  end_of_stream?: boolean;
}
export interface HttpTrailers {
  trailers?: HeaderMap;
}
export type BodySendMode = 'NONE' | 'STREAMED' | 'BUFFERED' | 'BUFFERED_PARTIAL' | 'FULL_DUPLEX_STREAMED';
export interface ProtocolConfiguration {
  request_body_mode?: BodySendMode | number;
  response_body_mode?: BodySendMode | number;
  send_body_without_waiting_for_header_response?: boolean;
}

export interface ProcessingRequest {
  request?:
    | 'request_headers'
    | 'response_headers'
    | 'request_body'
    | 'response_body'
    | 'request_trailers'
    | 'response_trailers';
  request_headers?: HttpHeaders;
  response_headers?: HttpHeaders;
  request_body?: HttpBody;
  response_body?: HttpBody;
  request_trailers?: HttpTrailers;
  response_trailers?: HttpTrailers;
  metadata_context?: { filter_metadata?: Record<string, ProtoStruct> };
  attributes?: Record<string, ProtoStruct>;
  observability_mode?: boolean;
  protocol_config?: ProtocolConfiguration;
}

export interface HeaderMutation {
  set_headers?: HeaderValueOption[];
  remove_headers?: string[];
}
export interface StreamedBodyResponse {
  body: Buffer | Uint8Array;
  end_of_stream: boolean;
}
export interface BodyMutation {
  mutation?: 'body' | 'clear_body' | 'streamed_response';
  body?: Buffer | Uint8Array;
  clear_body?: boolean;
  streamed_response?: StreamedBodyResponse;
}
export interface CommonResponse {
  status?: 'CONTINUE' | 'CONTINUE_AND_REPLACE' | number;
  header_mutation?: HeaderMutation;
  body_mutation?: BodyMutation;
  clear_route_cache?: boolean;
}
export interface ImmediateResponse {
  status: { code: number | string };
  headers?: HeaderMutation;
  body?: Buffer | Uint8Array;
  details?: string;
}
export interface ProcessingResponse {
  response?:
    | 'request_headers'
    | 'response_headers'
    | 'request_body'
    | 'response_body'
    | 'request_trailers'
    | 'response_trailers'
    | 'immediate_response';
  request_headers?: { response?: CommonResponse };
  response_headers?: { response?: CommonResponse };
  request_body?: { response?: CommonResponse };
  response_body?: { response?: CommonResponse };
  request_trailers?: { header_mutation?: HeaderMutation };
  response_trailers?: { header_mutation?: HeaderMutation };
  immediate_response?: ImmediateResponse;
  dynamic_metadata?: ProtoStruct;
}

let serviceDefinition: ServiceDefinition | undefined;

/** The ExternalProcessor service definition (loaded once). */
export function extProcService(): ServiceDefinition {
  if (!serviceDefinition) {
    const pkg = loadPackageDefinition(loadSync(EXT_PROC_PROTO, PROTO_LOADER_OPTIONS)) as unknown as {
      envoy: { service: { ext_proc: { v3: { ExternalProcessor: { service: ServiceDefinition } } } } };
    };
    serviceDefinition = pkg.envoy.service.ext_proc.v3.ExternalProcessor.service;
  }
  return serviceDefinition;
}

// ------------------------------------------------------------------ google.protobuf.Struct

/** A Struct as plain JSON-like data (what Envoy's metadata means). */
export function structToPlain(s: ProtoStruct | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(s?.fields ?? {})) out[k] = valueToPlain(v);
  return out;
}

function valueToPlain(v: ProtoValue | undefined): unknown {
  if (!v) return null;
  // decoded values name their member in `kind`; values built here only set the member
  const kind =
    v.kind ??
    (['stringValue', 'numberValue', 'boolValue', 'structValue', 'listValue'] as const).find((k) => v[k] !== undefined);
  switch (kind) {
    case 'stringValue':
      return v.stringValue ?? '';
    case 'numberValue':
      return v.numberValue ?? 0;
    case 'boolValue':
      return v.boolValue ?? false;
    case 'structValue':
      return structToPlain(v.structValue);
    case 'listValue':
      return (v.listValue?.values ?? []).map(valueToPlain);
    default:
      return null;
  }
}

/** A Struct from plain data: strings, finite numbers, booleans, null, arrays and objects. */
export function plainToStruct(o: Record<string, unknown>): ProtoStruct {
  const fields: Record<string, ProtoValue> = {};
  for (const [k, v] of Object.entries(o)) fields[k] = plainToValue(v);
  return { fields };
}

function plainToValue(v: unknown): ProtoValue {
  if (typeof v === 'string') return { stringValue: v };
  if (typeof v === 'number') return { numberValue: v };
  if (typeof v === 'boolean') return { boolValue: v };
  if (Array.isArray(v)) return { listValue: { values: v.map(plainToValue) } };
  if (v !== null && typeof v === 'object') return { structValue: plainToStruct(v as Record<string, unknown>) };
  return { nullValue: 'NULL_VALUE' };
}
