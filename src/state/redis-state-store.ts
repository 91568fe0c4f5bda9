import { randomBytes } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import { Redis, ReplyError, type ChainableCommander, type RedisOptions } from 'ioredis';
import { escapedText, quotedText } from '../core/shown-text.js';
import { isWorkerId } from '../core/validate.js';
import { MAX_WORKERS } from '../core/worker-registry.js';
import type { RouteRequest, SharedDecision } from '../core/router/index.js';
import { MAX_PREDICTION_TTL_MS } from '../core/router/options-schema.js';
import {
  decodeHashes,
  decodeLoadSnapshot,
  decisionIdOf,
  decodeMessage,
  encodeDecision,
  encodeLoad,
  encodeLoadEntry,
  encodePrefilled,
  encodeRefused,
  encodeReleased,
  encodeWorkflow,
  fingerprintDifferences,
  hashingFingerprint,
  isWellFormed,
  maxMessageBytes,
  MessageTooLong,
  parseFingerprint,
  parseWorkflow,
  RedisKeys,
  type HashingFingerprint,
  type WireDecision,
  type WireMessage,
  type WireKvEvents,
  type WireReadMark,
  type WireWorkerAdded,
  type WireWorkerDrained,
  type WireWorkerRemoved,
} from './redis-wire.js';
import { MAX_REDIS_DB, parseRedisUrl } from './redis-url.js';
import { MAX_REMOTE_REPLICAS, MAX_REPLICA_ID_LENGTH, RemoteLoad } from './remote-load.js';
import {
  SharedStateUnanswered,
  type StateStats,
  type StateStore,
  type StateStoreHost,
  type WorkerChange,
  type WorkerChangeVerdict,
  type WorkerRecord,
  workerLimitRefusal,
} from './state-store.js';

export { MAX_REDIS_DB, parseRedisUrl };

/** Kinds of refusal (error codes) logged once per connection: Redis names a handful, a stranger server could name any. */
const MAX_LOGGED_REFUSALS = 16;

/** Redis's refusals of this replica's credentials or of a command its ACL user lacks: no retry mends them. */
const ACCESS_REFUSED = /^(WRONGPASS|NOAUTH|NOPERM)\b/;

/**
 * Redis refused the database the URL names (SELECT: an index past its `databases`, or a
 * cluster, which has database 0 only). ioredis only reports a SELECT its connection handshake
 * sent that failed, and goes on, on database 0: another fleet's state.
 */
class DatabaseRefused extends Error {}

/**
 * `{prefix}settings` holds another replica's hashing settings (HashingFingerprint): the block
 * entries this replica would write never match theirs, nor theirs its own. At start the replica
 * refuses to run (exit 2, as for a refused password); found later (the key lost and written
 * again by a replica of other settings), it stops using the shared state until they agree.
 */
class SettingsMismatch extends Error {}

/** Whether `err` is Redis's refusal of a SELECT (the handshake's or the store's own). */
function selectRefused(err: Error): boolean {
  return err instanceof ReplyError && (err as Error & { command?: { name?: string } }).command?.name === 'select';
}

/**
 * A reconnection that READONLY prompted is followed by the next one no sooner than this,
 * doubled each time up to READONLY_RETRY_MAX_MS, until a heartbeat is taken: a reconnection
 * that lands on a read-only server again (the failover not finished, or a URL that names a
 * replica) must not loop, and refusals are only counted meanwhile.
 */
const READONLY_RETRY_MIN_MS = 1000;
const READONLY_RETRY_MAX_MS = 30_000;
/**
 * A connection whose database Redis refused (DatabaseRefused, after the start) reconnects no
 * sooner than this, doubled each time up to READONLY_RETRY_MAX_MS, until a resynchronisation
 * succeeds: ioredis counts its attempts from the last connection it made, and every one of
 * these connects, so its own delay would stay at its first (100 ms), a reconnection storm for
 * as long as the server lacks the database.
 */
const DATABASE_RETRY_MIN_MS = 1000;

/**
 * A resynchronisation that failed (a read or a write-back chunk Redis did not answer in time,
 * the connection lost under it) is tried again on a new connection no sooner than this, doubled
 * at each failure in a row up to READONLY_RETRY_MAX_MS, and reset by one that succeeds: a Redis
 * too slow for a resynchronisation is not asked for one every second, and each try costs it
 * the write-back and the reads again.
 */
const RESYNC_RETRY_MIN_MS = 1000;

/** A connection up less than this before its put-off reconnection was due is not dropped for coming early (timers' leeway). */
const RECONNECT_EARLY_MS = 20;

/**
 * The write-back after an outage goes in chunks of at most this many commands and bytes of
 * arguments, each one pipeline awaited before the next: one pipeline of all of it (up to
 * 10,000 block entries of tens of kilobytes) outlasted the command timeout on a Redis busy
 * with the others' write-backs, and one command timing out failed the whole of it. A chunk
 * done stays done (its block entries are known written, see `epoch`).
 */
const WRITE_BACK_CHUNK_COMMANDS = 100;
const WRITE_BACK_CHUNK_BYTES = 256 * 1024;
/**
 * A chunk that times out is sent again, on the same connection, after WRITE_BACK_RETRY_MIN_MS,
 * then twice that, and so on: a Redis slow for a moment finishes the write-back rather than
 * starting it over on a new connection. After WRITE_BACK_TRIES tries the resynchronisation
 * fails (and is tried again later, RESYNC_RETRY_MIN_MS).
 */
const WRITE_BACK_RETRY_MIN_MS = 100;
const WRITE_BACK_TRIES = 5;

/**
 * How far ahead of this replica's clock a heartbeat in `{prefix}replicas` may be dated and still
 * count (another replica's clock running ahead); one dated further is garbage, and dropped.
 */
const HEARTBEAT_AHEAD_MS = 60_000;

/**
 * Heartbeats read from `{prefix}replicas` at each load sync, the newest: this replica's own and
 * as many others as are tallied (MAX_REMOTE_REPLICAS). The set is anyone's to fill (20,000
 * members dated ahead made every sync's reply megabytes, and the replicas' answers seconds); the
 * load of a replica past the newest this many is not seen (logged once).
 */
const REPLICAS_READ = MAX_REMOTE_REPLICAS + 1;

/**
 * The least time a replica's heartbeat counts (10 load syncs when they are further apart): the
 * others drop a replica, and its load, only after this long without one. A replica whose event
 * loop is held for a second or two (a burst, a collection), or that sat out a short Redis stall
 * or a failed resynchronisation, keeps its place and its tally; one that is gone has its load
 * counted at the others this long after.
 */
const HEARTBEAT_WINDOW_MIN_MS = 5000;

/**
 * How often the replica's own event loop is timed (LoopClock): a tick that comes later than
 * this says for how long the loop was held.
 */
const LOOP_TICK_MS = 50;

/**
 * Time during which the replica's own event loop could run: wall-clock time less the time it
 * was held (a tick of a LOOP_TICK_MS timer come late, or due and not come yet). A reply Redis
 * sent while the loop was held is read only once it runs again — after the timers that were due,
 * the commands' timeouts among them — so that time says nothing of Redis.
 */
class LoopClock {
  private lastTickAt = Date.now();
  private heldMs = 0;
  private readonly timer = setInterval(() => {
    const now = Date.now();
    this.heldMs += Math.max(0, now - this.lastTickAt - LOOP_TICK_MS);
    this.lastTickAt = now;
  }, LOOP_TICK_MS);

  constructor() {
    this.timer.unref();
  }

  /** The loop's own time now, in ms from an arbitrary origin. */
  now(): number {
    const now = Date.now();
    // a tick that is due and has not come: the loop is held now (the caller is a timer run first)
    return now - this.heldMs - Math.max(0, now - this.lastTickAt - LOOP_TICK_MS);
  }

  stop(): void {
    clearInterval(this.timer);
  }
}

/**
 * What an error says, as a log line or an answer repeats it: Redis's refusals are the server's
 * text, and whatever answers on its address (a stranger, garbage) may send control characters
 * and any length; escaped and cut (escapedText).
 */
function said(err: unknown): string {
  return escapedText(err instanceof Error ? err.message : String(err));
}

/** Whether `err` is Redis's refusal of a command for the kind of value its key holds. */
function isWrongKind(err: Error | null | undefined): boolean {
  return err instanceof ReplyError && /^WRONGTYPE\b/.test((err as Error).message);
}

/**
 * Writes a recent decision's block entry back (KEYS[1] ← ARGV[2] for ARGV[3] ms) where Redis lacks
 * it, and then only, announces it on channel ARGV[1] (ARGV[4]): the replicas that are running
 * learn of it as they would have of the decision, not only one that loads the entries later.
 * 1 written, 0 there already. Atomic; only commands the state's ACL grants.
 */
const WRITE_BACK_CHAIN =
  "if redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3], 'NX') then redis.call('PUBLISH', ARGV[1], ARGV[4]) return 1 end return 0";

/**
 * A decision's message as a block entry written back announces it: its blocks, worker and
 * anchors, as a replica loading the entry applies them (applyChains()), without what made it
 * a request in flight (its prefill, its id) nor its workflow step, long past.
 */
function writtenBackAnnouncement(message: string): string {
  const { q: _q, i: _i, wf: _wf, s: _s, ...rest } = JSON.parse(message) as WireDecision;
  return JSON.stringify(rest);
}

/** The shared keys whose kind the load sync checks, and a resynchronisation repairs (repairWrongKinds()). */
type SharedKey = 'workers' | 'removed' | 'draining' | 'workflows';

/** Deletes KEYS[1] only while it holds ARGV[1] (one round trip, atomic). */
const DELETE_IF_EQUAL = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/**
 * Writes back workers the registry (KEYS[1]) lacks, ARGV[2] id → ARGV[3] record and so on (with
 * ARGV[4] the message announcing it, published on channel ARGV[1] when it is written), unless
 * recorded as removed (KEYS[2]) since they were read: one answer per worker, 1 written, 0 there
 * already, -1 removed. Atomic, announcement included: a removal another replica records just
 * after the write is published after its announcement, so every replica hears the two in the
 * order Redis applied them. Only with the commands the state's ACL grants.
 */
const WRITE_BACK_WORKERS =
  "local removed = {} local all = redis.call('HGETALL', KEYS[2]) for i = 1, #all, 2 do removed[all[i]] = true end local out = {} for i = 2, #ARGV, 3 do if removed[ARGV[i]] then out[#out + 1] = -1 else local set = redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) out[#out + 1] = set if set == 1 then redis.call('PUBLISH', ARGV[1], ARGV[i + 2]) end end end return out";

/**
 * Redis does not roll a script back when one of its commands fails: a script that changes the
 * registry first checks that every key it writes is a hash (or absent) by removing from each the
 * field '' (no worker id is empty), so a key holding another kind of value refuses the change
 * before any of it is written.
 */
const NOT_HASHES = `local function notHashes(...)
  for _, key in ipairs({...}) do
    local r = redis.pcall('HDEL', key, '')
    if type(r) == 'table' and r.err then return r end
  end
  return nil
end`;

/**
 * Whether two decoded worker records say the same (the order of their fields, and absent ones,
 * aside), and a hash's field read with HGETALL (the state's ACL grants no HGET).
 */
const SAME_RECORD = `${NOT_HASHES}
local function hget(key, field)
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do if all[i] == field then return all[i + 1] end end
  return nil
end
local function same(a, b)
  if a == cjson.null then a = nil end
  if b == cjson.null then b = nil end
  if type(a) ~= 'table' or type(b) ~= 'table' then return a == b end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k, v in pairs(b) do if a[k] == nil and v ~= cjson.null then return false end end
  return true
end
local function sameJson(x, y)
  local ok, a = pcall(cjson.decode, x)
  local ok2, b = pcall(cjson.decode, y)
  return ok and ok2 and same(a, b)
end
`;

/**
 * A worker added here while Redis was out of reach (ARGV[2], record ARGV[3]) written back to the
 * registry KEYS[1] when it holds no worker of that id, or (after a removal made here) still the
 * record this replica removed (ARGV[6], '' for none): a change Redis decided meanwhile, another
 * replica's answered addition, wins, and this replica takes the registry's record as it reloads
 * it. Written, it is no longer recorded removed (KEYS[2]) nor draining (KEYS[3]), announced
 * (ARGV[4]) and announced resumed (ARGV[5]): 1; else 0. Atomic.
 */
const WRITE_BACK_ADDED = `${SAME_RECORD}
local wrong = notHashes(KEYS[1], KEYS[2], KEYS[3])
if wrong then return wrong end
local held = hget(KEYS[1], ARGV[2])
if held and not (ARGV[6] ~= '' and sameJson(held, ARGV[6])) then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('PUBLISH', ARGV[1], ARGV[4])
redis.call('PUBLISH', ARGV[1], ARGV[5])
return 1`;

/**
 * A drain (ARGV[3] '1') or resume ('0') of worker ARGV[2] made here while Redis was out of reach,
 * written back to KEYS[2] and announced (ARGV[5]) only when the registry KEYS[1] still holds the
 * record it was made on (ARGV[4], compared field by field: the order of the fields, and absent
 * ones, aside), or holds no worker of that id and none recorded removed (KEYS[3]: Redis lost
 * its data, and the worker is written back next): 1. A worker removed (and perhaps added again)
 * meanwhile is not the one drained: 0, nothing written. Atomic.
 */
const WRITE_BACK_DRAIN = `${SAME_RECORD}
local wrong = notHashes(KEYS[1], KEYS[2], KEYS[3])
if wrong then return wrong end
local held = hget(KEYS[1], ARGV[2])
if held then
  if not sameJson(held, ARGV[4]) then return 0 end
elseif hget(KEYS[3], ARGV[2]) then return 0 end
if ARGV[3] == '1' then redis.call('HSET', KEYS[2], ARGV[2], '1') else redis.call('HDEL', KEYS[2], ARGV[2]) end
redis.call('PUBLISH', ARGV[1], ARGV[5])
return 1`;

/**
 * A removal of worker ARGV[2] made here while Redis was out of reach, written back only when the
 * registry KEYS[1] still holds the record it was made on (ARGV[3], '' for none known; compared
 * field by field), or holds no worker of that id: taken out, recorded removed at ARGV[4] (KEYS[2];
 * '' for a removal not recorded, discovery's), no longer draining (KEYS[3]) and announced (ARGV[5]):
 * 1. A worker the registry holds with another record (removed and added again, or replaced,
 * through another replica meanwhile) is a later decision: 0, nothing written, and this replica
 * takes the registry's record as it reloads it. Atomic.
 */
const WRITE_BACK_REMOVED = `${SAME_RECORD}
local wrong = notHashes(KEYS[1], KEYS[3])
if not wrong and ARGV[4] ~= '' then wrong = notHashes(KEYS[2]) end
if wrong then return wrong end
local held = hget(KEYS[1], ARGV[2])
if held and not (ARGV[3] ~= '' and sameJson(held, ARGV[3])) then return 0 end
redis.call('HDEL', KEYS[1], ARGV[2])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[2], ARGV[2], ARGV[4]) end
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('PUBLISH', ARGV[1], ARGV[5])
return 1`;

/**
 * The part the admin worker change scripts share: the mark (ARGV[2], the start of this replica's
 * `rm` message, its nonce up to ':') completed with the verdict (`code:n`) and published last on
 * channel ARGV[1], so the replica that asked hears it after every message of the change and of
 * every change Redis made before, and applies the change there, in Redis's order; `ranksOf` is
 * how many data-parallel ranks a registry record has (its dpSize, 1 without) and the first of
 * their global ranks (its dpStartRank, 0 without: engine-deployments.ts hasRank); `notHashes` comes
 * from NOT_HASHES.
 */
const CHANGE_PRELUDE = `${NOT_HASHES}
local function decided(code, n)
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. code .. ':' .. n .. '"}')
  return code
end
local function ranksOf(v)
  if not string.find(v, '"dpSize"', 1, true) then return 1, 0 end
  local ok, w = pcall(cjson.decode, v)
  if ok and type(w) == 'table' and type(w.dpSize) == 'number' and w.dpSize >= 1 then
    local s = 0
    if type(w.dpStartRank) == 'number' and w.dpStartRank >= 0 then s = w.dpStartRank end
    return w.dpSize, s
  end
  return 1, 0
end
`;

/**
 * An admin API's addition of worker ARGV[3] (record ARGV[4], ARGV[5] ranks) to the registry
 * KEYS[1], decided there: 0 when it holds the id, -1 (with the ranks it holds) when the ranks
 * would pass ARGV[6], else written (HSETNX), no longer recorded removed (KEYS[2]) nor draining
 * (KEYS[3]), announced (ARGV[7]) and announced resumed (ARGV[8]): 1. Atomic, mark included.
 */
const ADD_WORKER = `${CHANGE_PRELUDE}
local wrong = notHashes(KEYS[1], KEYS[2], KEYS[3])
if wrong then return wrong end
local all = redis.call('HGETALL', KEYS[1])
local ranks = 0
for i = 1, #all, 2 do
  if all[i] == ARGV[3] then return decided(0, 0) end
  ranks = ranks + ranksOf(all[i + 1])
end
if ranks + tonumber(ARGV[5]) > tonumber(ARGV[6]) then return decided(-1, ranks) end
redis.call('HSETNX', KEYS[1], ARGV[3], ARGV[4])
redis.call('HDEL', KEYS[2], ARGV[3])
redis.call('HDEL', KEYS[3], ARGV[3])
redis.call('PUBLISH', ARGV[1], ARGV[7])
redis.call('PUBLISH', ARGV[1], ARGV[8])
return decided(1, 0)`;

