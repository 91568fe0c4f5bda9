/**
 * One budget of request-body bytes held at once by a process, over all its requests. Each body
 * is bounded on its own (the body limit), but many clients each sending a large body slowly
 * would otherwise make the process hold (concurrent requests × body limit) bytes. A request
 * takes its bytes from the budget before they are buffered (the whole Content-Length at once,
 * or chunk by chunk when the length is not declared) and gives them back when the process no
 * longer holds its body: its answer started reaching the client (the gateway: no retry needs the
 * body after that, however long the answer streams; the picker: the body was routed on), it
 * ended earlier, it failed, or its client went away. A request whose bytes do not fit is
 * refused at once (the gateway's 503, the picker's immediate response).
 * Only counts: no I/O, no timers.
 */

import { constants } from 'node:buffer';

/**
 * The largest body limit: a request body is parsed as one string, and V8 makes none longer
 * than this (about 512 MiB; a longer body failed as it was parsed, a 500).
 */
export const MAX_BODY_LIMIT = constants.MAX_STRING_LENGTH;

/** The default budget: 16 bodies of the default 16 MiB body limit. */
export const DEFAULT_BUFFERED_BODY_LIMIT = 256 * 1024 * 1024;

/**
 * The default budget of complete answers gathered at once (a BodyBudget of its own): 16 answers
 * of the 16 MiB the proxy gathers at most. It is not the request-body budget: an answer it
 * cannot take passes through ungathered at no cost but its retry, while a request body that does
 * not fit is refused; answers drawing on the body budget would turn into refusals of other
 * clients' requests (and of the endpoint picker's streams, which share that budget).
 */
export const DEFAULT_BUFFERED_ANSWER_LIMIT = 256 * 1024 * 1024;

/** Seconds a client refused for want of budget is asked to wait (Retry-After). */
export const BODY_BUDGET_RETRY_AFTER_S = 1;

export class BodyBudget {
  private held = 0;

  /** `limit`: most bytes held at once; `name`: the setting it comes from, for the error naming it. */
  constructor(
    readonly limit: number,
    name = 'bufferedBodyLimit',
  ) {
    if (!Number.isSafeInteger(limit) || limit < 1)
      throw new RangeError(`${name} must be a positive integer number of bytes (got ${limit})`);
  }

  /** Bytes held now. */
  get used(): number {
    return this.held;
  }

  /** Takes `bytes` when they fit under the limit; false (and nothing taken) when they do not. */
  take(bytes: number): boolean {
    if (this.held + bytes > this.limit) return false;
    this.held += bytes;
    return true;
  }

  /** Gives back bytes taken before. */
  give(bytes: number): void {
    this.held -= bytes;
    // a give without its take is a bug; the count must never drift below zero and admit more
    if (this.held < 0) this.held = 0;
  }

  /** One request's share: what it took, given back once however many ways it ends. */
  charge(): BodyCharge {
    return new BodyCharge(this);
  }
}

/** The bytes one request holds of a BodyBudget. */
export class BodyCharge {
  private bytes = 0;
  private released = false;

  constructor(private readonly budget: BodyBudget) {}

  /** Takes `bytes` more for this request; false when they do not fit (or the request has ended). */
  take(bytes: number): boolean {
    if (this.released || !this.budget.take(bytes)) return false;
    this.bytes += bytes;
    return true;
  }

  /** Gives everything this request took back; later calls do nothing. */
  release(): void {
    if (this.released) return;
    this.released = true;
    this.budget.give(this.bytes);
    this.bytes = 0;
  }
}

/** The error code of a refusal for want of budget (the client may retry). */
export const BODY_BUDGET_CODE = 'body_budget_exceeded';

/** The message a client refused for want of budget gets. */
export const BODY_BUDGET_MESSAGE = 'the router is holding as many request bodies as it may at once; retry shortly';
