import { setImmediate as nextTurn } from 'node:timers/promises';
import { context, Dealer, Subscriber, type Observer } from 'zeromq';
import { errorText, quotedText, shownText } from '../../core/shown-text.js';
import type { KvEventApplier } from './applier.js';
import {
  emptyCounts,
  MISMATCHES_BEFORE_GIVING_UP,
  NON_LOCAL_SKIP,
  SGLANG_SHARED_MEDIUM,
  type ApplyCounts,
} from './applier.js';
import {
  FULL_PREFIX_KINDS,
  KV_EVENT_LIMITS,
  KvEventFormatError,
  readEventBatch,
  type EventBatchReader,
  type KvEventBatch,
} from './decode.js';

/**
 * One subscriber per engine endpoint (docs/architecture.md §8): a ZMQ SUB socket connected to the
 * engine's PUB, frames [topic, seq, payload]. Sequence numbers are checked:
 * - a gap means lost events: replay them over DEALER↔ROUTER when the engine has a replay
 *   endpoint; otherwise (or if the replay fails) drop the worker's entries and rebuild them
 *   from new events — never keep guessing. Replies come as ["", seq, payload] (SGLang, vLLM
 *   before vllm-project/vllm#45177) or ["", topic, seq, payload] (vLLM since), ending with
 *   seq = −1; both are read;
 * - a sequence number going back to 0 means the engine restarted with an empty cache: its
 *   entries are dropped;
 * - joining a stream late (first seq > 0) replays from 0 where possible, to learn what the
 *   engine already holds; the engine's buffer (vLLM's buffer_steps batches) may no longer
 *   start at 0, so a replay is accepted from its oldest batch (`lateJoins`): stores whose
 *   parents were in the dropped part are orphans (counted; `--block-hash vllm` applies them);
 * - a replay that itself has a gap (the buffer moved on) drops the worker's entries and
 *   rebuilds from the oldest batch it has, rather than asking again for what is gone;
 * - a replay asked for by a live batch applies batches up to that one only (later ones come
 *   live); one that jumps past it, leaving a hole, fails: numbered ahead of the stream, it
 *   would make every live batch look like one it had delivered;
 * - a live copy of a batch a replay delivered is skipped and counted (`duplicates`); a number
 *   below the first batch the replay delivered was never delivered by it: a restart;
 * - losing the connection makes the engine's state unknown (it may have died): its entries
 *   are dropped, and on reconnection rebuilt from the replay buffer;
 * - a quiet stream is polled through the replay endpoint every `idleReplayMs`, so the last
 *   batches before a silence are not lost for good (PUB/SUB drops silently).
 * A malformed message (bad frames, a sequence number with its top bit set — vLLM counts up
 * from 0 —, or a payload whose decoding fails in any way) is counted
 * and skipped; it never clears or corrupts the index, nor stops the stream. A large batch is
 * decoded and applied in slices (`APPLY_SLICE_EVENTS` events or `APPLY_SLICE_BYTES` bytes),
 * yielding to the event loop between them so that requests are routed meanwhile; the next
 * message waits for the batch to end (every handler runs in order on one chain). Between
 * messages, live or replayed, it yields once its work since the last turn of the loop passes
 * `YIELD_AFTER_MS`: ZeroMQ hands over queued messages without the loop turning, and a burst of
 * batches would otherwise hold up requests, timers and the connection watch for seconds. An event of a
 * batch that cannot be read or applied is skipped and counted per reason (`applied.skipped`);
 * the rest of its batch applies.
 * Reconnection is libzmq's, with exponential backoff up to `reconnectMaxMs`.
 */
export interface KvEventSubscriberOptions {
  workerId: string;
  endpoint: string;
  replayEndpoint?: string;
  applier: KvEventApplier;
  /**
   * The endpoint is data-parallel rank `rank`'s of an API server in front of the `size` ranks
   * `start`…`start`+`size`−1 (global ranks: vLLM's --data-parallel-start-rank, default 0;
   * workerId is that rank's worker). vLLM publishes each rank's events on a port of its own (the
   * events port + global rank, vllm/distributed/kv_events.py offset_endpoint_port), stamped with
   * the global rank: a batch stamped with another rank (outside the API server's, negative, or
   * another of its ranks) is skipped and counted (`unknownRanks`), logged once. Without it every
   * batch of the endpoint is workerId's, whatever its rank (an engine started with
   * --data-parallel-rank R, listed as a worker of its own, stamps its batches with R).
   */
  dataParallel?: { rank: number; start?: number; size: number };
  /** Longest wait for each message of a replay (default 2000 ms). */
  replayTimeoutMs?: number;
  /**
   * Longest a whole replay may take (default 10 s): an engine that replays batch after batch
   * without its end marker must not hold the stream (live messages wait while a replay runs).
   */
  replayDeadlineMs?: number;
  reconnectMaxMs?: number;
  /** Poll the replay endpoint after this long without messages (default 2000 ms; 0: never). */
  idleReplayMs?: number;
  /** Called with a one-line description of anything unusual (gaps, restarts, bad frames). */
  log?: (message: string) => void;
}

