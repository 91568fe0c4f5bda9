import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  credentials,
  makeGenericClientConstructor,
  status as GrpcStatus,
  type Client,
  type ClientDuplexStream,
} from '@grpc/grpc-js';
import { extProcService, type ProcessingRequest, type ProcessingResponse } from '../../src/epp/proto.js';
import {
  checkWire,
  MAX_MESSAGE_DEPTH,
  MAX_MESSAGE_FIELDS,
  MAX_NON_BODY_BYTES,
  processingRequestSchema,
} from '../../src/epp/wire-limits.js';
import { EnvoyRole } from './envoy-role.js';
import { startPickerFleet, streamEnd, type PickerFleet } from './harness.js';
import { until } from '../helpers/wait.js';

// A ProcessingRequest's wire bytes are checked before protobufjs decodes them: a message whose
// decoding would make millions of objects (2-byte empty google.protobuf.Values in a subset hint),
// nest without end, or carry megabytes besides its body chunk ends its stream with a status that
// names the limit, at once, and is counted; Envoy's largest real messages pass.

let fleet: PickerFleet;
let envoy: EnvoyRole;
type RawClient = Client & { Process(): ClientDuplexStream<Buffer, ProcessingResponse> };
let client: RawClient;
before(async () => {
  fleet = await startPickerFleet({ engines: 2 });
  envoy = new EnvoyRole(fleet.addresses[0]);
  // a client that sends bytes as they are: the messages here are built on the wire
  const service = extProcService();
  const Ctor = makeGenericClientConstructor(
    { ...service, Process: { ...service.Process, requestSerialize: (b: Buffer) => b } },
    'ExternalProcessor',
  );
  client = new Ctor(fleet.addresses[0], credentials.createInsecure()) as unknown as RawClient;
});
after(async () => {
  client.close();
  envoy.close();
  await fleet.close();
});

const serialize = (m: ProcessingRequest): Buffer => extProcService().Process.requestSerialize(m);

function varint(n: number): Buffer {
  const out: number[] = [];
  while (n > 127) {
    out.push((n & 127) | 128);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return Buffer.from(out);
}
/** A length-delimited field. */
const ld = (field: number, payload: Buffer) =>
  Buffer.concat([varint((field << 3) | 2), varint(payload.length), payload]);

const HEADERS = serialize({
  request_headers: {
    headers: {
      headers: [':method', ':path'].map((key, i) => ({ key, raw_value: Buffer.from(['GET', '/v1/models'][i]) })),
    },
    end_of_stream: true,
  },
});

/** Request headers and a subset hint whose list holds `n` empty google.protobuf.Values (2 bytes each). */
function emptyValuesHint(n: number): Buffer {
  const list = Buffer.alloc(2 * n);
  for (let i = 0; i < n; i++) list[2 * i] = 0x0a; // ListValue.values, length 0
  const entry = Buffer.concat([ld(1, Buffer.from('x-gateway-destination-endpoint-subset')), ld(2, ld(6, list))]);
  // ProcessingRequest.metadata_context (8) → filter_metadata entry (1) → Struct.fields entry (1)
  const metadata = ld(8, ld(1, Buffer.concat([ld(1, Buffer.from('envoy.lb.subset_hint')), ld(2, ld(1, entry))])));
  return Buffer.concat([HEADERS, metadata]);
}

/** Request headers and metadata whose Struct nests `levels` Values within each other. */
function nestedMetadata(levels: number): Buffer {
  // Value.struct_value (5) → Struct.fields (1) entry {key, value}
  let value = ld(3, Buffer.from('leaf')); // Value.string_value
  for (let i = 0; i < levels; i++) value = ld(5, ld(1, Buffer.concat([ld(1, Buffer.from('a')), ld(2, value)])));
  const struct = ld(1, Buffer.concat([ld(1, Buffer.from('deep')), ld(2, value)]));
  return Buffer.concat([HEADERS, ld(8, ld(1, Buffer.concat([ld(1, Buffer.from('envoy.lb')), ld(2, struct)])))]);
}

async function outcomes(outcome: string): Promise<number> {
  const page = await fleet.gateways[0].metrics.metrics();
  const line = page.split('\n').find((l) => l.startsWith(`contextforge_epp_requests_total{outcome="${outcome}"} `));
  return line === undefined ? 0 : Number(line.split(' ')[1]);
}

/** The picker still routes a normal request and answers its health check. */
async function stillServing(): Promise<void> {
  const out = await envoy.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt: 'after' }) });
  assert.equal(out.kind, 'routed');
  if (out.kind === 'routed') await out.stream.end();
  assert.equal(await envoy.healthStatus('liveness'), 'SERVING');
}

