/**
 * The gateway's Prometheus metrics: one prom-client registry per gateway (several gateways in
 * one process, as in tests and replicas, do not share counters) and the metric objects the
 * request path updates. Worker gauges read the router when scraped, so nothing updates them.
 * Metric names and labels are part of the operator-facing contract: keep them stable.
 */
import type { ServerResponse } from 'node:http';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { KVAwareRouter } from '../core/router/index.js';
import type { SubscriberStats } from '../engines/kv-events/subscriber.js';
import type { StateStats } from '../state/state-store.js';
import type { TokenizerPoolStats } from '../engines/tokenizer-pool.js';
import { skippedEventCounts } from './engine-deployments.js';
import { CLIENT_KEY_KINDS } from './client-requests.js';
import { MEDIA_URL_REFUSAL_REASONS } from './media-domains.js';

/**
 * Why an attempt failed (a bounded set: the label `reason` of contextforge_upstream_failures_total
 * before anything reached the client, and the word the gateway's 502 ends with; of
 * contextforge_stream_failures_total after): the engine's answer or next event was overdue
 * (`timeout`), the connection could not be made (`refused`) or broke (`reset`), the engine answered
 * with a status (or an error object or event) that is no answer (`status`), or its answer was not
 * one the client could read (`malformed`: JSON cut short or not JSON, a stream without its end or
 * with an event that is not JSON, a body of the wrong type, or an answer that breaks HTTP/1.1 so the
 * gateway could not read it: a status line missing, conflicting lengths, headers too large, an
 * interim 100 Continue nothing asked for, chunked framing broken).
 */
export const FAILURE_REASONS = ['timeout', 'refused', 'reset', 'status', 'malformed'] as const;
export type FailureReason = (typeof FAILURE_REASONS)[number];

/**
 * The status a request is counted with when its client closed the connection before the answer
 * was complete: nginx's 499 (Client Closed Request), which log and metric tooling knows.
 */
export const CLIENT_CLOSED_REQUEST = 499;

/** Responses the gateway cut itself after their headers went out (an engine that broke off its answer). */
const cutByGateway = new WeakSet<ServerResponse>();

/** `res` is being cut by the gateway, not left by its client: it counts with the status it was sent with. */
export function markCutByGateway(res: ServerResponse): void {
  cutByGateway.add(res);
}

/**
 * Responses whose request the HTTP server refused on its socket (a body that did not arrive in
 * time: 408), with the status written there: the response object itself is never written.
 */
const answeredOnSocket = new WeakMap<ServerResponse, number>();

/** The request of `res` was answered `status` on its socket, outside `res` (gateway.ts answerClientError). */
export function markAnsweredOnSocket(res: ServerResponse, status: number): void {
  answeredOnSocket.set(res, status);
}

/**
 * The status a response counts with once it has closed: its own when it was written whole or
 * the gateway cut it, the one written on its socket when the server refused its request there,
 * else CLIENT_CLOSED_REQUEST (the client left first: while the request waited, or in the middle
 * of the answer).
 */
export function closedStatus(res: ServerResponse): number {
  if (res.writableFinished || cutByGateway.has(res)) return res.statusCode;
  return answeredOnSocket.get(res) ?? CLIENT_CLOSED_REQUEST;
}

