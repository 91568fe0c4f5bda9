/** `a` if it has an entry for worker `slot`, else a copy at least twice as long (per-worker arrays grow rarely). */
export function withSlot(a: Float64Array<ArrayBuffer>, slot: number): Float64Array<ArrayBuffer> {
  if (slot < a.length) return a;
  const b = new Float64Array(Math.max(slot + 1, a.length * 2));
  b.set(a);
  return b;
}
