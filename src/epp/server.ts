import { createServer as createNetServer, type AddressInfo, type Server as NetServer, type Socket } from 'node:net';
import { Server, ServerCredentials } from '@grpc/grpc-js';
import { createProcessHandler, type ExtProcHandlerOptions } from './ext-proc-handler.js';
import { EXT_PROC_SERVICE } from './proto.js';
import { guardedExtProcService } from './wire-limits.js';
import { EppHealth } from './health.js';
import { capClientConnections, DEFAULT_MAX_CLIENT_CONNECTIONS } from '../server/client-connections.js';
import { BodyBudget } from '../server/body-budget.js';
import { chargePartialMessages } from './partial-messages.js';
import { EppServerCredentials, watchTlsIdentity, type TlsIdentity } from './tls.js';

/**
 * gRPC health service names the Gateway API Inference Extension's probes ask for, and '', the
 * server's overall health (what Envoy's grpc_health_check and a Kubernetes gRPC probe ask for
 * when given no service name), which answers as readiness.
 */
export const HEALTH_SERVICES = ['liveness', 'readiness', EXT_PROC_SERVICE, ''] as const;

/** The services that answer whether the picker can route now. */
const READINESS_SERVICES = ['readiness', EXT_PROC_SERVICE, ''] as const;

/**
 * Most connections the plaintext health port holds at once: probes, not traffic. One more
 * closes the oldest (a probe connects, asks once and goes: the oldest is the likeliest to be
 * one held open for nothing), so connections that hold the port cannot keep the probes out.
 */
export const MAX_HEALTH_CONNECTIONS = 64;

/**
 * What a client sends first on an HTTP/2 connection at the least: the 24-byte connection
 * preface and the header of its SETTINGS frame.
 */
const HTTP2_PREFACE_BYTES = 24 + 9;

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
 * Each stream holds at most one message it has not handled yet, and what the streams hold of
 * such messages is bounded by a budget of `--buffered-body-limit` (partial-messages.ts).
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
  /**
   * Serve the ext_proc port over TLS with this certificate (default: plaintext). With `reload`,
   * the certificate directory is re-read every `intervalMs` and a changed, valid pair replaces
   * the certificate for new connections.
   */
  tls?: { identity: TlsIdentity; reload?: { certPath: string; intervalMs: number } };
  /**
   * Also serve grpc.health.v1.Health alone, in plaintext, on this port (0: any free port):
   * kubelet gRPC probes speak no TLS. Default: none.
   */
  healthPort?: number;
  /**
   * Time a connection to the health port has to send its HTTP/2 preface before it is closed
   * (default 5000 ms).
   */
  healthPrefaceTimeoutMs?: number;
  /** Time a health-port connection with no call in flight stays open (default 10,000 ms). */
  healthIdleTimeoutMs?: number;
}

export interface EppServer {
  /** The bound port. */
  port: number;
  /** The bound plaintext health port, when one was asked for. */
  healthPort: number | undefined;
  server: Server;
  /** Stops taking streams, lets open ones finish up to `graceMs`, then cancels them. */
  close(graceMs?: number): Promise<void>;
}

/**
 * Longest message the plaintext health port reads: a HealthCheckRequest holds one service name,
 * and the picker serves names of a few bytes and watches names of at most MAX_WATCHED_NAME_BYTES
 * (256); 4 KiB leaves any name a probe sends room.
 */
export const HEALTH_MESSAGE_BYTES = 4096;

/**
 * The endpoint picker's gRPC server: envoy.service.ext_proc.v3.ExternalProcessor/Process and
 * grpc.health.v1.Health with the services `liveness` (the process answers), `readiness`, the
 * ExternalProcessor's own name and '' (these three: the picker can route now); over TLS when
 * `tls` is given. With `healthPort`, the same health services in plaintext on a port of their own.
 */
