import { canonicalChatText, hashString32, type ChatMessage } from '../../core/hashing.js';
import { checkChatMessages } from '../../core/chat-messages.js';
import type { PromptTokenizer } from '../chat-tokenizer.js';
import { HttpError } from './http.js';

/** Deterministic word-level tokenizer: words, punctuation and whitespace runs → ids. */
export function mockTokenize(text: string): number[] {
  const out: number[] = [];
  for (const piece of text.match(/\s+|\w+|[^\s\w]/gu) ?? []) out.push(256 + (hashString32(piece) % 100_000));
  return out;
}

/** The chat template of the mock: every message with its role, then the assistant's turn. */
export function mockChatPrompt(messages: readonly ChatMessage[]): string {
  return canonicalChatText(messages) + '<|assistant|>\n';
}

/**
 * A chat's prompt tokens: the model's template (the tokenizer's, else the mock's), with the
 * request's tools and template options.
 */
export function chatTokens(
  tokenizer: PromptTokenizer | undefined,
  messages: unknown,
  body: Record<string, unknown> = {},
): number[] {
  const checked = checkMessages(messages);
  const tools = body.tools;
  if (tools !== undefined && tools !== null && !Array.isArray(tools))
    throw new HttpError(400, 'tools must be an array', 'tools');
  const kwargs = body.chat_template_kwargs;
  if (kwargs !== undefined && kwargs !== null && (typeof kwargs !== 'object' || Array.isArray(kwargs)))
    throw new HttpError(400, 'chat_template_kwargs must be an object', 'chat_template_kwargs');
  if (!tokenizer) {
    // the mock template: the tools' and template options' JSON ahead of the messages
    const head =
      (tools ? `<|tools|>${JSON.stringify(tools)}\n` : '') + (kwargs ? `<|kwargs|>${JSON.stringify(kwargs)}\n` : '');
    return mockTokenize(head + mockChatPrompt(checked));
  }
  try {
    if (tokenizer.tokenizeChatRequest) {
      return tokenizer.tokenizeChatRequest({
        messages: checked,
        tools: tools as unknown[] | undefined,
        chat_template_kwargs: kwargs as Record<string, unknown> | undefined,
        add_generation_prompt: body.add_generation_prompt as boolean | undefined,
        continue_final_message: body.continue_final_message as boolean | undefined,
        add_special_tokens: body.add_special_tokens === true,
      });
    }
    return tokenizer.tokenize({ messages: checked });
  } catch (err) {
    throw new HttpError(400, `the chat template rejected the messages: ${(err as Error).message}`, 'messages');
  }
}

/**
 * A completion's prompt tokens: a string (tokenized, with the tokenizer's special tokens unless
 * `addSpecialTokens` is false, as vLLM's `add_special_tokens`), token ids, or a list of one of those.
 */
export function promptTokens(
  tokenizer: PromptTokenizer | undefined,
  prompt: unknown,
  addSpecialTokens = true,
): number[] {
  if (typeof prompt === 'string')
    return tokenizer ? tokenizer.tokenize({ text: prompt }, addSpecialTokens) : mockTokenize(prompt);
  if (Array.isArray(prompt) && prompt.every((t) => Number.isInteger(t) && t >= 0 && t < 2 ** 32))
    return prompt as number[];
  if (Array.isArray(prompt) && prompt.length === 1) return promptTokens(tokenizer, prompt[0], addSpecialTokens);
  throw new HttpError(400, 'prompt must be a string, a list of token ids, or a list with one of those', 'prompt');
}

function checkMessages(messages: unknown): ChatMessage[] {
  return checkChatMessages(messages, (message, field) => new HttpError(400, message, field));
}
