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
  private readonly entries = new Map<string, WorkflowEntry>();

  constructor(readonly capacity: number) {}

  get size(): number {
    return this.entries.size;
  }

  peek(workflowId: string): WorkflowEntry | undefined {
    return this.entries.get(workflowId);
  }

  /**
   * Records that `step` of a workflow ran on `workerId`. A step older than the one recorded
   * (a late retry) does not move the workflow back.
   */
  record(workflowId: string, workerId: string, step: number | null): void {
    const prev = this.entries.get(workflowId);
    if (prev && step !== null && prev.step !== null && step < prev.step) {
      // still the most recently used
      this.entries.delete(workflowId);
      this.entries.set(workflowId, prev);
      return;
    }
    this.set(workflowId, workerId, step);
  }

  /** Sets a workflow's worker and step whatever was recorded (another router's word for it). */
  set(workflowId: string, workerId: string, step: number | null): void {
    this.entries.delete(workflowId);
    this.entries.set(workflowId, { workerId, step });
    if (this.entries.size > this.capacity) this.entries.delete(this.entries.keys().next().value as string);
  }

  /** Every remembered workflow, least recently used first. */
  all(): IterableIterator<[string, WorkflowEntry]> {
    return this.entries.entries();
  }

  dropWorker(workerId: string): void {
    for (const [id, entry] of this.entries) if (entry.workerId === workerId) this.entries.delete(id);
  }
}
