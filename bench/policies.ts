/** The peers the README's tables compare `cost` with, as bench:sim, bench:held-out and bench:cost-eval run them. */
export const TABLE_PEERS: readonly string[] = ['seed', 'dynamo', 'sglang', 'llmd', 'round-robin'];
/** `cost` and its table peers: what the benchmarks run unless told otherwise. */
export const TABLE_POLICIES: readonly string[] = ['cost', ...TABLE_PEERS];
/**
 * Every policy the benchmarks' --policies takes: the table's, and the peers run beside them
 * (llm-d's guide routing, SMG's cache-aware routing: bench/results/peers-2026/).
 */
export const KNOWN_POLICIES: readonly string[] = [...TABLE_POLICIES, 'llmd-affinity', 'smg'];