export interface GatewayMetrics {
  registry: Registry;
  /** Requests by path and status (counted with countRequest once each response closes: closedStatus). */
  requests: Counter<'path' | 'status'>;
  /** Routing decisions by policy and reason (counted with countDecision). */
  decisions: Counter<'policy' | 'reason'>;
  /** One request answered: `requests` by its route's path and its status. */
  countRequest(path: string, status: number): void;
  /** One routing decision: `decisions` by its policy and reason. */
  countDecision(policy: string, reason: string): void;
  cachedTokens: Counter;
  promptTokens: Counter;
  /** Requests retried after a failed attempt (counted when the next attempt starts), by the worker that failed. */
  retries: Counter<'worker'>;
  /** Time to the first byte of the answer a request got (from the start of the attempt that answered). */
  ttft: Histogram;
  latency: Histogram;
  /** Connection failures and 5xx before the first byte, per worker (what opens a breaker). */
  upstreamFailures: Counter<'worker' | 'reason'>;
  /**
   * Attempts the engine failed after their answer started reaching the client (a stream ended
   * with the gateway's error event, any other answer cut), per worker and reason (FAILURE_REASONS):
   * not retried, and answered with the status already sent, so contextforge_requests_total does
   * not show them. Each counts for the worker's breaker.
   */
  streamFailures: Counter<'worker' | 'reason'>;
  /**
   * Streamed requests a worker answered with one whole completion, sent to the client as the
   * stream of it, per worker: an engine behind something that does not stream, whose clients get
   * their first token with their last.
   */
  wholeAnswersStreamed: Counter<'worker'>;
  /**
   * Attempts that waited for a free connection to a worker's engine until their deadline (every
   * connection the gateway keeps to it was busy), per worker: the gateway's limit, not the engine's failure.
   */
  connectionWaitTimeouts: Counter<'worker'>;
  /**
   * Attempts routed over workers held out of rotation only by a health check or metrics scrape
   * that timed out, because no worker was in rotation for the request (panic-routing.ts).
   */
  panicRouted: Counter;
  /**
   * Drops the series of a removed router worker (a data-parallel rank is one) from the per-worker
   * counters: workers that come and go (DNS discovery, the admin API) would otherwise grow the
   * page for good. (The per-worker gauges are read from the router, and leave with it.)
   */
  forgetWorker(workerId: string): void;
}

/**
 * Counts by two labels, kept as plain numbers on the request path and added to their
 * prom-client counter when it is read (a scrape): a labelled inc() hashes and checks its
 * labels on every call. The label values come from small fixed sets (route paths, statuses,
 * policies, reasons), so the table stays small.
 */
class PairCounts<A extends string, B extends string> {
  private readonly rows = new Map<string, Map<string | number, { labels: Record<A | B, string>; n: number }>>();

  constructor(
    private readonly first: A,
    private readonly second: B,
  ) {}

  add(a: string, b: string | number): void {
    let row = this.rows.get(a);
    if (row === undefined) this.rows.set(a, (row = new Map()));
    const cell = row.get(b);
    if (cell !== undefined) cell.n++;
    else row.set(b, { labels: { [this.first]: a, [this.second]: String(b) } as Record<A | B, string>, n: 1 });
  }

  /** Adds what was counted since the last flush to `counter`. */
  flush(counter: Counter<A | B>): void {
    for (const row of this.rows.values())
      for (const cell of row.values()) {
        if (cell.n === 0) continue;
        counter.inc(cell.labels, cell.n);
        cell.n = 0;
      }
  }
}

