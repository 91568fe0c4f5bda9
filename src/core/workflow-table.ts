import { LRUCache } from 'lru-cache';

/**
 * Workflow id → the worker that ran its latest step. Consecutive steps of a multi-agent
 * workflow share most of their context, so the next step prefers that worker. Bounded with
 * least-recently-used eviction, like the anchor table.
 */
export interface WorkflowEntry {
  workerId: string;
  step: number | null;
}

export class WorkflowTable {
  /**
   * Made at the first workflow recorded: lru-cache sizes its arrays by the capacity when it is
   * made, which a router that is never given a workflow never needs.
   */
  private entries: LRUCache<string, WorkflowEntry> | undefined;

  constructor(readonly capacity: number) {}

  get size(): number {
    return this.entries?.size ?? 0;
  }

  peek(workflowId: string): WorkflowEntry | undefined {
    return this.entries?.peek(workflowId);
  }

  /**
   * Records that `step` of a workflow ran on `workerId`. A step older than the one recorded
   * (a late retry) does not move the workflow back.
   */
  record(workflowId: string, workerId: string, step: number | null): void {
    const prev = this.entries?.get(workflowId); // a use, even by a late step that does not move it
    if (prev && step !== null && prev.step !== null && step < prev.step) return;
    this.set(workflowId, workerId, step);
  }

  /** Sets a workflow's worker and step whatever was recorded (another router's word for it). */
  set(workflowId: string, workerId: string, step: number | null): void {
    (this.entries ??= new LRUCache({ max: this.capacity })).set(workflowId, { workerId, step });
  }

  /** Every remembered workflow, least recently used first. */
  *all(): IterableIterator<[string, WorkflowEntry]> {
    const entries = this.entries;
    if (entries === undefined) return;
    for (const id of entries.rkeys()) yield [id, entries.peek(id)!];
  }

  dropWorker(workerId: string): void {
    const entries = this.entries;
    if (entries === undefined) return;
    const gone: string[] = [];
    for (const [id, entry] of entries.entries()) if (entry.workerId === workerId) gone.push(id);
    for (const id of gone) entries.delete(id);
  }
}