export interface SubscriberStats {
  batches: number;
  events: number;
  /** Sequence numbers skipped by a live batch (events lost on the way), replayed when the engine can. */
  gaps: number;
  /** Of those, the gaps no replay filled: the worker's entries dropped, rebuilt from new events. */
  gapsLost: number;
  replays: number;
  replayFailures: number;
  restarts: number;
  disconnects: number;
  /** Connections ZeroMQ closed for good (a protocol error: a message over the size limit) and the subscriber made again. */
  sessionsRestarted: number;
  malformed: number;
  /** Batches of a data-parallel rank the worker does not have (skipped). */
  unknownRanks: number;
  /** Live copies of batches a replay had delivered (skipped). */
  duplicates: number;
  /** Replays accepted from the oldest batch the engine still buffered (joined late). */
  lateJoins: number;
  lastSeq: number | null;
  /** now − the last batch's timestamp, in seconds (engine and router clocks assumed synced). */
  lagSeconds: number;
  applied: ApplyCounts;
}

/**
 * A slice of a batch decoded and applied at once: tens of milliseconds at most. Most batches
 * (a vLLM step, ~1 MB at 131,072 batched tokens) take one or a few; SGLang's at page size 1
 * (one event per token) take many.
 */
export const APPLY_SLICE_EVENTS = 4096;
export const APPLY_SLICE_BYTES = 256 * 1024;
/**
 * Blocks a slice's events may walk before the loop turns (KvEventApplier.workOf): a slice's
 * stores and removals stay well under it, but an AllBlocksCleared on a worker that keeps
 * offload copies walks every one of them (~100 ns each), and 4,096 such clears in one slice
 * would hold the loop for a minute. A few milliseconds of clearing.
 */
export const APPLY_SLICE_WORK = 65_536;

/**
 * Wall time (ms) the subscriber reads and applies messages before it lets the event loop turn
 * (requests, timers, its connection watch). zeromq.js resolves a receive from the messages it
 * already holds without the loop turning, up to 512 in a row: a burst of batches queued by an
 * engine, or a replay of thousands, would block everything else for seconds. Measured in time,
 * not in events or batches: a message's cost varies by orders of magnitude (a duplicate or
 * malformed message skipped, an empty batch, thousands of stores with their token ids), so a
 * count would yield far too often for some and too seldom for others; reading the clock once a
 * message costs tens of nanoseconds. A few milliseconds keeps a request's wait near a normal
 * answer's, and the turns (microseconds each) cost under 1% of the work.
 */
export const YIELD_AFTER_MS = 5;

/**
 * ZeroMQ sockets a subscriber holds at most: its SUB, the PAIR libzmq reports the SUB's
 * connections on and the PAIR its observer reads them from, and a replay's DEALER while one is
 * under way. ZeroMQ's context refuses sockets past its max_sockets (1023 by default), replays'
 * included: subscribers are only started while each can still open its replay's.
 */
export const SOCKETS_PER_SUBSCRIBER = 4;

/**
 * Sockets kept spare: a closed subscriber's are counted out once its SUB is released, but ZeroMQ
 * releases its two PAIRs and a cancelled replay's DEALER a moment later.
 */
const SPARE_SOCKETS = 2 * SOCKETS_PER_SUBSCRIBER;

/**
 * How long after a disconnect ZeroMQ has to show it is reconnecting (a connect attempt, a retry
 * scheduled) before the connection is taken as closed for good and made again: libzmq
 * reconnects after a connection error, but ends the session after a protocol error (a message
 * over maxMessageSize; session_base_t::engine_error), and nothing would connect again.
 */
export const SESSION_CHECK_MS = 1000;
/**
 * Lines of one kind about one worker's publisher logged at most once in this window (logOnceAWindow):
 * a wrong endpoint disconnects 10 times a second, and an engine may send an event the router skips,
 * or a foreign publisher a bad message, at every scheduler step. Every one is counted.
 */
export const LOG_WINDOW_MS = 60_000;

/** The largest sequence number: a signed 64-bit one (an engine's from 2^63 on is malformed). */
const MAX_SEQ = (1n << 63n) - 1n;

/**
 * `line`, with how many more of `what` were not logged since the last line of its kind (or
 * `first`, when given, on a first line).
 */
function moreSince(line: string, unlogged: number, what: string, first?: string): string {
  if (unlogged > 0) return `${line} (and ${unlogged} more ${what} since the last line)`;
  return first === undefined ? line : `${line} ${first}`;
}

/** Longest close() waits for ZeroMQ to release the socket (its observer's last event). */
const WATCH_END_WAIT_MS = 5000;

let openSubscribers = 0;

/**
 * Sockets whose observer ZeroMQ could not open, kept open for good: see start(). Referenced here
 * so that no collection closes them either.
 */
const unclosable: Subscriber[] = [];

/** Subscribers open (constructed, not yet released), and how many more ZeroMQ's max_sockets leaves room for. */
export function subscriberRoom(): { open: number; room: number; maxSockets: number } {
  const maxSockets = context.maxSockets;
  return {
    open: openSubscribers,
    room: Math.max(
      0,
      Math.floor((maxSockets - SPARE_SOCKETS - 2 * unclosable.length) / SOCKETS_PER_SUBSCRIBER) - openSubscribers,
    ),
    maxSockets,
  };
}