export function createGatewayMetrics(router: KVAwareRouter): GatewayMetrics {
  const registry = new Registry();
  const registers = [registry];
  const requestCounts = new PairCounts('path', 'status');
  const requests: Counter<'path' | 'status'> = new Counter({
    name: 'contextforge_requests_total',
    help: 'Requests by path and status.',
    labelNames: ['path', 'status'] as const,
    registers,
    collect() {
      requestCounts.flush(requests);
    },
  });
  const decisionCounts = new PairCounts('policy', 'reason');
  const decisions: Counter<'policy' | 'reason'> = new Counter({
    name: 'contextforge_route_decisions_total',
    help: 'Routing decisions by policy and reason.',
    labelNames: ['policy', 'reason'] as const,
    registers,
    collect() {
      decisionCounts.flush(decisions);
    },
  });
  const cachedTokens = new Counter({
    name: 'contextforge_predicted_cached_tokens_total',
    help: 'Prompt tokens predicted cached on the chosen worker.',
    registers,
  });
  const promptTokens = new Counter({
    name: 'contextforge_prompt_tokens_total',
    help: 'Prompt tokens routed (estimated in text mode).',
    registers,
  });
  const retries = new Counter({
    name: 'contextforge_upstream_retries_total',
    help: 'Requests retried after a failed attempt on the worker (on another worker; on the same one when its connection broke and no other could take the request).',
    labelNames: ['worker'] as const,
    registers,
  });
  const ttft = new Histogram({
    name: 'contextforge_time_to_first_byte_seconds',
    help: "Time to the first byte of each answered request's answer, from the start of the attempt that answered (failed attempts and error answers are not counted).",
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers,
  });
  const latency = new Histogram({
    name: 'contextforge_request_duration_seconds',
    help: "Duration of each routed request through the router, to its answer, whatever its status (the gateway's own answers included: 502, 503, 429, 508, 404 for an unknown model).",
    buckets: [0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
    registers,
  });
  new Gauge({
    name: 'contextforge_worker_kv_usage',
    help: 'KV-cache usage per worker, as last reported.',
    labelNames: ['worker'],
    aggregator: 'average',
    registers,
    collect() {
      this.reset();
      for (const w of router.listWorkers()) this.set({ worker: w.id }, w.load);
    },
  });
  new Gauge({
    name: 'contextforge_worker_in_flight',
    help: "The router's in-flight requests per worker.",
    labelNames: ['worker'],
    aggregator: 'average',
    registers,
    collect() {
      this.reset();
      for (const w of router.listWorkers()) this.set({ worker: w.id }, w.inFlightRequests);
    },
  });
  new Gauge({
    name: 'contextforge_index_entries',
    help: '(block, worker) entries in the block index.',
    aggregator: 'average',
    registers,
    collect() {
      this.set(router.index.entryCount);
    },
  });
  const upstreamFailures = new Counter({
    name: 'contextforge_upstream_failures_total',
    help: 'Failed attempts before the first byte (retried elsewhere or answered 502), per worker and reason: timeout, refused (connection not made), reset (connection broke), status (an error status, object or event that is no answer), malformed (an answer the client could not read, or one that breaks HTTP/1.1).',
    labelNames: ['worker', 'reason'] as const,
    registers,
  });
  const streamFailures = new Counter({
    name: 'contextforge_stream_failures_total',
    help: 'Failed attempts after the answer started reaching the client (the stream ended with an error event, any other answer cut; not retried, counted with the status already sent), per worker and reason: timeout (next event overdue), reset (connection broke), status (an error event of the engine for a server error), malformed (a stream ended without data: [DONE], one that held an event whose data is not JSON, passed on as sent, or whose HTTP/1.1 framing broke).',
    labelNames: ['worker', 'reason'] as const,
    registers,
  });
  const connectionWaitTimeouts = new Counter({
    name: 'contextforge_engine_connection_wait_timeouts_total',
    help: "Attempts that found every connection the gateway keeps to a worker's engine busy until their deadline, per worker (not engine failures).",
    labelNames: ['worker'] as const,
    registers,
  });
  const wholeAnswersStreamed = new Counter({
    name: 'contextforge_whole_answers_streamed_total',
    help: 'Streamed requests a worker answered with one whole completion (a proxy in front of the engine that does not stream), sent to the client as the stream of it, per worker: their first token came with their last.',
    labelNames: ['worker'] as const,
    registers,
  });
  const panicRouted = new Counter({
    name: 'contextforge_panic_routed_total',
    help: 'Attempts routed over workers held out of rotation only by a health check or metrics scrape that timed out, because no worker was in rotation for the request (panic routing; --panic-routing).',
    registers,
  });
  return {
    registry,
    requests,
    decisions,
    countRequest: (path, status) => requestCounts.add(path, status),
    countDecision: (policy, reason) => decisionCounts.add(policy, reason),
    cachedTokens,
    promptTokens,
    retries,
    ttft,
    latency,
    upstreamFailures,
    streamFailures,
    wholeAnswersStreamed,
    connectionWaitTimeouts,
    panicRouted,
    forgetWorker(workerId) {
      for (const counter of [retries, connectionWaitTimeouts]) counter.remove({ worker: workerId });
      for (const reason of FAILURE_REASONS)
        for (const counter of [upstreamFailures, streamFailures]) counter.remove({ worker: workerId, reason });
    },
  };
}

/** A budget's metrics: [name, help] of the bytes held now, of its limit, and of the counter of what it could not take. */
interface BudgetMetricNames {
  held: readonly [string, string];
  limit: readonly [string, string];
  overflows: readonly [string, string];
}

/** The bytes `budget` holds now, its limit, and a counter (returned) of what it could not take. */
function registerBudgetMetrics(
  registry: Registry,
  budget: { used: number; limit: number },
  names: BudgetMetricNames,
): Counter {
  for (const [[name, help], read] of [
    [names.held, () => budget.used],
    [names.limit, () => budget.limit],
  ] as const)
    new Gauge({
      name,
      help,
      registers: [registry],
      collect() {
        this.set(read());
      },
    });
  return new Counter({ name: names.overflows[0], help: names.overflows[1], registers: [registry] });
}

/**
 * The request-body budget (body-budget.ts): the bytes held now over all requests, their limit,
 * and the requests the gateway or its endpoint picker refused (503) because their body (the
 * picker: or its headers) did not fit. Returns the refusals counter.
 */
export function registerBodyBudgetMetrics(registry: Registry, budget: { used: number; limit: number }): Counter {
  return registerBudgetMetrics(registry, budget, {
    held: [
      'contextforge_request_body_bytes_held',
      'Request-body bytes held now over all requests (the buffered-body budget in use).',
    ],
    limit: [
      'contextforge_request_body_bytes_limit',
      'Most request-body bytes held at once over all requests (--buffered-body-limit).',
    ],
    overflows: [
      'contextforge_request_body_budget_refusals_total',
      'Requests refused because their body (or, at the endpoint picker, headers) did not fit in the buffered-body budget (503), or, at the endpoint picker, a gRPC message not yet whole did not fit in its budget of the same size (the stream reset).',
    ],
  });
}

/** Workers another replica added (shared state) that this one could not take; the counter to increment. */
export function registerStateRefusalMetrics(registry: Registry): Counter {
  return new Counter({
    name: 'contextforge_state_workers_not_added_total',
    help: 'Workers added by another replica (shared state) that this replica could not add (an engine-key variable it may not read, a full router, a malformed record).',
    registers: [registry],
  });
}

/** Requests cut because their body arrived too slowly (body-rate.ts); the counter to increment. */
export function registerBodyRateMetrics(registry: Registry): Counter {
  return new Counter({
    name: 'contextforge_request_body_too_slow_total',
    help: 'Requests cut with 408 because their body arrived slower than --min-body-rate after --min-body-rate-grace-ms.',
    registers: [registry],
  });
}

/**
 * Requests refused with 400 for a media URL of their chat (--allowed-media-domains,
 * media-domains.ts), by reason: host (not in the list), scheme (not http, https or data) or
 * malformed (not a URL, or one other parsers may read as another host). Every reason is shown
 * at 0 from the start. Returns the counter to increment.
 */
export function registerMediaUrlMetrics(registry: Registry): Counter<'reason'> {
  const refusals = new Counter({
    name: 'contextforge_media_url_refusals_total',
    help: 'Requests refused with 400 because a media URL of their chat names a host not in --allowed-media-domains (host), has a scheme other than http, https or data (scheme), or is not a URL or one other parsers may read as another host (malformed).',
    labelNames: ['reason'] as const,
    registers: [registry],
  });
  for (const reason of MEDIA_URL_REFUSAL_REASONS) refusals.inc({ reason }, 0);
  return refusals;
}

/** The client connections of a process's listeners, counted per listener (`http`, `ext_proc`). */
export interface ClientConnectionMetrics {
  /** Reports `listener`'s open connections and cap when scraped; returns its counters. */
  listen(
    listener: string,
    connections: { limit: number; open: () => Promise<number> },
  ): { refused: Counter.Internal; idleClosed: Counter.Internal };
}

/**
 * Client connections (client-connections.ts) per listener: open now, the cap
 * (--max-client-connections), the connections closed unanswered because the cap was reached,
 * and the idle ones closed to make room for a new one at the cap (the HTTP listener's; the
 * endpoint picker's are never counted there).
 */
export function registerClientConnectionMetrics(registry: Registry): ClientConnectionMetrics {
  const listeners = new Map<string, { limit: number; open: () => Promise<number> }>();
  new Gauge({
    name: 'contextforge_client_connections_open',
    help: 'Client connections open now, per listener.',
    labelNames: ['listener'],
    registers: [registry],
    async collect() {
      for (const [listener, c] of listeners) this.set({ listener }, await c.open());
    },
  });
  new Gauge({
    name: 'contextforge_client_connections_limit',
    help: 'Most client connections held at once, per listener (--max-client-connections).',
    labelNames: ['listener'],
    registers: [registry],
    collect() {
      for (const [listener, c] of listeners) this.set({ listener }, c.limit);
    },
  });
  const refused = new Counter({
    name: 'contextforge_client_connections_refused_total',
    help: 'Client connections closed as they were accepted because --max-client-connections were open (on the HTTP listener: none of them idle), per listener.',
    labelNames: ['listener'],
    registers: [registry],
  });
  const idleClosed = new Counter({
    name: 'contextforge_client_connections_idle_closed_total',
    help: 'Idle client connections (no request in progress) closed, the longest idle first, to make room for a new one because --max-client-connections were open, per listener.',
    labelNames: ['listener'],
    registers: [registry],
  });
  return {
    listen(listener, connections) {
      listeners.set(listener, connections);
      // shown at 0 from the start, not only after a first refusal
      refused.inc({ listener }, 0);
      idleClosed.inc({ listener }, 0);
      return { refused: refused.labels({ listener }), idleClosed: idleClosed.labels({ listener }) };
    },
  };
}

/**
 * The requests each client holds in flight (client-requests.ts, --max-requests-per-client): those
 * counted now, the clients holding them (the entries of the table), and the requests refused with
 * 429 because their client held the limit already, by how the client was told apart (`client`:
 * `api_key` or `address`), each shown at 0 from the start. Returns the refusals counter.
 */
export function registerClientRequestMetrics(
  registry: Registry,
  table: { readonly clients: number; readonly requests: number },
): Counter<'client'> {
  new Gauge({
    name: 'contextforge_client_requests_in_flight',
    help: 'Requests on the completion paths counted against --max-requests-per-client now (0 while it is off).',
    registers: [registry],
    collect() {
      this.set(table.requests);
    },
  });
  new Gauge({
    name: 'contextforge_clients_in_flight',
    help: 'Clients (API keys, or addresses: IPv6 by its /64) with requests in flight now, as --max-requests-per-client counts them (0 while it is off).',
    registers: [registry],
    collect() {
      this.set(table.clients);
    },
  });
  const refusals = new Counter({
    name: 'contextforge_client_request_limit_refusals_total',
    help: 'Requests refused with 429 because their client had --max-requests-per-client requests in flight already, by how the client was told apart: api_key (its API key) or address (its address; IPv6 by its /64).',
    labelNames: ['client'] as const,
    registers: [registry],
  });
  for (const client of CLIENT_KEY_KINDS) refusals.inc({ client }, 0);
  return refusals;
}

/**
 * The gathered-answer budget (body-budget.ts, DEFAULT_BUFFERED_ANSWER_LIMIT): the bytes of
 * complete answers gathered now over all requests, their limit, and the answers passed through
 * ungathered because the budget could not take them. Returns the pass-through counter.
 */
export function registerAnswerBudgetMetrics(registry: Registry, budget: { used: number; limit: number }): Counter {
  return registerBudgetMetrics(registry, budget, {
    held: [
      'contextforge_gathered_answer_bytes_held',
      'Bytes of complete engine answers gathered now over all requests (the buffered-answer budget in use).',
    ],
    limit: [
      'contextforge_gathered_answer_bytes_limit',
      'Most bytes of complete engine answers gathered at once over all requests (--buffered-answer-limit).',
    ],
    overflows: [
      'contextforge_gathered_answer_budget_passthroughs_total',
      'Complete answers passed through ungathered (so not retried if cut) because the buffered-answer budget could not take them.',
    ],
  });
}

/**
 * Answers other than 200 from the engines' /tokenize (--tokenize engine, or auto with KV
 * events) and its failures, per router worker, status and reason, read from the worker
 * connections when scraped: a request none of them tokenized is routed without token ids (no
 * cached prefix seen). An answer other than 200 has reason `refused` and the HTTP status
 * (`other` outside 100-599); a failure has status `none` and reason `timeout` (no answer within
 * the deadline), `malformed` (an answer that is no list of token ids the router takes) or
 * `error` (the connection failed). A removed worker's series leave with it.
 */
export function registerTokenizeRefusalMetrics(
  registry: Registry,
  refusals: () => Iterable<{ worker: string; status: string; reason: string; count: number }>,
): void {
  new Counter({
    name: 'contextforge_engine_tokenize_refusals_total',
    help: "Answers other than 200 (reason refused, by HTTP status) and failures (status none; reason timeout, malformed or error) of a worker's engine /tokenize (the request is asked of another engine or routed without token ids).",
    labelNames: ['worker', 'status', 'reason'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const { worker, status, reason, count } of refusals()) this.inc({ worker, status, reason }, count);
    },
  });
}

