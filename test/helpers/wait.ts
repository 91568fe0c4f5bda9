import { setTimeout as sleep } from 'node:timers/promises';

/** How long a wait may take and how often it looks. */
export interface WaitOptions {
  /** Deadline (ms) after which the wait fails; default 10 s. */
  timeoutMs?: number;
  /** Pause between checks (ms); default 10. */
  intervalMs?: number;
}

/**
 * Polls `cond` until it holds; throws naming `what` once the deadline passes. Tests wait for
 * the condition they assert on, never for a fixed time.
 */
export async function until(
  cond: () => boolean | Promise<boolean>,
  what: string,
  { timeoutMs = 10_000, intervalMs = 10 }: WaitOptions = {},
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(intervalMs);
  }
}

/**
 * Reads `read` until its value satisfies `done` or the deadline passes, and returns the last
 * value read: the caller asserts on it, so a timeout reports the value that was seen.
 */
export async function settled<T>(
  read: () => T | Promise<T>,
  done: (value: T) => boolean,
  { timeoutMs = 10_000, intervalMs = 10 }: WaitOptions = {},
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (done(value) || Date.now() > deadline) return value;
    await sleep(intervalMs);
  }
}