export class KvEventSubscriber {
  // ZeroMQ buffers a whole frame before handing it over: past the decode limit it disconnects
  // the sender instead, so a hostile frame is refused before it is held in memory
  private readonly sub = new Subscriber({ linger: 0, maxMessageSize: KV_EVENT_LIMITS.maxPayloadBytes });
  private lastSeq: bigint | null = null;
  /** The last sequence number a replay delivered: live copies up to it are duplicates. */
  private replayedThrough: bigint | null = null;
  /** The first sequence number the replays since the last live batch delivered. */
  private replayedFrom: bigint | null = null;
  private unknownRankLogged = false;
  private running = false;
  /** The replay under way: closed with the subscriber, so that a replay ends with it. */
  private replayDealer: Dealer | undefined;
  private loop: Promise<void> | undefined;
  private watch: Promise<void> | undefined;
  /** Every handler runs in order on this chain: replays must not interleave with messages. */
  private chain: Promise<void> = Promise.resolve();
  private lastMessageAt = Date.now();
  /** When the event loop last turned for this subscriber (YIELD_AFTER_MS). */
  private workingSince = performance.now();
  private idleTimer: NodeJS.Timeout | undefined;
  /** The check that ZeroMQ reconnects after a disconnect (SESSION_CHECK_MS). */
  private sessionCheck: NodeJS.Timeout | undefined;
  /** When ZeroMQ last tried to connect (a connection, an attempt under way, a retry scheduled), and when it last disconnected. */
  private connectingAt = 0;
  private disconnectedAt = 0;
  /** A disconnect, or a connection since the last disconnect, not handled yet (connectionChanged). */
  private disconnectPending = false;
  private connectPending = false;
  private connectionHandlerQueued = false;
  /**
   * Per kind of line logged at most once a window (disconnects, each reason of skipped events):
   * when its last line was, and how many it did not log since. A few kinds: reasons are a fixed set.
   */
  private readonly logWindows = new Map<string, { loggedAt: number; unlogged: number }>();
  /** Whether it was counted out of the open subscribers (closed, or refused at its start). */
  private released = false;
  readonly stats: SubscriberStats = {
    batches: 0,
    events: 0,
    gaps: 0,
    gapsLost: 0,
    replays: 0,
    replayFailures: 0,
    restarts: 0,
    disconnects: 0,
    sessionsRestarted: 0,
    malformed: 0,
    unknownRanks: 0,
    duplicates: 0,
    lateJoins: 0,
    lastSeq: null,
    lagSeconds: 0,
    applied: emptyCounts(),
  };

  constructor(private readonly options: KvEventSubscriberOptions) {
    openSubscribers++;
    this.sub.reconnectInterval = 100;
    this.sub.reconnectMaxInterval = options.reconnectMaxMs ?? 5000;
  }

  /**
   * Throws a RangeError, with nothing left open, when ZeroMQ refuses the endpoint, and ZeroMQ's
   * error (code EMFILE) when it is out of sockets or descriptors.
   */
  start(): this {
    this.running = true;
    // taken here, not in the watch: an observer ZeroMQ cannot open (out of sockets or
    // descriptors) refuses the subscriber at once rather than leave it running unwatched. Its
    // socket is not closed: libzmq may have set up the socket's monitor before the observer's
    // own socket failed, and closing a socket whose monitor has no reader blocks ZeroMQ's reaper
    // for good (see close()). Never connected, it reports nothing; it stays open, two sockets
    let events: Observer;
    try {
      events = this.sub.events;
    } catch (err) {
      this.running = false;
      unclosable.push(this.sub);
      this.release();
      throw err;
    }
    this.watch = this.watchConnection(events);
    try {
      this.sub.connect(this.options.endpoint);
    } catch (err) {
      // an endpoint of the right scheme ZeroMQ still refuses (no port, a wildcard host): the
      // socket closes, which ends the watch already started (see close() for the order)
      this.running = false;
      this.sub.close();
      this.release();
      throw new RangeError(`kv-events endpoint ${quotedText(this.options.endpoint)}: ${(err as Error).message}`, {
        cause: err,
      });
    }
    this.sub.subscribe();
    this.loop = this.receive();
    const idle = this.options.idleReplayMs ?? 2000;
    if (idle > 0 && this.options.replayEndpoint) {
      this.idleTimer = setInterval(() => {
        if (Date.now() - this.lastMessageAt >= idle) this.serial(() => this.catchUp());
      }, idle);
      this.idleTimer.unref();
    }
    return this;
  }