/**
 * KV-event counters per worker (a data-parallel rank is a worker), read from the subscribers
 * when scraped: events skipped by reason (one bad event never costs its batch; see
 * docs/engines.md for the reasons) and the subscriber's own counts. Each process of `serve
 * --processes N` subscribes to every engine and counts the same events: the batches and the
 * skipped events are merged by 'first', which the primary takes for a count every process keeps
 * of one thing and follows in one process (process-metrics.ts), not summed. The duplicates and
 * late joins are each process's own subscription's (when it joined, what its replay overlapped):
 * merged by 'max', the most any process met.
 */
export function registerKvEventMetrics(
  registry: Registry,
  subscribers: () => Iterable<[string, SubscriberStats]>,
): void {
  new Counter({
    name: 'contextforge_kv_events_skipped_total',
    help: 'KV events skipped (not applied), per worker and reason; a malformed_batch or unknown_rank is a whole batch.',
    labelNames: ['worker', 'reason'] as const,
    aggregator: 'first',
    registers: [registry],
    collect() {
      this.reset();
      for (const { worker, reason, count } of skippedEventCounts(subscribers())) this.inc({ worker, reason }, count);
    },
  });
  new Counter({
    name: 'contextforge_kv_event_batches_total',
    help: 'KV-event batches applied, per worker.',
    labelNames: ['worker'] as const,
    aggregator: 'first',
    registers: [registry],
    collect() {
      this.reset();
      for (const [worker, stats] of subscribers()) this.inc({ worker }, stats.batches);
    },
  });
  new Counter({
    name: 'contextforge_kv_event_duplicates_total',
    help: 'Live KV-event batches skipped as copies of batches a replay had delivered, per worker.',
    labelNames: ['worker'] as const,
    aggregator: 'max',
    registers: [registry],
    collect() {
      this.reset();
      for (const [worker, stats] of subscribers()) this.inc({ worker }, stats.duplicates);
    },
  });
  new Counter({
    name: 'contextforge_kv_event_gaps_total',
    help: "Gaps in a worker's KV-event sequence (events lost on the way), per worker and outcome: replayed from the engine, or lost (its entries dropped and rebuilt from new events).",
    labelNames: ['worker', 'outcome'] as const,
    aggregator: 'max',
    registers: [registry],
    collect() {
      this.reset();
      for (const [worker, stats] of subscribers()) {
        this.inc({ worker, outcome: 'replayed' }, stats.gaps - stats.gapsLost);
        this.inc({ worker, outcome: 'lost' }, stats.gapsLost);
      }
    },
  });
  new Counter({
    name: 'contextforge_kv_event_late_joins_total',
    help: 'Replays accepted from the oldest batch an engine still buffered (the router joined late or lost a stretch).',
    labelNames: ['worker'] as const,
    aggregator: 'max',
    registers: [registry],
    collect() {
      this.reset();
      for (const [worker, stats] of subscribers()) this.inc({ worker }, stats.lateJoins);
    },
  });
}

