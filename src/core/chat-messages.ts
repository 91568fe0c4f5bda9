/**
 * The one check of chat messages (OpenAI's `messages`), used wherever they enter: route(),
 * the gateway, the chat tokenizer and the mock engine. Each caller says which error to throw
 * (a TypeError here, an HTTP 400 naming the field at the gateway); the rules are the same.
 *
 * Content parts are taken as vLLM's OpenAI server takes them (vllm/entrypoints/chat_utils.py,
 * _parse_chat_message_content_part and _parse_chat_message_content_mm_part, read at commit
 * 001eadcf295d90aa0664963cd6a9d93f38a2f3da), so that a request an engine would serve is not
 * refused on the way to it:
 * - a plain string in the list is a text part;
 * - a part is read by its `type` when it has one and no `uuid`; a `type` vLLM has no parser
 *   for is refused, as vLLM refuses it;
 * - a part without a `type` (or with a null one), and any part with a `uuid`, is read by the
 *   first media field it has (MEDIA_FIELDS, in vLLM's order): its `type` is then not looked
 *   at; with none of them it is refused;
 * - with a `uuid` the media may be null: the engine takes it from its cache of media by that id;
 * - text and refusal parts whose text is null or missing are skipped; input_text, output_text
 *   and thinking parts need a string (vLLM fails joining a null one into the prompt);
 * - a prompt_embeds part needs its base64 `data`, a tool_reference part its tool `name`;
 * - with `wellFormed` (the gateway, the chat tokenizer), text holding a lone surrogate (JSON's
 *   "\ud800" outside a pair) is refused, as vLLM refuses it (pydantic and the tokenizer take no
 *   such str): in role, content, text parts, name, reasoning, tool_call_id, task, and tool
 *   calls' function name and arguments. route() hashes such text as it is.
 * OpenAI's `file` part, which vLLM has no parser for, is still taken: the engine answers for it.
 */
import type { ChatContentPart, ChatMessage } from './hashing.js';

/** Text-like part types, and the field that holds each one's text. */
export const TEXT_PART_FIELDS: Readonly<Record<string, string>> = Object.freeze({
  text: 'text',
  input_text: 'text',
  output_text: 'text',
  refusal: 'refusal',
  thinking: 'thinking',
});

/** Text-like types whose part vLLM skips when its text is null or missing. */
const SKIPPED_WHEN_NULL: ReadonlySet<string> = new Set(['text', 'refusal']);

/** Types whose media is a URL string or {url}. */
const URL_PART_TYPES: ReadonlySet<string> = new Set(['image_url', 'audio_url', 'video_url']);

/**
 * The fields a part without a type, or with a uuid, is read by, in the order vLLM looks for
 * them; each names the part's type.
 */
export const MEDIA_FIELDS: readonly string[] = Object.freeze([
  'image_url',
  'image_pil',
  'image_embeds',
  'audio_embeds',
  'prompt_embeds',
  'audio_url',
  'input_audio',
  'video_url',
  'tool_reference',
]);

/**
 * Chat content-part types taken by their `type` field: those vLLM has a parser for, and
 * OpenAI's `file`. Parts are hashed by type (and text, URL or uuid), so an unknown type is
 * refused rather than silently hashed as an empty part.
 */
export const CONTENT_PART_TYPES: ReadonlySet<string> = new Set([
  'text',
  'thinking',
  'input_text',
  'output_text',
  'refusal',
  'tool_reference',
  'image_url',
  'input_image',
  'image_pil',
  'image_embeds',
  'audio_url',
  'input_audio',
  'audio_embeds',
  'video_url',
  'prompt_embeds',
  'file',
]);

/**
 * Keys of chat_template_kwargs vLLM refuses (a 400): `chat_template` and `tokenize`, which
 * resolve_chat_template_kwargs (vllm/renderers/hf.py) rejects by name; `tools` and
 * `conversation`, which it lets through as apply_chat_template's own parameters and which then
 * reach that call a second time; `messages`, a variable of every template, which reaches the
 * template's render() beside the conversation (transformers' render_jinja_template): both
 * fail with "got multiple values for keyword argument".
 */
export const REFUSED_TEMPLATE_KWARGS: ReadonlySet<string> = new Set([
  'chat_template',
  'tokenize',
  'messages',
  'tools',
  'conversation',
]);

/** The first key of a chat_template_kwargs object that vLLM refuses, or undefined. */
export function refusedTemplateKwarg(kwargs: unknown): string | undefined {
  if (kwargs === null || typeof kwargs !== 'object' || Array.isArray(kwargs)) return undefined;
  for (const key of Object.keys(kwargs)) if (REFUSED_TEMPLATE_KWARGS.has(key)) return key;
  return undefined;
}

