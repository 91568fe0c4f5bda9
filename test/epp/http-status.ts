import { loadSync } from '@grpc/proto-loader';
import { EXT_PROC_PROTO, PROTO_LOADER_OPTIONS } from '../../src/epp/proto.js';

/** Envoy's StatusCode enum (proto/envoy/type/v3/http_status.proto): value name → HTTP status. */
const STATUS_BY_NAME: ReadonlyMap<string, number> = (() => {
  const enumType = loadSync(EXT_PROC_PROTO, PROTO_LOADER_OPTIONS)['envoy.type.v3.StatusCode'] as unknown as {
    type: { value: Array<{ name: string; number: number }> };
  };
  return new Map(enumType.type.value.map((v) => [v.name, v.number]));
})();

/**
 * The HTTP status of an ImmediateResponse as decoded: enums decode to their names, and a
 * number Envoy's enum does not name stays a number. A name outside the enum is NaN.
 */
export function statusNumber(code: number | string): number {
  return typeof code === 'number' ? code : (STATUS_BY_NAME.get(code) ?? Number.NaN);
}