/**
 * The shared state's health, read from its stats() when scraped: whether it is connected
 * (Redis), its outages, its errors (failed commands, refusals included), the malformed
 * messages or entries it skipped (and of those the oversize ones), and the other replicas'
 * load tallies it corrected from their snapshots. Only the series the store reports are registered (the
 * in-memory store reports none). `serve --processes N` takes the lowest `connected` (1 only
 * when every process is) and sums the counters.
 */
export function registerStateMetrics(registry: Registry, state: { stats(): StateStats }): void {
  const stats = state.stats();
  if (typeof stats.connected === 'boolean')
    new Gauge({
      name: 'contextforge_state_connected',
      help: 'Whether the shared state (Redis) is connected and resynchronised: 1, or 0 while routing on local state.',
      aggregator: 'min',
      registers: [registry],
      collect() {
        this.set(state.stats().connected === true ? 1 : 0);
      },
    });
  for (const [field, name, help] of [
    [
      'outages',
      'contextforge_state_outages_total',
      'Times the shared state was lost (Redis unreachable, stalled, or its subscription cut).',
    ],
    ['errors', 'contextforge_state_errors_total', 'Shared-state commands that failed (refusals included).'],
    [
      'malformedMessages',
      'contextforge_state_malformed_messages_total',
      'Shared-state messages and entries skipped as malformed.',
    ],
    [
      'oversizeMessages',
      'contextforge_state_oversize_messages_total',
      'Shared-state messages refused unread as longer than any replica sends (counted among the malformed too).',
    ],
    [
      'stalls',
      'contextforge_state_stalls_total',
      'Outages that were Redis no longer answering on an open connection (among the outages).',
    ],
    [
      'refused',
      'contextforge_state_refusals_total',
      'Shared-state commands Redis answered with an error (OOM, READONLY, NOPERM, ...), among the errors; /admin/stats names the last one (state.lastRefusal).',
    ],
    [
      'chainsSkipped',
      'contextforge_state_chains_skipped_total',
      'Block entries a resynchronisation skipped: not read in time, or longer than any replica writes.',
    ],
    [
      'chainsOversize',
      'contextforge_state_chains_oversize_total',
      'Block entries in Redis longer than any replica writes, skipped unread (among the skipped).',
    ],
    [
      'wrongKindRepairs',
      'contextforge_state_wrong_kind_repairs_total',
      'Shared keys found holding another kind of value (WRONGTYPE), deleted and written anew.',
    ],
    [
      'workersUnregistered',
      'contextforge_state_workers_unregistered_total',
      'Workers heard added on the channel that a resynchronisation found absent from the shared registry: dropped, not written back.',
    ],
    [
      'settingsMismatches',
      'contextforge_state_settings_mismatches_total',
      "Resynchronisations that found the fleet's hashing settings ({prefix}settings) differing from this replica's: it routes on local state, not sharing.",
    ],
    [
      'remoteLoadCorrected',
      'contextforge_state_remote_load_corrections_total',
      "Other replicas' load tallies replaced from their own snapshots because they disagreed (a forged or lost message).",
    ],
  ] as const)
    if (typeof stats[field] === 'number')
      countedOnScrape(registry, name, help, () => Number(state.stats()[field]) || 0);
}

