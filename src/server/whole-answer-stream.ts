/**
 * A streamed request (`stream: true`) answered with the whole completion as one JSON body: vLLM
 * and SGLang never answer so, but a proxy in front of an engine that does not stream may. An
 * OpenAI client that asked for a stream reads events only, and its SDK ends a JSON body's stream
 * empty, without an error; the gateway holds the whole completion already (it gathers a whole
 * answer), so it answers with the stream the engine would have sent, in the OpenAI API's chunk
 * form as vLLM writes it (protocol.py ChatCompletionStreamResponse, CompletionStreamResponse):
 * - one chunk per choice: `chat.completion.chunk` whose choice holds the message as its `delta`
 *   (a tool call with its `index`, which a stream's tool calls carry), or `text_completion` whose
 *   choice is the answer's own, with every other member of the choice as it was (finish_reason,
 *   logprobs, stop_reason…); every other member of the answer (system_fingerprint,
 *   prompt_logprobs, prompt_token_ids, kv_transfer_params…) in the first chunk only, as vLLM streams
 *   prompt_token_ids, so the stream is about the answer's size whatever the number of choices (the
 *   OpenAI SDKs' stream readers keep a member of any chunk);
 * - the usage chunk (`choices` empty, `usage` the answer's) when the client asked for it
 *   (stream_options.include_usage): a client that did not may index choices[0] of every chunk;
 * - `data: [DONE]`.
 */
import { utf8BomLength } from './whole-json.js';

type Members = Record<string, unknown>;

function isObject(value: unknown): value is Members {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * The SSE events that stream the whole completion `answer` (the JSON of a 2xx, checked whole) of a
 * chat completion (`chat`) or a text completion, with the usage chunk when `includeUsage`;
 * undefined when the answer is no such completion (no JSON, no `choices` array, a choice without
 * its `message` object or `text` string, an `object` of another kind): no answer to the request.
 */
export function wholeAnswerEvents(answer: Buffer, chat: boolean, includeUsage: boolean): Buffer | undefined {
  let value: unknown;
  try {
    value = JSON.parse(answer.toString('utf8', utf8BomLength(answer)));
  } catch {
    return undefined;
  }
  if (!isObject(value)) return undefined;
  const { id, object, created, model, choices, usage, ...others } = value;
  if (object !== undefined && object !== (chat ? 'chat.completion' : 'text_completion')) return undefined;
  if (!Array.isArray(choices)) return undefined;
  if (!choices.every((c) => isObject(c) && (chat ? isObject(c.message) : typeof c.text === 'string'))) return undefined;
  const chunkObject = chat ? 'chat.completion.chunk' : 'text_completion';
  let events = '';
  for (const [i, choice] of (choices as Members[]).entries()) {
    const streamed = chat ? chatChoiceDelta(choice) : choice;
    // the answer's other members go once, in the first chunk (vLLM's stream sends its
    // prompt_token_ids so): a copy per choice would make an n-choice stream n times their size (a
    // client sets n and prompt_logprobs, many megabytes at the top level of vLLM's answer)
    const chunk = { id, object: chunkObject, created, model, choices: [streamed], ...(i === 0 ? others : {}) };
    events += `data: ${JSON.stringify(chunk)}\n\n`;
  }
  if (includeUsage)
    events += `data: ${JSON.stringify({ id, object: chunkObject, created, model, choices: [], usage: usage ?? null })}\n\n`;
  return Buffer.from(`${events}data: [DONE]\n\n`);
}

/**
 * A chat completion's choice as a stream's: its message as the `delta` (the role first, assistant
 * when it names none), an empty `tool_calls` left out (vLLM streams none), each tool call with the
 * `index` a stream's tool calls carry (the OpenAI SDKs gather a call's parts by it).
 */
function chatChoiceDelta({ index, message, ...fields }: Members): Members {
  const { tool_calls: toolCalls, ...said } = message as Members;
  const delta: Members = { role: 'assistant', ...said };
  if (Array.isArray(toolCalls) && toolCalls.length > 0)
    delta.tool_calls = toolCalls.map((call: unknown, i) =>
      isObject(call) && call.index === undefined ? { index: i, ...call } : call,
    );
  else if (toolCalls !== undefined && !Array.isArray(toolCalls)) delta.tool_calls = toolCalls;
  return { index, delta, ...fields };
}
