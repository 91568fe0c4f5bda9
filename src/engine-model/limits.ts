/** The request sizes an engine serves: its context length and its KV capacity. */
export interface EngineLimits {
  /** The longest request served (prompt + output tokens). */
  maxModelLen: number;
  capacityBlocks: number;
  blockTokens: number;
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
  if (input >= len) {
    return `This model's maximum context length is ${len} tokens. However, your request has ${input} input tokens. Please reduce the length of the input messages.`;
  }
  if (input + request.outputTokens > len) {
    return `'max_tokens' or 'max_completion_tokens' is too large: ${request.outputTokens}. This model's maximum context length is ${len} tokens and your request has ${input} input tokens (${request.outputTokens} > ${len} - ${input}).`;
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