/** Builds the error for a bad message; `field` is its path, e.g. `messages[2].content[0].type`. */
export type ChatMessageFault = (message: string, field: string) => Error;

/**
 * Called with each media URL an engine would fetch (an image_url, audio_url or video_url part's
 * URL, an input_image part's image_url), `at` naming its part's media field
 * (`messages[2].content[0].image_url`) and `inObject` true when the URL is that field's `url`;
 * it throws to refuse the request. Only parts with a URL string call it.
 */
export type MediaUrlCheck = (url: string, at: string, inObject: boolean) => void;

const typeError: ChatMessageFault = (message) => new TypeError(message);

/** A part's media field, for a part read by one (vLLM skips an input_audio that is null). */
function mediaFieldOf(p: Record<string, unknown>): string | undefined {
  for (const field of MEDIA_FIELDS) {
    if (field === 'input_audio' ? p[field] !== undefined && p[field] !== null : field in p) return field;
  }
  return undefined;
}

/** A part's uuid, or undefined when it has none (a null uuid is none). */
export function contentPartUuid(part: ChatContentPart | string): string | undefined {
  if (typeof part === 'string') return undefined;
  const uuid = (part as Record<string, unknown>).uuid;
  return typeof uuid === 'string' ? uuid : undefined;
}

/**
 * The type vLLM reads a checked content part as: `text` for a plain string, the media field's
 * type for a part with a uuid or without a type, else its `type`.
 */
export function contentPartType(part: ChatContentPart | string): string {
  if (typeof part === 'string') return 'text';
  const p = part as Record<string, unknown>;
  if (p.uuid !== undefined && p.uuid !== null) return mediaFieldOf(p) ?? '';
  if (p.type === undefined || p.type === null) return mediaFieldOf(p) ?? '';
  return String(p.type);
}

/**
 * A checked text-like part's text (a plain string's own), `null` for one vLLM skips, or
 * undefined for a part that is not text.
 */
export function contentPartText(part: ChatContentPart | string): string | null | undefined {
  if (typeof part === 'string') return part;
  const field = TEXT_PART_FIELDS[contentPartType(part)];
  if (field === undefined) return undefined;
  const text = (part as Record<string, unknown>)[field];
  return typeof text === 'string' ? text : null;
}

/**
 * Returns `messages` as ChatMessage[] when every one is an object with a non-empty string
 * role, an optional string name, and content that is a string, null or a list of content
 * parts vLLM takes (see the top of this file); otherwise throws `fault(message, field)` for
 * the first bad field. `allowEmpty`: an empty list passes (route() hashes it to no blocks;
 * the OpenAI API refuses it). `onMediaUrl`, when given, is called with each media URL an engine
 * would fetch, in the same walk (the gateway's allowlist of media hosts). `wellFormed`: text
 * holding a lone surrogate is refused (see the top of this file).
 */
export function checkChatMessages(
  messages: unknown,
  fault: ChatMessageFault = typeError,
  allowEmpty = false,
  onMediaUrl?: MediaUrlCheck,
  wellFormed = false,
): ChatMessage[] {
  const fine: WellFormedCheck = wellFormed ? checkWellFormed : noCheck;
  if (!Array.isArray(messages) || (messages.length === 0 && !allowEmpty))
    throw fault(allowEmpty ? 'messages must be an array' : 'messages must be a non-empty array', 'messages');
  for (let i = 0; i < messages.length; i++) {
    const msg = messages[i] as unknown;
    const at = `messages[${i}]`;
    if (msg === null || typeof msg !== 'object' || Array.isArray(msg)) throw fault(`${at} must be an object`, at);
    const m = msg as Record<string, unknown>;
    const { role, content, name } = m;
    if (typeof role !== 'string' || role === '') throw fault(`${at} must have a string role`, `${at}.role`);
    if (name !== undefined && typeof name !== 'string') throw fault(`${at}.name must be a string`, `${at}.name`);
    fine(role, `${at}.role`, fault);
    for (const key of TEXT_MESSAGE_FIELDS) fine(m[key], `${at}.${key}`, fault);
    if (wellFormed && Array.isArray(m.tool_calls))
      for (let k = 0; k < m.tool_calls.length; k++) {
        const fn = (m.tool_calls[k] as { function?: Record<string, unknown> } | null)?.function;
        if (fn === null || typeof fn !== 'object') continue;
        fine(fn.name, `${at}.tool_calls[${k}].function.name`, fault);
        fine(fn.arguments, `${at}.tool_calls[${k}].function.arguments`, fault);
      }
    if (content === undefined || content === null || typeof content === 'string') {
      fine(content, `${at}.content`, fault);
      continue;
    }
    if (!Array.isArray(content))
      throw fault(`${at}.content must be a string, null or a list of content parts`, `${at}.content`);
    for (let k = 0; k < content.length; k++)
      checkContentPart(content[k], `${at}.content[${k}]`, fault, fine, onMediaUrl);
  }
  return messages as ChatMessage[];
}

