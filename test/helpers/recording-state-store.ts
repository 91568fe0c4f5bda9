import type { SharedDecision } from '../../src/index.js';
import type { StateStats, StateStore } from '../../src/state/state-store.js';

/** A state store that shares decisions, as a replica on Redis does, and records what it would tell the others. */
export class RecordingStateStore implements StateStore {
  readonly kind = 'memory';
  readonly sharesDecisions = true;
  /** The messages, in order. */
  readonly told: Array<'made' | 'prefilled' | 'ended' | 'refused'> = [];
  /** The decisions whose prefill-done it was told. */
  readonly prefilled: SharedDecision[] = [];
  async attach(): Promise<void> {}
  beforeRoute(): undefined {
    return undefined;
  }
  decisionMade(): void {
    this.told.push('made');
  }
  decisionPrefilled(d: SharedDecision): void {
    this.told.push('prefilled');
    this.prefilled.push(d);
  }
  decisionEnded(): void {
    this.told.push('ended');
  }
  decisionRefused(): void {
    this.told.push('refused');
  }
  workerAdded(): void {}
  workerRemoved(): void {}
  workerDrained(): void {}
  kvEventsPosted(): void {}
  stats(): StateStats {
    return { kind: 'recording' };
  }
  async close(): Promise<void> {}
}