/**
 * An admin API's removal of worker ARGV[3] from the registry KEYS[1]: 0 when it does not hold
 * it, else taken out, recorded removed at ARGV[4] (KEYS[2]), no longer draining (KEYS[3]) and
 * announced (ARGV[5]): 1. Atomic, mark included.
 */
const REMOVE_WORKER = `${CHANGE_PRELUDE}
local wrong = notHashes(KEYS[1], KEYS[2], KEYS[3])
if wrong then return wrong end
if redis.call('HDEL', KEYS[1], ARGV[3]) == 0 then return decided(0, 0) end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('HDEL', KEYS[3], ARGV[3])
redis.call('PUBLISH', ARGV[1], ARGV[5])
return decided(1, 0)`;

/**
 * An admin API's drain (ARGV[4] '1') or resume ('0') of ARGV[3]: a worker of the registry
 * KEYS[1] (1, announced with ARGV[5]), or else the data-parallel rank ARGV[7] of worker ARGV[6]
 * (2, the worker drained, announced with ARGV[8]), recorded in KEYS[2]; 0 when it names none.
 * Atomic, mark included.
 */
const DRAIN_WORKER = `${CHANGE_PRELUDE}
local wrong = notHashes(KEYS[1], KEYS[2])
if wrong then return wrong end
local all = redis.call('HGETALL', KEYS[1])
local id, message, code
for i = 1, #all, 2 do
  if all[i] == ARGV[3] then id, message, code = ARGV[3], ARGV[5], 1 break end
  if ARGV[6] ~= '' and all[i] == ARGV[6] then
    local n, s = ranksOf(all[i + 1])
    local r = tonumber(ARGV[7])
    if n > 1 and r >= s and r < s + n then id, message, code = ARGV[6], ARGV[8], 2 end
  end
end
if not id then return decided(0, 0) end
if ARGV[4] == '1' then redis.call('HSET', KEYS[2], id, '1') else redis.call('HDEL', KEYS[2], id) end
redis.call('PUBLISH', ARGV[1], message)
return decided(code, 0)`;

/**
 * Errors Redis did not answer with, and failed resynchronisations, are logged at most this
 * often (the rest only counted, and the next line says how many), as the KV-event
 * subscriber's lines are (LOG_WINDOW_MS).
 */
const LOG_WINDOW_MS = 60_000;

/** Admin worker changes (and reads) waiting for their mark; past this many the oldest is dropped unapplied. */
const MOST_PENDING_CHANGES = 10_000;

/**
 * Writes workflows' workers and steps under KEYS[2..] (`wf:{id}`), ids and values in ARGV[5..]
 * (id, value, id, value, …), for ARGV[1] ms, and records each write in the index KEYS[1]
 * (sorted set id → the write's place: one past the newest, so the order is the order of the
 * writes, whatever the replicas' clocks). Past ARGV[3] entries the least recently written are
 * dropped, key (ARGV[4] .. id) and entry. With ARGV[2] = '1' it claims them (SET NX): a
 * workflow someone wrote is left as it is. Otherwise a step lower than the one stored (a late
 * retry of an earlier step) leaves the workflow where the later step went, as a replica's own
 * table does (WorkflowTable.record), its key's lifetime and its place renewed: a replica that
 * reads it later (one starting, a resynchronisation, a workflow its table had dropped) then
 * agrees with those that heard every step. Answers 1 per workflow written, 0 per one left.
 * Atomic: however many replicas write at once, the index holds at most ARGV[3] workflows, and
 * so do the keys it names (an entry whose key expired stays until pushed out: at most ARGV[3]).
 * The dropped keys are not among KEYS: a standalone server (which the store requires) allows
 * that, and the ACL's key pattern covers them. Only commands the state's ACL grants already.
 */
const WRITE_WORKFLOWS = `local function stepOf(value)
  if not value then return nil end
  local ok, v = pcall(cjson.decode, value)
  if ok and type(v) == 'table' and type(v.s) == 'number' then return v.s end
  return nil
end
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local last = tonumber(newest[2] or '0')
local written = {}
for i = 2, #KEYS do
  local set
  if ARGV[2] == '1' then set = redis.call('SET', KEYS[i], ARGV[2 * i + 2], 'PX', ARGV[1], 'NX')
  else
    local step = stepOf(ARGV[2 * i + 2])
    local stored = step and stepOf(redis.call('GET', KEYS[i]))
    if stored and step < stored then
      redis.call('PEXPIRE', KEYS[i], ARGV[1])
      last = last + 1
      redis.call('ZADD', KEYS[1], last, ARGV[2 * i + 1])
      set = false
    else set = redis.call('SET', KEYS[i], ARGV[2 * i + 2], 'PX', ARGV[1]) end
  end
  if set then
    last = last + 1
    redis.call('ZADD', KEYS[1], last, ARGV[2 * i + 1])
    written[i - 1] = 1
  else written[i - 1] = 0 end
end
local over = redis.call('ZRANGE', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
for j = 1, #over, 1000 do
  local ids, keys = {}, {}
  for k = j, math.min(j + 999, #over) do
    ids[#ids + 1] = over[k]
    keys[#keys + 1] = ARGV[4] .. over[k]
  end
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('DEL', unpack(keys))
end
return written`;

/**
 * Block entries read per MGET when the state is loaded: an entry holds a decision's whole
 * chain, tens of kilobytes for a long prompt, and one read of every entry would outlast the
 * command timeout.
 */
const CHAINS_PER_READ = 100;

/** The state of bounded reads that goes on from one call of readBounded() to the next. */
interface BoundedReads {
  /** Keys the next read asks for. */
  size: number;
  /** Keys that failed alone in a row. */
  failedAlone: number;
}

/**
 * Reads block entries KEYS[…] as MGET would (workflows' `wf:` values too, readWorkflows()),
 * bounded: an entry longer than ARGV[1] bytes (longer than any decision message a replica sends,
 * maxMessageBytes(); WORKFLOW_VALUE_MAX_BYTES for workflows) is answered as its length, not
 * its value, and no more entries are read once the values answered pass ARGV[2] bytes (the reply
 * then holds fewer answers than keys; at least one). A key absent, or holding another kind of
 * value, is answered nil. An entry's length is asked first (STRLEN), so an oversize one is never
 * copied into the script: a GET of 30 MB there takes about 0.3 s, over the command timeout, and
 * holds Redis meanwhile. An ACL user without STRLEN (docs/state.md's ACL before it was added)
 * has every entry read with GET, as before.
 */
const READ_CHAINS = `local out, total = {}, 0
local limit = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  if i > 1 and total >= tonumber(ARGV[2]) then break end
  local n = redis.pcall('STRLEN', key)
  if type(n) == 'number' and n > limit then out[i] = n
  else
    local v = redis.pcall('GET', key)
    if type(v) ~= 'string' then out[i] = false
    elseif #v > limit then out[i] = #v
    else out[i] = v total = total + #v end
  end
end
return out`;

/**
 * Reads KEYS[1] (the epoch marker, a workflow's `wf:` value) as GET would, bounded: a value longer
 * than ARGV[1] bytes is answered as its length, not its value (asked first, STRLEN, so it is never
 * copied); a key holding another kind of value is answered with Redis's refusal (WRONGTYPE). For
 * an ACL user without STRLEN the value is read inside Redis and its length answered all the same:
 * nothing long crosses the connection.
 */
const READ_VALUE = `local n = redis.pcall('STRLEN', KEYS[1])
if type(n) == 'number' and n > tonumber(ARGV[1]) then return n end
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' and #v > tonumber(ARGV[1]) then return #v end
return v`;

/**
 * The longest epoch marker read: replicas write 16 hex digits. `{prefix}epoch` is read at every
 * load sync (100 ms); a value of 10 MB written there made each sync's reply take the command
 * connection for the others' commands, and every replica stalled on it. A longer one is no
 * epoch marker: deleted, and written anew (as a lost one), logged once.
 */
const EPOCH_MAX_BYTES = 256;

/** Bytes of block entries one READ_CHAINS reply holds at most (past its last entry, which may reach maxMessageBytes()). */
const CHAIN_READ_BYTES = 16 * 1024 * 1024;

/** Workflows' values read per READ_CHAINS call when the state is loaded, at most (halved while reads fail, see readWorkflows()). */
const WORKFLOWS_PER_READ = 1000;

/**
 * The longest `wf:` value read: a replica writes a worker id (at most 256 characters, JSON-escaped)
 * and a step, under 2 KB. One of 30 MB made every resynchronisation's read of the workflows time
 * out, and the replica never came back; a longer one is skipped unread, counted.
 */
const WORKFLOW_VALUE_MAX_BYTES = 4096;

/** Workflows written back per WRITE_WORKFLOWS call after an outage: one short script each, not one for all. */
const WORKFLOWS_PER_WRITE = 500;

/**
 * Workflows kept in Redis by default, per workflow a replica remembers (--workflow-capacity):
 * a workflow that went quiet while three times as many others ran still returns to its worker
 * (a replica that forgot it reads it back on first sight), at a few megabytes for the default
 * 10,000 (40,000 keys; some 30 MB at most with 256-byte ids), whatever number of ids clients send.
 */
export const SHARED_WORKFLOWS_PER_CAPACITY = 4;

/**
 * How long a worker removed through the admin API stays recorded in `{prefix}removed` (a replica
 * configured with it that starts meanwhile does not bring it back); older records are dropped
 * by the next resynchronisation, so the hash does not grow for good.
 */
const REMOVAL_KEPT_MS = 24 * 3_600_000;

/**
 * Largest batch of posted KV events (as its `ev` message) relayed to the other replicas: one
 * message the size of a whole request body (16 MiB by default) would hold the command
 * connection long enough to look stalled, and every replica would parse it. A larger batch
 * is applied only by the replica it was posted to (counted, logged once).
 */
export const MAX_RELAYED_EVENTS_BYTES = 1 << 20;

/**
 * A registry change made here while Redis was out of reach: a worker added, or removed (recorded
 * or not). `base`: the record the registry held for the id as far as this replica knew when it
 * was first changed here (what it removed), if any. `held`: the record a removal was made on
 * (`base`, or the one added here before it), written back only while the registry holds it.
 */
type UnsyncedWorker =
  { added: WorkerRecord; base?: string } | { removed: { record: boolean; base?: string; held?: string } };

/** A drain (`on`) or resume made here while Redis was out of reach, with the record (JSON) of the worker it was made on. */
interface UnsyncedDrain {
  on: boolean;
  record: string;
}

/**
 * Registry messages heard after a resynchronisation's mark (published just before it reads the
 * registry): as new as what it read or newer, they win over it (a worker added (its record) or
 * removed (null); drained or resumed).
 */
interface HeardChanges {
  /** The mark's nonce; `past` once it was heard back. */
  mark: string;
  past: boolean;
  workers: Map<string, WorkerRecord | null>;
  drains: Map<string, boolean>;
}

export interface RedisStateOptions {
  /** redis://[user:password@]host:port[/db] */
  url: string;
  /** Prefix of every key and of the channel (default `contextforge:`): several fleets can share a server. */
  prefix?: string;
  /** This replica's id in the shared state (default: random); at most MAX_REPLICA_ID_LENGTH characters, or the others would not count its load. */
  replicaId?: string;
  /** How often in-flight counts are exchanged (default 100 ms). */
  syncIntervalMs?: number;
  /** How long a workflow's worker is remembered after its last step (default 1 h). */
  workflowTtlMs?: number;
  /**
   * Most workflows kept in Redis, the least recently used dropped beyond it (default
   * SHARED_WORKFLOWS_PER_CAPACITY times the router's workflow capacity): every workflow id a
   * client sends is an entry, so their number must be bounded by the fleet, not the clients.
   */
  sharedWorkflows?: number;
  /**
   * Lifetime of shared block entries (default: the attached router's predictionTtlMs, 120 s in
   * approximate mode, 5 s in precise mode). They are what a replica that starts, or comes
   * back, loads as predicted blocks: one kept longer than its maker's router keeps the
   * prediction (an unconfirmed speculative entry in precise mode) would be recorded there,
   * anew, after its maker dropped it, and the replicas would disagree.
   */
  predictionTtlMs?: number;
  /** Own recent decisions kept to write back after Redis lost them (default 10,000). */
  recentDecisions?: number;
  /** A command that takes longer fails, and routing goes on without it (default 250 ms). */
  commandTimeoutMs?: number;
  /**
   * A Redis that has answered nothing for this long while commands time out is treated as gone
   * (default 1,000 ms): its connection is dropped and the replica routes on its local state
   * until Redis answers again, then resynchronises.
   */
  stallTimeoutMs?: number;
  /**
   * How long an admin worker change (or read) waits to hear its decision back on the channel
   * before it is answered 503 (default 5 s); a decision heard later is still applied.
   */
  adminTimeoutMs?: number;
  /**
   * How the gateway hashes prompts (`serve --tokenize`, resolved): text is hashed in chunks,
   * token ids in blocks, so a replica hashing text and one hashing token ids write block
   * entries that never match. Part of the settings fingerprint (`{prefix}settings`) when given.
   */
  tokenize?: 'text' | 'tokenizer' | 'engine';
  /**
   * How the gateway renders chats into token ids under `--tokenize tokenizer` (`serve
   * --chat-rendering`): vLLM's and SGLang's rules give a chat other tokens, so replicas rendering
   * otherwise write block entries for chats that never match. Part of the fingerprint with it.
   */
  chatRendering?: 'vllm' | 'sglang';
}

/**
 * One of this replica's recent decisions, to write back after an outage: its message (what its
 * chain key holds), when its key expires, and the epoch of Redis's data it is known written
 * in (by its decision's pipeline, or a write-back): not written back again while Redis is in
 * that epoch.
 */
interface RecentDecision {
  message: string;
  expiresAt: number;
  writtenIn?: string;
}

interface RedisStats {
  outages: number;
  /** Outages that were a Redis no longer answering on an open connection. */
  stalls: number;
  /** Times Redis was found without this replica's heartbeat on a live connection (it lost its data), and the state written back. */
  stateLost: number;
  errors: number;
  /** Commands Redis answered with an error (OOM, READONLY, NOPERM, …): among the errors. */
  refused: number;
  resyncs: number;
  decisionsPublished: number;
  decisionsApplied: number;
  decisionsUnknownWorker: number;
  /** Refusals of other replicas' decisions that withdrew blocks here. */
  refusalsWithdrawn: number;
  workflowLookups: number;
  workflowClaimsLost: number;
  malformedMessages: number;
  /** Channel messages longer than the bound (maxMessageBytes()), refused unread: among the malformed. */
  oversizeMessages: number;
  replicasSeen: number;
  /** Posted KV-event batches larger than MAX_RELAYED_EVENTS_BYTES: applied only here. */
  eventBatchesNotShared: number;
  /** Block entries a resynchronisation could not read (one that timed out read alone, or one longer than any replica writes) and skipped. */
  chainsSkipped: number;
  /** Block entries longer than any replica writes (maxMessageBytes()), skipped unread: among chainsSkipped. */
  chainsOversize: number;
  /** Workflows a resynchronisation could not read (a `wf:` value longer than any replica writes, or a read that timed out alone) and skipped. */
  workflowsSkipped: number;
  /** Shared keys found holding another kind of value (WRONGTYPE), deleted and written anew: among the errors. */
  wrongKindRepairs: number;
  /** Resynchronisations that failed (and were tried again later). */
  resyncFailures: number;
  /** Chunks of a write-back after an outage that Redis did not answer in time, and were sent again. */
  writeBackRetries: number;
  /** Workers heard added on the channel that a resynchronisation found absent from the registry: dropped here, not written back. */
  workersUnregistered: number;
  /**
   * Resynchronisations that found `{prefix}settings` holding other hashing settings than this
   * replica's (after its start): the replica routes on its local state meanwhile, and tries again.
   */
  settingsMismatches: number;
}

/**
 * Shared state on Redis, for several router replicas behind one load balancer.
 *
 * - Decisions: each tracked decision is published on one channel (`{prefix}events`) and the
 *   other replicas apply it to their own router (blocks as predicted entries, workflow,
 *   anchors), so a request routed by any replica teaches all of them. The blocks are also
 *   kept under `{prefix}chain:{worker}:{last block}` with Redis's own TTL (the prediction
 *   lifetime), from which a replica that starts, or comes back, loads the current state.
 * - Workflows: `{prefix}wf:{id}` → worker (TTL refreshed every step). A replica that sees a
 *   workflow for the first time reads it before routing (one round trip, once), and claims a
 *   new one with SET NX, so two replicas starting the same workflow at once end up agreeing.
 *   `{prefix}workflows` indexes them by last use: past `sharedWorkflows` the least recently
 *   used is dropped (clients choose the ids), and a replica that starts loads the newest ones.
 * - In-flight work: a decision message counts its request on the worker at every other
 *   replica as queued prefill, a prefill-done message (its first token) moves it to the
 *   decode load, and a release message (when the request ends) takes it off, so a replica sees
 *   the others' load within a publish, not a polling interval (requests can be shorter than
 *   any sensible interval). Every `syncIntervalMs` each replica also writes its counts to
 *   `{prefix}load:{replica}` (expiring) and a heartbeat to `{prefix}replicas`: a replica
 *   that joins, or comes back after an outage, starts from those, and a replica that stops
 *   heartbeating has its counts dropped.
 * - Refusals: when an engine refuses a request holding none of it, a refusal message names its
 *   decision, and the other replicas withdraw what it alone added to theirs (until its
 *   prefill-done or release, which settle it).
 * - Registry: `{prefix}workers` (id → worker), changes published on the same channel.
 *
 * Redis is never on the request's critical path except for that first workflow lookup, which
 * has a short timeout. When Redis is unreachable the replica keeps routing on its local state,
 * logs it once, counts errors, and on reconnection writes back what Redis lost (its workers,
 * workflows and recent decisions, with SET NX so nothing newer is overwritten) and reloads.
 */
