import { LRUCache } from 'lru-cache';

/**
 * The options given to every lookup: lru-cache makes an object per call when given none (and
 * writes only an undefined `status` into the one it is given), and a lookup runs for every
 * anchor of every request, for every candidate.
 */
const LOOKUP_OPTIONS = {};

/**
 * Most entries one id keeps: an anchor is made under a handful of namespaces (adapters, salts,
 * CLA groups) at once. A client controls the namespace (its cache_salt, its model, its CLA group),
 * and every lookup of the id walks its list, for every candidate worker of every request naming
 * it: a list as long as the table's bound made one request naming the id cost a hundred
 * milliseconds. Past it, the id's least recent entry makes room.
 */
export const MAX_ENTRIES_PER_ID = 16;

/**
 * Id → a short list of entries (an anchor's, one for each namespace it was recorded under), least recently used by id and bounded in entries over all ids: an id a
 * client names under many namespaces takes its share of the bound, no more. Making room
 * evicts the least recently used id whole; an id never holds more than MAX_ENTRIES_PER_ID
 * entries, nor more than the bound (its least recent entry makes room). A list holds its most
 * recently added entry first (a user moves an entry it uses first: moveFirst).
 */
export class EntryLists<E> {
  /**
   * Ids never outnumber entries, kept within `capacity`: the cache itself never has to evict.
   * Made at the first entry added: lru-cache sizes its arrays by `capacity` when it is made
   * (tens of milliseconds and megabytes at the default 100,000), and a router that is never
   * given an anchor (most are) never needs them; the first request to record one pays it, once.
   */
  private lists: LRUCache<string, E[]> | undefined;
  private count = 0;
  private evicted = 0;

  /** @param capacity most entries over all ids (at least 1) */
  constructor(readonly capacity: number) {}

  /** Entries held over all ids. */
  get size(): number {
    return this.count;
  }

  /** Entries the bound pushed out. */
  get evictions(): number {
    return this.evicted;
  }

  /** An id's entries, recency untouched. */
  peek(id: string): E[] | undefined {
    return this.lists?.peek(id, LOOKUP_OPTIONS);
  }

  /** An id's entries, the id now the most recently used. */
  get(id: string): E[] | undefined {
    return this.lists?.get(id, LOOKUP_OPTIONS);
  }

  /**
   * Removes up to `most` of the least recently used ids while every entry's `until(entry)` is
   * at most `at` (not evictions: what they held is over). Returns the latest `until` of the
   * least recently used id left, -Infinity when none is.
   */
  dropUnused(most: number, until: (entry: E) => number, at: number): number {
    if (this.lists === undefined) return -Infinity;
    for (let dropped = 0; ; dropped++) {
      // looked up afresh each time: the cache is not changed under an iteration
      const oldest = this.lists.rkeys().next();
      if (oldest.done) return -Infinity;
      const list = this.lists.peek(oldest.value)!;
      let latest = -Infinity;
      for (let i = 0; i < list.length; i++) latest = Math.max(latest, until(list[i]));
      if (latest > at || dropped >= most) return latest;
      this.count -= list.length;
      this.lists.delete(oldest.value);
    }
  }

  /** Every id, most recently used first (a copy: the lists may be changed meanwhile). */
  ids(): string[] {
    return this.lists === undefined ? [] : [...this.lists.keys()];
  }

  /** Adds `entry` first in `id`'s list, the id now the most recently used, room made first. Returns the list. */
  add(id: string, entry: E): E[] {
    const lists = (this.lists ??= new LRUCache({ max: this.capacity }));
    let list = lists.get(id);
    if (list !== undefined && list.length >= Math.min(MAX_ENTRIES_PER_ID, this.capacity)) this.dropLeastRecent(list);
    while (this.count >= this.capacity) {
      const oldest = lists.rkeys().next();
      // the id itself the least recently used (it holds the only entries left): its own least recent goes
      if (oldest.done || oldest.value === id) this.dropLeastRecent(list!);
      else this.evicted += this.removeWhere(oldest.value, always, undefined);
    }
    if (list === undefined) lists.set(id, (list = []));
    list.unshift(entry);
    this.count++;
    return list;
  }

  /**
   * Removes the entries of `id` for which `gone(entry, arg)` holds, and the id with its last;
   * recency untouched. Returns how many went. (`arg` spares the caller a closure: one that
   * captures a hot function's variable costs that function a context on every call.)
   */
  removeWhere<A>(id: string, gone: (entry: E, arg: A) => boolean, arg: A): number {
    const list = this.lists?.peek(id, LOOKUP_OPTIONS);
    if (list === undefined) return 0;
    let kept = 0;
    for (const entry of list) if (!gone(entry, arg)) list[kept++] = entry;
    const removed = list.length - kept;
    list.length = kept;
    this.count -= removed;
    if (kept === 0) this.lists!.delete(id);
    return removed;
  }

  /** Evicts the last (least recently added or used) of an id's entries. */
  private dropLeastRecent(list: E[]): void {
    list.pop();
    this.count--;
    this.evicted++;
  }
}

const always = (): boolean => true;

/** Moves `list[at]` first in its list, in place (no allocation: a list holds a handful of entries). Returns it. */
export function moveFirst<E>(list: E[], at: number): E {
  const entry = list[at];
  for (let i = at; i > 0; i--) list[i] = list[i - 1];
  list[0] = entry;
  return entry;
}
