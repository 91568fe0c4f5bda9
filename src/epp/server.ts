import { createServer as createNetServer, type AddressInfo, type Server as NetServer } from 'node:net';
import { Server, ServerCredentials } from '@grpc/grpc-js';
import { HealthImplementation } from 'grpc-health-check';
import { createProcessHandler, type ExtProcHandlerOptions } from './ext-proc-handler.js';
import { EXT_PROC_SERVICE, extProcService } from './proto.js';
import { capClientConnections, DEFAULT_MAX_CLIENT_CONNECTIONS } from '../server/client-connections.js';

/** gRPC health service names the Gateway API Inference Extension's probes ask for. */
export const HEALTH_SERVICES = ['liveness', 'readiness', EXT_PROC_SERVICE] as const;

/** Room in a message for what comes with a body chunk: its framing, attributes and metadata. */
const MESSAGE_OVERHEAD_BYTES = 64 * 1024;
/** gRPC's default limit on a received message, the one the Inference Extension's picker runs with. */
const GRPC_DEFAULT_MAX_RECEIVE_BYTES = 4 * 1024 * 1024;

/**
 * Most streams (requests) open at once on one gateway connection, announced in HTTP/2's
 * SETTINGS_MAX_CONCURRENT_STREAMS: Envoy opens another connection past it (each counted under
 * --max-client-connections), so one connection cannot hold an unbounded number of requests.
 */
export const MAX_CONCURRENT_STREAMS = 1024;

/**
 * The largest gRPC message the picker reads. grpc-js ends a stream whose next message is
 * larger with RESOURCE_EXHAUSTED as soon as it reads the message's length, before the handler
 * sees anything: Envoy then answers the client 500 (ext_proc_error_gRPC_error_8), since
 * FULL_DUPLEX_STREAMED requires failure_mode_allow false. Below the limit the handler reads
 * the message and answers a body over the body limit 413. Envoy passes a body on in chunks of
 * what it read (up to its buffer limit, 1 MiB by default), or whole in BUFFERED mode: with a
 * small body limit, this limit stays at gRPC's default 4 MiB, so such a chunk gets its 413.
 * Each stream holds at most one message it has not handled yet.
 */
export function maxReceiveMessageBytes(bodyLimit: number): number {
  return Math.max(bodyLimit, GRPC_DEFAULT_MAX_RECEIVE_BYTES) + MESSAGE_OVERHEAD_BYTES;
}

export interface EppServerOptions extends ExtProcHandlerOptions {
  host?: string;
  /** gRPC port (0: any free port). */
  port: number;
  /** Whether the picker can route now (readiness and the ExternalProcessor health service). */
  ready: () => boolean;
  /** How often readiness is re-evaluated for health watchers (default 1000 ms). */
  readinessIntervalMs?: number;
  /**
   * How often the picker pings each gateway connection (default 30,000 ms), and how long it
   * waits for the answer (default 10,000 ms) before closing the connection and ending its
   * streams: a gateway that vanished without closing the connection would otherwise hold its
   * requests in flight for ever.
   */
  keepaliveTimeMs?: number;
  keepaliveTimeoutMs?: number;
  /**
   * Caps the connections of the picker's listener (the gateway's capClientConnections, so the
   * cap and its metrics are the gateway's); default: DEFAULT_MAX_CLIENT_CONNECTIONS, not counted.
   */
  capConnections?: (listener: NetServer) => void;
}

export interface EppServer {
  /** The bound port. */
  port: number;
  server: Server;
  /** Stops taking streams, lets open ones finish up to `graceMs`, then cancels them. */
  close(graceMs?: number): Promise<void>;
}

/**
 * The endpoint picker's gRPC server: envoy.service.ext_proc.v3.ExternalProcessor/Process and
 * grpc.health.v1.Health with the services `liveness` (the process answers), `readiness` and
 * the ExternalProcessor's own name (both: the picker can route now).
 */
export async function startEppServer(options: EppServerOptions): Promise<EppServer> {
  const server = new Server({
    'grpc.max_receive_message_length': maxReceiveMessageBytes(options.bodyLimit),
    'grpc.max_send_message_length': options.bodyLimit + MESSAGE_OVERHEAD_BYTES,
    'grpc.max_concurrent_streams': MAX_CONCURRENT_STREAMS,
    // Envoy keeps one HTTP/2 connection per worker thread; let its keepalive pings through
    'grpc.keepalive_permit_without_calls': 1,
    'grpc.http2.min_ping_interval_without_data_ms': 10_000,
    // grpc-js sends no keepalive pings from a server unless asked: a dead peer's streams never end
    'grpc.keepalive_time_ms': options.keepaliveTimeMs ?? 30_000,
    'grpc.keepalive_timeout_ms': options.keepaliveTimeoutMs ?? 10_000,
  });
  server.addService(extProcService(), { Process: createProcessHandler(options) });
  const health = new HealthImplementation({
    liveness: 'SERVING',
    readiness: 'NOT_SERVING',
    [EXT_PROC_SERVICE]: 'NOT_SERVING',
  });
  health.addToServer(server);
  let lastReady: boolean | undefined;
  const refresh = () => {
    const ready = options.ready();
    if (ready === lastReady) return;
    lastReady = ready;
    health.setStatus('readiness', ready ? 'SERVING' : 'NOT_SERVING');
    health.setStatus(EXT_PROC_SERVICE, ready ? 'SERVING' : 'NOT_SERVING');
  };
  refresh();
  const timer = setInterval(refresh, options.readinessIntervalMs ?? 1000);
  timer.unref();

  // the picker's own listener hands its connections to the gRPC server: grpc-js's listeners
  // take no cap on connections, a net.Server does (client-connections.ts)
  const injector = server.createConnectionInjector(ServerCredentials.createInsecure());
  const listener = createNetServer((socket) => injector.injectConnection(socket));
  if (options.capConnections) options.capConnections(listener);
  else capClientConnections(listener, DEFAULT_MAX_CLIENT_CONNECTIONS, () => {});
  const closeListener = () => new Promise<void>((resolve) => listener.close(() => resolve()));
  let port: number;
  try {
    port = await new Promise<number>((resolve, reject) => {
      listener.once('error', reject);
      // an IPv6 address as listen() takes it: without brackets
      listener.listen(options.port, (options.host ?? '0.0.0.0').replace(/^\[(.*)\]$/, '$1'), () => {
        listener.off('error', reject);
        resolve((listener.address() as AddressInfo).port);
      });
    });
  } catch (err) {
    // nobody gets a close() for a server that did not start: the readiness poll would run
    // (and keep the picker and its gateway reachable) for the life of the process
    clearInterval(timer);
    server.forceShutdown();
    throw err;
  }
  return {
    port,
    server,
    close: async (graceMs = 5000) => {
      clearInterval(timer);
      health.setStatus('readiness', 'NOT_SERVING');
      health.setStatus(EXT_PROC_SERVICE, 'NOT_SERVING');
      await new Promise<void>((resolve) => {
        // no new connections meanwhile; those open are the gRPC server's to close
        void closeListener();
        const force = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, graceMs);
        force.unref();
        server.tryShutdown(() => {
          clearTimeout(force);
          resolve();
        });
      });
    },
  };
}
