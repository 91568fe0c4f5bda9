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
  private readonly entries: LRUCache<string, WorkflowEntry>;

  constructor(readonly capacity: number) {
    this.entries = new LRUCache({ max: capacity });
  }

  get size(): number {
    return this.entries.size;
  }

  peek(workflowId: string): WorkflowEntry | undefined {
    return this.entries.peek(workflowId);
  }

  /**
   * Records that `step` of a workflow ran on `workerId`. A step older than the one recorded
   * (a late retry) does not move the workflow back.
   */
  record(workflowId: string, workerId: string, step: number | null): void {
    const prev = this.entries.get(workflowId); // a use, even by a late step that does not move it
    if (prev && step !== null && prev.step !== null && step < prev.step) return;
    this.set(workflowId, workerId, step);
  }

  /** Sets a workflow's worker and step whatever was recorded (another router's word for it). */
  set(workflowId: string, workerId: string, step: number | null): void {
    this.entries.set(workflowId, { workerId, step });
  }

  /** Every remembered workflow, least recently used first. */
  *all(): IterableIterator<[string, WorkflowEntry]> {
    for (const id of this.entries.rkeys()) yield [id, this.entries.peek(id)!];
  }

  dropWorker(workerId: string): void {
    const gone: string[] = [];
    for (const [id, entry] of this.entries.entries()) if (entry.workerId === workerId) gone.push(id);
    for (const id of gone) this.entries.delete(id);
  }
}
