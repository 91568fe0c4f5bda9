import type { RouteRequest } from '../core/router/index.js';
import type { ChatTemplateRequest } from '../engines/chat-tokenizer.js';
import type { SubscriberStats } from '../engines/kv-events/subscriber.js';
import { messagesSourceText, toolsSourceText } from './request-limits.js';

/**
 * How the gateway maps the ways engines are deployed onto router workers:
 *
 * - Data-parallel ranks. vLLM with `--data-parallel-size K` serves one HTTP endpoint in
 *   front of K engine cores, each with its own KV cache; rank r publishes its KV events on
 *   the configured port + r (vllm/distributed/kv_events.py offset_endpoint_port) and takes
 *   the requests whose `X-data-parallel-rank` header names it. A worker with `dp-size=K` is
 *   K router workers, one per rank, `ID` for rank 0's stream when K is 1 and `ID#r`
 *   otherwise; the router picks a (worker, rank) and the gateway sets the header. A node of a
 *   multi-node deployment (`--data-parallel-size-local L --data-parallel-start-rank S`, as
 *   `--data-parallel-hybrid-lb` runs one API server per node) is `dp-size=L,dp-start-rank=S`:
 *   its ranks are the global ranks S…S+L−1 everywhere but in the header (workerRanks()).
 * - LoRA adapters. vLLM lists each adapter in /v1/models with `parent` = the base model
 *   (vllm/entrypoints/openai/serving_models.py show_available_models); a request naming an
 *   adapter is hashed under the adapter's name, as vLLM keys that adapter's blocks. SGLang
 *   lists its adapters alike (`parent` = its served model) but takes a request's adapter from
 *   `model: "base:adapter"` or the body's `lora_path` (WorkerConnections.loraOf and
 *   openai-request.ts requestAdapter).
 */
export const DP_RANK_HEADER = 'x-data-parallel-rank';

/**
 * One router worker of a gateway worker: the worker itself, or one of its data-parallel ranks.
 *
 * vLLM names a rank by its global rank g everywhere but in the request header. On a node of
 * `--data-parallel-size-local L --data-parallel-start-rank S` the API server's
 * data_parallel_rank is S (vllm/engine/arg_utils.py) and starts the engine of local rank i with
 * dp_rank g = S + i (vllm/v1/engine/utils.py CoreEngineProcManager: global_index = start_index +
 * index), which sets parallel_config.data_parallel_index = g (vllm/v1/engine/core.py
 * run_engine_core). Its scheduler creates the KV-event publisher with that index
 * (vllm/v1/core/sched/scheduler.py), which binds the configured port + g and stamps every batch's
 * data_parallel_rank with g (vllm/distributed/kv_events.py ZmqEventPublisher,
 * offset_endpoint_port). The API server's /metrics labels it engine="g" (the stat loggers get
 * its client's engine_ranks_managed, S…S+L−1: vllm/v1/engine/async_llm.py, core_client.py
 * MPClient). The header is the exception: the API server passes X-data-parallel-rank on as it is
 * (vllm/entrypoints/openai/engine/serving.py _get_data_parallel_rank), refuses a value outside
 * [0, L) when it serves its local engines only (hybrid and external load balancing:
 * vllm/v1/engine/input_processor.py process_inputs, local_engines_only) and takes it as an index
 * into its L engines (core_client.py DPLBAsyncMPClient.get_core_engine_for_request; core_engines
 * are ranks S…S+L−1): rank g is named g − S there. With S = 0 (one node) the two agree.
 * (vllm-project/vllm: core_client.py and core.py at 00080ee13c7a, input_processor.py at
 * 009daaeebfb0, scheduler.py at 00024d314514, kv_events.py at 0181ea3173e5.)
 */
export interface WorkerRank {
  /** The router worker id: `ID` without ranks, `ID#g` for global rank g. */
  id: string;
  /** vLLM's global rank g (KV batches' data_parallel_rank, /metrics engine="g"); null without ranks. */
  rank: number | null;
  /** The X-data-parallel-rank value that puts a request on the rank (g − S); null without ranks. */
  header: number | null;
  /** What its event endpoints' ports are offset by (g, as vLLM offsets the rank's publisher; 0 without ranks). */
  portOffset: number;
}

/** A gateway worker's router workers: one per data-parallel rank (dp-size > 1), else the worker itself. */
export function workerRanks(w: { id: string; dpSize?: number; dpStartRank?: number }): WorkerRank[] {
  const size = w.dpSize ?? 1;
  if (size <= 1) return [{ id: w.id, rank: null, header: null, portOffset: 0 }];
  const start = w.dpStartRank ?? 0;
  return Array.from({ length: size }, (_, i) => ({
    id: `${w.id}#${start + i}`,
    rank: start + i,
    header: i,
    portOffset: start + i,
  }));
}

