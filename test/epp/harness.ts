import assert from 'node:assert/strict';
import { Duplex } from 'node:stream';
import { after, before } from 'node:test';
import {
  credentials,
  makeGenericClientConstructor,
  status as GrpcStatus,
  type Client,
  type ClientDuplexStream,
  type ServerDuplexStream,
} from '@grpc/grpc-js';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { createProcessHandler, type PickInput } from '../../src/epp/ext-proc-handler.js';
import { startPicker, type PickerConfig, type RunningPicker } from '../../src/epp/run-picker.js';
import { createGateway, type Gateway, type GatewayOptions, type GatewayWorker } from '../../src/server/gateway.js';
import { MemoryStateStore, type StateStore } from '../../src/state/state-store.js';
import { extProcService, type ProcessingRequest, type ProcessingResponse } from '../../src/epp/proto.js';
import { EnvoyRole } from './envoy-role.js';

/** Mock engines, and endpoint-picker replicas in front of them (a gateway each, sharing state or not). */
export interface PickerFleet {
  engines: MockEngine[];
  gateways: Gateway[];
  pickers: RunningPicker[];
  /** gRPC address of each picker replica (127.0.0.1:port). */
  addresses: string[];
  /** Each engine's endpoint (127.0.0.1:port), in worker order. */
  endpoints: string[];
  /** Worker id by endpoint. */
  workerAt: Map<string, string>;
  logs: string[];
  close(): Promise<void>;
}

/** A bare ext_proc client, for streams written by hand (EnvoyRole's are always well-formed). */
export type ExtProcClient = Client & { Process(): ClientDuplexStream<ProcessingRequest, ProcessingResponse> };

/** A picker fleet with Envoy's role and a bare client on its first replica; close() ends all three. */
export async function startPickerWithClients(
  o: Parameters<typeof startPickerFleet>[0],
): Promise<{ fleet: PickerFleet; envoy: EnvoyRole; client: ExtProcClient; close(): Promise<void> }> {
  const fleet = await startPickerFleet(o);
  const envoy = new EnvoyRole(fleet.addresses[0]);
  const Ctor = makeGenericClientConstructor(extProcService(), 'ExternalProcessor');
  const client = new Ctor(fleet.addresses[0], credentials.createInsecure()) as unknown as ExtProcClient;
  return {
    fleet,
    envoy,
    client,
    close: async () => {
      client.close();
      envoy.close();
      await fleet.close();
    },
  };
}

export async function startPickerFleet(
  o: {
    engines?: number;
    /**
     * In place of `engines` workers engine-0…: one engine each, with `engineOptions` and its own
     * `engine` options, served as the worker `worker` describes (its url the engine's).
     */
    workers?: Array<{ engine?: ConstructorParameters<typeof MockEngine>[0]; worker: Omit<GatewayWorker, 'url'> }>;
    replicas?: number;
    state?: () => StateStore;
    picker?: Partial<PickerConfig>;
    gateway?: Partial<GatewayOptions>;
    engineOptions?: ConstructorParameters<typeof MockEngine>[0];
  } = {},
): Promise<PickerFleet> {
  const specs =
    o.workers ?? Array.from({ length: o.engines ?? 3 }, (_, i) => ({ engine: {}, worker: { id: `engine-${i}` } }));
  const engines: MockEngine[] = [];
  for (const s of specs)
    engines.push(
      await new MockEngine({
        kvBlocks: 4096,
        prefillTokS: 200_000,
        decodeTokS: 4000,
        ...o.engineOptions,
        ...s.engine,
      }).start(),
    );
  const endpoints = engines.map((e) => `127.0.0.1:${e.port}`);
  const workerAt = new Map(endpoints.map((e, i) => [e, specs[i].worker.id]));
  const gateways: Gateway[] = [];
  const pickers: RunningPicker[] = [];
  const addresses: string[] = [];
  const logs: string[] = [];
  for (let r = 0; r < (o.replicas ?? 1); r++) {
    const gateway = await createGateway({
      router: new KVAwareRouter({ blockSize: 16 }),
      workers: specs.map((s, i) => ({ ...s.worker, url: `http://${endpoints[i]}` })),
      state: (o.state ?? (() => new MemoryStateStore()))(),
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      log: (m) => logs.push(m),
      ...o.gateway,
    });
    const picker = await startPicker(
      gateway,
      {
        shedQueueDepth: 5,
        shedKvUsage: 0.8,
        eppFallbacks: 2,
        bodyLimit: o.gateway?.bodyLimit ?? 16 * 1024 * 1024,
        ...o.picker,
      },
      { host: '127.0.0.1', port: 0, log: (m) => logs.push(m), readinessIntervalMs: 50 },
    );
    gateways.push(gateway);
    pickers.push(picker);
    addresses.push(`127.0.0.1:${String(picker.eppPort)}`);
  }
  return {
    engines,
    gateways,
    pickers,
    addresses,
    endpoints,
    workerAt,
    logs,
    close: async () => {
      for (const p of pickers) await p.close();
      for (const g of gateways) await g.close();
      for (const e of engines) await e.close();
    },
  };
}

