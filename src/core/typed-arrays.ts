/**
 * A copy of `a` in a new array of `size` elements, the rest zero: how the policies' per-slot
 * tables grow (only while a table grows, never on a decision that fits).
 */
export function resized(a: Float64Array, size: number): Float64Array<ArrayBuffer>;
export function resized(a: Int32Array, size: number): Int32Array<ArrayBuffer>;
export function resized(a: Float64Array | Int32Array, size: number): Float64Array | Int32Array {
  const b = a instanceof Float64Array ? new Float64Array(size) : new Int32Array(size);
  b.set(a.length > size ? a.subarray(0, size) : a);
  return b;
}