/**
 * Whether `rank` (the r of an id `ID#r`, as written) is a data-parallel rank of worker `w`: one
 * of its global ranks S…S+L−1 when it has several.
 */
export function hasRank(w: { dpSize?: number; dpStartRank?: number }, rank: string): boolean {
  const size = w.dpSize ?? 1;
  if (size <= 1 || !/^(0|[1-9]\d*)$/.test(rank)) return false;
  const start = w.dpStartRank ?? 0;
  return Number(rank) >= start && Number(rank) < start + size;
}

/** A rank's endpoint: the port + rank, as vLLM offsets its publishers'. */
export function rankEndpoint(endpoint: string, rank: number): string {
  if (rank === 0) return endpoint;
  const m = /^(tcp:\/\/.+):(\d+)$/.exec(endpoint);
  if (!m) throw new RangeError(`endpoint '${endpoint}' must be tcp://host:port to have a port per data-parallel rank`);
  const port = Number(m[2]) + rank;
  if (port > 65535) throw new RangeError(`endpoint '${endpoint}': rank ${rank}'s port ${port} is over 65535`);
  return `${m[1]}:${port}`;
}

/** A worker's event endpoints as the subscribers connect to them: each rank's (port + global rank). */
function subscribedEndpoints(
  w: { id: string; events?: string; replay?: string; dpSize?: number; dpStartRank?: number },
  field: 'events' | 'replay',
): string[] {
  const endpoint = w[field];
  if (endpoint === undefined) return [];
  const out: string[] = [];
  for (const { portOffset } of workerRanks(w)) {
    try {
      out.push(rankEndpoint(endpoint, portOffset));
    } catch {
      // a rank past the last port: the worker is refused for it when added
    }
  }
  return out;
}

/** Two workers whose subscribers would connect to one endpoint: `field` is the second's. */
export interface SharedEndpoint {
  field: 'events' | 'replay';
  endpoint: string;
  worker: string;
  other: string;
}

/**
 * The first endpoint `w` would subscribe to (or ask replays of) that a worker of `others`
 * already does, each data-parallel rank on its port + global rank. An engine publishes one stream: two
 * workers on it are both credited with its blocks, and requests for them go half to the engine
 * without them. A data-parallel engine is one worker with `dp-size`, a rank served on its own
 * (external load balancing) a worker on its own port: neither shares an endpoint. Endpoints
 * are compared as written: one host under two names is not seen.
 */
export function sharedEndpoint(
  w: { id: string; events?: string; replay?: string; dpSize?: number; dpStartRank?: number },
  others: Iterable<{ id: string; events?: string; replay?: string; dpSize?: number; dpStartRank?: number }>,
): SharedEndpoint | undefined {
  for (const field of ['events', 'replay'] as const) {
    const mine = subscribedEndpoints(w, field);
    if (mine.length === 0) continue;
    for (const o of others) {
      if (o.id === w.id) continue;
      const theirs = new Set(subscribedEndpoints(o, field));
      const endpoint = mine.find((e) => theirs.has(e));
      if (endpoint !== undefined) return { field, endpoint, worker: w.id, other: o.id };
    }
  }
  return undefined;
}

/** What sharedEndpoint() found, said naming both workers. */
export function sharedEndpointMessage(s: SharedEndpoint): string {
  return `workers '${s.other}' and '${s.worker}' have the same ${s.field} endpoint ${s.endpoint}: one engine's KV events would be credited to both (a data-parallel engine is one worker with dp-size)`;
}

/** Adapters (name → base model) among a /v1/models answer's entries: those with a parent. */
export function adaptersFromModels(models: ReadonlyArray<{ id: string }>): Map<string, string> {
  const out = new Map<string, string>();
  for (const m of models) {
    const parent = (m as { parent?: unknown }).parent;
    if (typeof parent === 'string' && parent !== '' && parent !== m.id) out.set(m.id, parent);
  }
  return out;
}

/**
 * The body of a vLLM /tokenize request giving the same prompt tokens as the request: the
 * model, `add_special_tokens` when the request gives it (vLLM's /tokenize defaults it as its
 * generation endpoints do: true for a prompt, false for messages), and for a chat everything
 * that shapes the rendered prompt (vLLM's TokenizeChatRequest fields), so the ids match what
 * the engine will compute for the request itself.
 */
