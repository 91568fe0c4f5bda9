import {
  status as GrpcStatus,
  type sendUnaryData,
  type Server,
  type ServerUnaryCall,
  type ServerWritableStream,
} from '@grpc/grpc-js';
import { service as healthService, type ServingStatus } from 'grpc-health-check';

/**
 * Longest service name a Watch call is held open for. The picker serves a fixed set of short
 * names (`liveness`, `readiness`, the ExternalProcessor's, ''): a Watch for any other is answered
 * SERVICE_UNKNOWN, as the gRPC health protocol asks, and stays open (a client-side health checker
 * waits on it) only when its name is no longer than this, so that open calls do not hold names of
 * megabytes.
 */
export const MAX_WATCHED_NAME_BYTES = 256;

interface HealthRequest {
  service?: string;
}
type WatchCall = ServerWritableStream<HealthRequest, { status: ServingStatus | 'SERVICE_UNKNOWN' }>;

/**
 * grpc.health.v1.Health for a fixed set of services. grpc-health-check's HealthImplementation
 * keeps a watcher set under every name a Watch ever asked for, never deleting it (a million
 * Watches with distinct names of a megabyte each held their names for the process's life);
 * here only the services the picker serves have watchers, a Watch for any other name holds
 * nothing of this object, Check answers NOT_FOUND for it, and shutdown() ends every open Watch.
 */
export class EppHealth {
  private readonly statuses = new Map<string, ServingStatus>();
  /** Open Watch calls of the served services, by name. */
  private readonly watchers = new Map<string, Set<WatchCall>>();
  /** Open Watch calls of names the picker does not serve (ended at shutdown). */
  private readonly unknownWatchers = new Set<WatchCall>();
  /** shutdown() was called: a Watch gets its status and ends. */
  private closing = false;

  constructor(initial: Readonly<Record<string, ServingStatus>>) {
    for (const [name, status] of Object.entries(initial)) {
      this.statuses.set(name, status);
      this.watchers.set(name, new Set());
    }
  }

  /** Sets a served service's status and tells its watchers. */
  setStatus(name: string, status: ServingStatus): void {
    const watchers = this.watchers.get(name);
    if (!watchers) throw new Error(`the health service ${JSON.stringify(name)} is not served`);
    if (this.statuses.get(name) === status) return;
    this.statuses.set(name, status);
    for (const call of watchers) call.write({ status });
  }

  /** Open Watch calls (all names). */
  get openWatches(): number {
    let n = this.unknownWatchers.size;
    for (const set of this.watchers.values()) n += set.size;
    return n;
  }

  /** Ends every open Watch call (with OK, after the statuses already sent): the server can then shut down. */
  shutdown(): void {
    this.closing = true;
    const calls = [...this.unknownWatchers];
    for (const set of this.watchers.values()) calls.push(...set);
    this.unknownWatchers.clear();
    for (const set of this.watchers.values()) set.clear();
    for (const call of calls) call.end();
  }

  addToServer(server: Server): void {
    server.addService(healthService, {
      Check: (call: ServerUnaryCall<HealthRequest, unknown>, callback: sendUnaryData<{ status: ServingStatus }>) => {
        const name = call.request.service ?? '';
        const status = this.statuses.get(name);
        if (status) callback(null, { status });
        else
          callback({
            code: GrpcStatus.NOT_FOUND,
            details: `health status unknown for service ${JSON.stringify(shorten(name))}`,
          });
      },
      Watch: (call: WatchCall) => {
        const name = call.request.service ?? '';
        const status = this.statuses.get(name);
        const set = status === undefined ? this.unknownWatchers : this.watchers.get(name)!;
        call.write({ status: status ?? 'SERVICE_UNKNOWN' });
        // shutting down, or a name the picker will never serve, too long to hold on to: nothing more will come
        if (this.closing || (status === undefined && Buffer.byteLength(name) > MAX_WATCHED_NAME_BYTES)) {
          call.end();
          return;
        }
        set.add(call);
        const forget = () => set.delete(call);
        call.on('cancelled', forget);
        call.on('close', forget);
        call.on('error', forget);
      },
      List: (_call: ServerUnaryCall<unknown, unknown>, callback: sendUnaryData<unknown>) => {
        const statuses: Record<string, { status: ServingStatus }> = {};
        for (const [name, status] of this.statuses) statuses[name] = { status };
        callback(null, { statuses });
      },
    });
  }
}

/** A name as a log or status message shows it: its first 64 characters. */
function shorten(name: string): string {
  return name.length > 64 ? `${name.slice(0, 64)}…` : name;
}