export class RedisStateStore implements StateStore {
  readonly kind = 'redis';
  readonly sharesDecisions = true;
  readonly replicaId: string;
  private readonly keys: RedisKeys;
  private readonly channel: string;
  /** host:port, to name the server in errors (never the URL: it may hold a password). */
  private readonly address: string;
  /** The last error the command connection reported, to tell why a start failed. */
  private connectionError: Error | undefined;
  /** Why the last resynchronisation failed, if it did; logged once until one succeeds. */
  private resyncError: Error | undefined;
  /** The database the URL names. */
  private readonly db: number;
  /** Redis's refusal of the SELECT of the current connection's handshake, if it refused it. */
  private selectError: Error | undefined;
  private readonly cmd: Redis;
  private readonly sub: Redis;
  private host: StateStoreHost | undefined;
  private up = false;
  private closed = false;
  /** Whether the start said Redis was unreachable, and its connection has not been said since (saidConnected()). */
  private unreachableAtStart = false;
  /** While attach() waits on the first resynchronisation: a refusal then fails the start rather than being retried. */
  private starting = true;
  private timer: NodeJS.Timeout | undefined;
  /**
   * The command connection is not made again before this time (performance.now(): monotonic, a
   * wall clock set back does not hold it off): a reconnection put off after a refused database or
   * a failed resynchronisation (reconnectLater(); see DATABASE_RETRY_MIN_MS, RESYNC_RETRY_MIN_MS).
   */
  private reconnectAt = 0;
  private databaseBackoffMs = DATABASE_RETRY_MIN_MS;
  private resyncBackoffMs = RESYNC_RETRY_MIN_MS;
  /** Failed resynchronisations in a row, and when the last line about one was logged and how many came since (resyncFailed()). */
  private resyncFailuresInRow = 0;
  private resyncFailedLoggedAt = -Infinity;
  private resyncFailuresUnlogged = 0;
  private syncing = false;
  private resyncing: Promise<void> | undefined;
  private readonly syncIntervalMs: number;
  private readonly workflowTtlMs: number;
  /** The most workflows kept in Redis (set by attach() unless configured). */
  private sharedWorkflowLimit: number;
  /** The most workflows looked up and not yet claimed kept (the router's workflow capacity, set by attach()). */
  private unclaimedLimit = 1;
  /** Set by attach() from the router unless given. */
  private predictionTtlMs: number;
  private readonly recentLimit: number;
  private readonly stallTimeoutMs: number;
  /**
   * When Redis last sent anything on the command connection (a reply, or an error reply, even to
   * a command that timed out), on the loop's clock: what tells a stalled server.
   */
  private lastAnswerAt = 0;
  /** Wall-clock time less the time this replica's own event loop was held: see dropIfStalled(). */
  private readonly loopClock = new LoopClock();
  /** Why the connection was dropped on purpose, for the outage's log line. */
  private dropReason: string | undefined;
  /**
   * The epoch of Redis's data as this replica last read it: the value of `{prefix}epoch`, which
   * the first replica to find it absent writes (SET NX, a random value). Data Redis lost (a
   * FLUSHALL, a restart without persistence, a failover to a server without it) takes the key
   * with it, and the next replica to look writes another: a changed epoch is what tells a loss,
   * not a heartbeat missing (which the others may have dropped for a replica that was only slow).
   */
  private epoch: string | undefined;
  /**
   * What a recent decision's block entry is known written in (RecentDecision.writtenIn): the
   * epoch and the run of the Redis server that took it (its `run_id`, new at each start). A
   * restart that kept the epoch from a snapshot or an append-only file may still have lost what
   * came after them, and a failover to a replica behind its primary the last writes: neither
   * changes the epoch, both change the server's run, so the write-back skips only what this
   * very server took. Undefined while either is unknown (INFO refused to this user): nothing is
   * skipped then.
   */
  private writtenMark: string | undefined;
  /**
   * Counts the connections that came up (cameUp()): a resynchronisation started on one stops
   * where it would go on over a later one, which runs its own.
   */
  private connectionsUp = 0;
  /** A write-back after Redis lost its data, while it runs. */
  private rewriting = false;
  /** Whether a replica set holding more heartbeats than are read (REPLICAS_READ) was logged (once). */
  private loggedManyReplicas = false;
  /** Whether a block entry longer than any replica writes was logged (once, then only counted). */
  private loggedOversizeChains = false;
  /** The keys found holding another kind of value, logged once each (replaceWrongKind()). */
  private readonly loggedWrongKinds = new Set<string>();
  /** The kinds of refusal already logged on this connection. */
  private readonly loggedRefusals = new Set<string>();
  /** Before this time a READONLY refusal does not reconnect (see READONLY_RETRY_MIN_MS). */
  private readOnlyRetryAt = 0;
  /** Whether ioredis is reconnecting after a READONLY (paced by readOnlyRetryAt, not by the resynchronisation's backoff). */
  private readOnlyReconnecting = false;
  /** How long the next READONLY reconnection waits after this one; reset by a write Redis takes. */
  private readOnlyBackoffMs = READONLY_RETRY_MIN_MS;
  /** The error code of the last command Redis refused ('' for none yet). */
  private lastRefusal = '';
  /** When an error Redis did not answer with was last logged, and how many came since (unanswered()). */
  private unansweredLoggedAt = -Infinity;
  private unansweredSinceLogged = 0;
  /** Own decisions still alive, by chain key, to write back after an outage. */
  /** Own decisions by chain key, least recently written evicted beyond recentLimit; none when the limit is 0. */
  private readonly recent: LRUCache<string, RecentDecision> | undefined;
  /**
   * Workflows looked up and found unclaimed: the decision that follows claims them (SET NX).
   * A lookup no decision follows (no worker to route to, the client gone) stays until it is
   * the oldest of unclaimedLimit, and is dropped then: a full set must not stop new workflows
   * from being claimed.
   */
  private readonly unclaimed = new Set<string>();
  /**
   * Other replicas' in-flight work: kept current by their decision/prefill-done/release
   * messages, seeded from their snapshots; only on workers this router has (see RemoteLoad).
   */
  private readonly remote = new RemoteLoad({
    // a data-parallel rank's `ID#r`, as decisions name it, is a worker of the router too
    hasWorker: (id) => this.host?.router.hasWorker(id) === true,
    onRefused: (why) =>
      this.host?.log(
        `state: other replicas' load refused past a bound (${why}); further refusals are only counted (state.remoteLoadRefused)`,
      ),
  });
  /** Own decisions whose prefill-done was published: their release takes decode tokens off, not prefill. */
  private readonly prefilled = new WeakSet<SharedDecision>();
  /** Workers drained through an admin API (this replica's or another's) and not resumed, by id. */
  private draining = new Set<string>();
  /** Workers added or removed through this replica's admin API (or discovery) while Redis was out of reach, or during a resynchronisation. */
  private readonly unsyncedWorkers = new Map<string, UnsyncedWorker>();
  /**
   * The record (JSON) of each worker as the registry last held it to this replica's knowledge:
   * its own changes Redis took, the others' heard, the registry read (before it is first read,
   * the workers held at start). A removal made here while Redis was out of reach is written back
   * only while the registry still holds this record (or none), and an addition written back after
   * such a removal replaces the record only while the registry still holds this one.
   */
  private readonly syncedRecords = new Map<string, string>();
  /**
   * Workers removed here whose removal this replica has not yet heard back on the channel. An
   * addition announced before it (another replica's write-back that Redis applied before the
   * removal, heard after the worker was removed here) is older than the removal and is not
   * followed: the registry has the removal, and following it would keep the worker here alone.
   */
  private readonly removalsInFlight = new Set<string>();
  /**
   * The workers this replica may write back to the registry when it lacks them (Redis lost its
   * data): those it was configured with, those added through its own admin API (or its DNS
   * discovery), and those it read in the registry itself. Never one it only heard of on the
   * channel: anything that can publish there can announce a worker, and writing that into the
   * registry would make it every replica's for good; such a worker is dropped here instead
   * when a resynchronisation finds the registry without it (loadRegistryHearing()).
   */
  private readonly vouched = new Set<string>();
  /** Drains (true) and resumes (false) made through this replica's admin API while Redis was out of reach, or during a resynchronisation. */
  private readonly unsyncedDrains = new Map<string, UnsyncedDrain>();
  /** Whether the subscriber is subscribed to the channel (on its current connection). */
  private subscribed = false;
  /** Whether the subscriber was ever subscribed: subscribing again means it lost messages. */
  private subscribedBefore = false;
  /** Set when the other replicas' tallies must be reseeded from their snapshots at the next load sync. */
  private reseedLoad = false;
  /**
   * When a message last moved each tallied replica's tally here (Date.now()), until a load sync
   * has found the tally agreeing with that replica's snapshot (see reconcileQuietMs): at most
   * one entry per replica tallied (MAX_REMOTE_REPLICAS), those of replicas dropped pruned at
   * each sync.
   */
  private readonly heardAt = new Map<string, number>();
  /**
   * How long a replica's messages must have been quiet before its snapshot is trusted over its
   * tally here. A snapshot is written at every one of its replica's syncs (syncIntervalMs, one
   * setting across a fleet), after the messages it published before it on the same connection:
   * once nothing of it has been heard for two intervals, the snapshot read now was written after
   * the last message heard, so it holds what that message did, and no later message of it has
   * been applied here. The command timeout on top: the replica's sync may wait up to that on
   * Redis before it writes its next snapshot. A tally that still disagrees then has a wrong
   * message in it (a forged one under the replica's id, or a lost release), not one in flight.
   * Under steady traffic a replica is never quiet that long and its tally is never replaced: the
   * messages keep it. Should the judgement fail (a message in flight longer than this), the
   * correction keeps the replica to be checked again at the next sync and the message that came
   * late marks it heard again: either way the next snapshot settles it.
   */
  private readonly reconcileQuietMs: number;
  /** The longest channel message read (maxMessageBytes()); set by attach() from the router, lowered block sizes raise it. */
  private maxMessageBytes = Infinity;
  /** The smallest block size of any worker seen (the router's own at first): what maxMessageBytes is of. */
  private smallestBlockSize = Infinity;
  private readonly subscribedWaiters: Array<() => void> = [];
  private readonly adminTimeoutMs: number;
  /**
   * Admin worker changes (and reads) made in Redis, or on their way, whose mark this replica has
   * not heard back yet, by the mark's nonce: `heard` gets the verdict the mark carries, `fail`
   * says the mark will not come (the connection or the subscription was lost).
   */
  private readonly pendingChanges = new Map<
    string,
    { heard: (code: string, n: string) => void; fail: (err: Error) => void }
  >();
  /** What the resynchronisations reading the registry now have heard since they started reading. */
  private readonly hearing = new Set<HeardChanges>();
  /** The gateway's tokenize mode, when given: part of the settings fingerprint. */
  private readonly tokenize: RedisStateOptions['tokenize'];
  /** The gateway's chat rendering, when given: part of the fingerprint under `--tokenize tokenizer`. */
  private readonly chatRendering: RedisStateOptions['chatRendering'];
  /** This replica's hashing settings (set by attach()), written to and compared with `{prefix}settings`. */
  private fingerprint: HashingFingerprint | undefined;
  /**
   * Why the shared state is not used (`{prefix}settings` holds other hashing settings, found by a
   * resynchronisation after the start), until one finds them agreeing; logged once per reason.
   */
  private settingsMismatch: string | undefined;
  private readonly counters: RedisStats = {
    outages: 0,
    stalls: 0,
    stateLost: 0,
    errors: 0,
    refused: 0,
    resyncs: 0,
    decisionsPublished: 0,
    decisionsApplied: 0,
    decisionsUnknownWorker: 0,
    refusalsWithdrawn: 0,
    workflowLookups: 0,
    workflowClaimsLost: 0,
    malformedMessages: 0,
    oversizeMessages: 0,
    replicasSeen: 0,
    eventBatchesNotShared: 0,
    chainsSkipped: 0,
    chainsOversize: 0,
    workflowsSkipped: 0,
    wrongKindRepairs: 0,
    resyncFailures: 0,
    writeBackRetries: 0,
    workersUnregistered: 0,
    settingsMismatches: 0,
  };

  constructor(options: RedisStateOptions) {
    const url = parseRedisUrl(options.url);
    this.address = `${url.host}:${url.port}`;
    this.db = url.db ?? 0;
    this.keys = new RedisKeys(options.prefix ?? 'contextforge:', this.db);
    this.channel = this.keys.channel;
    this.replicaId = options.replicaId ?? randomBytes(6).toString('hex');
    if (this.replicaId.length > MAX_REPLICA_ID_LENGTH)
      throw new RangeError(
        `replicaId must be at most ${MAX_REPLICA_ID_LENGTH} characters, got ${this.replicaId.length}`,
      );
    this.syncIntervalMs = positive(options.syncIntervalMs ?? 100, 'syncIntervalMs');
    this.workflowTtlMs = positive(options.workflowTtlMs ?? 3_600_000, 'workflowTtlMs');
    this.sharedWorkflowLimit =
      options.sharedWorkflows === undefined ? 0 : positiveInteger(options.sharedWorkflows, 'sharedWorkflows');
    // what `SET … PX` takes, as the router's option does (MAX_PREDICTION_TTL_MS)
    this.predictionTtlMs =
      options.predictionTtlMs === undefined ? 0 : positiveInteger(options.predictionTtlMs, 'predictionTtlMs');
    if (this.predictionTtlMs > MAX_PREDICTION_TTL_MS)
      throw new RangeError(`predictionTtlMs must be at most ${MAX_PREDICTION_TTL_MS}, got ${this.predictionTtlMs}`);
    this.recentLimit = options.recentDecisions ?? 10_000;
    this.tokenize = options.tokenize;
    this.chatRendering = options.chatRendering;
    this.stallTimeoutMs = positive(options.stallTimeoutMs ?? 1000, 'stallTimeoutMs');
    this.adminTimeoutMs = positive(options.adminTimeoutMs ?? 5000, 'adminTimeoutMs');
    this.reconcileQuietMs = 2 * this.syncIntervalMs + (options.commandTimeoutMs ?? 250);
    this.recent = this.recentLimit > 0 ? new LRUCache({ max: this.recentLimit }) : undefined;
    const common: RedisOptions = {
      ...url,
      lazyConnect: true,
      // retry forever, at most a second apart: Redis coming back must be noticed
      retryStrategy: (attempt) => Math.min(100 * attempt, 1000),
      maxRetriesPerRequest: 0,
      commandTimeout: options.commandTimeoutMs ?? 250,
    };
    // commands fail at once while disconnected instead of queueing behind a dead server
    this.cmd = new Redis({
      ...common,
      // and no sooner than a reconnection put off after a failure asks (reconnectLater())
      // put off until reconnectAt, on the monotonic clock (a wall clock set back would hold the
      // replica off Redis for as long), and never by more than the longest retry
      retryStrategy: (attempt) =>
        Math.max(Math.min(100 * attempt, 1000), Math.min(this.reconnectAt - performance.now(), READONLY_RETRY_MAX_MS)),
      enableOfflineQueue: false,
      connectionName: `contextforge-${this.replicaId}`,
      reconnectOnError: (err) => this.reconnectIfReadOnly(err),
    });
    // subscribed on every 'ready' below rather than by ioredis's autoResubscribe, whose
    // SUBSCRIBE has no handler: a connection closed before Redis answers it would reject a
    // promise nobody holds and take the process down
    this.sub = new Redis({
      ...common,
      commandTimeout: undefined,
      enableOfflineQueue: true,
      autoResubscribe: false,
      connectionName: `contextforge-${this.replicaId}-sub`,
    });
    // state changes are handled below; errors are counted where they surface
    this.cmd.on('error', (err: Error) => {
      this.connectionError = err;
      if (selectRefused(err)) this.selectError = err;
      // a refusal of the handshake after the start (the password changed, the ACL user gone):
      // logged once, counted, and retried by ioredis's reconnection; at start it fails the start
      else if (!this.starting && !this.closed && err instanceof ReplyError)
        this.failed(err, `the connection to ${this.address}`);
    });
    // each connection's handshake selects the database anew: 'connect' comes before it
    this.cmd.on('connect', () => {
      this.selectError = undefined;
      // anything Redis sends is an answer, a late reply to a command that timed out too
      this.cmd.stream.on('data', () => this.answered());
    });
    this.sub.on('error', () => {});
    this.cmd.on('close', () => this.wentDown());
    this.cmd.on('ready', () => void this.cameUp());
    this.sub.on('ready', () => this.subscribe());
    this.sub.on('close', () => (this.subscribed = false));
    this.sub.on('messageBuffer', (_channel: Buffer, message: Buffer) => this.onMessage(message));
  }

