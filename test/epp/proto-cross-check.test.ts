import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { test } from 'node:test';
import { loadSync, type PackageDefinition } from '@grpc/proto-loader';
import { EXT_PROC_PROTO, PROTO_DIR } from '../../src/epp/proto.js';

// Every field of the repository's minimal Envoy protos (proto/) against the copy of Envoy's
// API that @grpc/grpc-js-xds ships: same number, type, label, message type and oneof. That
// copy predates FULL_DUPLEX_STREAMED, StreamedBodyResponse and protocol_config; those are
// checked against NEWER below, the numbers of Envoy's current
// api/envoy/service/ext_proc/v3/external_processor.proto and
// api/envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto.

const NEWER_FIELDS: Record<string, { number: number; type: string; typeName?: string }> = {
  'envoy.service.ext_proc.v3.ProcessingRequest.protocol_config': {
    number: 11,
    type: 'TYPE_MESSAGE',
    typeName: 'ProtocolConfiguration',
  },
  'envoy.service.ext_proc.v3.ProtocolConfiguration.request_body_mode': {
    number: 1,
    type: 'TYPE_ENUM',
    typeName: 'BodySendMode',
  },
  'envoy.service.ext_proc.v3.ProtocolConfiguration.response_body_mode': {
    number: 2,
    type: 'TYPE_ENUM',
    typeName: 'BodySendMode',
  },
  'envoy.service.ext_proc.v3.ProtocolConfiguration.send_body_without_waiting_for_header_response': {
    number: 3,
    type: 'TYPE_BOOL',
  },
  'envoy.service.ext_proc.v3.BodyMutation.streamed_response': {
    number: 3,
    type: 'TYPE_MESSAGE',
    typeName: 'StreamedBodyResponse',
  },
  'envoy.service.ext_proc.v3.StreamedBodyResponse.body': { number: 1, type: 'TYPE_BYTES' },
  'envoy.service.ext_proc.v3.StreamedBodyResponse.end_of_stream': { number: 2, type: 'TYPE_BOOL' },
};
const NEWER_ENUM_VALUES: Record<string, number> = {
  'envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode.FULL_DUPLEX_STREAMED': 4,
};

interface FieldDescriptor {
  name: string;
  number: number;
  label: string;
  type: string;
  typeName: string;
  oneofIndex?: number;
}
interface EnumDescriptor {
  name?: string;
  value: Array<{ name: string; number: number }>;
}
interface MessageDescriptor {
  field: FieldDescriptor[];
  oneofDecl: Array<{ name: string }>;
  enumType?: EnumDescriptor[];
}
type Entry = { format: string; type: MessageDescriptor | EnumDescriptor };

const require = createRequire(import.meta.url);
const xdsDeps = `${dirname(require.resolve('@grpc/grpc-js-xds/package.json'))}/deps`;

const ours = loadSync(EXT_PROC_PROTO, { keepCase: true, includeDirs: [PROTO_DIR] });
const shipped = loadSync(EXT_PROC_PROTO, {
  keepCase: true,
  includeDirs: ['envoy-api', 'xds', 'protoc-gen-validate', 'googleapis'].map((d) => `${xdsDeps}/${d}`),
});

const entries = (pd: PackageDefinition, kind: 'DescriptorProto' | 'EnumDescriptorProto') =>
  Object.entries(pd).filter(
    ([name, e]) => name.startsWith('envoy.') && (e as Entry).format === `Protocol Buffer 3 ${kind}`,
  ) as Array<[string, Entry]>;
/** Top-level enums and the enums nested in messages, by full name. */
function enums(pd: PackageDefinition): Map<string, EnumDescriptor> {
  const out = new Map<string, EnumDescriptor>();
  for (const [name, e] of entries(pd, 'EnumDescriptorProto')) out.set(name, e.type as EnumDescriptor);
  for (const [name, e] of entries(pd, 'DescriptorProto'))
    for (const en of (e.type as MessageDescriptor).enumType ?? []) out.set(`${name}.${en.name}`, en);
  return out;
}
const tail = (typeName: string) => typeName.split('.').pop() ?? '';
const oneofOf = (m: MessageDescriptor, f: FieldDescriptor) =>
  f.oneofIndex === undefined || f.oneofIndex === null ? undefined : m.oneofDecl[f.oneofIndex]?.name;