test('a subset hint of a million empty Values ends the stream RESOURCE_EXHAUSTED naming the limit, undecoded', async () => {
  const before = await outcomes('resource_exhausted');
  const out = await streamEnd(client.Process(), [emptyValuesHint(1_000_000)]);
  assert.equal(out.code, GrpcStatus.RESOURCE_EXHAUSTED, `status ${out.code} ${out.details}`);
  assert.match(out.details, new RegExp(`more than ${MAX_MESSAGE_FIELDS} fields`));
  assert.equal(out.answers.length, 0);
  await until(async () => (await outcomes('resource_exhausted')) === before + 1, 'the stream counted under its status');
  await stillServing();
});

test('metadata nested deeper than MAX_MESSAGE_DEPTH ends the stream RESOURCE_EXHAUSTED naming the limit', async () => {
  const out = await streamEnd(client.Process(), [nestedMetadata(MAX_MESSAGE_DEPTH)]);
  assert.equal(out.code, GrpcStatus.RESOURCE_EXHAUSTED, `status ${out.code} ${out.details}`);
  assert.match(out.details, new RegExp(`deeper than ${MAX_MESSAGE_DEPTH}`));
  // a few levels of JSON in metadata are read as before
  const shallow = await streamEnd(client.Process(), [nestedMetadata(10)], true);
  assert.equal(shallow.code, GrpcStatus.OK);
  assert.ok(shallow.answers[0].request_headers, 'routed');
  await stillServing();
});

test('headers of more than MAX_NON_BODY_BYTES end the stream; a body chunk of more passes', async () => {
  const big = serialize({
    request_headers: {
      headers: {
        headers: [
          { key: ':method', raw_value: Buffer.from('POST') },
          { key: ':path', raw_value: Buffer.from('/v1/completions') },
          { key: 'x-big', raw_value: Buffer.alloc(MAX_NON_BODY_BYTES, 'h') },
        ],
      },
    },
  });
  const out = await streamEnd(client.Process(), [big]);
  assert.equal(out.code, GrpcStatus.RESOURCE_EXHAUSTED, `status ${out.code} ${out.details}`);
  assert.match(out.details, new RegExp(`more than ${MAX_NON_BODY_BYTES} bytes besides its body chunk`));
  // a body in one chunk of twice as much is routed
  const prompt = 'p'.repeat(2 * MAX_NON_BODY_BYTES);
  const routed = await envoy.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt }) });
  assert.equal(routed.kind, 'routed');
  if (routed.kind === 'routed') await routed.stream.end();
});

