/**
 * The one check of chat messages (OpenAI's `messages`), used wherever they enter: route(),
 * the gateway, the chat tokenizer and the mock engine. Each caller says which error to throw
 * (a TypeError here, an HTTP 400 naming the field at the gateway); the rules are the same.
 */
import type { ChatMessage } from './hashing.js';

/**
 * Chat content-part types the OpenAI API and vLLM accept. Parts are hashed by type (and text
 * or URL), so an unknown type is refused rather than silently hashed as an empty part.
 */
export const CONTENT_PART_TYPES: ReadonlySet<string> = new Set([
  'text',
  'image_url',
  'input_audio',
  'audio_url',
  'video_url',
  'file',
  'refusal',
  'image_embeds',
  'image_pil',
  'input_image',
  'input_text',
]);

/** Builds the error for a bad message; `field` is its path, e.g. `messages[2].content[0].type`. */
export type ChatMessageFault = (message: string, field: string) => Error;

const typeError: ChatMessageFault = (message) => new TypeError(message);

/**
 * Returns `messages` as ChatMessage[] when every one is an object with a non-empty string
 * role, an optional string name, and content that is a string, null or a list of known
 * content parts (text parts with string text, image_url a URL string or {url}); otherwise
 * throws `fault(message, field)` for the first bad field. `allowEmpty`: an empty list passes
 * (route() hashes it to no blocks; the OpenAI API refuses it).
 */
export function checkChatMessages(
  messages: unknown,
  fault: ChatMessageFault = typeError,
  allowEmpty = false,
): ChatMessage[] {
  if (!Array.isArray(messages) || (messages.length === 0 && !allowEmpty))
    throw fault(allowEmpty ? 'messages must be an array' : 'messages must be a non-empty array', 'messages');
  for (let i = 0; i < messages.length; i++) {
    const msg = messages[i] as unknown;
    const at = `messages[${i}]`;
    if (msg === null || typeof msg !== 'object' || Array.isArray(msg)) throw fault(`${at} must be an object`, at);
    const { role, content, name } = msg as Record<string, unknown>;
    if (typeof role !== 'string' || role === '') throw fault(`${at} must have a string role`, `${at}.role`);
    if (name !== undefined && typeof name !== 'string') throw fault(`${at}.name must be a string`, `${at}.name`);
    if (content === undefined || content === null || typeof content === 'string') continue;
    if (!Array.isArray(content))
      throw fault(`${at}.content must be a string, null or a list of content parts`, `${at}.content`);
    for (let k = 0; k < content.length; k++) checkContentPart(content[k], `${at}.content[${k}]`, fault);
  }
  return messages as ChatMessage[];
}

function checkContentPart(part: unknown, at: string, fault: ChatMessageFault): void {
  if (part === null || typeof part !== 'object' || Array.isArray(part))
    throw fault(`${at} must be a content part object`, at);
  const p = part as Record<string, unknown>;
  if (typeof p.type !== 'string' || !CONTENT_PART_TYPES.has(p.type))
    throw fault(`${at}.type must be one of ${[...CONTENT_PART_TYPES].join(', ')}`, `${at}.type`);
  if ((p.type === 'text' || p.type === 'input_text') && typeof p.text !== 'string')
    throw fault(`${at}.text must be a string`, `${at}.text`);
  if (p.image_url !== undefined && typeof p.image_url !== 'string') {
    const url = (p.image_url as { url?: unknown } | null)?.url;
    if (p.image_url === null || typeof p.image_url !== 'object' || typeof url !== 'string')
      throw fault(`${at}.image_url must be a URL string or {url}`, `${at}.image_url`);
  }
}
