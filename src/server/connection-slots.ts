/** The connections the gateway keeps to one engine. */

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