/** The string fields of a message besides content that vLLM's message types read as text. */
const TEXT_MESSAGE_FIELDS: readonly string[] = ['name', 'reasoning', 'tool_call_id', 'task'];

/** A UTF-16 unit of a surrogate pair standing alone: no Unicode character. */
const LONE_SURROGATE = /\p{Cs}/u;

/**
 * Refuses a string holding a lone surrogate (JSON's "\ud800"), as vLLM does: Python's json
 * reads it into a str that pydantic cannot take as text, nor the tokenizer encode.
 */
type WellFormedCheck = (value: unknown, at: string, fault: ChatMessageFault) => void;
const noCheck: WellFormedCheck = () => {};

function checkWellFormed(value: unknown, at: string, fault: ChatMessageFault): void {
  if (typeof value === 'string' && LONE_SURROGATE.test(value))
    throw fault(`${at} holds a lone surrogate (a \\uD800-\\uDFFF escape outside a pair), which is not text`, at);
}

function checkContentPart(
  part: unknown,
  at: string,
  fault: ChatMessageFault,
  fine: WellFormedCheck,
  onMediaUrl?: MediaUrlCheck,
): void {
  if (typeof part === 'string') {
    fine(part, at, fault);
    return;
  }
  if (part === null || typeof part !== 'object' || Array.isArray(part))
    throw fault(`${at} must be a string or a content part object`, at);
  const p = part as Record<string, unknown>;
  const withUuid = p.uuid !== undefined && p.uuid !== null;
  if (withUuid && typeof p.uuid !== 'string') throw fault(`${at}.uuid must be a string`, `${at}.uuid`);
  let type: string;
  if (withUuid || p.type === undefined || p.type === null) {
    const field = mediaFieldOf(p);
    if (field === undefined)
      throw withUuid
        ? fault(
            `${at}.uuid names a media item but the part has no media field (${MEDIA_FIELDS.join(', ')})`,
            `${at}.uuid`,
          )
        : fault(
            `${at}.type is missing and no media field (${MEDIA_FIELDS.join(', ')}) says what the part is`,
            `${at}.type`,
          );
    type = field;
  } else {
    if (typeof p.type !== 'string') throw fault(`${at}.type must be a string`, `${at}.type`);
    if (!CONTENT_PART_TYPES.has(p.type))
      throw fault(`${at}.type must be one of ${[...CONTENT_PART_TYPES].join(', ')}`, `${at}.type`);
    type = p.type;
  }
  const textField = TEXT_PART_FIELDS[type];
  if (textField !== undefined) {
    const text = p[textField];
    if (typeof text !== 'string' && !(SKIPPED_WHEN_NULL.has(type) && (text === undefined || text === null)))
      throw fault(`${at}.${textField} must be a string`, `${at}.${textField}`);
    fine(text, `${at}.${textField}`, fault);
  } else if (type === 'tool_reference') {
    if (typeof p.name !== 'string') throw fault(`${at}.name must be a string`, `${at}.name`);
  } else if (type === 'prompt_embeds') {
    if (typeof p.data !== 'string' || p.data === '') throw fault(`${at}.data must be a non-empty string`, `${at}.data`);
  } else if (URL_PART_TYPES.has(type)) {
    checkMediaUrl(p[type], withUuid, `${at}.${type}`, fault, onMediaUrl);
  } else if (type === 'input_image' && onMediaUrl !== undefined && typeof p.image_url === 'string') {
    // the Responses API's image part: vLLM fetches its image_url string as an image_url part's
    onMediaUrl(p.image_url, `${at}.image_url`, false);
  }
}

/** A URL part's media: a URL string or {url}; null (or a null url) only with a uuid. */
function checkMediaUrl(
  media: unknown,
  withUuid: boolean,
  at: string,
  fault: ChatMessageFault,
  onMediaUrl: MediaUrlCheck | undefined,
): void {
  if (typeof media === 'string') {
    onMediaUrl?.(media, at, false);
    return;
  }
  if (media === null) {
    if (withUuid) return;
    throw fault(`${at} must be a URL string or {url}; it may be null only with a uuid naming cached media`, at);
  }
  if (typeof media === 'object' && !Array.isArray(media)) {
    const url = (media as { url?: unknown }).url;
    if (typeof url === 'string') {
      onMediaUrl?.(url, at, true);
      return;
    }
    if (withUuid && (url === undefined || url === null)) return;
  }
  throw fault(`${at} must be a URL string or {url}`, at);
}
