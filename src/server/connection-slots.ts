/**
 * The connections the gateway keeps to one engine, counted by the gateway itself: a request
 * is handed to the engine's undici pool only when one of them is free, and waits here until
 * then. undici's own pool queue cannot give a request back (its queue has no removal, and a
 * queued request's handler gets its abort only once a connection takes it), so a request the
 * gateway gave up on would stay there with its body until a stream ended; here it leaves at
 * once. Waiting here also tells a request that never got a connection of the gateway's own
 * apart from one the engine was slow to answer: only the latter says anything about the engine.
 */

/**
 * Connections the gateway keeps to one engine at most, by default. A stream holds one until it
 * ends, so this bounds the requests one engine has at once from one gateway process. Requests
 * beyond an engine's running batch should wait in the engine's own queue, which its metrics
 * show the router (vLLM's num_requests_waiting), not in the gateway's: vLLM runs at most 256
 * sequences by default (1024 on GPUs of 70 GiB or more other than the A100, --max-num-seqs),
 * SGLang half its KV pool's tokens (--max-running-requests), thousands on large GPUs. Twice
 * vLLM's largest default leaves room for the engine's queue.
 */
export const DEFAULT_ENGINE_CONNECTIONS = 2048;
/** The most a setting may ask for: each connection is a socket (a file descriptor) while open. */
export const MAX_ENGINE_CONNECTIONS = 65_536;

/** The withdrawal of a request that started at once: nothing to withdraw, and nothing kept. */
const STARTED = (): boolean => false;

export class ConnectionSlots {
  private busy = 0;
  /**
   * Requests waiting for a free connection, first come first served (a Map: leaving is O(1)):
   * each one's start, and what tells it it was withdrawn (withdrawAll).
   */
  private readonly waiting = new Map<() => void, () => void>();

  constructor(readonly capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 1 || capacity > MAX_ENGINE_CONNECTIONS)
      throw new RangeError(`capacity must be an integer from 1 to ${MAX_ENGINE_CONNECTIONS}, got ${capacity}`);
  }

  /** Requests holding a connection (handed to the pool, not ended). */
  get inUse(): number {
    return this.busy;
  }

  /** Requests waiting for a free connection. */
  get queued(): number {
    return this.waiting.size;
  }

  /**
   * Calls `start` once a connection is free: at once when one is, else when a request ends.
   * Returns a function that withdraws it while it still waits (true: it was waiting; false: it
   * has started). Whoever started must call release() exactly once when its request ends.
   * `withdrawn` is called instead of `start` when withdrawAll takes it out of the wait.
   */
  take(start: () => void, withdrawn: () => void): () => boolean {
    if (this.busy < this.capacity && this.waiting.size === 0) {
      this.busy++;
      start();
      return STARTED;
    }
    return this.wait(start, withdrawn);
  }

  /**
   * Takes a connection if one is free now and nobody waits for one (true; the caller must
   * release() it exactly once), else takes nothing and leaves no place in the wait (false): for a
   * caller that has other engines to ask rather than wait behind this one's streams.
   */
  tryTake(): boolean {
    if (this.busy >= this.capacity || this.waiting.size > 0) return false;
    this.busy++;
    return true;
  }

  /** (Apart from take: a closure made in take would keep `start`, and what it holds, alive after it ran.) */
  private wait(start: () => void, withdrawn: () => void): () => boolean {
    this.waiting.set(start, withdrawn);
    return () => this.waiting.delete(start);
  }

  /**
   * Takes every waiting request out of the wait and tells each (its `withdrawn`): the engine is
   * gone (its worker was removed), and a request left waiting would start only when one of the
   * engine's streams ended, on a pool that is closed by then.
   */
  withdrawAll(): void {
    const told = [...this.waiting.values()];
    this.waiting.clear();
    for (const withdrawn of told) withdrawn();
  }

  /**
   * A request that held a connection ended: the next waiting one starts. It starts on a later
   * turn of the event loop: undici frees the connection itself only after it reported the end
   * (then a request handed to it would land in the pool's own queue).
   */
  release(): void {
    setImmediate(() => {
      this.busy--;
      this.startWaiting();
    });
  }

  private startWaiting(): void {
    while (this.busy < this.capacity) {
      const next = this.waiting.entries().next();
      if (next.done === true) return;
      const [start] = next.value;
      this.waiting.delete(start);
      this.busy++;
      start();
    }
  }
}
