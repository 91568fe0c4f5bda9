/**
 * The most KV blocks a process holds for its simulated engines together (mock-engine's ranks, a
 * simulated cluster): every block is held in memory, some 25 bytes each whatever its size.
 */
export const MAX_KV_BLOCKS = 2 ** 24;

/** The request sizes an engine serves: its context length and its KV capacity. */
export interface EngineLimits {
  /** The longest request served (prompt + output tokens). */
  maxModelLen: number;
  capacityBlocks: number;
  blockTokens: number;
}

/**
 * Whether an engine of context length `maxModelLen` refuses a prompt of `inputTokens` that asks
 * for `outputTokens` (undefined: no max_tokens given) as too long: vLLM refuses a prompt of
 * max_model_len tokens or more, and one whose max_tokens does not fit in what is left
 * (vllm/entrypoints/openai/serving_engine.py, _validate_input); SGLang alike, by its context
 * length (tokenizer_manager.py, _validate_one_request).
 */
export function exceedsContext(maxModelLen: number, inputTokens: number, outputTokens: number | undefined): boolean {
  return inputTokens >= maxModelLen || (outputTokens !== undefined && inputTokens + outputTokens > maxModelLen);
}

/**
 * Why the engine would refuse the request, as vLLM's OpenAI server words it (HTTP 400), or
 * null. vLLM refuses a prompt of max_model_len tokens or more, and a prompt whose requested
 * output does not fit in what is left (vllm/entrypoints/openai/serving_engine.py,
 * _validate_input); the output a trace recorded is taken as the max_tokens asked for.
 */
export function rejection(
  limits: EngineLimits,
  request: { inputTokens: number; outputTokens: number; anchors?: ReadonlyArray<{ tokens: number }> },
): string | null {
  const len = limits.maxModelLen;
  const input = request.inputTokens;
  if (exceedsContext(len, input, request.outputTokens)) {
    return input >= len
      ? `This model's maximum context length is ${len} tokens. However, your request has ${input} input tokens. Please reduce the length of the input messages.`
      : `'max_tokens' or 'max_completion_tokens' is too large: ${request.outputTokens}. This model's maximum context length is ${len} tokens and your request has ${input} input tokens (${request.outputTokens} > ${len} - ${input}).`;
  }
  // content anchors take whole blocks of their own: the request must still fit alone
  const bt = limits.blockTokens;
  let anchorTokens = 0;
  let blocks = 0;
  for (const a of request.anchors ?? []) {
    anchorTokens += a.tokens;
    blocks += Math.ceil(a.tokens / bt);
  }
  blocks += Math.ceil(Math.max(1, input - anchorTokens + request.outputTokens) / bt);
  if (blocks > limits.capacityBlocks)
    return `This request needs ${blocks} KV blocks with its passages, more than the ${limits.capacityBlocks} the engine has.`;
  return null;
}