export async function startEppServer(options: EppServerOptions): Promise<EppServer> {
  const keepalive = {
    // Envoy keeps one HTTP/2 connection per worker thread; let its keepalive pings through
    'grpc.keepalive_permit_without_calls': 1,
    'grpc.http2.min_ping_interval_without_data_ms': 10_000,
    // grpc-js sends no keepalive pings from a server unless asked: a dead peer's streams never end
    'grpc.keepalive_time_ms': options.keepaliveTimeMs ?? 30_000,
    'grpc.keepalive_timeout_ms': options.keepaliveTimeoutMs ?? 10_000,
  };
  const server = new Server({
    'grpc.max_receive_message_length': maxReceiveMessageBytes(options.bodyLimit),
    'grpc.max_send_message_length': options.bodyLimit + MESSAGE_OVERHEAD_BYTES,
    'grpc.max_concurrent_streams': MAX_CONCURRENT_STREAMS,
    ...keepalive,
  });
  // each message's wire bytes are checked against the limits on fields, nesting and bytes
  // besides the body before protobufjs decodes them (wire-limits.ts)
  server.addService(guardedExtProcService(), { Process: createProcessHandler(options) });
  // the services above only: any other name is answered unknown and held nowhere (health.ts)
  const health = new EppHealth({
    liveness: 'SERVING',
    ...Object.fromEntries(READINESS_SERVICES.map((s) => [s, 'NOT_SERVING'])),
  });
  health.addToServer(server);
  const setReady = (ready: boolean) => {
    for (const s of READINESS_SERVICES) health.setStatus(s, ready ? 'SERVING' : 'NOT_SERVING');
  };
  let lastReady: boolean | undefined;
  const refresh = () => {
    const ready = options.ready();
    if (ready === lastReady) return;
    lastReady = ready;
    setReady(ready);
  };
  refresh();
  const timer = setInterval(refresh, options.readinessIntervalMs ?? 1000);
  timer.unref();

  const credentials = options.tls ? new EppServerCredentials(options.tls.identity) : ServerCredentials.createInsecure();
  // the picker's own listener hands its connections to the gRPC server: grpc-js's listeners
  // take no cap on connections, a net.Server does (client-connections.ts)
  const injector = server.createConnectionInjector(credentials);
  // what grpc-js holds of messages not yet whole is bounded as the bodies the handler holds are
  // (a budget of the same size of its own: taken from the handler's, it would reset a stream
  // whose next chunk the handler would have answered 503)
  if (options.bodyBudget)
    chargePartialMessages(server, new BodyBudget(options.bodyBudget.limit, 'buffered-body-limit'), () =>
      options.onBodyBudgetRefusal?.(),
    );
  const listener = createNetServer((socket) => injector.injectConnection(socket));
  if (options.capConnections) options.capConnections(listener);
  else capClientConnections(listener, DEFAULT_MAX_CLIENT_CONNECTIONS, () => {});
  const closeListener = () => new Promise<void>((resolve) => listener.close(() => resolve()));

  // kubelet probes: the health services alone, plaintext, on a gRPC server of their own, whose
  // connections are closed once idle (a probe asks once) or when they send no HTTP/2 preface;
  // a HealthCheckRequest is a service name, so a message past HEALTH_MESSAGE_BYTES is refused
  // unread (RESOURCE_EXHAUSTED) rather than taken at gRPC's default 4 MiB
  const healthServer =
    options.healthPort === undefined
      ? undefined
      : new Server({
          ...keepalive,
          'grpc.max_connection_idle_ms': options.healthIdleTimeoutMs ?? 10_000,
          'grpc.max_receive_message_length': HEALTH_MESSAGE_BYTES,
        });
  let healthListener: NetServer | undefined;
  if (healthServer) {
    health.addToServer(healthServer);
    const healthInjector = healthServer.createConnectionInjector(ServerCredentials.createInsecure());
    const prefaceTimeoutMs = options.healthPrefaceTimeoutMs ?? 5000;
    // oldest first (a Set keeps its insertion order)
    const held = new Set<Socket>();
    healthListener = createNetServer((socket) => {
      if (held.size >= MAX_HEALTH_CONNECTIONS) {
        const oldest = held.values().next().value!;
        held.delete(oldest);
        oldest.destroy();
      }
      held.add(socket);
      socket.once('close', () => held.delete(socket));
      // a client that has not sent its HTTP/2 preface by then is no probe
      const preface = setTimeout(() => {
        if (socket.bytesRead < HTTP2_PREFACE_BYTES) socket.destroy();
      }, prefaceTimeoutMs);
      preface.unref();
      socket.once('close', () => clearTimeout(preface));
      healthInjector.injectConnection(socket);
    });
  }
  const closeHealth = () =>
    new Promise<void>((resolve) => {
      healthServer?.forceShutdown();
      if (healthListener?.listening) healthListener.close(() => resolve());
      else resolve();
    });

  let port: number;
  let healthPort: number | undefined;
  try {
    port = await listen(listener, options.port, options.host);
    if (healthListener) healthPort = await listen(healthListener, options.healthPort!, options.host);
  } catch (err) {
    // nobody gets a close() for a server that did not start: the readiness poll would run
    // (and keep the picker and its gateway reachable) for the life of the process
    clearInterval(timer);
    if (listener.listening) await closeListener();
    await closeHealth();
    server.forceShutdown();
    throw err;
  }
  const stopReload =
    options.tls?.reload &&
    watchTlsIdentity(
      options.tls.reload.certPath,
      options.tls.identity,
      options.tls.reload.intervalMs,
      (identity) => (credentials as EppServerCredentials).replace(identity),
      options.log ?? (() => {}),
    );
  return {
    port,
    healthPort,
    server,
    close: async (graceMs = 5000) => {
      clearInterval(timer);
      stopReload?.();
      setReady(false);
      // open Watch calls, told NOT_SERVING just now, end: tryShutdown waits for every call, and
      // a Watch never ends on its own
      health.shutdown();
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
      await closeHealth();
    },
  };
}

/** Listens on `port` of `host` (default every IPv4 address); the bound port. */
function listen(listener: NetServer, port: number, host = '0.0.0.0'): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    listener.once('error', reject);
    // an IPv6 address as listen() takes it: without brackets
    listener.listen(port, host.replace(/^\[(.*)\]$/, '$1'), () => {
      listener.off('error', reject);
      resolve((listener.address() as AddressInfo).port);
    });
  });
}