  /**
   * Stops the subscriber. From the call on it applies nothing and drops nothing (the worker may
   * be added again under its id at once): a replay under way is cancelled, and the handler
   * running ends at its next step. Resolves once everything it started has ended.
   */
  async close(): Promise<void> {
    this.running = false;
    clearInterval(this.idleTimer);
    clearTimeout(this.sessionCheck);
    this.replayDealer?.close();
    // The socket alone is closed, never its observer first (zeromq/zeromq.js#716): libzmq's
    // reaper thread (4.3.5, socket_base_t::stop_monitor), destroying the socket, sends its
    // monitor's PAIR a last event (MONITOR_STOPPED) with a blocking send. The observer's PAIR,
    // its only peer, closed first, that send waits forever: the reaper is stuck, and no socket of
    // the process is released from then on (a worker added and removed left four file
    // descriptors, until max_sockets refused every new socket, other workers' replays included).
    // Closed alone, the socket's last event reaches the observer, which closes itself on it,
    // ending the watch's iteration. Closed already when start() was refused.
    if (!this.sub.closed && !unclosable.includes(this.sub)) this.sub.close();
    await this.loop?.catch(() => {});
    // the observer's last event comes once ZeroMQ released the socket: counted out then. Waited
    // for a while only: a close never hangs on ZeroMQ's reaper (nor is the observer closed
    // early, which would stop that reaper for good)
    if (this.watch) {
      let timer: NodeJS.Timeout | undefined;
      const ended = await Promise.race([
        this.watch.then(
          () => true,
          () => true,
        ),
        new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), WATCH_END_WAIT_MS).unref())),
      ]);
      clearTimeout(timer);
      if (!ended) this.log(`ZeroMQ did not release the socket within ${WATCH_END_WAIT_MS} ms of its close`);
    }
    this.release();
    await this.chain.catch(() => {});
  }

  private release(): void {
    if (this.released) return;
    this.released = true;
    openSubscribers--;
  }

  /**
   * Runs `fn` after every handler queued before it. A handler's unforeseen failure is logged as
   * the other faults are, at most once a window (a message that makes it fail may come at
   * every step), its message shown escaped and cut.
   */
  private serial(fn: () => Promise<void> | void): Promise<void> {
    this.chain = this.chain
      .then(fn, fn)
      .catch((err: unknown) =>
        this.logOnceAWindow('handler failed', 1, (unlogged) =>
          moreSince(`handler failed: ${errorText(err)}`, unlogged, 'failures'),
        ),
      );
    return this.chain;
  }

  /** Asks the replay endpoint for anything after the last batch seen. */
  private async catchUp(): Promise<void> {
    if (!this.running || !this.options.replayEndpoint) return;
    this.lastMessageAt = Date.now();
    const from = this.lastSeq === null ? 0n : this.lastSeq + 1n;
    // after 2^63 − 1 no batch can follow (a number from 2^63 on is malformed, nor can it be
    // asked for: the request's start is a signed 64-bit number); the next one will go back
    if (from > MAX_SEQ) return;
    await this.replayFrom(from, null);
  }

  private async watchConnection(events: Observer): Promise<void> {
    try {
      // read to the end (the 'end' event of the socket's close, after which the observer is
      // closed): an observer left unread fills, and libzmq's send to it blocks (see close())
      for await (const event of events) {
        if (!this.running) continue;
        if (event.type === 'connect' || event.type === 'connect:delay' || event.type === 'connect:retry')
          this.connectingAt = Date.now();
        if (event.type === 'disconnect') {
          this.stats.disconnects++;
          this.disconnectedAt = Date.now();
          this.checkSessionSoon();
          this.disconnectPending = true;
          this.connectPending = false;
          this.connectionChanged();
        } else if (event.type === 'handshake:error:protocol') {
          this.logDisconnect(`the endpoint does not speak ZeroMQ's protocol (${event.error.message})`);
        } else if (event.type === 'connect') {
          this.connectPending = true;
          this.connectionChanged();
        }
      }
    } catch (err) {
      if (this.running) this.log(`connection watch ended: ${(err as Error).message}`);
    }
  }

  /**
   * Queues the handling of the connection's changes on the chain, once for all those seen until
   * it runs: the watch never waits for it, so it goes on reading ZeroMQ's events (the attempts
   * to connect again that the session check looks for) while a burst or a replay holds the
   * chain; and an endpoint dropped ten times a second queues one handler, not one per event.
   */
  private connectionChanged(): void {
    if (this.connectionHandlerQueued) return;
    this.connectionHandlerQueued = true;
    void this.serial(async () => {
      this.connectionHandlerQueued = false;
      const [disconnected, connected] = [this.disconnectPending, this.connectPending];
      this.disconnectPending = this.connectPending = false;
      if (!this.running) return;
      if (disconnected) {
        this.logDisconnect('engine disconnected: its entries are dropped until it is heard from again');
        this.dropWorkerEntries();
        this.lastSeq = null;
        this.replayedThrough = null;
        this.replayedFrom = null;
      }
      // connected since the last disconnect: learn what the engine holds
      if (connected) await this.catchUp();
    });
  }

  /**
   * Logs a disconnect, or a protocol error, at most once a LOG_WINDOW_MS: an endpoint
   * that accepts TCP but is no ZeroMQ publisher (an engine's HTTP port given by mistake) is
   * connected to and dropped ten times a second, for as long as it is configured.
   */
  private logDisconnect(message: string): void {
    this.logOnceAWindow('disconnect', 1, (unlogged) => moreSince(message, unlogged, 'disconnects'));
  }

  /**
   * Logs a line of `kind` unless one was logged less than LOG_WINDOW_MS ago; then only adds
   * `count` to what the next line of that kind says it did not log (`line` gets that number).
   */
  private logOnceAWindow(kind: string, count: number, line: (unlogged: number) => string): void {
    const now = Date.now();
    const w = this.logWindows.get(kind);
    if (w !== undefined && now - w.loggedAt < LOG_WINDOW_MS && now >= w.loggedAt) {
      w.unlogged += count;
      return;
    }
    this.logWindows.set(kind, { loggedAt: now, unlogged: 0 });
    this.log(line(w?.unlogged ?? 0));
  }

  /**
   * A message or batch skipped as malformed: counted, and logged at most once a window per `kind`
   * of fault, since a broken or foreign publisher may send one at every step.
   */
  private logMalformed(kind: string, message: string): void {
    this.stats.malformed++;
    this.logOnceAWindow(`malformed ${kind}`, 1, (unlogged) => moreSince(message, unlogged, `${kind} skipped`));
  }

  /**
   * After a disconnect: unless ZeroMQ tries to connect again within SESSION_CHECK_MS, the
   * connection is made again here. libzmq ends the session for good after a protocol error,
   * such as a message over maxMessageSize (a publisher's one oversized batch), and the worker
   * would have no KV events from then on; made again, the next batches come, and the replay
   * fills what was missed.
   */
  private checkSessionSoon(): void {
    if (this.sessionCheck !== undefined) return;
    this.sessionCheck = setTimeout(() => {
      this.sessionCheck = undefined;
      if (!this.running || this.connectingAt >= this.disconnectedAt) return;
      this.stats.sessionsRestarted++;
      this.logDisconnect(
        `ZeroMQ closed the connection for good (a protocol error, such as a message over ${KV_EVENT_LIMITS.maxPayloadBytes} bytes): connecting again`,
      );
      try {
        this.sub.disconnect(this.options.endpoint);
      } catch {
        // the session is gone already: nothing to disconnect
      }
      try {
        this.sub.connect(this.options.endpoint);
      } catch (err) {
        this.log(`connecting again failed: ${(err as Error).message}`);
      }
    }, SESSION_CHECK_MS);
    this.sessionCheck.unref();
  }

  /** Whether the work since the event loop last turned has passed YIELD_AFTER_MS. */
  private turnDue(): boolean {
    return performance.now() - this.workingSince >= YIELD_AFTER_MS;
  }

  /** Lets the event loop turn once (a macrotask: I/O, timers and requests run meanwhile). */
  private async turn(): Promise<void> {
    await nextTurn();
    this.workingSince = performance.now();
  }

  private log(message: string): void {
    this.options.log?.(`kv-events ${this.options.workerId} (${shownText(this.options.endpoint)}): ${message}`);
  }

  private async receive(): Promise<void> {
    try {
      for await (const frames of this.sub) {
        this.lastMessageAt = Date.now();
        if (this.turnDue()) await this.turn();
        await this.serial(() => this.onMessage(frames));
      }
    } catch (err) {
      if (this.running) this.log(`receive loop ended: ${(err as Error).message}`);
    }
  }

  private async onMessage(frames: Buffer[]): Promise<void> {
    if (frames.length !== 3) {
      this.logMalformed(
        'messages of another frame count',
        `skipped a message of ${frames.length} frames (expected 3: topic, sequence number, payload)`,
      );
      return;
    }
    if (frames[1].length !== 8) {
      this.logMalformed(
        'messages with a bad sequence frame',
        `skipped a message whose sequence frame is ${frames[1].length} bytes, not 8`,
      );
      return;
    }
    const seq = frames[1].readBigInt64BE();
    if (seq < 0n) {
      // an unsigned 64-bit number from 2^63 on: no engine counts that far from 0
      this.logMalformed(
        'messages with a sequence number of 2^63 or more',
        `skipped a message whose sequence number ${frames[1].readBigUInt64BE()} is 2^63 or more (negative as signed: ${seq})`,
      );
      return;
    }
    if (this.lastSeq !== null && seq <= this.lastSeq) {
      // PUB never repeats a message: an old number is one a replay already delivered, or
      // the engine restarted (with an empty cache) and counts from 0 again. A number below
      // the first one the replay delivered is not one it delivered
      if (
        this.replayedThrough !== null &&
        this.replayedFrom !== null &&
        seq <= this.replayedThrough &&
        seq >= this.replayedFrom
      ) {
        this.stats.duplicates++;
        return;
      }
      this.stats.restarts++;
      this.logOnceAWindow('restart', 1, (unlogged) =>
        moreSince(
          `sequence went back from ${this.lastSeq} to ${seq}: engine restarted, its entries are dropped`,
          unlogged,
          'restarts',
        ),
      );
      this.dropWorkerEntries();
      this.lastSeq = null;
      this.replayedThrough = null;
      this.replayedFrom = null;
    }
    // a live batch past what the replays delivered: live delivery has caught up with them,
    // older numbers now mean a restart. Reset before a replay this batch asks for, whose window
    // starts afresh: one that covers this batch returns below, before the reset after applying
    if (this.replayedThrough !== null && seq > this.replayedThrough) {
      this.replayedThrough = null;
      this.replayedFrom = null;
    }
    const expected = this.lastSeq === null ? 0n : this.lastSeq + 1n;
    if (seq > expected) {
      if (this.lastSeq !== null) this.stats.gaps++;
      const recovered = this.options.replayEndpoint ? await this.replayFrom(expected, seq) : false;
      if (!this.running) return;
      if (!recovered && this.lastSeq !== null) {
        this.stats.gapsLost++;
        this.logOnceAWindow('lost', 1, (unlogged) =>
          moreSince(
            `lost events ${expected}..${seq - 1n} and could not replay them: entries dropped, rebuilt from new events`,
            unlogged,
            'losses',
          ),
        );
        this.dropWorkerEntries();
      }
      if (this.lastSeq !== null && seq <= this.lastSeq) return; // the replay covered it
    }
    await this.applyPayload(seq, frames[2]);
    // past what a replay this batch asked for delivered: caught up with it too
    if (this.replayedThrough !== null && seq > this.replayedThrough) {
      this.replayedThrough = null;
      this.replayedFrom = null;
    }
  }

  private async applyPayload(seq: bigint, payload: Uint8Array): Promise<void> {
    if (!this.running) return;
    this.lastSeq = seq;
    this.stats.lastSeq = Number(seq);
    let reader: EventBatchReader;
    try {
      reader = readEventBatch(payload);
    } catch (err) {
      // a payload that is not a batch throws a KvEventFormatError (a bad event only skips
      // itself); any other error would be a case the decoding did not foresee. Either way
      // nothing of it is applied: counted and skipped, and the stream goes on
      const why = err instanceof KvEventFormatError ? err.message : `could not be decoded (${String(err)})`;
      this.logMalformed('malformed batches', `skipped malformed batch ${seq}: ${why}`);
      return;
    }
    const worker = this.options.workerId;
    const dp = this.options.dataParallel;
    const rank = reader.dataParallelRank;
    if (dp && rank !== null && rank !== dp.rank) {
      // the rank's entries are another subscriber's, cleared when its own stream breaks: a
      // batch applied to them from here would outlive that
      this.stats.unknownRanks++;
      if (!this.unknownRankLogged) {
        this.unknownRankLogged = true;
        const start = dp.start ?? 0;
        this.log(
          rank >= start && rank < start + dp.size
            ? `batch ${seq} is from data-parallel rank ${rank} but came on rank ${dp.rank}'s endpoint: vLLM publishes each rank's events on a port of its own ` +
                `(the events port + rank), so batches of other ranks are skipped here (reason unknown_rank). Check that the worker's events= is the port ` +
                `the engine was configured with (rank 0's) and that nothing else publishes on the ports after it`
            : `batch ${seq} is from data-parallel rank ${rank}, which the worker's dp-size${start > 0 ? ' and dp-start-rank do' : ' does'} not cover: ` +
                `batches of ranks it does not have are skipped (reason unknown_rank). Give the worker the engine's ` +
                `--data-parallel-size (or, for one node of several, --data-parallel-size-local) as dp-size and its --data-parallel-start-rank as dp-start-rank, ` +
                `or list an engine that serves one rank (--data-parallel-rank) as its own worker without dp-size`,
        );
      }
      return;
    }
    const mismatchesBefore = this.stats.applied.hashMismatches;
    const positionFreeBefore = this.stats.applied.positionFreeHashes;
    const unknownKindBefore = this.stats.applied.unknownKindStores;
    const nonLocalBefore = this.stats.applied.skipped[NON_LOCAL_SKIP] ?? 0;
    /** This batch's events the decoding skipped, per reason: how many, and the first one's message. */
    let skips: Map<string, { count: number; first: string }> | undefined;
    let events = 0;
    for (let from = 0; from < reader.count || from === 0;) {
      // a slice: up to APPLY_SLICE_EVENTS events or APPLY_SLICE_BYTES bytes (one event at least)
      let to = Math.min(reader.count, from + APPLY_SLICE_EVENTS);
      while (to > from + 1 && reader.bytes(from, to) > APPLY_SLICE_BYTES) to = from + Math.ceil((to - from) / 2);
      if (from > 0) await this.turn();
      // closed meanwhile (the worker removed, perhaps added again under its id): nothing more
      if (!this.running) return;
      let batch: KvEventBatch;
      try {
        batch = reader.read(from, to);
      } catch (err) {
        // a bad event is skipped alone (read lists it): a failure of the read itself is a case
        // the decoding did not foresee, and the rest of the batch is dropped, counted as malformed
        this.logMalformed(
          'batches that could not be decoded',
          `could not decode batch ${seq} from event ${from}: ${errorText(err)}`,
        );
        return;
      }
      if (batch.skipped) {
        const skipped = this.stats.applied.skipped;
        skips ??= new Map();
        for (const s of batch.skipped) {
          skipped[s.reason] = (skipped[s.reason] ?? 0) + 1;
          const r = skips.get(s.reason);
          if (r) r.count++;
          else skips.set(s.reason, { count: 1, first: s.message });
        }
      }
      try {
        // applied in parts of at most APPLY_SLICE_WORK blocks walked (one event at least), the
        // loop turning between them: a clear walks every block the worker keeps offloaded
        const applier = this.options.applier;
        const list = batch.events;
        for (let i = 0; i < list.length;) {
          let j = i;
          for (let work = 0; j < list.length; j++) {
            const w = applier.workOf(worker, list[j], j > i ? list[j - 1] : undefined);
            if (j > i && work + w > APPLY_SLICE_WORK) break;
            work += w;
          }
          if (i > 0) {
            await this.turn();
            if (!this.running) return;
          }
          applier.apply(
            worker,
            i === 0 && j === list.length ? batch : { ...batch, events: list.slice(i, j) },
            this.stats.applied,
          );
          i = j;
        }
      } catch (err) {
        // e.g. the worker was removed from the router meanwhile
        this.logMalformed(
          'batches that could not be applied',
          `could not apply batch ${seq}: ${(err as Error).message}`,
        );
        return;
      }
      events += batch.events.length;
      if (to >= reader.count) break;
      from = to;
    }
    // each reason at most once a window: an engine may send a skipped event at every step
    for (const [reason, { count, first }] of skips ?? [])
      this.logOnceAWindow(`skipped ${reason}`, count, (unlogged) =>
        moreSince(
          `batch ${seq}: skipped ${count} event(s) (reason ${reason}): ${first}`,
          unlogged,
          'skipped for this reason',
          '(events skipped for this reason are counted, and logged at most once a minute)',
        ),
      );
    if (nonLocalBefore === 0 && (this.stats.applied.skipped[NON_LOCAL_SKIP] ?? 0) > 0)
      this.log(
        `worker ${worker}: its KV events report blocks on storage that is not the engine's own (a locality other than "LOCAL", such as "REMOTE": vllm-project/vllm#48281; ` +
          `or SGLang's medium "${SGLANG_SHARED_MEDIUM}", its shared pool): ` +
          `shared storage other engines read too is no cache of this worker's, so such stores and removals are skipped (reason ${NON_LOCAL_SKIP}); ` +
          `set locality "LOCAL" on the engine's storage tier if it is the worker's own`,
      );
    // what makes vLLM's hashes differ from the router's: a cache salt the event does not carry
    // (releases before extra_keys hash it into the first block without sending it), the
    // algorithm and seed, or the step its hashes are chained at (vllm/v1/core/kv_cache_utils.py:
    // resolve_kv_cache_block_sizes gives get_request_block_hasher a step finer than the block for
    // several KV cache groups, the GCD of their block sizes, or cache_config.prefix_match_unit,
    // hash_block_size in some releases;
    // and one of block size times the decode-context-parallel size for one group)
    if (mismatchesBefore === 0 && this.stats.applied.hashMismatches > 0)
      this.log(
        `worker ${worker}: a block hash is not the one the router computes (vLLM's ${this.options.applier.vllmHashAlgo} under the router's PYTHONHASHSEED, one per block of the worker's block size, each chained to the last); ` +
          `such stores are skipped (reason hash_mismatch). If the engine's events carry no extra_keys (vLLM releases before they were added), a prompt sent with a cache_salt is hashed with the salt, which the event does not carry: ` +
          `its store is skipped alone, and the worker's stores are all skipped only once ${MISMATCHES_BEFORE_GIVING_UP} distinct prompts have differed with none matching (or one whose extra_keys were sent). ` +
          `Otherwise give the router the engine's --prefix-caching-hash-algo (vLLM's default is sha256) and PYTHONHASHSEED, or start the engine with --prefix-caching-hash-algo ${this.options.applier.vllmHashAlgo} and the router's PYTHONHASHSEED. ` +
          `If those agree, the engine chains its hashes at another step than its block: vLLM does at a finer one for a hybrid model (several KV cache groups: the greatest common divisor of their block sizes) or when its cache config sets prefix_match_unit (hash_block_size in some releases), which the router does not reproduce (serve --block-hash router keys blocks by the router's own hash of the events' token ids instead); ` +
          `and with --decode-context-parallel-size N its step is --block-size times N: the worker's block-size must be that product`,
      );
    if (positionFreeBefore === 0 && this.stats.applied.positionFreeHashes > 0)
      this.log(
        `worker ${worker}: its engine's block hashes do not depend on a block's position (one was stored again under another parent, or a page stored after another ` +
          `has Python's hash(tuple(page_tokens)) of its own tokens, as SGLang's first page events hash, sgl-project/sglang#6824). Chained by them, its blocks would be indexed ` +
          `under the wrong prefix and count as cached where they are not: its entries are dropped and its stores refused (reason position_free_hash) until they are cleared ` +
          `(a restart, a removal, a reset of its prefix cache), so requests are routed to it without its cache. Run an SGLang release with sequence-aware (sha256-chained) KV event hashes, ` +
          `sgl-project/sglang#13488 or later (docs/engines.md)`,
      );
    if (unknownKindBefore === 0 && this.stats.applied.unknownKindStores > 0)
      this.log(
        `worker ${worker}: its KV events name no group of a full-prefix kind (${[...FULL_PREFIX_KINDS].join(', ')}): ` +
          `its group of kind "unknown" (vLLM's kind for a group whose layers are of several kinds, such as MLA with full attention, or of a spec it does not name) ` +
          `is indexed as holding the whole prefix, until a group of a full-prefix kind is seen`,
      );
    this.stats.batches++;
    this.stats.events += events;
    this.stats.lagSeconds = Math.max(0, Date.now() / 1000 - reader.ts);
  }

  /**
   * Asks the engine's ROUTER for every batch from `from` on and applies them in order: up to
   * `until`, the live batch that asked for the replay, when there is one (later batches come
   * live). Returns whether the stream is whole again up to `until`.
   */
  private async replayFrom(from: bigint, until: bigint | null): Promise<boolean> {
    const receiveTimeout = this.options.replayTimeoutMs ?? 2000;
    const dealer = new Dealer({ linger: 0, receiveTimeout, maxMessageSize: KV_EVENT_LIMITS.maxPayloadBytes });
    const deadlineMs = this.options.replayDeadlineMs ?? 10_000;
    const deadline = performance.now() + deadlineMs;
    const [lastSeqBefore, replayedThroughBefore, replayedFromBefore] = [
      this.lastSeq,
      this.replayedThrough,
      this.replayedFrom,
    ];
    let next = from;
    this.replayDealer = dealer;
    try {
      if (!this.running) throw new Error('the subscriber closed');
      dealer.connect(this.options.replayEndpoint!);
      const start = Buffer.alloc(8);
      start.writeBigInt64BE(from);
      await dealer.send(['', start]);
      for (;;) {
        // the loop turns during a replay of thousands of batches as during a live burst
        if (this.turnDue()) {
          await this.turn();
          if (!this.running) throw new Error('the subscriber closed');
        }
        // the deadline holds while batches keep coming (checked at each one, below) and while
        // none comes: the wait for the next one ends with it
        const left = Math.ceil(deadline - performance.now());
        const untilDeadline = left < receiveTimeout;
        if (untilDeadline) dealer.receiveTimeout = Math.max(1, left);
        let frames: Buffer[];
        try {
          frames = await dealer.receive();
        } catch (err) {
          // (ZeroMQ's timer may end the wait a fraction of a millisecond before the deadline)
          if (this.running && untilDeadline && (err as { code?: string }).code === 'EAGAIN')
            throw new Error(`it did not end within ${deadlineMs} ms`, { cause: err });
          throw err;
        }
        if (!this.running) throw new Error('the subscriber closed');
        // ["", seq, payload] (SGLang, vLLM before #45177) or ["", topic, seq, payload] (vLLM
        // since): the sequence number is the second frame from the end either way
        if ((frames.length !== 3 && frames.length !== 4) || frames.at(-2)!.length !== 8)
          throw new Error(`bad replay frame of ${frames.length} parts`);
        const seq = frames.at(-2)!.readBigInt64BE();
        if (seq === -1n) break;
        if (performance.now() > deadline) throw new Error(`it did not end within ${deadlineMs} ms`);
        if (seq < 0n) throw new Error(`bad replay sequence number ${seq}`);
        if (seq < next) continue;
        if (until !== null && seq > until) {
          // past the live batch that asked: it comes live. A replay that jumps past it, leaving
          // a hole before it, numbers its batches ahead of the stream: taken, every live batch
          // would look like one it had delivered
          if (next < until) throw new Error(`it answered batch ${seq}, past the live batch ${until} that asked for it`);
          continue;
        }
        if (seq > next) {
          // the engine's buffer no longer has batches from `next` on: take what it has, from
          // its oldest batch. With no state yet (joining late) nothing is lost but the older
          // stores; with state, the entries are rebuilt from here.
          if (this.lastSeq !== null && this.lastSeq >= from - 1n && next === from) {
            this.log(
              `replay starts at ${seq}, not ${next}: events ${next}..${seq - 1n} are gone; entries dropped and rebuilt from the engine's oldest buffered batch`,
            );
            this.dropWorkerEntries();
          } else if (next === from) {
            this.log(
              `replay starts at ${seq}, not ${next}: joined late, applying from the engine's oldest buffered batch`,
            );
          } else {
            throw new Error(`replay skipped from ${next} to ${seq}`);
          }
          this.stats.lateJoins++;
        }
        await this.applyPayload(seq, frames.at(-1)!);
        if (this.replayedThrough === null) this.replayedFrom = seq;
        this.replayedThrough = seq;
        next = seq + 1n;
      }
      this.stats.replays++;
      const upTo = until ?? from;
      return next > from || next > upTo || this.lastSeq === null || this.lastSeq >= upTo - 1n;
    } catch (err) {
      if (!this.running) return false; // cancelled by close(): no failure of the engine's
      this.stats.replayFailures++;
      // once a window per reason (its numbers aside): an endpoint that never answers fails
      // every idle poll, for as long as it is configured
      const why = errorText(err);
      this.logOnceAWindow(`replay failed: ${why.replace(/\d+/g, 'N')}`, 1, (unlogged) =>
        moreSince(`replay from ${from} failed: ${why}`, unlogged, 'replays failed for this reason'),
      );
      if (next > from) {
        // what it applied before it failed is dropped, and the stream goes on from where it stood
        // before the replay: a replay that never ends numbers its batches on past the live ones,
        // which would all be taken for batches it had delivered
        this.dropWorkerEntries();
        this.lastSeq = lastSeqBefore;
        this.replayedThrough = replayedThroughBefore;
        this.replayedFrom = replayedFromBefore;
        this.stats.lastSeq = lastSeqBefore === null ? null : Number(lastSeqBefore);
      }
      return false;
    } finally {
      this.replayDealer = undefined;
      if (!dealer.closed) dealer.close();
    }
  }

  private dropWorkerEntries(): void {
    // closed: the worker's entries are no longer this subscriber's (it may have been added again)
    if (!this.running) return;
    try {
      this.options.applier.clearWorker(this.options.workerId);
    } catch (err) {
      this.log(`could not drop entries: ${(err as Error).message}`);
    }
  }
}