export function tokenizeBody(body: Record<string, unknown>, r: RouteRequest): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (typeof body.model === 'string') out.model = body.model;
  if (typeof body.add_special_tokens === 'boolean') out.add_special_tokens = body.add_special_tokens;
  if (r.messages) {
    out.messages = r.messages;
    for (const k of [
      'tools',
      'chat_template_kwargs',
      'add_generation_prompt',
      'continue_final_message',
      'documents',
      'chat_template',
    ] as const) {
      if (body[k] !== undefined) out[k] = body[k];
    }
  } else {
    out.prompt = r.text;
  }
  return out;
}

/**
 * The chat fields the in-process tokenizer needs, from a /v1/chat/completions body; throws a
 * TypeError naming the field (first in its message) when one has the wrong type.
 */
export function chatTemplateRequest(body: Record<string, unknown>): ChatTemplateRequest {
  for (const k of ['tools', 'documents'] as const)
    if (body[k] !== undefined && body[k] !== null && !Array.isArray(body[k]))
      throw new TypeError(`${k} must be a list`);
  const kwargs = body.chat_template_kwargs;
  if (kwargs !== undefined && kwargs !== null && (typeof kwargs !== 'object' || Array.isArray(kwargs)))
    throw new TypeError('chat_template_kwargs must be an object');
  for (const k of ['add_generation_prompt', 'continue_final_message'] as const)
    if (body[k] !== undefined && body[k] !== null && typeof body[k] !== 'boolean')
      throw new TypeError(`${k} must be true or false`);
  // the tools' JSON text when the body holds it (parsed again losslessly by the tokenizer), else
  // the parsed tools: one of the two goes to the tokenizer thread, not both
  const toolsJson = toolsSourceText(body.tools);
  // the messages' JSON text only when they hold numbers the template renders with tojson
  // (tool-call arguments given as objects, a developer message's tools): most chats hold none
  const messagesJson = messagesHoldJsonNumbers(body.messages) ? messagesSourceText(body.messages) : undefined;
  return {
    messages: body.messages as unknown[],
    messagesJson,
    tools: toolsJson === undefined ? (body.tools as unknown[] | undefined) : undefined,
    toolsJson,
    documents: body.documents as unknown[] | undefined,
    // vLLM's ChatCompletionRequest hands it to the template (the engine checks its value);
    // SGLang's also takes a number
    reasoning_effort:
      typeof body.reasoning_effort === 'string' || typeof body.reasoning_effort === 'number'
        ? body.reasoning_effort
        : undefined,
    // read by SGLang's rules only (--chat-rendering sglang)
    reasoning: body.reasoning ?? undefined,
    tool_choice: body.tool_choice ?? undefined,
    chat_template_kwargs: body.chat_template_kwargs as Record<string, unknown> | undefined,
    add_generation_prompt: (body.add_generation_prompt ?? undefined) as boolean | undefined,
    continue_final_message: (body.continue_final_message ?? undefined) as boolean | undefined,
    // checked by readRouteRequest
    add_special_tokens: (body.add_special_tokens ?? undefined) as boolean | undefined,
  };
}

/**
 * Whether chat messages hold JSON data whose numbers the engine renders with Python's text: an
 * assistant's tool call whose arguments are not a string (vLLM and SGLang keep a dict or list as
 * parsed) or a message's tools (vLLM passes a developer message's, SGLang any role's but the user's).
 */
function messagesHoldJsonNumbers(messages: unknown): boolean {
  if (!Array.isArray(messages)) return false;
  for (const m of messages as Array<Record<string, unknown> | null>) {
    if (m === null || typeof m !== 'object') continue;
    if (m.tools !== undefined && m.tools !== null) return true;
    if (!Array.isArray(m.tool_calls)) continue;
    for (const call of m.tool_calls as Array<{ function?: { arguments?: unknown } } | null>) {
      const args = call?.function?.arguments;
      if (args !== null && typeof args === 'object') return true;
    }
  }
  return false;
}

/**
 * Skipped KV events per (worker, reason), summed over a worker's subscribers, for /metrics;
 * `malformed_batch` and `unknown_rank` count whole batches.
 */
export function skippedEventCounts(
  subscribers: Iterable<[string, SubscriberStats]>,
): Array<{ worker: string; reason: string; count: number }> {
  const out: Array<{ worker: string; reason: string; count: number }> = [];
  for (const [worker, stats] of subscribers) {
    for (const [reason, count] of Object.entries(stats.applied.skipped)) out.push({ worker, reason, count });
    if (stats.malformed > 0) out.push({ worker, reason: 'malformed_batch', count: stats.malformed });
    if (stats.unknownRanks > 0) out.push({ worker, reason: 'unknown_rank', count: stats.unknownRanks });
  }
  return out;
}