/**
 * Envoy's role on a picker fleet started with `o` before the calling file's (or suite's) tests
 * and closed after them; `fleet` and `envoy` are there once those tests run.
 */
export function pickerFleetWithEnvoy(o: Parameters<typeof startPickerFleet>[0] = {}): {
  readonly fleet: PickerFleet;
  readonly envoy: EnvoyRole;
} {
  let started: { fleet: PickerFleet; envoy: EnvoyRole } | undefined;
  before(async () => {
    const fleet = await startPickerFleet(o);
    started = { fleet, envoy: new EnvoyRole(fleet.addresses[0]) };
  });
  after(async () => {
    started?.envoy.close();
    await started?.fleet.close();
  });
  const running = () => {
    assert.ok(started, 'the picker fleet starts before the tests');
    return started;
  };
  return {
    get fleet() {
      return running().fleet;
    },
    get envoy() {
      return running().envoy;
    },
  };
}

/**
 * Envoy's role on two one-engine picker fleets, started before the calling file's tests and
 * closed after them: `stripping` with the gateway's defaults, `keeping` with `keep` (the option
 * that keeps fields the picker removes by default).
 */
export function strippingAndKeeping(keep: Partial<GatewayOptions>): {
  readonly stripping: EnvoyRole;
  readonly keeping: EnvoyRole;
} {
  const fleets: PickerFleet[] = [];
  const envoys: EnvoyRole[] = [];
  before(async () => {
    fleets.push(await startPickerFleet({ engines: 1 }), await startPickerFleet({ engines: 1, gateway: keep }));
    for (const f of fleets) envoys.push(new EnvoyRole(f.addresses[0]));
  });
  after(async () => {
    for (const e of envoys) e.close();
    for (const f of fleets) await f.close();
  });
  return {
    get stripping() {
      return envoys[0];
    },
    get keeping() {
      return envoys[1];
    },
  };
}

/** The body Envoy forwards for `body` sent to `path` (the client's own when the picker changed nothing). */
export async function forwardedBody(envoy: EnvoyRole, path: string, body: string): Promise<string> {
  const out = await envoy.request({ headers: { ':path': path }, body });
  assert.equal(out.kind, 'routed', out.kind === 'immediate' ? out.body : '');
  if (out.kind !== 'routed') return '';
  const text = out.body.length > 0 ? out.body.toString() : body;
  if (out.body.length > 0) assert.equal(out.setHeaders.get('content-length'), String(out.body.length));
  await out.stream.end();
  return text;
}

/**
 * The ext_proc handler on a stream of its own, before any gRPC: `call` takes the messages Envoy
 * would send (push them), and `picked()` is what the picker was asked, once it was (the picker
 * refuses every request, 400).
 */
export function handlerCapturingPick(bodyLimit = 1 << 20): { call: Duplex; picked: () => PickInput | undefined } {
  const call = new Duplex({ objectMode: true, read() {}, write: (_c, _e, done: () => void) => done() });
  let picked: PickInput | undefined;
  const handler = createProcessHandler({
    bodyLimit,
    picker: {
      pick: (input) => {
        picked = input;
        return { ok: false, status: 400, message: 'seen' };
      },
    },
  });
  handler(call as unknown as ServerDuplexStream<ProcessingRequest, ProcessingResponse>);
  return { call, picked: () => picked };
}

/** A stream's answers, the status it ended with, and how long it took (ms). */
export interface StreamEnd {
  answers: ProcessingResponse[];
  code: number;
  details: string;
  ms: number;
}

/**
 * Writes `messages` on `call` and resolves once the picker ends the stream (or, with
 * `untilAnswer`, at its first answer, the stream cancelled then); rejects after 10 s.
 */
export function streamEnd<T>(
  call: ClientDuplexStream<T, ProcessingResponse>,
  messages: readonly T[],
  untilAnswer = false,
): Promise<StreamEnd> {
  const start = Date.now();
  const answers: ProcessingResponse[] = [];
  return new Promise<StreamEnd>((resolve, reject) => {
    const deadline = setTimeout(() => {
      call.cancel();
      reject(new Error('the picker did not end the stream within 10 s'));
    }, 10_000);
    const done = (code: number, details: string) => {
      clearTimeout(deadline);
      resolve({ answers, code, details, ms: Date.now() - start });
    };
    call.on('data', (m: ProcessingResponse) => {
      answers.push(m);
      if (untilAnswer) {
        call.cancel();
        done(GrpcStatus.OK, '');
      }
    });
    call.on('error', (e: Error & { code: number; details: string }) => done(e.code, e.details));
    call.on('status', (s: { code: number; details: string }) => {
      if (s.code === GrpcStatus.OK) done(s.code, s.details);
    });
    call.on('end', () => {});
    for (const m of messages) call.write(m);
  });
}