  async attach(host: StateStoreHost): Promise<void> {
    this.host = host;
    if (this.predictionTtlMs === 0) this.predictionTtlMs = host.router.predictionTtlMs;
    const capacity = host.router.workflowCapacity;
    if (this.sharedWorkflowLimit === 0) this.sharedWorkflowLimit = SHARED_WORKFLOWS_PER_CAPACITY * capacity;
    this.unclaimedLimit = capacity;
    this.fingerprint = hashingFingerprint(host.router, this.tokenize, this.chatRendering);
    this.noteBlockSize(host.router.blockSize);
    for (const w of host.router.listWorkers()) this.noteBlockSize(w.info.blockSize);
    // until the registry is read, the workers held at start (configured, written back unless it
    // holds them) are the records a removal made here while Redis is out of reach is made on
    for (const w of host.listWorkers()) {
      this.syncedRecords.set(w.id, JSON.stringify(w));
      this.vouched.add(w.id);
    }
    // close() can come while the start waits on Redis (the gateway stopped during its start):
    // a client connected after it would stay open, and reconnect, for good
    if (this.closed) return;
    // both connections at once: the subscriber's 'ready' subscribes, now or when Redis answers,
    // and the first sync waits for that (stallTimeoutMs at most) before it reads anything
    this.sub.connect().catch(() => {});
    const started = this.cmd.connect().then(() => this.resyncing); // 'ready' runs the first sync
    try {
      // a Redis that takes the connection and answers nothing (stopped, paused) is not waited
      // for longer than one that refuses it: requests never wait for Redis
      if (!(await this.answeredWithinStall(started))) {
        started.catch(() => {}); // ioredis reconnects; 'ready' runs the sync then
        if (this.closed) return;
        this.unreachableAtStart = true;
        host.log(
          `state: redis unreachable at start (redis at ${this.address} did not answer within ${this.stallTimeoutMs} ms); routing on local state until it answers`,
        );
      }
    } catch (err) {
      if (this.closed) return;
      await this.refuseStart(this.connectionError);
      // ioredis rejects the connection as closed: the error it reported before says why
      const cause = said(this.connectionError ?? err);
      this.unreachableAtStart = true;
      host.log(`state: redis unreachable at start (${cause}); routing on local state until it answers`);
    }
    // (the first resynchronisation may have ended since the start gave up waiting on it)
    if (this.up) this.saidConnected();
    this.starting = false;
    if (this.closed) return;
    // a password Redis refused, or an ACL user without a command the state needs, is a
    // configuration to fix: the replica would otherwise retry for good
    if (!this.up) await this.refuseStart(this.resyncError);
    this.timer = setInterval(() => void this.syncLoad(), this.syncIntervalMs);
    this.timer.unref();
  }

  /**
   * Whether the start settled (true) before stallTimeoutMs passed without Redis answering the
   * command connection's handshake (false); rejects as the start does. A connection Redis has
   * answered is waited on: every command of the first sync has the command timeout.
   */
  private answeredWithinStall(started: Promise<void>): Promise<boolean> {
    return new Promise<boolean>((resolve, reject) => {
      const timer = setTimeout(() => {
        if (this.cmd.status !== 'ready') resolve(false);
      }, this.stallTimeoutMs);
      started.then(
        () => resolve(true),
        (err: unknown) => reject(err as Error),
      );
      void started.finally(() => clearTimeout(timer)).catch(() => {});
    });
  }

  beforeRoute(request: RouteRequest): Promise<void> | undefined {
    const id = request.workflowId;
    if (id === undefined || !this.up || this.host!.router.workflowAffinity(id) !== undefined) return undefined;
    this.counters.workflowLookups++;
    return this.readWorkflow(id).then(
      (value) => {
        // (a value longer than any replica writes, answered by its length, is none)
        const entry = value === undefined ? undefined : parseWorkflow(value);
        if (entry) this.host!.router.setWorkflowAffinity(id, entry.w, entry.s);
        else this.markUnclaimed(id);
      },
      (err: unknown) => this.unanswered("a workflow's lookup", err),
    );
  }

  /**
   * A workflow's `wf:` value, read bounded (READ_VALUE): undefined when there is none, or one
   * longer than any replica writes (WORKFLOW_VALUE_MAX_BYTES; one of 30 MB read whole held the
   * command connection past the command timeout on every first sight of the workflow).
   */
  private async readWorkflow(id: string): Promise<string | undefined> {
    const value = (await this.cmd.eval(READ_VALUE, 1, this.key('wf', id), String(WORKFLOW_VALUE_MAX_BYTES))) as
      string | number | null;
    return typeof value === 'string' ? value : undefined;
  }

  decisionMade(d: SharedDecision): void {
    const message = JSON.stringify(encodeDecision(this.replicaId, d));
    const chain = this.chainOf(d);
    if (chain) this.remember(chain, message);
    if (!this.up) return;
    void this.publishDecision(d, message, chain).catch((err: Error) => this.failed(err, 'a decision'));
  }

  decisionPrefilled(d: SharedDecision): void {
    if (!this.up || !d.tracked || this.prefilled.has(d)) return;
    this.prefilled.add(d);
    this.publish(JSON.stringify(encodePrefilled(this.replicaId, d)));
  }

  decisionEnded(d: SharedDecision): void {
    if (!this.up || !d.tracked) return;
    this.publish(JSON.stringify(encodeReleased(this.replicaId, d, this.prefilled.has(d))));
  }

  decisionRefused(d: SharedDecision): void {
    if (!d.tracked) return;
    const wire = encodeRefused(this.replicaId, d);
    const chain = this.chainOf(d);
    if (chain && wire) {
      // a replica that starts or resynchronises loads the chains: the refused decision's must
      // not come back there. Only while it is still this decision's: a later one with the same
      // last block on the same worker (a retry the engine took) keeps its own
      const message = JSON.stringify(encodeDecision(this.replicaId, d));
      if (this.recent?.get(chain)?.message === message) this.recent.delete(chain);
      if (this.up)
        void this.cmd
          .eval(DELETE_IF_EQUAL, 1, chain, message)
          .catch((err: unknown) => this.unanswered("a refused decision's withdrawal", err));
    }
    if (this.up && wire) this.publish(JSON.stringify(wire));
  }

  workerAdded(worker: WorkerRecord): void {
    this.noteBlockSize(worker.blockSize);
    this.vouched.add(worker.id);
    this.removalsInFlight.delete(worker.id);
    this.draining.delete(worker.id);
    this.unsyncedDrains.delete(worker.id);
    if (!this.up) {
      // written when Redis is back; after a removal made here, over the record it removed
      const before = this.unsyncedWorkers.get(worker.id);
      const base = before === undefined ? undefined : 'added' in before ? before.base : before.removed.base;
      return void this.unsyncedWorkers.set(worker.id, base === undefined ? { added: worker } : { added: worker, base });
    }
    this.syncedRecords.set(worker.id, JSON.stringify(worker));
    const m = this.cmd.pipeline();
    this.writeAdded(m, worker);
    void this.run(m, 'a worker added').catch((err: unknown) => this.unanswered('a worker added', err));
  }

  workerRemoved(workerId: string, options: { record?: boolean } = {}): void {
    const record = options.record ?? true;
    this.vouched.delete(workerId);
    this.draining.delete(workerId);
    this.unsyncedDrains.delete(workerId);
    // its tallies (its ranks') go with it: a worker added again starts from nothing
    this.remote.forgetUnknownWorkers();
    if (!this.up) {
      const before = this.unsyncedWorkers.get(workerId);
      const base =
        before === undefined ? this.syncedRecords.get(workerId) : 'added' in before ? before.base : before.removed.base;
      // written back only over the record removed: the registry's to this replica's knowledge,
      // or the one added here meanwhile (over none the registry held)
      const held =
        before === undefined
          ? base
          : 'added' in before
            ? (before.base ?? JSON.stringify(before.added))
            : before.removed.held;
      const removed: { record: boolean; base?: string; held?: string } = { record };
      if (base !== undefined) removed.base = base;
      if (held !== undefined) removed.held = held;
      return void this.unsyncedWorkers.set(workerId, { removed });
    }
    this.syncedRecords.delete(workerId);
    this.removalsInFlight.add(workerId);
    const m = this.cmd.pipeline();
    this.writeRemoved(m, workerId, record);
    void this.run(m.del(this.key('load', this.replicaId)), 'a worker removed').catch((err: unknown) =>
      this.unanswered('a worker removed', err),
    );
  }

  workerDrained(workerId: string, draining: boolean): void {
    if (draining) this.draining.add(workerId);
    else this.draining.delete(workerId);
    if (!this.up) {
      // written back only onto this record: a worker removed and added again meanwhile is another
      const held = this.host?.listWorkers().find((w) => w.id === workerId);
      return void this.unsyncedDrains.set(workerId, { on: draining, record: held ? JSON.stringify(held) : '' });
    }
    const m = this.cmd.pipeline();
    this.writeDrained(m, workerId, draining);
    const what = draining ? 'a worker drained' : 'a worker resumed';
    void this.run(m, what).catch((err: unknown) => this.unanswered(what, err));
  }

  kvEventsPosted(workerId: string, events: unknown): void {
    // not kept while Redis is out of reach: the engine's next events, or a replay, bring the rest
    if (!this.up) return;
    const message = JSON.stringify({ r: this.replicaId, k: 'ev', w: workerId, e: events } satisfies WireKvEvents);
    if (Buffer.byteLength(message) > MAX_RELAYED_EVENTS_BYTES) {
      if (this.counters.eventBatchesNotShared++ === 0)
        this.host?.log(
          `state: a batch of KV events posted for '${workerId}' is larger than ${MAX_RELAYED_EVENTS_BYTES} bytes: applied here, not shared with the other replicas (post smaller batches); further ones are only counted (state.eventBatchesNotShared)`,
        );
      return;
    }
    this.publish(message);
  }

  /** Whether the admin API's worker changes are decided in Redis now: while it is up (else here, as before). */
  decidesWorkerChanges(): boolean {
    return this.up;
  }

  /**
   * Decides an admin worker change in Redis, against the registry, in one script (ADD_WORKER,
   * REMOVE_WORKER, DRAIN_WORKER): made and announced only when the registry allows it, with the
   * same statuses and messages as one replica. The script publishes a mark carrying its verdict
   * last; `apply` is called with that verdict as this replica hears the mark, so after every
   * registry change Redis made before it (this replica then holds what the registry held) and
   * before any made after it. Rejects with SharedStateUnanswered when Redis refuses or does not
   * answer the script (it may still have been made: a mark heard later still applies it) or
   * when the mark is not heard within adminTimeoutMs (applied when it is).
   */
  orderWorkerChange<T>(change: WorkerChange, apply: (verdict: WorkerChangeVerdict) => T): Promise<T> {
    const what =
      change.op === 'add'
        ? `the addition of worker '${change.worker.id}'`
        : change.op === 'remove'
          ? `the removal of worker '${change.id}'`
          : `the ${change.draining ? 'drain' : 'resumption'} of worker '${change.id}'`;
    return this.awaitMark(
      what,
      (mark) => this.runChange(change, mark),
      (code, n) => {
        const verdict = this.verdictOf(change, code, n);
        this.keepChange(change, verdict);
        const result = apply(verdict);
        if (verdict.ok && change.op === 'remove') {
          // its tallies (its ranks') go with it; this replica's snapshot is written anew at its next sync
          this.remote.forgetUnknownWorkers();
          void this.cmd
            .del(this.key('load', this.replicaId))
            .catch((err: unknown) => this.unanswered("this replica's load snapshot's removal", err));
        }
        return result;
      },
    );
  }

  /**
   * Resolves once this replica has heard every registry change Redis made before the call (a
   * mark it publishes, heard back), so an admin read shows every change some replica answered;
   * at once while Redis is out of reach or the subscriber is not subscribed (the read shows
   * this replica's view). Rejects with
   * SharedStateUnanswered when the mark is not published or not heard within adminTimeoutMs.
   */
  syncWorkerChanges(): Promise<void> {
    // unsubscribed (the subscriber reconnecting), no mark is heard: the resynchronisation that follows mends the view
    if (!this.up || !this.subscribed) return Promise.resolve();
    return this.awaitMark(
      'the read of the workers',
      (mark) => this.cmd.publish(this.channel, `${mark}s:0"}`),
      () => undefined,
    );
  }