test('Envoy’s largest request headers (1,000) with a 4,096-endpoint subset hint are read and routed', async () => {
  const endpoints = fleet.endpoints;
  const hint = [
    ...endpoints,
    ...Array.from({ length: 4096 - endpoints.length }, (_, i) => `10.9.${i >> 8}.${i & 255}:8000`),
  ];
  const m = serialize({
    request_headers: {
      headers: {
        headers: [
          { key: ':method', raw_value: Buffer.from('GET') },
          { key: ':path', raw_value: Buffer.from('/v1/models') },
          ...Array.from({ length: 998 }, (_, i) => ({ key: `x-h-${i}`, raw_value: Buffer.from(`value ${i}`) })),
        ],
      },
      end_of_stream: true,
    },
    metadata_context: {
      filter_metadata: {
        'envoy.lb.subset_hint': {
          fields: {
            'x-gateway-destination-endpoint-subset': {
              listValue: { values: hint.map((stringValue) => ({ stringValue })) },
            },
          },
        },
      },
    },
  });
  assert.equal(checkWire(processingRequestSchema(), m), undefined);
  const out = await streamEnd(client.Process(), [m], true);
  assert.equal(out.code, GrpcStatus.OK, `status ${out.code} ${out.details}`);
  assert.ok(out.answers[0].request_headers, `routed, got ${out.answers[0].response}`);
});

test('a message that is not protobuf ends the stream INVALID_ARGUMENT, counted under its status', async () => {
  const before = await outcomes('invalid_argument');
  const out = await streamEnd(client.Process(), [Buffer.from([0xff, 0xff, 0xff])]);
  assert.equal(out.code, GrpcStatus.INVALID_ARGUMENT, `status ${out.code} ${out.details}`);
  assert.match(out.details, /not a valid ProcessingRequest/);
  await until(async () => (await outcomes('invalid_argument')) === before + 1, 'the stream counted under its status');
});

test('the wire pass counts every field at every depth, and frames varints as protobufjs does', () => {
  const schema = processingRequestSchema();
  // a 16 MiB body chunk is one field, its bytes skipped
  const body = serialize({ request_body: { body: Buffer.alloc(16 << 20), end_of_stream: true } });
  assert.equal(checkWire(schema, body), undefined);
  // an unknown length-delimited field is one field, whatever it holds
  const unknown = Buffer.concat([ld(900, Buffer.alloc(2 * MAX_MESSAGE_FIELDS, 0x08))]);
  assert.equal(checkWire(schema, unknown), undefined);
  // an unknown group's fields are skipped one by one (as protobufjs does): each counts
  const group = (n: number) =>
    Buffer.concat([
      varint((900 << 3) | 3),
      Buffer.alloc(2 * n).fill(Buffer.from([0x08, 0x00])),
      varint((900 << 3) | 4),
    ]);
  assert.equal(checkWire(schema, group(100)), undefined);
  assert.equal(checkWire(schema, group(MAX_MESSAGE_FIELDS))?.code, GrpcStatus.RESOURCE_EXHAUSTED);
  // request_headers (field 2) tagged in 10 bytes, as protobufjs reads a 32-bit varint: accepted, and decoded alike
  const tenBytes = Buffer.from([0x92, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00]);
  assert.equal(checkWire(schema, tenBytes), undefined);
  assert.equal((extProcService().Process.requestDeserialize(tenBytes) as ProcessingRequest).request, 'request_headers');
  // in 7 bytes protobufjs would still skip to the tenth: refused, so the pass and the decoder never disagree
  const sevenBytes = Buffer.from([0x92, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00]);
  assert.equal(checkWire(schema, sevenBytes)?.code, GrpcStatus.INVALID_ARGUMENT);
});

test('a message over the receive limit, refused by gRPC itself, is counted under its status, not cancelled', async () => {
  const before = { exhausted: await outcomes('resource_exhausted'), cancelled: await outcomes('cancelled') };
  // the fleet's body limit is 16 MiB: the receive limit is that and 64 KiB
  const out = await streamEnd(client.Process(), [Buffer.alloc(17 << 20)]);
  assert.equal(out.code, GrpcStatus.RESOURCE_EXHAUSTED, `status ${out.code} ${out.details}`);
  await until(
    async () => (await outcomes('resource_exhausted')) === before.exhausted + 1,
    'the stream counted under resource_exhausted',
  );
  assert.equal(await outcomes('cancelled'), before.cancelled);
  assert.ok(
    fleet.logs.some((l) => /ended by gRPC with RESOURCE_EXHAUSTED/.test(l)),
    'logged with its status',
  );
});