/** A counter whose value is read from a component's own count when scraped. */
function countedOnScrape(registry: Registry, name: string, help: string, read: () => number): void {
  new Counter({
    name,
    help,
    registers: [registry],
    collect() {
      this.reset();
      this.inc(read());
    },
  });
}

/**
 * The tokenizer threads' work (`--tokenize tokenizer`, TokenizerPool.stats()), read when scraped:
 * the requests waiting or being tokenized, and the counts of those answered, failed, refused
 * while full, past their deadline (--tokenize-timeout-ms from their arrival: routed on their
 * text) while tokenized or while waiting for a thread, and dropped when their client left, and
 * of the threads replaced.
 */
export function registerTokenizerMetrics(registry: Registry, pool: { stats(): TokenizerPoolStats }): void {
  new Gauge({
    name: 'contextforge_tokenizer_pending',
    help: 'Requests waiting for a tokenizer thread or being tokenized, and those answered already (past their deadline, or their client left) until their thread skips them (--tokenize tokenizer).',
    registers: [registry],
    collect() {
      this.set(pool.stats().pending);
    },
  });
  for (const [field, name, help] of [
    ['completed', 'contextforge_tokenizer_completed_total', 'Requests the tokenizer threads tokenized.'],
    [
      'failed',
      'contextforge_tokenizer_failed_total',
      'Requests the tokenizer threads could not tokenize: the chat template raised, the content cannot be tokenized (media), or their thread stopped.',
    ],
    [
      'rejectedBusy',
      'contextforge_tokenizer_rejected_busy_total',
      'Requests refused (503) because as many as the tokenizer takes were waiting already.',
    ],
    [
      'threadRestarts',
      'contextforge_tokenizer_thread_restarts_total',
      'Tokenizer threads replaced after they stopped or were stopped past a deadline.',
    ],
    [
      'timedOut',
      'contextforge_tokenizer_timed_out_total',
      'Requests a tokenizer thread was still tokenizing --tokenize-timeout-ms after their arrival: routed on their text (a thread that works on one request that long is replaced).',
    ],
    [
      'timedOutWaiting',
      'contextforge_tokenizer_timed_out_waiting_total',
      'Requests still waiting for a tokenizer thread --tokenize-timeout-ms after their arrival: routed on their text, never tokenized.',
    ],
    [
      'aborted',
      'contextforge_tokenizer_aborted_total',
      'Requests whose client left before they were tokenized (those a thread had not started were never tokenized).',
    ],
  ] as const)
    countedOnScrape(registry, name, help, () => pool.stats()[field]);
}