  /**
   * Sends what `send` makes with the start of a fresh mark (this replica's `rm` message up to
   * its nonce and ':'), and settles with `heard` of the verdict the mark carries, called as the
   * mark is heard (in the channel's order). A failed send, or no mark within adminTimeoutMs,
   * rejects with SharedStateUnanswered naming `what`; a mark heard later still runs `heard`.
   */
  private awaitMark<T>(
    what: string,
    send: (mark: string) => Promise<unknown>,
    heard: (code: string, n: string) => T,
  ): Promise<T> {
    if (!this.up)
      return Promise.reject(
        new SharedStateUnanswered(`redis at ${this.address} is out of reach: ${what} was not decided`),
      );
    const nonce = randomBytes(6).toString('hex');
    const mark = JSON.stringify({ r: this.replicaId, k: 'rm', n: `${nonce}:` } satisfies WireReadMark).slice(0, -2);
    return new Promise<T>((resolve, reject) => {
      let done = false;
      const settle = (f: () => void) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        f();
      };
      const timer = setTimeout(
        () =>
          settle(() =>
            reject(
              new SharedStateUnanswered(
                `${what} was sent to redis at ${this.address}, and not heard back on its channel within ${this.adminTimeoutMs} ms; it may still be made: read /admin/workers before trying again`,
              ),
            ),
          ),
        this.adminTimeoutMs,
      );
      if (this.pendingChanges.size >= MOST_PENDING_CHANGES)
        this.pendingChanges.delete(this.pendingChanges.keys().next().value!);
      this.pendingChanges.set(nonce, {
        heard: (code, n) => {
          let result: T;
          try {
            result = heard(code, n);
          } catch (err) {
            return settle(() => reject(err as Error));
          }
          settle(() => resolve(result));
        },
        fail: (err) => settle(() => reject(err)),
      });
      send(mark).catch((err: Error) => {
        this.failed(err, what);
        // refused, the script wrote nothing and published no mark: nothing is left to wait for
        if (err instanceof ReplyError) this.pendingChanges.delete(nonce);
        // a command that timed out may still have run: its mark, heard later, applies it here
        settle(() =>
          reject(
            new SharedStateUnanswered(
              err instanceof ReplyError
                ? `redis at ${this.address} refused ${what} (${said(err)})`
                : `redis at ${this.address} did not answer ${what} (${said(err)}); it may still be made: read /admin/workers before trying again`,
            ),
          ),
        );
      });
    });
  }

  /** The admin changes waiting for a mark that will not come now (the connection or subscription lost): refused, forgotten. */
  private failPendingChanges(why: string): void {
    const pending = [...this.pendingChanges.values()];
    this.pendingChanges.clear();
    for (const p of pending)
      p.fail(
        new SharedStateUnanswered(
          `${why} before the worker change was heard back; it may have been made: read /admin/workers before trying again`,
        ),
      );
  }

  /** Runs `change`'s script, its mark starting with `mark`. */
  private runChange(change: WorkerChange, mark: string): Promise<unknown> {
    const keys = [this.key('workers'), this.key('removed'), this.key('draining')];
    const r = this.replicaId;
    switch (change.op) {
      case 'add': {
        const { worker } = change;
        this.noteBlockSize(worker.blockSize);
        return this.cmd.eval(
          ADD_WORKER,
          3,
          ...keys,
          this.channel,
          mark,
          worker.id,
          JSON.stringify(worker),
          String(worker.dpSize ?? 1),
          String(MAX_WORKERS),
          JSON.stringify({ r, k: 'wa', worker } satisfies WireWorkerAdded),
          JSON.stringify({ r, k: 'dr', id: worker.id, on: false } satisfies WireWorkerDrained),
        );
      }
      case 'remove':
        return this.cmd.eval(
          REMOVE_WORKER,
          3,
          ...keys,
          this.channel,
          mark,
          change.id,
          String(Date.now()),
          JSON.stringify({ r, k: 'wr', id: change.id } satisfies WireWorkerRemoved),
        );
      case 'drain': {
        // a data-parallel rank's id (ID#r) names its worker when the registry holds no worker of that id
        const hash = change.id.lastIndexOf('#');
        const rank = hash > 0 ? change.id.slice(hash + 1) : '';
        const worker = /^(0|[1-9]\d*)$/.test(rank) ? change.id.slice(0, hash) : '';
        const drained = (id: string) =>
          JSON.stringify({ r, k: 'dr', id, on: change.draining } satisfies WireWorkerDrained);
        return this.cmd.eval(
          DRAIN_WORKER,
          2,
          keys[0],
          keys[2],
          this.channel,
          mark,
          change.id,
          change.draining ? '1' : '0',
          drained(change.id),
          worker,
          worker === '' ? '0' : rank,
          worker === '' ? '' : drained(worker),
        );
      }
    }
  }

  /** The verdict a change's mark carries (`code`, and `n` the ranks registered for a refusal past the bound). */
  private verdictOf(change: WorkerChange, code: string, n: string): WorkerChangeVerdict {
    switch (change.op) {
      case 'add': {
        const { id } = change.worker;
        if (code === '1') return { ok: true, id };
        if (code !== '-1') return { ok: false, status: 409, message: `worker '${id}' exists`, param: 'id' };
        const dpSize = change.worker.dpSize ?? 1;
        const ranks = Number(n);
        return { ok: false, status: 409, ...workerLimitRefusal(id, dpSize, ranks) };
      }
      case 'remove':
        return code === '1'
          ? { ok: true, id: change.id }
          : { ok: false, status: 404, message: `no worker '${change.id}'` };
      case 'drain':
        if (code === '1') return { ok: true, id: change.id };
        if (code === '2') return { ok: true, id: change.id.slice(0, change.id.lastIndexOf('#')) };
        return { ok: false, status: 404, message: `no worker '${change.id}'` };
    }
  }

  /**
   * What this replica keeps of a change Redis made as its mark is heard, as of another replica's
   * message (onMessage()): a resynchronisation reading the registry now lays it over its read.
   */
  private keepChange(change: WorkerChange, verdict: WorkerChangeVerdict): void {
    if (!verdict.ok) return;
    const id = verdict.id;
    if (change.op === 'add') this.removalsInFlight.delete(id);
    if (change.op === 'add') {
      this.syncedRecords.set(id, JSON.stringify(change.worker));
      this.vouched.add(id);
    } else if (change.op === 'remove') {
      this.syncedRecords.delete(id);
      this.vouched.delete(id);
    }
    for (const h of this.hearing) {
      if (!h.past) continue;
      if (change.op === 'drain') h.drains.set(id, change.draining);
      else {
        h.workers.set(id, change.op === 'add' ? change.worker : null);
        h.drains.set(id, false);
      }
    }
    // made in the registry: nothing of this worker made here while Redis was out of reach is left to write
    this.unsyncedDrains.delete(id);
    if (change.op === 'drain' && change.draining) this.draining.add(id);
    else this.draining.delete(id);
  }

  /**
   * A worker added to the registry (no longer recorded as removed, nor draining: a worker
   * removed and added again starts afresh), announced, and announced resumed: a replica that
   * did not hear of its removal (this one was cut off then) may hold it drained.
   */
  private writeAdded(m: ChainableCommander, worker: WorkerRecord): void {
    const message = JSON.stringify({ r: this.replicaId, k: 'wa', worker } satisfies WireWorkerAdded);
    const resumed = JSON.stringify({
      r: this.replicaId,
      k: 'dr',
      id: worker.id,
      on: false,
    } satisfies WireWorkerDrained);
    m.hset(this.key('workers'), worker.id, JSON.stringify(worker))
      .hdel(this.key('removed'), worker.id)
      .hdel(this.key('draining'), worker.id)
      .publish(this.channel, message)
      .publish(this.channel, resumed);
  }

  /**
   * A worker taken out of the registry, announced, and with `record` (a removal through the
   * admin API) recorded as removed: a replica that (re)starts configured with it does not
   * write it back (loadRegistry()). Discovery's removals are not recorded: the engine's DNS
   * records, which every replica reads, say whether it is back.
   */
  private writeRemoved(m: ChainableCommander, workerId: string, record: boolean): void {
    const message = JSON.stringify({ r: this.replicaId, k: 'wr', id: workerId } satisfies WireWorkerRemoved);
    m.hdel(this.key('workers'), workerId);
    if (record) m.hset(this.key('removed'), workerId, String(Date.now()));
    m.hdel(this.key('draining'), workerId).publish(this.channel, message);
  }

  /**
   * Writes the registry changes made here while Redis was out of reach (or a resynchronisation
   * ran) into `m`; the function returned forgets those still unchanged once `m` has run.
   */
  private writeUnsynced(m: ChainableCommander): () => void {
    const workerChanges = [...this.unsyncedWorkers];
    const drainChanges = [...this.unsyncedDrains];
    const r = this.replicaId;
    for (const [id, change] of workerChanges) {
      if ('added' in change) {
        // not over a worker of that id Redis took meanwhile (another replica's answered
        // addition): the registry's record wins, and this replica takes it as it reloads
        const worker = change.added;
        m.eval(
          WRITE_BACK_ADDED,
          3,
          this.key('workers'),
          this.key('removed'),
          this.key('draining'),
          this.channel,
          id,
          JSON.stringify(worker),
          JSON.stringify({ r, k: 'wa', worker } satisfies WireWorkerAdded),
          JSON.stringify({ r, k: 'dr', id, on: false } satisfies WireWorkerDrained),
          change.base ?? '',
        );
      } else {
        // only while the registry holds the record removed here, or none: a worker another
        // replica added again (or replaced) meanwhile stays, and this replica takes it as it reloads
        const { record, held } = change.removed;
        m.eval(
          WRITE_BACK_REMOVED,
          3,
          this.key('workers'),
          this.key('removed'),
          this.key('draining'),
          this.channel,
          id,
          held ?? '',
          record ? String(Date.now()) : '',
          JSON.stringify({ r, k: 'wr', id } satisfies WireWorkerRemoved),
        );
      }
    }
    // only onto the record drained here; else dropped, and the registry's word is taken as it reloads
    for (const [id, { on, record }] of drainChanges)
      m.eval(
        WRITE_BACK_DRAIN,
        3,
        this.key('workers'),
        this.key('draining'),
        this.key('removed'),
        this.channel,
        id,
        on ? '1' : '0',
        record,
        JSON.stringify({ r, k: 'dr', id, on } satisfies WireWorkerDrained),
      );
    return () => {
      // (changes made meanwhile stay for the next write)
      for (const [id, w] of workerChanges) if (this.unsyncedWorkers.get(id) === w) this.unsyncedWorkers.delete(id);
      for (const [id, d] of drainChanges) if (this.unsyncedDrains.get(id) === d) this.unsyncedDrains.delete(id);
    };
  }

  /**
   * The registry changes made through this replica while its resynchronisation ran (it was
   * not up yet, so they waited), written and announced once it is up: the resynchronisation
   * wrote only those made before it.
   */
  private flushUnsynced(): void {
    if (this.unsyncedWorkers.size === 0 && this.unsyncedDrains.size === 0) return;
    const m = this.cmd.pipeline();
    const forget = this.writeUnsynced(m);
    // on failure they stay for the next resynchronisation
    const what = 'the registry changes made while resynchronising';
    void this.run(m, what).then(forget, (err: unknown) => this.unanswered(what, err));
  }

  /** A drain (or resume) recorded in the registry, announced. */
  private writeDrained(m: ChainableCommander, workerId: string, draining: boolean): void {
    if (draining) m.hset(this.key('draining'), workerId, '1');
    else m.hdel(this.key('draining'), workerId);
    m.publish(
      this.channel,
      JSON.stringify({ r: this.replicaId, k: 'dr', id: workerId, on: draining } satisfies WireWorkerDrained),
    );
  }

  /**
   * Closes the store and throws a RangeError naming Redis's refusal when `err` is one of access,
   * or of the database, or names the hashing settings that differ from the fleet's.
   */
  private async refuseStart(err: Error | undefined): Promise<void> {
    if (err instanceof DatabaseRefused || err instanceof SettingsMismatch) {
      await this.close();
      throw new RangeError(err.message);
    }
    const message = err instanceof ReplyError ? (err as Error).message : '';
    if (!ACCESS_REFUSED.test(message)) return;
    await this.close();
    throw new RangeError(
      `state: redis at ${this.address} refused this replica (${said(err)}); check the user and password of the redis:// URL and the user's ACL (docs/state.md)`,
    );
  }

  stats(): StateStats {
    return {
      kind: 'redis',
      replicaId: this.replicaId,
      ...this.counters,
      remoteLoadClamped: this.remote.clamped,
      remoteLoadUnknownWorkers: this.remote.unknownWorkers,
      remoteLoadRefused: this.remote.refused,
      remoteLoadCorrected: this.remote.corrected,
      lastRefusal: this.lastRefusal,
      connected: this.up,
      /** Admin worker changes (and reads) sent to Redis whose mark has not been heard yet. */
      adminChangesPending: this.pendingChanges.size,
    };
  }

  async close(): Promise<void> {
    this.failPendingChanges('this replica is stopping');
    this.closed = true;
    clearInterval(this.timer);
    this.loopClock.stop();
    if (this.up)
      await this.cmd
        .multi()
        .zrem(this.key('replicas'), this.replicaId)
        .del(this.key('load', this.replicaId))
        .exec()
        .catch(() => {});
    this.cmd.disconnect();
    this.sub.disconnect();
  }

  // ------------------------------------------------------------------------ internals

  private key(...parts: string[]): string {
    return this.keys.key(...parts);
  }

  /** The key a decision's blocks are kept under (named by its worker and last block); none without blocks. */
  private chainOf(d: SharedDecision): string | undefined {
    const n = d.hi.length;
    return n > 0 ? this.keys.chainKey(d.workerId, d.hi[n - 1], d.lo[n - 1]) : undefined;
  }

  private publish(message: string): void {
    void this.cmd.publish(this.channel, message).catch((err: Error) => this.failed(err, 'a message'));
  }

  /**
   * Counts a failed command. A refusal (Redis answered with an error: out of memory, a
   * read-only replica, an ACL without the command) is logged once per kind and connection:
   * it says what an operator must fix, and would otherwise repeat with every request.
   */
  private failed(error: Error, what: string): void {
    if (!(error instanceof ReplyError)) return this.unanswered(what, error);
    this.counters.errors++;
    this.counters.refused++;
    // a discarded transaction (EXECABORT) is reported by the refusal that discarded it, which
    // ioredis keeps beside it (Redis 7.0 says only "because of previous errors")
    const cause = (error as Error & { previousErrors?: unknown[] }).previousErrors?.[0];
    const err = cause instanceof ReplyError ? (cause as Error) : error;
    const code = /^(?:EXECABORT .*?because of: )?([A-Z]+)/.exec(err.message)?.[1] ?? 'ERR';
    this.lastRefusal = code;
    if (this.loggedRefusals.has(code) || this.loggedRefusals.size >= MAX_LOGGED_REFUSALS) return;
    this.loggedRefusals.add(code);
    this.host?.log(
      `state: redis refused ${what} (${said(err)}); routing goes on, further ${code} refusals are only counted (state.refused)`,
    );
  }

  /**
   * A command Redis did not answer (the command timeout, the connection lost): counted, and
   * logged at most once a minute with what it was, so the count in state.errors has a cause
   * in the log. Routing goes on either way; a lost connection is also logged when it drops.
   */
  private unanswered(what: string, err: unknown): void {
    this.counters.errors++;
    const now = Date.now();
    if (now - this.unansweredLoggedAt < LOG_WINDOW_MS) {
      this.unansweredSinceLogged++;
      return;
    }
    const more = this.unansweredSinceLogged > 0 ? `, ${this.unansweredSinceLogged} more since the last such line` : '';
    this.unansweredLoggedAt = now;
    this.unansweredSinceLogged = 0;
    this.host?.log(
      `state: redis did not answer ${what} (${said(err)}${more}); routing goes on, such errors are logged at most once a minute and counted (state.errors)`,
    );
  }

  /**
   * Sends a pipeline and answers its replies, a refused command's as [its error, undefined]
   * once failed() counted it: one refusal (a write under OOM) does not cost the commands
   * beside it (the PUBLISH that needs no memory), as it would in a transaction. Rejects when
   * a command got no answer (timeout, connection lost).
   */
  private async run(
    batch: ChainableCommander,
    what: string,
    handled: (err: Error) => boolean = () => false,
  ): Promise<[Error | null, unknown][]> {
    const res = (await batch.exec()) ?? [];
    for (const [err] of res) if (err && !(err instanceof ReplyError)) throw err;
    for (const [err] of res) if (err && !handled(err)) this.failed(err, what);
    return res;
  }

  /**
   * One of the fleet's own keys holds a value of another kind (WRONGTYPE: written by hand, or
   * by another program sharing the prefix): it is deleted, for the store to write it anew.
   * Counted among the errors; logged once per key.
   */
  private async replaceWrongKind(key: string, found = 'another kind of value (WRONGTYPE)'): Promise<void> {
    this.counters.errors++;
    this.counters.wrongKindRepairs++;
    const name = this.key(key);
    if (!this.loggedWrongKinds.has(name)) {
      this.loggedWrongKinds.add(name);
      this.host?.log(`state: ${name} in redis holds ${found}; deleted, written anew`);
    }
    await this.cmd.del(name);
  }

  /** `{prefix}epoch` holds `bytes` bytes, longer than any epoch marker (EPOCH_MAX_BYTES): deleted, for the next sync to write it anew. */
  private replaceEpoch(bytes: number): Promise<void> {
    return this.replaceWrongKind('epoch', `a value of ${bytes} bytes, no epoch marker (at most ${EPOCH_MAX_BYTES})`);
  }

  private subscribe(): void {
    this.sub.subscribe(this.channel).then(
      () => {
        this.subscribed = true;
        for (const done of this.subscribedWaiters.splice(0)) done();
        // subscribed again on a connection that stayed up: what was published meanwhile is lost
        if (this.subscribedBefore) this.subscriberCameBack();
        this.subscribedBefore = true;
      },
      () => {
        if (this.closed) return;
        this.counters.errors++;
        this.sub.disconnect(true); // reconnects, and 'ready' subscribes again
      },
    );
  }

  /** A workflow looked up and not found: the decision that follows claims it; the oldest such lookup makes room. */
  private markUnclaimed(id: string): void {
    this.unclaimed.delete(id);
    if (this.unclaimed.size >= this.unclaimedLimit) this.unclaimed.delete(this.unclaimed.values().next().value!);
    this.unclaimed.add(id);
  }

  /**
   * Workflows' workers and steps ([id, encoded value], least recently used first) written into
   * `m` in one WRITE_WORKFLOWS call, bounded in number; with `claim` only those no one wrote.
   */
  private writeWorkflows(m: ChainableCommander, workflows: Array<[string, string]>, claim: boolean): void {
    m.eval(
      WRITE_WORKFLOWS,
      1 + workflows.length,
      this.key('workflows'),
      ...workflows.map(([id]) => this.key('wf', id)),
      String(this.workflowTtlMs),
      claim ? '1' : '0',
      String(this.sharedWorkflowLimit),
      this.key('wf', ''),
      ...workflows.flat(),
    );
  }

  private remember(chain: string, message: string): void {
    this.recent?.set(chain, { message, expiresAt: Date.now() + this.predictionTtlMs });
  }

  private async publishDecision(d: SharedDecision, message: string, chain: string | undefined): Promise<void> {
    // published before anything else: the other replicas must learn of it before the next
    // request that shares its prefix reaches them
    const m = this.cmd.pipeline().publish(this.channel, message);
    if (chain) m.set(chain, message, 'PX', this.predictionTtlMs);
    if (d.anchor !== undefined) m.set(this.key('anchor', d.anchor), d.workerId, 'PX', this.workflowTtlMs);
    const value = encodeWorkflow(d.workerId, d.workflowStep);
    const claiming = d.workflowId !== undefined && this.unclaimed.delete(d.workflowId);
    // the first step anyone routed claims the workflow (NX): of two replicas starting it at once, the first wins
    if (d.workflowId !== undefined) this.writeWorkflows(m, [[d.workflowId, value]], claiming);
    const mark = this.writtenMark;
    const res = await this.run(m, 'a decision');
    if (res[0]?.[0] === null) this.counters.decisionsPublished++;
    // its chain key written: not written back while the same Redis server keeps this epoch's data
    const recent = chain === undefined ? undefined : this.recent?.peek(chain);
    if (recent?.message === message && res[1]?.[0] === null) recent.writtenIn = mark;
    const claim = res[res.length - 1];
    if (claiming && claim?.[0] === null && (claim[1] as number[])[0] === 0) {
      // lost the claim: follow the winner, and tell the others who had heard this replica's choice
      this.counters.workflowClaimsLost++;
      const winner = parseWorkflow((await this.readWorkflow(d.workflowId!)) ?? '');
      if (!winner) return;
      this.host!.router.setWorkflowAffinity(d.workflowId!, winner.w, winner.s);
      const correction: WireDecision = { r: this.replicaId, k: 'd', w: winner.w, h: '', wf: d.workflowId, s: winner.s };
      await this.cmd.publish(this.channel, JSON.stringify(correction));
    }
  }

  /**
   * A worker's block size (undefined: the router's): a smaller one than any seen before raises
   * the longest message read, as its decisions may carry more blocks.
   */
  private noteBlockSize(blockSize: number | undefined): void {
    if (this.host === undefined || !Number.isSafeInteger(blockSize) || blockSize! < 1) return;
    if (blockSize! >= this.smallestBlockSize) return;
    this.smallestBlockSize = blockSize!;
    this.maxMessageBytes = maxMessageBytes(this.host.router.maxPromptTokens, blockSize!);
  }

  private onMessage(raw: Buffer): void {
    // hashed otherwise than this replica: nothing the others send is applied (settingsDiffer())
    if (this.settingsMismatch !== undefined) return;
    let msg: WireMessage;
    try {
      msg = decodeMessage(raw, this.maxMessageBytes);
    } catch (err) {
      this.counters.malformedMessages++;
      if (err instanceof MessageTooLong && this.counters.oversizeMessages++ === 0)
        this.host?.log(
          `state: refused ${err.message} on ${this.channel} unread: longer than any replica sends; further ones are only counted (state.oversizeMessages)`,
        );
      return;
    }
    if (msg.k === 'rm') {
      if (msg.r !== this.replicaId || typeof msg.n !== 'string') return;
      for (const h of this.hearing) if (h.mark === msg.n) h.past = true;
      // an admin change's mark: `nonce:code:n`
      const [nonce, code = '', n = ''] = msg.n.split(':');
      const pending = this.pendingChanges.get(nonce);
      if (pending === undefined) return;
      this.pendingChanges.delete(nonce);
      pending.heard(code, n);
      return;
    }
    // this replica's own removal, heard back: what was announced before it has been heard
    if (msg.r === this.replicaId && msg.k === 'wr') this.removalsInFlight.delete(msg.id);
    if (msg.r === this.replicaId || !this.host) return;
    // its worker as the router checks one given through its API, its amounts and flags (as the process channel's)
    if (!isWellFormed(msg)) return void this.counters.malformedMessages++;
    try {
      if (msg.k === 'd') {
        this.applyDecision(msg);
        if (typeof msg.q === 'number' && this.remote.decided(msg.r, msg.w, msg.q)) this.applyRemote(msg.w);
        if (typeof msg.q === 'number') this.heard(msg.r);
      } else if (msg.k === 'pd') {
        this.host.router.settleSharedDecision({ id: decisionIdOf(msg) });
        if (this.remote.prefilled(msg.r, msg.w, msg.q, msg.d)) this.applyRemote(msg.w);
        this.heard(msg.r);
      } else if (msg.k === 'rl') {
        this.host.router.settleSharedDecision({ id: decisionIdOf(msg) });
        if (this.remote.released(msg.r, msg.w, msg.q, typeof msg.d === 'number' ? msg.d : undefined))
          this.applyRemote(msg.w);
        this.heard(msg.r);
      } else if (msg.k === 'rf') {
        if (this.host.router.refuseSharedDecision({ id: decisionIdOf(msg) }) > 0) this.counters.refusalsWithdrawn++;
      } else if (msg.k === 'ld') {
        // what it says it holds replaces what this replica counted of it (releases it could
        // not publish while cut off would otherwise stay counted for good); only known workers
        if (msg.l === null || typeof msg.l !== 'object') return void this.counters.malformedMessages++;
        this.remote.replace(msg.r, decodeLoadSnapshot(msg.l));
        this.heard(msg.r);
        for (const w of this.host.router.listWorkers()) this.applyRemote(w.id);
      } else if (msg.k === 'wa') {
        const id = msg.worker.id;
        if (this.removalsInFlight.has(id)) return; // announced before this replica's removal of it
        this.noteBlockSize(msg.worker.blockSize);
        for (const h of this.hearing) if (h.past) h.workers.set(id, msg.worker);
        this.syncedRecords.set(id, JSON.stringify(msg.worker));
        const held = this.host.listWorkers().find((w) => w.id === id);
        if (!held) this.host.addWorkerFromState(msg.worker);
        // the registry's record now: one held here with another (decided here while cut off) gives way
        else if (!sameRecord(held, msg.worker)) this.replaceWorker(this.host, msg.worker);
      } else if (msg.k === 'wr') {
        for (const h of this.hearing)
          if (h.past) {
            h.workers.set(msg.id, null);
            h.drains.set(msg.id, false);
          }
        this.draining.delete(msg.id);
        this.syncedRecords.delete(msg.id);
        this.vouched.delete(msg.id);
        if (this.host.listWorkers().some((w) => w.id === msg.id)) this.host.removeWorkerFromState(msg.id);
        this.remote.forgetUnknownWorkers();
      } else if (msg.k === 'dr') {
        for (const h of this.hearing) if (h.past) h.drains.set(msg.id, msg.on);
        if (msg.on) this.draining.add(msg.id);
        else this.draining.delete(msg.id);
        if (this.host.listWorkers().some((w) => w.id === msg.id)) this.host.drainWorkerFromState?.(msg.id, msg.on);
      } else if (msg.k === 'ev') {
        this.host.applyKvEventsFromState?.(msg.w, msg.e);
      } else this.counters.malformedMessages++;
    } catch {
      this.counters.malformedMessages++;
    }
  }

  private applyDecision(msg: WireDecision, now?: number): void {
    const router = this.host!.router;
    // more blocks than the longest prompt has on that worker: refused by the router anyway
    // (applySharedDecision), and refused here before its base64 is decoded (up to the message
    // bound, megabytes of work for nothing); 8 bytes a block, 4 characters per 3 bytes
    if (
      typeof msg.h === 'string' &&
      router.hasWorker(msg.w) &&
      Math.floor((3 * msg.h.length) / 4 / 8) > router.maxPromptBlocks(msg.w)
    )
      throw new RangeError('a shared decision of more blocks than the longest prompt has');
    const { hi, lo } = decodeHashes(msg.h);
    const applied = router.applySharedDecision(
      {
        workerId: msg.w,
        hi,
        lo,
        workflowId: msg.wf,
        workflowStep: msg.s ?? null,
        anchor: msg.a,
        claGroup: msg.c ?? null,
        contentAnchors: msg.ca,
        anchorNamespace: msg.ns,
        id: decisionIdOf(msg),
      },
      now,
    );
    if (applied) this.counters.decisionsApplied++;
    else this.counters.decisionsUnknownWorker++;
  }

  /** A message of `replica` moved (or meant to move) its tally: compared with its snapshot once it is quiet (reconcileQuietMs). */
  private heard(replica: string): void {
    if (this.remote.has(replica)) this.heardAt.set(replica, Date.now());
  }

  /** Sums the other replicas' work on a worker into the router's view. */
  private applyRemote(workerId: string): void {
    const router = this.host!.router;
    if (!router.hasWorker(workerId)) return;
    router.setRemoteLoad(workerId, this.remote.sum(workerId));
  }

  /** Redis sent something: it is not stalled (see dropIfStalled()). */
  private answered(): void {
    this.lastAnswerAt = this.loopClock.now();
  }

  /**
   * A Redis that keeps its connection open but answers nothing (stopped, swapped out, stuck in
   * a long command) is as good as gone, and worse: every command sent to it waits in the
   * client, holding its arguments, for as long as the stall lasts, and every first lookup of
   * a workflow waits out the command timeout. Past stallTimeoutMs without an answer the
   * connection is dropped: pending commands fail at once, the replica routes on local state,
   * and the reconnection resynchronises when Redis answers again.
   *
   * The silence is counted on the replica's own clock (LoopClock): time its event loop was held
   * (a burst of work, a long collection) is left out, for a reply that came then is read only
   * after the command timeouts that fell due meanwhile have fired. Without that a replica busy
   * for a second took its own slowness for Redis stalling and dropped a healthy connection.
   * A loop held again and again still counts the time it runs between: a Redis that is silent
   * is dropped all the same, later by the time the loop was held.
   */
  private dropIfStalled(): void {
    const silentMs = Math.round(this.loopClock.now() - this.lastAnswerAt);
    if (!this.up || this.closed || silentMs < this.stallTimeoutMs) return;
    this.counters.stalls++;
    this.dropReason = `redis stopped answering (nothing for ${silentMs} ms)`;
    // down now, not when the connection closes: closing one the server does not read waits
    // for ioredis's disconnect timeout, and nothing more may queue behind it meanwhile
    this.wentDown();
    this.cmd.disconnect(true);
    // the subscriber too: on a path gone silent it would hear nothing for good, while the new
    // command connection made the replica look whole; it subscribes again on its 'ready'
    this.sub.disconnect(true);
  }

  /**
   * Redis lost its data while this replica stayed connected: flushed, or failed over to a
   * server without it (a replica promoted after syncing from an empty primary), as its epoch
   * marker changed tells. No reconnection tells of it, so the write-back a reconnection runs is
   * run here: the registry, workflows and recent decisions (SET NX), then Redis's word is
   * reloaded.
   */
  private writeBackLost(): void {
    if (this.rewriting) return;
    this.rewriting = true;
    this.counters.stateLost++;
    this.host?.log(
      `state: redis lost the shared state (its epoch marker ${this.key('epoch')} changed: flushed, or failed over to a server without the data); writing it back`,
    );
    void this.resync()
      .then(
        () => void this.counters.resyncs++,
        (err: Error) => this.resyncFailedWhileUp(err, 'the state written back'),
      )
      .finally(() => (this.rewriting = false));
  }

  /**
   * The subscriber lost its connection and subscribed again while the command connection
   * stayed up (Redis killed it: `CLIENT KILL TYPE pubsub`, or a subscriber past its
   * client-output-buffer-limit): every message published meanwhile was missed, so the other
   * replicas' tallies and the registry may be wrong for good. Treated as an outage: logged,
   * counted, the tallies reseeded from the load snapshots and the state resynchronised. A
   * subscriber back while the replica is down is left to the reconnection's resynchronisation.
   */
  private subscriberCameBack(): void {
    if (!this.up || this.closed || !this.host) return;
    this.counters.outages++;
    this.host.log(
      "state: lost the subscription to redis's channel (messages were missed); resynchronising with the shared state",
    );
    this.reseedLoad = true;
    this.failPendingChanges(`the subscription to redis's channel was lost`);
    void this.syncLoad();
    if (this.rewriting) return;
    this.rewriting = true;
    void this.resync()
      .then(
        () => void this.counters.resyncs++,
        (err: Error) => this.resyncFailedWhileUp(err, 'the resynchronisation after the subscription was lost'),
      )
      .finally(() => (this.rewriting = false));
  }

  /**
   * READONLY: the server this connection reached was a primary and is a replica now (a
   * failover: Sentinel, a managed Redis, a Kubernetes Service whose endpoint moved), and the
   * connection stays on it for as long as it lives. Reconnecting reaches the new primary
   * behind the same address; the reconnection writes back and reloads as after any outage.
   * The failed command is not resent (ioredis's 2): with no offline queue it would fail at
   * once, and the write-back covers what it wrote. The subscriber reconnects too: on the
   * demoted server it hears only what replication brings it, nothing once that link breaks.
   */
  private reconnectIfReadOnly(err: Error): 1 | false {
    if (this.closed || !/^READONLY\b/.test(err.message)) return false;
    const now = Date.now();
    if (now < this.readOnlyRetryAt) return false;
    this.readOnlyRetryAt = now + this.readOnlyBackoffMs;
    this.readOnlyBackoffMs = Math.min(2 * this.readOnlyBackoffMs, READONLY_RETRY_MAX_MS);
    this.dropReason = `redis at ${this.address} is a read-only replica now (failed over?); reconnecting`;
    this.readOnlyReconnecting = true;
    this.sub.disconnect(true);
    return 1;
  }

  private wentDown(): void {
    if (!this.up || this.closed) return;
    this.up = false;
    this.counters.outages++;
    // a removal's message may never come back now; the resynchronisation reads the registry
    this.removalsInFlight.clear();
    this.failPendingChanges(`the connection to redis at ${this.address} was lost`);
    // other replicas' counts can no longer be kept current: route on this replica's own
    this.remote.clear();
    for (const w of this.host?.router.listWorkers() ?? []) this.applyRemote(w.id);
    const reason = this.dropReason ?? 'lost redis';
    this.dropReason = undefined;
    this.host?.log(`state: ${reason}; routing on local state, will resynchronise when it is back`);
  }

  private async cameUp(): Promise<void> {
    if (this.closed || !this.host) return;
    // made by ioredis before the reconnection put off after a failure is due (it had lost the
    // connection already and set its own delay): made again then (reconnectLater())
    if (this.reconnectAt - performance.now() > RECONNECT_EARLY_MS) return this.dropConnection();
    const first = this.counters.resyncs === 0;
    const connection = ++this.connectionsUp;
    this.readOnlyReconnecting = false;
    this.remote.clear(); // messages were missed: start again from the snapshots
    // nothing is sent on this connection before its database is known to be the URL's (the
    // SELECT goes first: anything sent after it runs after it); what changes after the
    // registry is read must be heard: the subscriber reconnects on its own, and a
    // resynchronisation that read before it subscribed would miss what came between
    this.resyncing = this.checkDatabase()
      .then(() => this.untilSubscribed())
      .then(() => this.resync(connection))
      .then(
        () => {
          // a later connection came up while this one's resynchronisation ran: that one's counts
          if (connection !== this.connectionsUp) return;
          this.up = true;
          this.flushUnsynced();
          this.answered();
          this.dropReason = undefined; // left by a drop while it was not up: it named no outage
          if (this.settingsMismatch !== undefined)
            this.host!.log(`state: ${this.key('settings')} agrees with this replica's settings again; sharing`);
          this.settingsMismatch = undefined;
          this.loggedRefusals.clear();
          this.resyncError = undefined;
          this.databaseBackoffMs = DATABASE_RETRY_MIN_MS;
          this.resyncBackoffMs = RESYNC_RETRY_MIN_MS;
          const failures = this.resyncFailuresInRow;
          this.resyncFailuresInRow = 0;
          this.resyncFailedLoggedAt = -Infinity;
          this.resyncFailuresUnlogged = 0;
          this.counters.resyncs++;
          // the others may still count requests whose releases went unpublished while this was cut off
          this.publish(JSON.stringify(encodeLoad(this.replicaId, this.ownLoad())));
          const after = failures > 0 ? ` (after ${failures} failed ${failures === 1 ? 'attempt' : 'attempts'})` : '';
          if (!first) this.host!.log(`state: redis is back; state written back and reloaded${after}`);
          else this.saidConnected();
        },
        (err: Error) => {
          if (this.closed) return; // close() cut the sync short: nothing to retry
          // cut short by a later connection, whose own resynchronisation runs: nothing to retry
          if (connection !== this.connectionsUp) return;
          this.counters.errors++;
          // at start, attach() decides whether to retry: a refusal of access, or of the
          // database, fails the start (with this error: no retry to announce)
          const fatal =
            this.starting &&
            (ACCESS_REFUSED.test(err.message) || err instanceof DatabaseRefused || err instanceof SettingsMismatch);
          this.resyncError = err;
          if (fatal) return;
          if (err instanceof SettingsMismatch) {
            this.settingsDiffer(err);
            return this.reconnectLater(this.resyncBackoffMs, (d) => (this.resyncBackoffMs = d));
          }
          if (err instanceof DatabaseRefused) {
            this.resyncFailed(err, this.databaseBackoffMs);
            return this.reconnectLater(this.databaseBackoffMs, (d) => (this.databaseBackoffMs = d));
          }
          // cut short by a READONLY reconnection: ioredis reconnects now, and READONLY's own
          // backoff keeps the next one from looping
          if (this.readOnlyReconnecting) return;
          this.resyncFailed(err, this.resyncBackoffMs);
          // a new connection, later and later while it keeps failing: 'ready' tries again
          this.reconnectLater(this.resyncBackoffMs, (d) => (this.resyncBackoffMs = d));
        },
      );
    await this.resyncing;
  }

  /** After a start that found Redis unreachable (and said so), says once that it answers now. */
  private saidConnected(): void {
    if (!this.unreachableAtStart) return;
    this.unreachableAtStart = false;
    this.host?.log(`state: redis connected (${this.address}); shared state loaded, sharing with the other replicas`);
  }

  /**
   * A failed resynchronisation: counted, and logged at most once a LOG_WINDOW_MS, the line
   * saying how many failed since the last one (a Redis too slow for a resynchronisation fails
   * every try, and one line said nothing of the tries after it).
   */
  private resyncFailed(err: Error, retryMs: number): void {
    this.counters.resyncFailures++;
    this.resyncFailuresInRow++;
    const now = Date.now();
    if (now - this.resyncFailedLoggedAt < LOG_WINDOW_MS && now >= this.resyncFailedLoggedAt) {
      this.resyncFailuresUnlogged++;
      return;
    }
    const more =
      this.resyncFailuresUnlogged > 0
        ? ` (and ${this.resyncFailuresUnlogged} more failed attempts since the last line)`
        : '';
    this.resyncFailedLoggedAt = now;
    this.resyncFailuresUnlogged = 0;
    this.host!.log(
      `state: resynchronising with redis failed (${said(err)}); will retry in ${retryMs} ms, backing off up to ${READONLY_RETRY_MAX_MS} ms${more}; routing on local state meanwhile, further failures are logged at most once a minute (state.resyncFailures)`,
    );
  }

  /**
   * Drops the connection (a refused database, a failed resynchronisation) and makes the next one
   * after `delay`; `next` is given the delay after that, doubled up to READONLY_RETRY_MAX_MS.
   *
   * The reconnection is ioredis's own, put off by the retry strategy until `reconnectAt`: it
   * follows the connection's close whenever that comes, and is retried as after any drop. (A
   * timer of the store's calling connect() after `delay` found the connection still open when
   * the path to Redis was silent — ioredis waits its disconnect timeout for the server's side of
   * the close — was refused, and the store never reconnected.) The socket is destroyed at once,
   * nothing waits on a server that does not answer. A connection already lost has its
   * reconnection set by ioredis at its own pace; one made before `reconnectAt` is dropped as it
   * comes up (cameUp()), and made again after.
   */
  private reconnectLater(delay: number, next: (ms: number) => void): void {
    next(Math.min(2 * delay, READONLY_RETRY_MAX_MS));
    this.reconnectAt = performance.now() + delay;
    this.dropConnection();
  }

  /** Closes the command connection at once, for ioredis to make it again (see reconnectLater()). */
  private dropConnection(): void {
    const status = this.cmd.status;
    if (status !== 'connecting' && status !== 'connect' && status !== 'ready') return;
    this.cmd.disconnect(true);
    // (its 'close' is ioredis's cue to reconnect: a socket ended and not destroyed would wait for the server's FIN)
    this.cmd.stream.destroy();
  }

  /**
   * Rejects with a DatabaseRefused when this connection is not on the URL's database: its
   * handshake's SELECT was refused, or the SELECT sent again here is (the connection stays
   * down, retried as after any failed resynchronisation, rather than sharing database 0).
   */
  private async checkDatabase(): Promise<void> {
    // a refusal of access (an ACL without SELECT) is told as one
    const refused = (err: Error) =>
      !selectRefused(err) || ACCESS_REFUSED.test(err.message)
        ? err
        : new DatabaseRefused(
            `state: redis at ${this.address} refused database ${this.db} of the --state URL (${said(err)}); name a database it has (0 to its 'databases' setting less one; a cluster has 0 only)`,
          );
    if (this.selectError) throw refused(this.selectError);
    if (this.db === 0) return; // every connection starts on database 0
    await this.cmd.select(this.db).catch((err: Error) => {
      throw refused(err);
    });
  }

  /** Resolves once the subscriber is subscribed, or after stallTimeoutMs (it may be the one cut off). */
  private untilSubscribed(): Promise<void> {
    if (this.subscribed) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, this.stallTimeoutMs);
      timer.unref();
      this.subscribedWaiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  /** Writes back what Redis may have lost (SET NX: never over newer state) and loads the rest. */
  private async resync(connection = this.connectionsUp): Promise<void> {
    const host = this.host!;
    const router = host.router;
    // before anything is written: a replica that hashes otherwise than the fleet writes nothing
    await this.checkSettings();
    // the epoch of the data written back and read now: a later change of it is a loss
    await this.readEpoch();
    const mark = this.writtenMark;
    // registry changes made here while Redis was out of reach
    let forgetUnsynced = () => {};
    await this.writeBackChunk(connection, (m) => void (forgetUnsynced = this.writeUnsynced(m)));
    forgetUnsynced();
    // least recently used first: written in that order, the index keeps this replica's order
    const held = [...router.workflowAffinities()].map(([id, e]): [string, string] => [
      id,
      encodeWorkflow(e.workerId, e.step),
    ]);
    for (let at = 0; at < held.length; at += WORKFLOWS_PER_WRITE) {
      const some = held.slice(at, at + WORKFLOWS_PER_WRITE);
      await this.writeBackChunk(connection, (m) => this.writeWorkflows(m, some, true));
    }
    // recent decisions, but those known written by this server in this epoch (before the outage,
    // when Redis kept its data, or by an earlier try of this write-back)
    const expired: string[] = [];
    let chunk: Array<[string, RecentDecision]> = [];
    let bytes = 0;
    const writeChains = async () => {
      const some = chunk;
      chunk = [];
      bytes = 0;
      const now = Date.now();
      // announced as written: a replica that stayed connected meanwhile loads no entries, and
      // would never learn of a decision made here while this one was cut off
      const res = await this.writeBackChunk(connection, (m) => {
        for (const [chain, r] of some)
          m.eval(
            WRITE_BACK_CHAIN,
            1,
            chain,
            this.channel,
            r.message,
            String(Math.max(1, r.expiresAt - now)),
            writtenBackAnnouncement(r.message),
          );
      });
      some.forEach(([, r], i) => {
        if (res[i]?.[0] === null) r.writtenIn = mark;
      });
    };
    const now = Date.now();
    for (const [chain, r] of [...(this.recent?.entries() ?? [])]) {
      if (r.expiresAt <= now) expired.push(chain);
      else if (mark === undefined || r.writtenIn !== mark) {
        chunk.push([chain, r]);
        bytes += chain.length + 2 * r.message.length; // the entry and its announcement
        if (chunk.length >= WRITE_BACK_CHUNK_COMMANDS || bytes >= WRITE_BACK_CHUNK_BYTES) await writeChains();
      }
    }
    if (chunk.length > 0) await writeChains();
    for (const chain of expired) this.recent!.delete(chain);

    await this.loadRegistry(host);
    // workflows: Redis's word wins, for the newest as many as the router remembers (older ones
    // are read on first sight), oldest first so the router's own order is Redis's
    const newest = await this.unlessWrongKind(
      this.cmd.zrange(this.key('workflows'), String(-router.workflowCapacity), '-1'),
      [],
      'workflows',
    );
    await this.readWorkflows(newest);
    // block entries other replicas recorded, best effort: a bounded batch at a time (an entry can
    // hold thousands of blocks), as readBounded() reads; the replica comes up without the skipped
    // blocks (they come back with the next requests)
    let skipped = 0;
    let oversize = 0;
    const reads: BoundedReads = { size: CHAINS_PER_READ, failedAlone: 0 };
    for await (const keys of this.scan(this.key('chain', '*')))
      skipped += await this.readBounded(
        keys,
        CHAINS_PER_READ,
        this.maxMessageBytes,
        'the block entries read',
        reads,
        (answers) => {
          // an entry longer than any replica writes is skipped unread (its length only)
          const values: Array<string | null> = [];
          for (const v of answers)
            if (typeof v === 'number') {
              oversize++;
              values.push(null);
            } else values.push(v);
          this.applyChains(values);
        },
      );
    if (skipped > 0) {
      this.counters.chainsSkipped += skipped;
      this.host?.log(
        `state: ${skipped} block entries in redis could not be read in time and were skipped (state.chainsSkipped); routing goes on without them`,
      );
    }
    if (oversize > 0) {
      this.counters.chainsSkipped += oversize;
      this.counters.chainsOversize += oversize;
      if (!this.loggedOversizeChains) {
        this.loggedOversizeChains = true;
        this.host?.log(
          `state: ${oversize} block ${oversize === 1 ? 'entry' : 'entries'} in redis longer than any replica writes (${this.maxMessageBytes} bytes) skipped unread; further ones are only counted (state.chainsOversize, state.chainsSkipped)`,
        );
      }
    }
  }

  /**
   * Reads workflows' `wf:` values (`ids` oldest first) into the router, bounded as the block
   * entries are: WORKFLOWS_PER_READ at a time with READ_CHAINS, a value longer than any replica
   * writes (WORKFLOW_VALUE_MAX_BYTES) skipped unread; a read that fails (it outlasted the command
   * timeout) is made again with half as many ids, down to one, one failing alone is skipped, and
   * after two such in a row the rest are. The skipped are counted (state.workflowsSkipped) and
   * said once per resynchronisation; their workflows are read on first sight, as older ones are.
   */
  private async readWorkflows(ids: string[]): Promise<void> {
    const router = this.host!.router;
    let oversize = 0;
    let skipped = await this.readBounded(
      ids.map((id) => this.key('wf', id)),
      WORKFLOWS_PER_READ,
      WORKFLOW_VALUE_MAX_BYTES,
      "the workflows' read",
      { size: WORKFLOWS_PER_READ, failedAlone: 0 },
      (answers, from) =>
        answers.forEach((v, i) => {
          if (typeof v === 'number') return void oversize++;
          const id = ids[from + i];
          const e = v === null ? undefined : parseWorkflow(v);
          if (e && id !== '') router.setWorkflowAffinity(id, e.w, e.s);
          else if (v !== null) this.counters.malformedMessages++;
        }),
    );
    skipped += oversize;
    if (skipped === 0) return;
    this.counters.workflowsSkipped += skipped;
    this.host?.log(
      `state: ${skipped} ${skipped === 1 ? 'workflow' : 'workflows'} in redis could not be read (a value longer than any replica writes, ${WORKFLOW_VALUE_MAX_BYTES} bytes, or a read that timed out) and skipped (state.workflowsSkipped); read again on first sight`,
    );
  }

  /**
   * Reads `keys` with READ_CHAINS (a value longer than `maxBytes` answered by its length), at most
   * `perRead` at a time, handing each batch's answers to `take` with the index of its first key. A read that fails
   * (it outlasted the command timeout: large values, a busy Redis or process) is made again with
   * half as many keys, down to one, and the batch grows back as reads succeed; a key that fails
   * alone is skipped, and after two such in a row (Redis itself is too slow) the rest are, so a
   * stuck Redis costs a handful of timeouts. `reads` carries the batch size and the failures in a
   * row from one call to the next (the pages of a SCAN). Returns the keys skipped. A connection
   * gone fails the caller: the resynchronisation, retried once it is back.
   */
  private async readBounded(
    keys: readonly string[],
    perRead: number,
    maxBytes: number,
    what: string,
    reads: BoundedReads,
    take: (answers: Array<string | number | null>, from: number) => void,
  ): Promise<number> {
    let skipped = 0;
    for (let at = 0; at < keys.length;) {
      if (reads.failedAlone >= 2) return skipped + keys.length - at;
      const batch = keys.slice(at, at + reads.size);
      let error: Error | undefined;
      const answers = await this.readChainBatch(batch, maxBytes).catch((err: Error) => {
        if (this.cmd.status !== 'ready') throw err;
        error = err;
        return null;
      });
      if (answers !== null) {
        take(answers, at);
        at += Math.max(1, answers.length);
        reads.failedAlone = 0;
        reads.size = Math.min(perRead, reads.size * 2);
      } else if (batch.length > 1) reads.size = batch.length >>> 1;
      else {
        this.failed(error!, what);
        skipped++;
        at++;
        reads.failedAlone++;
      }
    }
    return skipped;
  }

  /**
   * Block entries `keys` read with READ_CHAINS: their values in order (null for none), or the
   * length of one longer than any replica writes; fewer answers than keys when the values
   * answered pass CHAIN_READ_BYTES (the rest are read next).
   */
  private async readChainBatch(
    keys: string[],
    // attach() has set the bound (from the router's block size) before any resynchronisation reads
    longest = this.maxMessageBytes,
  ): Promise<Array<string | number | null>> {
    return (await this.cmd.eval(READ_CHAINS, keys.length, ...keys, String(longest), String(CHAIN_READ_BYTES))) as Array<
      string | number | null
    >;
  }

  /**
   * One chunk of the write-back, made into a fresh pipeline by `write`, and its replies. Redis's
   * refusals (out of memory, read-only) are counted and the rest goes on; a chunk Redis did not
   * answer in time is sent again after a growing pause (WRITE_BACK_RETRY_MIN_MS), up to
   * WRITE_BACK_TRIES tries, without dropping the connection. A connection lost rejects at once;
   * one replaced during the pause (`connection` no longer the last to come up) rejects after it,
   * for the new connection's resynchronisation runs on its own.
   */
  private async writeBackChunk(
    connection: number,
    write: (m: ChainableCommander) => void,
  ): Promise<[Error | null, unknown][]> {
    let pause = WRITE_BACK_RETRY_MIN_MS;
    for (let tries = 1; ; tries++) {
      const m = this.cmd.pipeline();
      write(m);
      if (m.length === 0) return [];
      try {
        return await this.run(m, 'the state written back');
      } catch (err) {
        if (this.closed || this.cmd.status !== 'ready' || tries >= WRITE_BACK_TRIES) throw err;
        this.counters.writeBackRetries++;
        this.unanswered('a chunk of the state written back (sent again)', err);
        await new Promise((resolve) => setTimeout(resolve, pause).unref());
        if (connection !== this.connectionsUp)
          throw new Error('the connection was replaced during the write-back', { cause: err });
        pause *= 2;
      }
    }
  }

  /**
   * Writes this replica's hashing settings to `{prefix}settings` where there are none (SET NX:
   * the first replica's, or written again after Redis lost them) and compares them with those
   * stored: rejects with a SettingsMismatch naming every setting that differs. A value that is
   * no fingerprint (garbage, another kind of value) is replaced, logged once; a read Redis
   * refused (out of memory with no key) checks nothing.
   */
  private async checkSettings(): Promise<void> {
    const key = this.key('settings');
    const mine = JSON.stringify(this.fingerprint);
    const res = await this.run(this.cmd.pipeline().set(key, mine, 'NX').get(key), 'the settings check', isWrongKind);
    const [err, stored] = res[1] ?? [null, null];
    const theirs = typeof stored === 'string' ? parseFingerprint(stored) : undefined;
    if (isWrongKind(err) || (typeof stored === 'string' && theirs === undefined)) {
      await this.replaceWrongKind('settings', 'no settings fingerprint');
      await this.cmd.set(key, mine);
      return;
    }
    if (theirs === undefined) return;
    const differ = fingerprintDifferences(this.fingerprint!, theirs);
    if (differ.length === 0) return;
    throw new SettingsMismatch(
      `state: ${key} in redis at ${this.address} holds other block-hashing settings than this replica's: ${differ.join('; ')}. Replicas that hash otherwise never match each other's block entries: give every replica the same settings or its own --state-prefix; to change them for the whole fleet, stop every replica and delete the key (redis-cli DEL ${key})`,
    );
  }

  /**
   * A resynchronisation found other hashing settings in `{prefix}settings` (SettingsMismatch)
   * after the start: counted, logged once per reason, and the shared state is not used (no
   * message applied, nothing written: the replica is not up) until a later try finds them agreeing.
   */
  private settingsDiffer(err: SettingsMismatch): void {
    this.counters.settingsMismatches++;
    if (this.settingsMismatch === err.message) return;
    this.settingsMismatch = err.message;
    this.host?.log(
      `${err.message}; routing on local state, not sharing, tried again at each reconnection (state.settingsMismatches)`,
    );
  }

  /**
   * A resynchronisation run while the replica is up (Redis lost its data, the subscription was
   * cut) failed: counted; one that found other hashing settings also takes the replica off the
   * shared state (settingsDiffer()), and a new connection tries again later.
   */
  private resyncFailedWhileUp(err: Error, what: string): void {
    if (!(err instanceof SettingsMismatch)) return this.failed(err, what);
    this.settingsDiffer(err);
    this.dropReason = `${this.key('settings')} holds other hashing settings than this replica's`;
    this.wentDown();
    this.reconnectLater(this.resyncBackoffMs, (d) => (this.resyncBackoffMs = d));
  }

  /**
   * Reads Redis's epoch (writing one first where there is none, see `epoch`); left as it was
   * when Redis refuses the key (out of memory, another kind of value: the load sync handles it).
   */
  private async readEpoch(): Promise<void> {
    const res = await this.run(
      this.cmd
        .pipeline()
        .set(this.key('epoch'), randomBytes(8).toString('hex'), 'NX')
        .eval(READ_VALUE, 1, this.key('epoch'), String(EPOCH_MAX_BYTES))
        .info('server'),
      'the epoch read',
      // INFO refused (an ACL without it, a renamed command): the server's run is unknown, and
      // nothing is skipped
      (err) => isWrongKind(err) || /^(NOPERM|ERR unknown command)/.test(err.message),
    );
    if (res[1]?.[0] === null && typeof res[1][1] === 'string') this.epoch = res[1][1];
    else if (res[1]?.[0] === null && typeof res[1][1] === 'number') {
      // no epoch marker: replaced, and the next load sync reads the new one (nothing skipped till then)
      await this.replaceEpoch(res[1][1]);
      this.epoch = undefined;
    }
    const info = res[2]?.[0] === null && typeof res[2][1] === 'string' ? res[2][1] : '';
    const run = /^run_id:([0-9a-f]+)\r?$/m.exec(info)?.[1];
    this.writtenMark = this.epoch !== undefined && run !== undefined ? `${this.epoch}/${run}` : undefined;
  }

  /** Applies block entries other replicas recorded (their decisions' messages). */
  private applyChains(values: Array<string | null>): void {
    for (const v of values) {
      if (v === null) continue;
      try {
        const msg = JSON.parse(v) as WireDecision;
        // nor kept to withdraw: whether it was refused, or is past refusal, was not heard here
        if (msg.r !== this.replicaId) this.applyDecision({ ...msg, wf: undefined, s: undefined, i: undefined });
      } catch {
        this.counters.malformedMessages++;
      }
    }
  }

  /**
   * Replaces the worker of `record`'s id held here (another record: decided here while Redis was
   * out of reach, or before a change Redis decided) with the registry's `record`, through the
   * host: removed and added again, not draining, said once.
   */
  private replaceWorker(host: StateStoreHost, record: WorkerRecord): void {
    host.removeWorkerFromState(record.id, 'replaced');
    this.draining.delete(record.id);
    this.remote.forgetUnknownWorkers();
    host.addWorkerFromState(record, 'replaced');
  }

  /**
   * The shared registry wins over this replica's own (its flags, or what it held through an
   * outage): a worker removed through an admin API is removed here too, and one the registry
   * lacks but never removed is written back (HSETNX) and announced, so the replicas that are
   * running add it as well — only one this replica vouches for (`vouched`); one it only heard
   * of is dropped here. Drains are Redis's word; when Redis holds no registry at all (a
   * fresh fleet, or Redis lost its data) this replica's drains are written back instead.
   * What this replica hears from the others while it reads is newer than what it read, and
   * wins over it. Removals recorded more than REMOVAL_KEPT_MS ago are forgotten.
   */
  private async loadRegistry(host: StateStoreHost): Promise<void> {
    const heard: HeardChanges = {
      mark: randomBytes(6).toString('hex'),
      past: false,
      workers: new Map(),
      drains: new Map(),
    };
    this.hearing.add(heard);
    try {
      await this.loadRegistryHearing(host, heard);
    } finally {
      this.hearing.delete(heard);
    }
  }

  private async loadRegistryHearing(host: StateStoreHost, heard: HeardChanges): Promise<void> {
    // the mark, then the three reads, on one connection (so in that order): what is heard after
    // the mark was published after it, so it is as new as the reads or newer, and wins over them
    const mark = JSON.stringify({ r: this.replicaId, k: 'rm', n: heard.mark } satisfies WireReadMark);
    const read =
      (await this.cmd
        .pipeline()
        .publish(this.channel, mark)
        .hgetall(this.key('workers'))
        .hgetall(this.key('removed'))
        .hgetall(this.key('draining'))
        .exec()) ?? [];
    // a mark Redis refused is never heard: nothing then wins over the reads
    if (read[0]?.[0]) this.failed(read[0][0], 'the registry read');
    // kept in Maps, by worker id: ids are read from Redis and heard from the others, and an id
    // such as `__proto__` assigned as a plain object's key would set its prototype instead
    const [workers, removed, drains] = await Promise.all(
      (['workers', 'removed', 'draining'] as const).map(async (key, i) => {
        const [err, value] = read[i + 1] ?? [new Error('no answer'), undefined];
        const hash = await this.unlessWrongKind(
          err ? Promise.reject(err) : Promise.resolve(value as Record<string, string>),
          {},
          key,
        );
        return new Map(Object.entries(hash));
      }),
    );
    /** What was read, with what was heard since laid over it. */
    const overlay = () => {
      for (const [id, w] of heard.workers) {
        if (w) {
          workers.set(id, JSON.stringify(w));
          removed.delete(id);
        } else workers.delete(id); // removed here already (onMessage)
      }
      for (const [id, on] of heard.drains) {
        if (on) drains.set(id, '1');
        else drains.delete(id);
      }
    };
    // removals recorded long ago (or unreadable) are forgotten, unless recorded again meanwhile
    const cutoff = Date.now() - REMOVAL_KEPT_MS;
    const forgotten = [...removed].filter(([, at]) => !(Number(at) > cutoff)).map(([id]) => id);
    for (const id of forgotten) removed.delete(id);
    // what the registry itself holds may be written back after Redis lost it (see `vouched`)
    for (const id of workers.keys()) this.vouched.add(id);
    if (forgotten.length > 0)
      await this.cmd.hdel(this.key('removed'), ...forgotten).catch((err: Error) => {
        if (!(err instanceof ReplyError)) throw err;
        this.failed(err, 'the old removals forgotten');
      });
    overlay();
    const shared = workers.size > 0 || removed.size > 0;
    for (const w of [...host.listWorkers()])
      if (removed.has(w.id) && !workers.has(w.id)) {
        host.removeWorkerFromState(w.id, 'registry');
        this.draining.delete(w.id);
      }
    // workers only heard of on the channel and absent from the registry: dropped here, never written back
    const unvouched = host.listWorkers().filter((w) => !workers.has(w.id) && !this.vouched.has(w.id));
    for (const w of unvouched) {
      host.removeWorkerFromState(w.id, 'replaced'); // said here, once for all of them
      this.draining.delete(w.id);
      this.syncedRecords.delete(w.id);
    }
    if (unvouched.length > 0) {
      this.counters.workersUnregistered += unvouched.length;
      const ids = unvouched.slice(0, 10).map((w) => quotedText(w.id));
      const more = unvouched.length > ids.length ? ` and ${unvouched.length - ids.length} more` : '';
      host.log(
        `state: ${unvouched.length === 1 ? 'a worker' : `${unvouched.length} workers`} heard added on ${this.channel} but absent from ${this.key('workers')} dropped here (${ids.join(', ')}${more}); only workers a replica was configured with, added through its admin API or read in the registry are written back (state.workersUnregistered)`,
      );
    }
    const missing = host.listWorkers().filter((w) => !workers.has(w.id));
    const localDrains = shared ? [] : [...this.draining].filter((id) => !drains.has(id));
    if (missing.length > 0 || localDrains.length > 0) {
      const back = this.cmd.pipeline();
      // not over a removal another replica recorded since the registry was read
      if (missing.length > 0)
        back.eval(
          WRITE_BACK_WORKERS,
          2,
          this.key('workers'),
          this.key('removed'),
          this.channel,
          ...missing.flatMap((worker) => [
            worker.id,
            JSON.stringify(worker),
            JSON.stringify({ r: this.replicaId, k: 'wa', worker } satisfies WireWorkerAdded),
          ]),
        );
      for (const id of localDrains) back.hsetnx(this.key('draining'), id, '1');
      const res = await this.run(back, 'the workers written back');
      const written = missing.length > 0 && res[0]?.[0] === null ? (res[0][1] as number[]) : [];
      // the drains this replica wrote the others learn now, not at their next resynchronisation
      const announce = this.cmd.pipeline();
      missing.forEach((worker, i) => {
        // (a worker written was announced by the write itself)
        // removed meanwhile through another replica (unless added here, or heard added, since);
        // its message may have been heard during the write-back, and removed it already
        if (written[i] === -1 && !this.unsyncedWorkers.has(worker.id) && !heard.workers.get(worker.id)) {
          if (host.listWorkers().some((w) => w.id === worker.id)) host.removeWorkerFromState(worker.id);
          this.draining.delete(worker.id);
        }
      });
      for (const id of localDrains)
        announce.publish(
          this.channel,
          JSON.stringify({ r: this.replicaId, k: 'dr', id, on: true } satisfies WireWorkerDrained),
        );
      if (announce.length > 0) await this.run(announce, 'the workers written back');
      for (const id of localDrains) drains.set(id, '1');
      overlay(); // what was heard during the write-back
    }
    // workers other replicas added, and those held here with another record than the
    // registry's (changed elsewhere while this replica was cut off), replaced by the registry's
    const local = new Map(host.listWorkers().map((w) => [w.id, w]));
    for (const [id, json] of workers) {
      const held = local.get(id);
      if (held && sameRecordJson(held, json)) continue;
      // an id the router refuses through its API (too long, not well-formed text) is not taken from here either
      if (!isWorkerId(id)) {
        this.counters.malformedMessages++;
        host.log(`state: a worker in ${this.key('workers')} whose id no router takes (${quotedText(id)}) skipped`);
        continue;
      }
      try {
        const record = JSON.parse(json) as WorkerRecord;
        // a record that is not this worker's (not an object, or another id than its field's) is
        // taken neither over the one held nor as a new worker: added under its own id, it would be
        // one the admin API finds under neither
        if (record === null || typeof record !== 'object' || record.id !== id) {
          this.counters.malformedMessages++;
          host.log(`state: the record of worker ${quotedText(id)} in ${this.key('workers')} is not its own; skipped`);
        } else if (!held) host.addWorkerFromState(record, 'registry');
        else this.replaceWorker(host, record);
      } catch (err) {
        host.log(`state: worker ${quotedText(id)} from redis not added: ${said(err)}`);
      }
    }
    // drains: the registry's word (with what this replica just wrote back); made meanwhile here, kept
    const draining = new Set([...drains.keys(), ...[...this.unsyncedDrains].filter(([, d]) => d.on).map(([id]) => id)]);
    for (const [id, d] of this.unsyncedDrains) if (!d.on) draining.delete(id);
    for (const w of host.listWorkers())
      if (draining.has(w.id) !== this.draining.has(w.id)) host.drainWorkerFromState?.(w.id, draining.has(w.id));
    this.draining = draining;
    // the registry's records, as this replica now holds them
    this.syncedRecords.clear();
    for (const w of host.listWorkers()) this.syncedRecords.set(w.id, JSON.stringify(w));
    // the tallies of workers removed here go with them
    this.remote.forgetUnknownWorkers();
  }

  /**
   * What a read answers, or `fallback` when Redis refused it for the key's kind (another
   * program, or garbage, holds the key): that key is repaired (repairWrongKinds(): deleted, and
   * written anew), and the rest of the state still loads. Any other failure (Redis gone) still rejects.
   */
  private async unlessWrongKind<T>(read: Promise<T>, fallback: T, key: SharedKey): Promise<T> {
    try {
      return await read;
    } catch (err) {
      if (!(err instanceof ReplyError) || !/^WRONGTYPE\b/.test((err as Error).message)) throw err;
      this.counters.malformedMessages++;
      await this.repairWrongKinds([key]);
      return fallback;
    }
  }

  /**
   * Shared keys found holding another kind of value (WRONGTYPE: written by hand, or by another
   * program under the prefix) are deleted, as `{prefix}replicas` is: what they hold is nothing any
   * replica can read, so deleting it loses nothing, while keeping it kept every admin change and
   * every write to it refused until an operator deleted it. Logged once per key, naming the kind
   * found (when the ACL grants TYPE), counted (state.wrongKindRepairs). The registry's keys
   * (`workers`, `removed`, `draining`) are then as good as lost: the epoch is written anew, so
   * every replica (this one at its next load sync) writes back what it holds, as after Redis
   * lost its data. `workflows` is filled again by the next writes (the `wf:` keys it no longer
   * names expire within their TTL).
   */
  private async repairWrongKinds(keys: SharedKey[]): Promise<void> {
    for (const key of keys) {
      const kind = await this.cmd.type(this.key(key)).catch(() => undefined);
      const belongs = key === 'workflows' ? 'a sorted set' : 'a hash';
      await this.replaceWrongKind(
        key,
        `${kind === undefined ? 'another kind of value' : `a ${escapedText(kind)}`} (WRONGTYPE) where ${belongs} belongs`,
      );
    }
    if (keys.some((k) => k !== 'workflows')) await this.cmd.set(this.key('epoch'), randomBytes(8).toString('hex'));
  }

  private async *scan(pattern: string): AsyncGenerator<string[]> {
    let cursor = '0';
    do {
      const [next, keys] = await this.cmd.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) yield keys;
    } while (cursor !== '0');
  }

  /**
   * This replica's own in-flight work per worker, as its snapshot holds it. Without a prototype:
   * a worker named `__proto__` is a key like any other (on a plain object, assigning it sets the
   * object's prototype instead, and the worker's load would go unshared).
   */
  private ownLoad(): Record<string, string> {
    const router = this.host!.router;
    const load = Object.create(null) as Record<string, string>;
    for (const w of router.listWorkers()) {
      this.noteBlockSize(w.info.blockSize);
      const l = router.localLoad(w.id);
      load[w.id] = encodeLoadEntry(l.inFlightRequests, l.queuedPrefillTokens, l.activeDecodeTokens);
    }
    return load;
  }

  /** Shares this replica's in-flight counts and reads the other replicas'. */
  private async syncLoad(): Promise<void> {
    if (!this.up || this.syncing || !this.host) return;
    this.syncing = true;
    const router = this.host.router;
    try {
      const now = Date.now();
      const ttl = Math.max(HEARTBEAT_WINDOW_MIN_MS, 10 * this.syncIntervalMs);
      const mine = Object.entries(this.ownLoad()).flat();
      const loadKey = this.key('load', this.replicaId);
      // the snapshot is replaced in one transaction: a replica reading it never sees it half written
      const snapshot = this.cmd.multi().del(loadKey);
      if (mine.length > 0) snapshot.hset(loadKey, ...mine).pexpire(loadKey, ttl);
      const written = snapshot.exec().then(
        () => undefined,
        (err: Error) => err,
      );
      // the heartbeat apart from it: a refused snapshot (out of memory) must not cost the replica list
      // heartbeats dated past any clock's lead are garbage (or a clock to fix): dropped with the
      // stale ones before the set is read, so only the replicas within the window are
      const ahead = now + Math.max(ttl, HEARTBEAT_AHEAD_MS);
      const res = await this.run(
        this.cmd
          .pipeline()
          .zadd(this.key('replicas'), String(now), this.replicaId)
          .zremrangebyscore(this.key('replicas'), '-inf', now - ttl)
          .zremrangebyscore(this.key('replicas'), `(${ahead}`, '+inf')
          // the newest heartbeats only, and one more to tell a set past them
          .zrange(this.key('replicas'), String(-(REPLICAS_READ + 1)), '-1')
          // the epoch: written afresh where Redis lost it, read to compare with the one known
          .set(this.key('epoch'), randomBytes(8).toString('hex'), 'NX')
          .eval(READ_VALUE, 1, this.key('epoch'), String(EPOCH_MAX_BYTES))
          // the kinds of the registry's keys and the workflows' index (a no-op on the right
          // kind, WRONGTYPE on another: no field is empty, and no range ends before it starts)
          .hdel(this.key('workers'), '')
          .hdel(this.key('removed'), '')
          .hdel(this.key('draining'), '')
          .zrange(this.key('workflows'), '1', '0'),
        'the load sync',
        isWrongKind,
      );
      const unwritten = await written;
      if (unwritten && !(unwritten instanceof ReplyError)) throw unwritten;
      this.answered();
      if (unwritten) this.failed(unwritten, "this replica's load");
      // the fleet's own key holds another kind of value: deleted, rewritten by the next sync
      if (res.slice(0, 4).some(([err]) => isWrongKind(err))) return await this.replaceWrongKind('replicas');
      if (isWrongKind(res[5]?.[0])) return await this.replaceWrongKind('epoch');
      // longer than any epoch marker: replaced, and the next sync writes a new one (a loss told as any)
      if (res[5]?.[0] === null && typeof res[5][1] === 'number') return await this.replaceEpoch(res[5][1]);
      const wrong = (['workers', 'removed', 'draining', 'workflows'] as const).filter((_, i) =>
        isWrongKind(res[6 + i]?.[0]),
      );
      if (wrong.length > 0) await this.repairWrongKinds(wrong);
      // another epoch than the one read before: Redis lost what every replica wrote (none when it
      // could not be written: out of memory, read-only; the loss is told once it can)
      const epoch = res[5]?.[0] === null ? res[5][1] : null;
      if (typeof epoch === 'string') {
        const known = this.epoch;
        this.epoch = epoch;
        if (known !== undefined && known !== epoch) this.writeBackLost();
      }
      // no heartbeat could be written (out of memory, read-only), so none of the others' either:
      // which replicas are gone is unknown, and their load stays as their messages keep it
      if (res[0]?.[0] !== null) return;
      // a primary took the heartbeat: a later READONLY is a new failover, reconnected at once
      this.readOnlyRetryAt = 0;
      this.readOnlyBackoffMs = READONLY_RETRY_MIN_MS;
      // oldest first: past the bound, those dropped are the oldest heartbeats
      const members = (res[3]?.[1] as string[] | undefined) ?? [];
      if (members.length > REPLICAS_READ && !this.loggedManyReplicas) {
        this.loggedManyReplicas = true;
        this.host.log(
          `state: ${this.key('replicas')} holds more than ${REPLICAS_READ} heartbeats within their window; only the newest ${REPLICAS_READ} are read, and the load of the replicas past them is not counted here (garbage in the set, or a fleet past ${MAX_REMOTE_REPLICAS} replicas); said once`,
        );
      }
      const replicas = members.filter((r) => r !== this.replicaId).slice(-MAX_REMOTE_REPLICAS);
      this.counters.replicasSeen = replicas.length + 1;
      // replicas that stopped heartbeating: their requests are gone with them
      let changed = this.remote.retain(new Set(replicas));
      if (this.reseedLoad) {
        // messages were missed: every tally starts again from its replica's snapshot
        this.reseedLoad = false;
        this.remote.clear();
        changed = true;
      }
      // replicas not heard from yet (joined, or after an outage) start from their snapshot;
      // past the replicas tallied, none is read (the rest are refused, and counted)
      const unseen = replicas.filter((r) => !this.remote.has(r));
      const fresh = unseen.slice(0, Math.max(0, MAX_REMOTE_REPLICAS - this.remote.size));
      for (const r of unseen.slice(fresh.length)) this.remote.seed(r, new Map());
      // tallied replicas quiet for reconcileQuietMs are checked against their snapshot: a
      // forged or lost message would otherwise stay counted for as long as they heartbeat
      const quietSince = Date.now() - this.reconcileQuietMs;
      const quiet: Array<[replica: string, heardAt: number]> = [];
      for (const [r, at] of this.heardAt)
        if (!this.remote.has(r)) this.heardAt.delete(r);
        else if (at <= quietSince) quiet.push([r, at]);
      // one pipeline, of at most MAX_REMOTE_REPLICAS reads: the fresh fill what the tallied leave
      const reads = [...fresh, ...quiet.map(([r]) => r)];
      const read = reads.length === 0 ? undefined : this.cmd.pipeline();
      for (const r of reads) read!.hgetall(this.key('load', r));
      const results = read ? await this.run(read, 'the load sync', isWrongKind) : [];
      const snapshots = results.map(([err, hash], i) => {
        if (!isWrongKind(err)) return err ? undefined : (hash as Record<string, string>);
        this.counters.malformedMessages++;
        this.host?.log(`state: ${this.key('load', reads[i])} in redis is unreadable (${said(err)}); skipped`);
        return undefined;
      });
      // a replica without a snapshot (idle, or a member no replica wrote) is not tallied:
      // its messages, or its next snapshot, start its tally
      fresh.forEach((r, i) => {
        const snapshot = snapshots[i];
        if (snapshot === undefined || Object.keys(snapshot).length === 0) return;
        this.remote.seed(r, decodeLoadSnapshot(snapshot));
        changed = true;
      });
      quiet.forEach(([r, at], i) => {
        const snapshot = snapshots[fresh.length + i];
        // heard while its snapshot was read: that message may be newer than it, checked later
        if (snapshot === undefined || this.heardAt.get(r) !== at) return;
        // none: a replica with no worker holds no work (one with workers always writes one)
        if (this.remote.reconcile(r, decodeLoadSnapshot(snapshot))) changed = true;
        // in agreement, nothing to check until its next message; corrected, checked once more
        // at the next sync, against a snapshot surely written after what it was heard say
        else this.heardAt.delete(r);
      });
      if (changed) for (const w of router.listWorkers()) this.applyRemote(w.id);
    } catch (err) {
      this.failed(err as Error, 'the load sync');
      if (err instanceof ReplyError) this.answered();
      else this.dropIfStalled();
    } finally {
      this.syncing = false;
    }
  }
}

/** A value with its object's fields in one order and absent (undefined or null) ones dropped, for comparing. */
function canonical(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(canonical);
  if (v === null || typeof v !== 'object') return v;
  return Object.fromEntries(
    Object.entries(v)
      .filter(([, x]) => x !== undefined && x !== null)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([k, x]) => [k, canonical(x)]),
  );
}

/** Whether two worker records say the same (the order of their fields, and absent ones, aside). */
function sameRecord(a: WorkerRecord, b: unknown): boolean {
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

/** sameRecord() with a record as the registry holds it (JSON); unreadable JSON is another record. */
function sameRecordJson(a: WorkerRecord, json: string): boolean {
  try {
    return sameRecord(a, JSON.parse(json));
  } catch {
    return false;
  }
}

function positiveInteger(v: number, name: string): number {
  if (!(Number.isSafeInteger(v) && v > 0)) throw new RangeError(`${name} must be a positive integer, got ${v}`);
  return v;
}

function positive(v: number, name: string): number {
  if (!(Number.isFinite(v) && v > 0)) throw new RangeError(`${name} must be a positive number, got ${v}`);
  return v;
}