test("the minimal protos declare the messages the picker needs, under Envoy's names", () => {
  const names = new Set(Object.keys(ours));
  for (const m of [
    'ProcessingRequest',
    'ProcessingResponse',
    'HttpHeaders',
    'HttpBody',
    'CommonResponse',
    'HeaderMutation',
    'BodyMutation',
    'StreamedBodyResponse',
    'ImmediateResponse',
    'ProtocolConfiguration',
  ]) {
    assert.ok(names.has(`envoy.service.ext_proc.v3.${m}`), m);
  }
  for (const m of [
    'envoy.config.core.v3.HeaderValue',
    'envoy.config.core.v3.HeaderValueOption',
    'envoy.config.core.v3.HeaderMap',
    'envoy.config.core.v3.Metadata',
    'envoy.type.v3.HttpStatus',
  ])
    assert.ok(names.has(m), m);
});

test('every field shared with the shipped copy has the same number, type, label, message type and oneof', () => {
  let compared = 0;
  const newerSeen = new Set<string>();
  for (const [name, entry] of entries(ours, 'DescriptorProto')) {
    const mine = entry.type as MessageDescriptor;
    const theirs = (shipped[name] as Entry | undefined)?.type as MessageDescriptor | undefined;
    for (const f of mine.field) {
      const full = `${name}.${f.name}`;
      const t: FieldDescriptor | undefined = theirs?.field.find((x) => x.name === f.name);
      if (!t) {
        const newer = NEWER_FIELDS[full];
        assert.ok(newer, `${full} is in neither the shipped copy nor the list of newer fields`);
        assert.equal(f.number, newer.number, `${full}: number`);
        assert.equal(f.type, newer.type, `${full}: type`);
        if (newer.typeName) assert.equal(tail(f.typeName), newer.typeName, `${full}: message type`);
        // a newer field's number must not be taken by another field in the shipped copy
        assert.ok(
          !theirs?.field.some((x) => x.number === f.number),
          `${full}: number ${f.number} is used by another field in the shipped copy`,
        );
        newerSeen.add(full);
        continue;
      }
      assert.equal(f.number, t.number, `${full}: number`);
      assert.equal(f.type, t.type, `${full}: type`);
      assert.equal(f.label, t.label, `${full}: label`);
      assert.equal(tail(f.typeName), tail(t.typeName), `${full}: message type`);
      assert.equal(oneofOf(mine, f), oneofOf(theirs!, t), `${full}: oneof`);
      compared++;
    }
  }
  assert.ok(compared >= 40, `compared ${compared} fields`);
  assert.deepEqual([...newerSeen].sort(), Object.keys(NEWER_FIELDS).sort(), 'every newer field is declared');
});

test('every enum value shared with the shipped copy has the same number', () => {
  let compared = 0;
  const shippedEnums = enums(shipped);
  const ourEnums = enums(ours);
  assert.ok(ourEnums.has('envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode'));
  for (const [name, mine] of ourEnums) {
    const theirs = shippedEnums.get(name);
    assert.ok(theirs, `${name} is not in the shipped copy`);
    for (const v of mine.value) {
      const t: { name: string; number: number } | undefined = theirs.value.find((x) => x.name === v.name);
      if (!t) {
        assert.equal(
          v.number,
          NEWER_ENUM_VALUES[`${name}.${v.name}`],
          `${name}.${v.name} is in neither the shipped copy nor the newer values`,
        );
        continue;
      }
      assert.equal(v.number, t.number, `${name}.${v.name}`);
      compared++;
    }
  }
  assert.ok(compared >= 15, `compared ${compared} enum values`);
});

test('the service is the same bidirectional stream', () => {
  const mine = ours['envoy.service.ext_proc.v3.ExternalProcessor'] as Record<
    string,
    { path: string; requestStream: boolean; responseStream: boolean }
  >;
  const theirs = shipped['envoy.service.ext_proc.v3.ExternalProcessor'] as typeof mine;
  assert.equal(mine.Process.path, '/envoy.service.ext_proc.v3.ExternalProcessor/Process');
  assert.equal(mine.Process.path, theirs.Process.path);
  assert.equal(mine.Process.requestStream, true);
  assert.equal(mine.Process.responseStream, true);
  assert.equal(theirs.Process.requestStream && theirs.Process.responseStream, true);
});

test("the HTTP status enum is Envoy's whole StatusCode: every status the picker answers with has its name", () => {
  const name = 'envoy.type.v3.StatusCode';
  const mine = enums(ours).get(name);
  const theirs = enums(shipped).get(name);
  assert.ok(mine && theirs, name);
  const missing = theirs.value.filter((t) => !mine.value.some((v) => v.name === t.name && v.number === t.number));
  assert.deepEqual(
    missing.map((v) => `${v.name} = ${v.number}`),
    [],
    `values of Envoy's ${name} missing here`,
  );
  assert.equal(mine.value.length, theirs.value.length, `${name}: values Envoy does not define`);
});
