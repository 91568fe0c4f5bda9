import { createHash } from 'node:crypto';
import { existsSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { LRUCache } from 'lru-cache';
import type { ChatContentPart, ChatMessage } from '../core/hashing.js';
import { checkChatMessages, contentPartText, contentPartType, refusedTemplateKwarg } from '../core/chat-messages.js';
import { JsonNumber, jsonEntries, orderedObject, parseLosslessJson } from '../core/lossless-json.js';
import type { RouteRequest } from '../core/router/index.js';
import { escapedText, fileErrorMessage, quotedText } from '../core/shown-text.js';
import {
  MAX_CHAT_TEMPLATE_BYTES,
  MAX_TOKENIZER_CONFIG_BYTES,
  MAX_TOKENIZER_JSON_BYTES,
  readRegularFile,
} from './bounded-file.js';
import { ChatTemplateError, pythonStrip, renderWithPythonNumbers, TemplateBoundError } from './python-jinja.js';

/** Turns a request into the token ids the engine will see (`--tokenize tokenizer`). */
export interface PromptTokenizer {
  /**
   * A completion's prompt with the tokenizer's special tokens when `addSpecialTokens` (the
   * request's `add_special_tokens`: default true, as vLLM's CompletionRequest), or a chat.
   */
  tokenize(request: RouteRequest, addSpecialTokens?: boolean): number[];
  /** A chat request with what besides the messages shapes its prompt (tools, template options). */
  tokenizeChatRequest?(request: ChatTemplateRequest): number[];
}

/** The parts of a /v1/chat/completions body that decide the prompt, as vLLM reads them. */
export interface ChatTemplateRequest {
  messages: readonly unknown[];
  /**
   * The `messages` array as the request's JSON text gave it (messagesSourceText): read again
   * here, when given, in place of `messages`, so the numbers of tool-call arguments given as
   * objects (and of a developer message's tools) render as vLLM renders them (`1.0` stays `1.0`).
   */
  messagesJson?: string;
  tools?: readonly unknown[] | null;
  /**
   * The `tools` array as the request's JSON text gave it (toolsSourceText): read again here so
   * its numbers render as vLLM renders them (`0.0` stays `0.0`). Taken over `tools` when given.
   */
  toolsJson?: string;
  documents?: readonly unknown[] | null;
  /**
   * The request's top-level reasoning_effort, which vLLM hands the template as a variable (a
   * string only; SGLang also takes a number from 0 to 0.99).
   */
  reasoning_effort?: string | number | null;
  /** SGLang only: the request's `reasoning` object ({effort, enabled}), read as SGLang's normalize_reasoning_inputs. */
  reasoning?: unknown;
  /** SGLang only: which tools reach the template ("none": none; {function: {name}}: that one). */
  tool_choice?: unknown;
  chat_template_kwargs?: Record<string, unknown> | null;
  /** Default true, as vLLM's ChatCompletionRequest. */
  add_generation_prompt?: boolean;
  continue_final_message?: boolean;
  /**
   * The tokenizer's special tokens (a BOS) around the rendered prompt, on top of what the
   * template writes. Default false, as vLLM's ChatCompletionRequest.
   */
  add_special_tokens?: boolean;
}

/**
 * Content the router cannot turn into the engine's tokens (images, audio, video: the engine's
 * multimodal processor makes their placeholder tokens). Not the client's fault: the gateway
 * routes such a request on its text instead.
 */
export class UntokenizableContentError extends RangeError {
  constructor(message: string) {
    super(message);
    this.name = 'UntokenizableContentError';
  }
}

/**
 * Variables the request's own fields set, which chat_template_kwargs does not override (vLLM's
 * build_chat_params merges the request's fields over the kwargs). Keys vLLM refuses
 * (REFUSED_TEMPLATE_KWARGS) are refused.
 */
const OVERRIDDEN_KWARGS = new Set(['documents', 'add_generation_prompt', 'continue_final_message']);
/** A text whose ids show where a tokenizer's post-processor puts its special tokens. */
const PROBE_TEXT = 'a';
/** Appended to the final message for continue_final_message, as transformers' render_jinja_template. */
const CONTINUE_TAG = 'CONTINUE_FINAL_MESSAGE_TAG ';

/**
 * Whose rules turn a chat request into the prompt (`--chat-rendering`): vLLM's (the default)
 * or SGLang's (sglangConversation). The router hashes a request before it picks a worker, so
 * the rules are the fleet's, not a worker's.
 */
export type ChatRendering = 'vllm' | 'sglang';
const CHAT_RENDERINGS: readonly ChatRendering[] = ['vllm', 'sglang'];

export interface ChatTokenizerOptions {
  /** Whose rules render a chat (default vllm). */
  rendering?: ChatRendering;
  /** A Jinja chat template overriding tokenizer_config.json's `chat_template`. */
  chatTemplate?: string;
  /** What a template that does not compile is called in the error (the CLI's `--chat-template`; default: chat template). */
  chatTemplateSource?: string;
  /** Cached message segments, least recently used dropped first (default 50,000). */
  cacheEntries?: number;
  /**
   * Most bytes the cached segments' text and tokens take, least recently used dropped first
   * (default 128 MiB); a segment over an eighth of it is not cached.
   */
  cacheBytes?: number;
  /**
   * What load()'s messages call the path (the CLI's `--tokenizer`); by default they name the
   * file's part: tokenizer, tokenizer config, chat template.
   */
  source?: string;
}

export interface ChatTokenizerStats {
  /** Messages whose tokens came from the cache. */
  segmentHits: number;
  /** Messages rendered and tokenized. */
  segmentMisses: number;
  /** Requests whose last messages could not be cut (the template's output for them is not prefix-stable): tokenized in one piece, not cached. */
  wholeRenders: number;
  /** Messages cached inside a segment with the messages after them, not cut alone. */
  segmentsJoined: number;
}

interface Segment {
  /** The template's output for this message, after the previous messages' output. */
  text: string;
  tokens: number[];
}

/**
 * Stored for a message inside a segment (see segmentsJoined): no text of its own, the
 * segment that ends later holds it. A lookup takes it as an empty cut and goes on.
 */
const NO_CUT: Segment = { text: '', tokens: [] };
/** The segment cache's default bound in bytes (ChatTokenizerOptions.cacheBytes). */
const DEFAULT_CACHE_BYTES = 128 * 1024 * 1024;

/** What a cached segment takes: its text (two bytes a character at most) and its tokens (eight bytes each), and the entry. */
function segmentBytes(seg: Segment): number {
  return 2 * seg.text.length + 8 * seg.tokens.length + 64;
}

/**
 * Tokenizer classes whose transformers 4 implementation (the transformers vLLM and SGLang pin)
 * replaces tokenizer.json's post-processor with one built from tokenizer_config.json's
 * add_bos_token and add_eos_token (update_post_processor), with each class's defaults for those
 * and for the tokens. DeepSeek-V3's tokenizer.json adds no BOS, but its tokenizer_class
 * LlamaTokenizerFast and add_bos_token put one before a completions prompt.
 */
const POST_PROCESSOR_CLASSES: Readonly<Record<string, { bos: string; eos: string; addBos: boolean }>> = {
  LlamaTokenizerFast: { bos: '<s>', eos: '</s>', addBos: true },
  CodeLlamaTokenizerFast: { bos: '<s>', eos: '</s>', addBos: true },
  GemmaTokenizerFast: { bos: '<bos>', eos: '<eos>', addBos: true },
  CohereTokenizerFast: { bos: '<BOS_TOKEN>', eos: '<|END_OF_TURN_TOKEN|>', addBos: true },
  GPTNeoXTokenizerFast: { bos: '<|endoftext|>', eos: '<|endoftext|>', addBos: false },
};

/**
 * The ids that tokenizer_config.json's class puts around a text encoded with its special
 * tokens (POST_PROCESSOR_CLASSES), or undefined where tokenizer.json's post-processor is the
 * one used (any other class) or the class's would fail to build (a token without an id:
 * transformers raises on such a tokenizer).
 */
function classPostProcessor(
  tokenizer: Tokenizer,
  config: Record<string, unknown>,
): { before: number[]; after: number[] } | undefined {
  const name = typeof config.tokenizer_class === 'string' ? config.tokenizer_class.replace(/Fast$/, '') + 'Fast' : '';
  const defaults = Object.hasOwn(POST_PROCESSOR_CLASSES, name) ? POST_PROCESSOR_CLASSES[name] : undefined;
  if (defaults === undefined) return undefined;
  // a token given (a string or {content}), null (None), or absent (the class's default)
  const tokenId = (key: 'bos_token' | 'eos_token', fallback: string): number | undefined => {
    const v = key in config ? config[key] : fallback;
    const content =
      typeof v === 'string' ? v : v && typeof v === 'object' ? (v as { content?: unknown }).content : undefined;
    return typeof content === 'string' ? (tokenizer.token_to_id(content) ?? undefined) : undefined;
  };
  const flag = (key: string, fallback: boolean) => (typeof config[key] === 'boolean' ? config[key] : fallback);
  const addBos = flag('add_bos_token', defaults.addBos);
  const addEos = flag('add_eos_token', false);
  const bos = addBos ? tokenId('bos_token', defaults.bos) : undefined;
  const eos = addEos ? tokenId('eos_token', defaults.eos) : undefined;
  if ((addBos && bos === undefined) || (addEos && eos === undefined)) return undefined;
  return { before: bos === undefined ? [] : [bos], after: eos === undefined ? [] : [eos] };
}

/** Whether the tokenizer's normalizer leaves every text as it is: none, or a Sequence of none. */
function identityNormalizer(tokenizer: Tokenizer): boolean {
  const n = tokenizer.normalizer as unknown as { config?: { type?: unknown; normalizers?: unknown } } | null;
  if (n === null || n === undefined) return true;
  const config = n.config;
  return config?.type === 'Sequence' && Array.isArray(config.normalizers) && config.normalizers.length === 0;
}

/** Most messages cut as one segment; a template whose prefixes never match its whole output gives up there. */
const MAX_JOINED_MESSAGES = 8;

/**
 * The model's own tokenizer (tokenizer.json, @huggingface/tokenizers) and chat template
 * (@huggingface/jinja), applied as vLLM applies them, so the ids are the engine's prompt
 * tokens (checked against Python transformers on Qwen3, Llama 3.1, DeepSeek-V3 and Gemma 3 in
 * test/engines/chat-parity-models.test.ts):
 *
 * - messages are read as vLLM reads them (vllm/entrypoints/chat_utils.py
 *   _parse_chat_message_content, _postprocess_messages): content null → "", a list of parts
 *   → its non-empty text parts joined with "\n" (or, for a template that iterates over content
 *   parts, detectContentFormat, kept as [{type: "text", text}], a tool message's joined back);
 *   assistant tool_calls kept, their JSON-string arguments parsed into objects ({} for text
 *   that is not JSON and for arguments neither an object nor a list); `reasoning` kept (also
 *   as reasoning_content); a tool message's tool_call_id, a string name and task, a developer
 *   message's tools kept; other fields dropped;
 * - tools as vLLM's ChatCompletionToolsParam dumps them ({type, function: {name,
 *   description, parameters}}, missing ones null, extra fields kept after);
 * - the template rendered with the special tokens, chat_template_kwargs, reasoning_effort,
 *   add_generation_prompt (default true) and continue_final_message (as transformers'
 *   render_jinja_template: the final message is left open);
 * - the text tokenized without adding special tokens (the template has them). A completions
 *   prompt is tokenized with them.
 * The template is `chatTemplate`, else the model directory's chat_template.jinja, else
 * tokenizer_config.json's `chat_template`, the order vLLM and transformers use.
 *
 * Multi-turn requests resend the whole conversation, so tokenizing it every turn would cost
 * O(turns²). The template's output is cut at message boundaries — the output for
 * messages[0..j] minus that for messages[0..i] — and each segment is tokenized alone and
 * cached under a digest of the options and messages up to its end. A request's new messages
 * make one segment, cut where the request ends, since the next request of the conversation
 * resends them; the opening message is a segment of its own (conversations share system
 * prompts). Every request still renders the whole conversation once and uses a cached
 * segment only where it is exactly what the whole rendering has there: templates that render
 * a message differently once more follow (Qwen3 drops the reasoning of earlier turns and
 * opens a thinking block for the newest assistant turn) are handled, a message that cannot
 * be cut after joining the segment of the messages that follow it. A cut is made only where
 * one of the tokenizer's added tokens (a special token such as `<|im_start|>`) begins in the
 * whole text and none straddles it (cutsCleanly): the tokenizer splits a text on its added
 * tokens before anything else, so the pieces on either side tokenize alone as they do in the
 * whole text. Most templates open each message with a special token; DeepSeek-V3's runs the
 * system prompts into the first turn (`First.` then `\n\nSecond.`, which its tokenizer writes
 * with a `.\n\n` token), where no cut is made (the parity tests check it).
 */
export class ChatTokenizer implements PromptTokenizer {
  readonly stats: ChatTokenizerStats = { segmentHits: 0, segmentMisses: 0, wholeRenders: 0, segmentsJoined: 0 };
  private readonly template: Template | undefined;
  private readonly templateSource: string | undefined;
  private readonly specialTokens: Record<string, unknown>;
  /** Cached segments by the digest of the conversation up to them; none when cacheEntries is 0. */
  private readonly segments: LRUCache<string, Segment> | undefined;
  private readonly cacheEntries: number;
  private readonly cacheBytes: number;
  /** The template iterates over content parts (the "openai" content format, found by the rendering's rules). */
  private readonly partsContent: boolean;
  readonly rendering: ChatRendering;
  /** SGLang: the tokenizer adds special tokens to an empty text, so the prompt is encoded without them. */
  private readonly specialsOnEmpty: boolean;
  /** The id of the tokenizer's BOS token, if it has one (SGLang drops it from a continued final message's ids). */
  private readonly bosId: number | undefined;
  /** The text of every added token, none of which may straddle a cut (cutsCleanly). */
  private readonly addedTexts: TokenTrie;
  /**
   * The added tokens a cut may fall before: matched on the text as it is (not normalized, or
   * under a normalizer that changes nothing), taking no whitespace before them (not lstrip)
   * and not only as a whole word.
   */
  private readonly cutBefore: TokenTrie;
  /** The longest added token's length in UTF-16 units. */
  private readonly addedMaxLength: number;
  /** The special tokens tokenizer_config.json's class puts around a text (classPostProcessor), if it sets them. */
  private readonly classSpecials: { before: number[]; after: number[] } | undefined;
  /** specialTokensAround's answer; null until asked. */
  private around: { before: number[]; after: number[] } | undefined | null = null;

  constructor(
    private readonly tokenizer: Tokenizer,
    config: Record<string, unknown>,
    options: ChatTokenizerOptions = {},
  ) {
    const source = options.chatTemplate ?? templateOf(config);
    this.templateSource = source;
    this.template = source === undefined ? undefined : compileTemplate(source, options.chatTemplateSource);
    this.rendering = options.rendering ?? 'vllm';
    if (!CHAT_RENDERINGS.includes(this.rendering))
      throw new RangeError(`rendering must be vllm or sglang, got ${String(options.rendering)}`);
    this.partsContent =
      this.template !== undefined &&
      (this.rendering === 'sglang'
        ? detectSglangContentFormat(source!, this.template.parsed)
        : detectContentFormat(this.template.parsed)) === 'openai';
    // serving_chat.py OpenAIServingChat.__init__ (_tokenizer_auto_adds_specials): encode("")
    this.classSpecials = classPostProcessor(tokenizer, config);
    this.specialsOnEmpty = this.encodeText('', true).length > 0;
    this.specialTokens = {};
    for (const key of ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token']) {
      const v = config[key];
      const content =
        typeof v === 'string'
          ? v
          : v && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string'
            ? (v as { content: string }).content
            : undefined;
      if (content !== undefined) this.specialTokens[key] = content;
    }
    if (Array.isArray(config.additional_special_tokens))
      this.specialTokens.additional_special_tokens = config.additional_special_tokens;
    const added = [...tokenizer.get_added_tokens_decoder().values()];
    this.addedTexts = tokenTrie(added.map((t) => t.content));
    // a normalized added token is matched on the normalized text: the text itself where the
    // normalizer changes nothing (DeepSeek-V3's <｜User｜> and <｜Assistant｜>, under an empty one)
    const asIs = identityNormalizer(tokenizer);
    this.cutBefore = tokenTrie(
      added
        .filter((t) => (asIs || !t.normalized) && !t.lstrip && !t.single_word && t.content !== '')
        .map((t) => t.content),
    );
    this.addedMaxLength = added.reduce((n, t) => Math.max(n, t.content.length), 0);
    const bos = this.specialTokens.bos_token;
    this.bosId = typeof bos === 'string' ? (tokenizer.token_to_id(bos) ?? undefined) : undefined;
    this.cacheEntries = options.cacheEntries ?? 50_000;
    if (!Number.isInteger(this.cacheEntries) || this.cacheEntries < 0)
      throw new RangeError(`cacheEntries must be a non-negative integer, got ${options.cacheEntries}`);
    this.cacheBytes = options.cacheBytes ?? DEFAULT_CACHE_BYTES;
    if (!Number.isInteger(this.cacheBytes) || this.cacheBytes < 1)
      throw new RangeError(`cacheBytes must be a positive integer, got ${options.cacheBytes}`);
    // bounded by bytes too: an entry count alone let a few distinct multi-megabyte chats hold
    // gigabytes (a 1 MB chat's segment keeps about 4 MB: its text and one number per token)
    this.segments =
      this.cacheEntries > 0
        ? new LRUCache({
            max: this.cacheEntries,
            maxSize: this.cacheBytes,
            maxEntrySize: Math.max(1, Math.floor(this.cacheBytes / 8)),
            sizeCalculation: segmentBytes,
          })
        : undefined;
  }

  /** Bytes the cached segments take, as the cache counts them (segmentBytes). */
  get cachedBytes(): number {
    return this.segments?.calculatedSize ?? 0;
  }

  /**
   * Loads tokenizer.json and, next to it, tokenizer_config.json (which holds the special
   * tokens and usually the chat template) and chat_template.jinja (which, when present, is
   * the template). `path` is the file or the directory holding them (a Hugging Face model
   * snapshot).
   */
  static load(path: string, options: ChatTokenizerOptions = {}): ChatTokenizer {
    // `--tokenizer`, `--tokenizer (tokenizer config)`; or the part alone
    const named = (part: string) =>
      options.source === undefined ? part : part === 'tokenizer' ? options.source : `${options.source} (${part})`;
    if (!existsSync(path)) throw new RangeError(`${named('tokenizer')}: no such file or directory ${quotedText(path)}`);
    const file = statSync(path).isDirectory() ? join(path, 'tokenizer.json') : path;
    if (!existsSync(file)) throw new RangeError(`${named('tokenizer')}: ${quotedText(file)} does not exist`);
    const configFile = join(dirname(file), 'tokenizer_config.json');
    const jinjaFile = join(dirname(file), 'chat_template.jinja');
    const tokenizerJson = readJson(file, named('tokenizer'), MAX_TOKENIZER_JSON_BYTES);
    const config = existsSync(configFile)
      ? readJson(configFile, named('tokenizer config'), MAX_TOKENIZER_CONFIG_BYTES)
      : {};
    let tokenizer: Tokenizer;
    try {
      tokenizer = new Tokenizer(tokenizerJson, config);
    } catch (err) {
      throw new RangeError(
        `${named('tokenizer')}: ${quotedText(file)} is not a tokenizer this library reads: ${escapedText((err as Error).message)}`,
        {
          cause: err,
        },
      );
    }
    const given = options.chatTemplate !== undefined;
    const fromFile = !given && existsSync(jinjaFile);
    const chatTemplate =
      options.chatTemplate ??
      (fromFile ? readText(jinjaFile, named('chat template'), MAX_CHAT_TEMPLATE_BYTES) : undefined);
    // a template that does not compile is named where it came from
    const chatTemplateSource = given
      ? options.chatTemplateSource
      : fromFile
        ? `${named('chat template')} ${quotedText(jinjaFile)}`
        : `${named('tokenizer config')} ${quotedText(configFile)} (chat_template)`;
    return new ChatTokenizer(tokenizer, config, { ...options, chatTemplate, chatTemplateSource });
  }

  tokenize(request: RouteRequest, addSpecialTokens = true): number[] {
    if (request.tokens) return Array.from(request.tokens);
    if (request.messages) return this.tokenizeChat(request.messages);
    return this.encodeText(request.text ?? '', addSpecialTokens);
  }

  /** A text's ids, with the special tokens around them as transformers 4 puts them when `addSpecialTokens`. */
  private encodeText(text: string, addSpecialTokens: boolean): number[] {
    if (!addSpecialTokens || this.classSpecials === undefined)
      return this.tokenizer.encode(text, { add_special_tokens: addSpecialTokens }).ids;
    const { before, after } = this.classSpecials;
    return [...before, ...this.tokenizer.encode(text, { add_special_tokens: false }).ids, ...after];
  }

  /** Token ids of a chat as the engine renders it (with the generation prompt). */
  tokenizeChat(messages: readonly ChatMessage[]): number[] {
    return this.tokenizeChatRequest({ messages });
  }

  /** Token ids of a chat request (messages, tools, template options) as vLLM computes them. */
  tokenizeChatRequest(request: ChatTemplateRequest): number[] {
    if (!this.template) throw new RangeError('the tokenizer has no chat template (give one with --chat-template)');
    // the messages as the request's JSON text gave them, when the gateway passes it: their
    // numbers (tool-call arguments, a developer message's tools) as Python reads them
    const messages =
      request.messagesJson !== undefined
        ? (parseLosslessJson(request.messagesJson, MAX_JSON_DEPTH) as unknown[])
        : request.messages;
    checkChatMessages(messages, (message) => new RangeError(message), false, undefined, true);
    if (this.rendering === 'sglang') return this.tokenizeSglang(request, messages);
    const addGenerationPrompt = request.add_generation_prompt ?? true;
    const continueFinal = request.continue_final_message ?? false;
    if (addGenerationPrompt && continueFinal)
      throw new RangeError('continue_final_message and add_generation_prompt cannot both be true');
    const conversation = messages.map((m, i) => this.message(m, i));
    postprocess(conversation);
    const context = this.context(request);
    const whole = this.renderAll(conversation, context, addGenerationPrompt, continueFinal);
    const key = digest('', {
      tools: context.tools,
      documents: context.documents,
      kwargs: request.chat_template_kwargs ?? null,
      reasoningEffort: context.reasoning_effort ?? null,
    });
    return this.tokenizeRendered(conversation, context, whole, key, continueFinal, request.add_special_tokens === true);
  }

  /**
   * A chat request as SGLang turns it into prompt ids (serving_chat.py
   * OpenAIServingChat._apply_jinja_template, the plain Jinja path): the conversation and the
   * template's variables (sglangConversation), rendered with add_generation_prompt (always:
   * SGLang's request has no such field), retried with the tools' bare functions when the
   * template raises; the text encoded without special tokens when the tokenizer adds them to an
   * empty text (else with them: most add none); a final assistant turn continued
   * (continue_final_message) appended as the tokens of its text alone
   * (_append_assistant_prefix_to_prompt_ids).
   */
  private tokenizeSglang(request: ChatTemplateRequest, messages: readonly unknown[]): number[] {
    const { conversation, context, prefix } = sglangConversation(request, messages, this.partsContent);
    let ctx = { ...this.specialTokens, ...context };
    let whole: string;
    try {
      whole = this.render(conversation, ctx, true);
    } catch (err) {
      // "Some templates (e.g. Mistral) expect tools without the OpenAI wrapper"
      const tools = ctx.tools as Array<Record<string, unknown>> | null;
      if (!tools || tools.length === 0) throw err;
      ctx = { ...ctx, tools: tools.map((t) => ('function' in t ? t.function : t)) };
      whole = this.render(conversation, ctx, true);
    }
    // ctx holds the special tokens already (with what chat_template_kwargs sets over them)
    const key = digest('sglang', ctx);
    const ids = this.tokenizeRendered(conversation, ctx, whole, key, false, !this.specialsOnEmpty);
    if (!prefix) return ids;
    // tokenizer.encode(prefix) with its special tokens, a leading BOS dropped
    const encoded = this.encodeText(prefix, true);
    if (encoded.length > 0 && this.bosId !== undefined && encoded[0] === this.bosId) encoded.shift();
    return [...ids, ...encoded];
  }

  /**
   * The ids of `whole` (the rendering of `conversation` with `context`), from the segment
   * cache where it holds the rendering of a conversation prefix (see the class comment).
   */
  private tokenizeRendered(
    conversation: Record<string, unknown>[],
    context: Record<string, unknown>,
    whole: string,
    firstKey: string,
    continueFinal: boolean,
    addSpecialTokens: boolean,
  ): number[] {
    const out: number[] = [];
    let rendered = '';
    let key = firstKey;
    // the final message is cut open by continue_final_message: it is never a cacheable cut
    const cacheable = continueFinal ? conversation.length - 1 : conversation.length;
    let i = 0;
    for (; i < cacheable; i++) {
      const next = digest(key, conversation[i]);
      const seg = this.segments?.peek(next);
      if (!seg || !whole.startsWith(seg.text, rendered.length)) break;
      // what follows the cached segment may differ from what followed it when it was cut
      if (seg !== NO_CUT && !this.cutsCleanly(whole, rendered.length + seg.text.length)) break;
      this.segments!.get(next); // a use: eviction takes the coldest
      key = next;
      rendered += seg.text;
      for (const t of seg.tokens) out.push(t);
      this.stats.segmentHits++;
    }
    // The messages after the last cached cut. An agent's next request resends this one plus
    // a few new messages, so the cut that pays is at this request's end: the new messages are
    // tried as one segment (one render) and cut one by one only when the template does not
    // render them as a prefix of the whole. The opening message (the system prompt that other
    // conversations share) is cut alone.
    const prefixText = (end: number): string | undefined => {
      let text: string;
      try {
        text = this.render(conversation.slice(0, end), context, false);
      } catch {
        return undefined; // a template that refuses a partial conversation
      }
      return text.startsWith(rendered) && whole.startsWith(text) && this.cutsCleanly(whole, text.length)
        ? text
        : undefined;
    };
    /** Caches messages[from..end) as one segment ending in `text`, the output for messages[0..end). */
    const cut = (from: number, end: number, text: string) => {
      for (let j = from; j < end; j++) {
        key = digest(key, conversation[j]);
        // no cut after a message inside the segment: a lookup passes it on to the cut that follows
        if (this.segments && j < end - 1 && !this.segments.has(key)) {
          this.remember(key, NO_CUT);
          this.stats.segmentsJoined++;
        }
      }
      const segText = text.slice(rendered.length);
      const tokens = this.tokenizer.encode(segText, { add_special_tokens: false }).ids;
      this.remember(key, { text: segText, tokens });
      this.stats.segmentMisses++;
      for (const t of tokens) out.push(t);
      rendered = text;
      i = end;
    };
    if (i === 0 && cacheable > 1) {
      const text = prefixText(1);
      if (text !== undefined) cut(0, 1, text);
    }
    if (i < cacheable - 1) {
      const text = prefixText(cacheable);
      if (text !== undefined) cut(i, cacheable, text);
    }
    // one by one: a message that renders differently when it is the last one (Qwen3's newest
    // assistant turn opens a thinking block; a run of tool results is closed after its last)
    // joins the messages after it, up to a few
    for (let from = i, end = i + 1; end <= cacheable && end - from <= MAX_JOINED_MESSAGES; end++) {
      const text = prefixText(end);
      if (text === undefined) continue;
      cut(from, end, text);
      from = end;
    }
    if (i < cacheable) this.stats.wholeRenders++;
    const rest = whole.slice(rendered.length);
    if (rest.length > 0) for (const t of this.tokenizer.encode(rest, { add_special_tokens: false }).ids) out.push(t);
    if (!addSpecialTokens) return out;
    // vLLM encodes the rendered prompt with the special tokens: the tokenizer's post-processor
    // puts them around the text's ids, wherever the text was cut
    const around = this.specialTokensAround();
    if (around === undefined) return this.encodeText(whole, true);
    return around.before.length === 0 && around.after.length === 0 ? out : [...around.before, ...out, ...around.after];
  }

  /**
   * Whether `text` tokenizes as its two pieces cut at `at` do: an added token (cutBefore) begins
   * at `at` and no added token straddles it, so the tokenizer's own split on its added tokens
   * falls there. A cut inside plain text is refused, however the template ends its messages:
   * pre-tokenization and merges run across it (`.` and `\n\n` are one token to many tokenizers).
   */
  private cutsCleanly(text: string, at: number): boolean {
    if (at <= 0 || at >= text.length) return true;
    // walked along the text in place (tokenTrie): a request's cuts allocate nothing
    if (!beginsAt(this.cutBefore, text, at, 0)) return false;
    for (let start = Math.max(0, at - this.addedMaxLength + 1); start < at; start++)
      if (beginsAt(this.addedTexts, text, start, at - start)) return false;
    return true;
  }

  /** The special tokens the tokenizer's post-processor puts before and after a text's ids, once. */
  private specialTokensAround(): { before: number[]; after: number[] } | undefined {
    if (this.around !== null) return this.around;
    if (this.classSpecials !== undefined) return (this.around = this.classSpecials);
    const plain: number[] = this.tokenizer.encode(PROBE_TEXT, { add_special_tokens: false }).ids;
    const special: number[] = this.tokenizer.encode(PROBE_TEXT, { add_special_tokens: true }).ids;
    let at = -1;
    for (let i = 0; at < 0 && i + plain.length <= special.length; i++)
      if (plain.every((t, j) => special[i + j] === t)) at = i;
    // a post-processor that changes the text's own ids: the whole prompt is encoded each time
    this.around =
      plain.length === 0 || at < 0
        ? undefined
        : { before: special.slice(0, at), after: special.slice(at + plain.length) };
    return this.around;
  }

  /** One message (checked by checkChatMessages) as vLLM passes it to the template. */
  private message(raw: unknown, i: number): Record<string, unknown> {
    const m = raw as Record<string, unknown>;
    const parts: ReadonlyArray<ChatContentPart | string> =
      m.content === null || m.content === undefined
        ? []
        : typeof m.content === 'string'
          ? [m.content]
          : (m.content as ReadonlyArray<ChatContentPart | string>);
    const texts: string[] = [];
    for (const [k, part] of parts.entries()) {
      // a plain string and every text-like part are text to vLLM; one with a null text is skipped
      const text = contentPartText(part);
      if (text === undefined)
        throw new UntokenizableContentError(
          `messages[${i}].content[${k}]: a ${contentPartType(part)} part cannot be tokenized by the router (text parts only)`,
        );
      // vLLM's _parse_chat_message_content_parts keeps a parsed part only when it is truthy: an
      // empty text is dropped where the template takes strings, kept as {type, text: ""} where
      // it takes parts (a non-empty dict)
      if (text !== null && (text !== '' || this.partsContent)) texts.push(text);
    }
    const out: Record<string, unknown> = {
      role: m.role,
      content: this.partsContent ? texts.map((text) => ({ type: 'text', text })) : texts.join('\n'),
    };
    if (m.role === 'assistant') {
      if (m.tool_calls !== undefined && m.tool_calls !== null)
        out.tool_calls = Array.isArray(m.tool_calls) ? copyJson(m.tool_calls) : m.tool_calls;
      // _parse_chat_message_content reads message.get("reasoning") only (at the cited commit
      // a `reasoning_content` the client sends is not read) and passes it under both names
      const reasoning = m.reasoning;
      if (reasoning !== undefined && reasoning !== null) {
        out.reasoning = reasoning;
        out.reasoning_content = reasoning;
      }
    } else if (m.role === 'tool') {
      if (m.tool_call_id !== undefined) out.tool_call_id = m.tool_call_id;
      // a tool message's text parts go back to one string ("\n"-joined) in the openai format
      if (Array.isArray(out.content)) out.content = texts.join('\n');
    }
    if (typeof m.name === 'string') out.name = m.name;
    // DeepSeek V4's task marker, and a developer message's tools (None when it has none)
    if (typeof m.task === 'string') out.task = m.task;
    if (m.role === 'developer') out.tools = m.tools ?? null;
    return out;
  }

  private context(request: ChatTemplateRequest): Record<string, unknown> {
    const ctx: Record<string, unknown> = { ...this.specialTokens };
    const kwargs = request.chat_template_kwargs;
    if (kwargs !== undefined && kwargs !== null) {
      if (typeof kwargs !== 'object' || Array.isArray(kwargs))
        throw new RangeError('chat_template_kwargs must be an object');
      const refused = refusedTemplateKwarg(kwargs);
      if (refused !== undefined)
        throw new RangeError(
          `chat_template_kwargs.${refused} cannot be given: it is an argument of the rendering itself`,
        );
      for (const [k, v] of Object.entries(kwargs)) if (!OVERRIDDEN_KWARGS.has(k)) ctx[k] = v;
    }
    const tools =
      request.toolsJson !== undefined ? parseLosslessJson(request.toolsJson, MAX_JSON_DEPTH) : request.tools;
    ctx.tools = tools === undefined || tools === null ? null : toolsAsVllm(tools as readonly unknown[]);
    ctx.documents = request.documents ?? null;
    // ChatCompletionRequest.build_chat_params passes reasoning_effort to the template when given
    if (typeof request.reasoning_effort === 'string') ctx.reasoning_effort = request.reasoning_effort;
    return ctx;
  }

  private render(
    messages: readonly Record<string, unknown>[],
    context: Record<string, unknown>,
    addGenerationPrompt: boolean,
  ): string {
    try {
      return renderWithPythonNumbers(this.template!.parsed, {
        ...context,
        messages,
        add_generation_prompt: addGenerationPrompt,
      });
    } catch (err) {
      // the template refusing the request (raise_exception: ChatTemplateError) and the bounds this
      // renderer keeps (TemplateBoundError) are answered 400, as vLLM answers a template's error;
      // any other failure is the renderer's (@huggingface/jinja lacks a feature of Python's Jinja2:
      // a filter, `%` formatting, a test with arguments; or fails where Jinja2 does not, such as a
      // negative indent's RangeError), not the client's, and the engine may render the request: it
      // is routed on its text, as media are
      if (err instanceof ChatTemplateError || err instanceof TemplateBoundError) throw err;
      throw new UntokenizableContentError(
        `the chat template could not be rendered here (${err instanceof Error ? err.message : String(err)}): routed on the request's text`,
      );
    }
  }

  /** The whole conversation; with continue_final_message, cut open after the final message's text. */
  private renderAll(
    conversation: Record<string, unknown>[],
    context: Record<string, unknown>,
    addGenerationPrompt: boolean,
    continueFinal: boolean,
  ): string {
    if (!continueFinal) return this.render(conversation, context, addGenerationPrompt);
    if (!this.templateSource!.includes('content'))
      throw new RangeError('continue_final_message: the chat template has no message content to continue');
    const last = { ...conversation[conversation.length - 1] };
    let finalText: string;
    if (typeof last.content === 'string') {
      finalText = last.content;
      last.content += CONTINUE_TAG;
    } else if (Array.isArray(last.content) && last.content.length > 0) {
      const parts = last.content as Array<{ type: string; text: string }>;
      finalText = parts[parts.length - 1].text;
      last.content = [
        ...parts.slice(0, -1),
        { ...parts[parts.length - 1], text: parts[parts.length - 1].text + CONTINUE_TAG },
      ];
    } else throw new RangeError('continue_final_message: the final message has no text to continue');
    const text = this.render([...conversation.slice(0, -1), last], context, addGenerationPrompt);
    const at = text.lastIndexOf(CONTINUE_TAG.trim());
    // transformers refuses a rendering without the tag or without the final text (stripped)
    if (at < 0 || !text.includes(pythonStrip(finalText, undefined, true, true)))
      throw new RangeError('continue_final_message: the chat template drops the final message');
    // a template that keeps spacing: cut at the tag; one that trimmed it: cut and trim (Python's
    // rstrip(), whose whitespace is not JavaScript's trimEnd()'s)
    return text.startsWith(CONTINUE_TAG, at)
      ? text.slice(0, at)
      : pythonStrip(text.slice(0, at), undefined, false, true);
  }

  private remember(key: string, seg: Segment): void {
    this.segments?.set(key, seg);
  }
}

/**
 * How deep the JSON of tool-call arguments (and of the tools) may nest: past Python's json
 * recursion limit, where vLLM would refuse it too.
 */
const MAX_JSON_DEPTH = 1000;

/**
 * vLLM's _postprocess_messages: tool-call arguments given as a JSON string parsed (their
 * numbers as Python reads them, see parseLosslessJson), {} for a string that is not JSON and
 * for arguments that are neither an object nor a list; an empty tool_calls dropped.
 */
function postprocess(conversation: Record<string, unknown>[]): void {
  for (const m of conversation) {
    if (m.role !== 'assistant' || !Array.isArray(m.tool_calls)) continue;
    if (m.tool_calls.length === 0) {
      delete m.tool_calls;
      continue;
    }
    for (const item of m.tool_calls as Array<{ function?: { arguments?: unknown } }>) {
      const fn = item?.function;
      if (!fn || typeof fn !== 'object') continue;
      const args = fn.arguments;
      if (typeof args === 'string') {
        try {
          fn.arguments = parseLosslessJson(args, MAX_JSON_DEPTH);
        } catch (err) {
          // Python's json.loads fails past its recursion limit with a RecursionError, which
          // vLLM does not catch: refused. Any other text that is not JSON (empty, blank,
          // malformed) is a JSONDecodeError, which vLLM turns into {}.
          if (/nested deeper/.test((err as Error).message))
            throw new RangeError("a tool call's arguments nest too deeply", { cause: err });
          fn.arguments = {};
        }
      } else if (!isDictOrList(args)) fn.arguments = {}; // None, a number, a boolean: {} as vLLM
    }
  }
}

/**
 * A copy of parsed JSON (plain objects and arrays) that keeps its JsonNumbers (structuredClone
 * drops their class), its objects' key order and a "__proto__" key as a member (orderedObject).
 */
function copyJson(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(copyJson);
  if (v === null || typeof v !== 'object' || v instanceof JsonNumber) return v;
  return orderedObject(jsonEntries(v).map(([k, x]) => [k, copyJson(x)]));
}

/** A Python dict or list as json.loads makes them (a JsonNumber is a number). */
function isDictOrList(v: unknown): boolean {
  return v !== null && typeof v === 'object' && !(v instanceof JsonNumber);
}

/** Tools as vLLM's ChatCompletionToolsParam.model_dump() gives them to the template. */
function toolsAsVllm(tools: readonly unknown[]): unknown[] {
  if (!Array.isArray(tools)) throw new RangeError('tools must be an array');
  return tools.map((t, i) => {
    const tool = t as Record<string, unknown> | null;
    const fn = tool?.function as Record<string, unknown> | undefined;
    if (!tool || typeof tool !== 'object' || !fn || typeof fn !== 'object' || typeof fn.name !== 'string')
      throw new RangeError(`tools[${i}] must be {type: "function", function: {name, …}}`);
    // the declared fields first, then the others in the request's order (an array-index key too)
    const declared = ['name', 'description', 'parameters'];
    const f = orderedObject([
      ['name', fn.name],
      ['description', fn.description ?? null],
      ['parameters', fn.parameters ?? null],
      ...jsonEntries(fn).filter(([k]) => !declared.includes(k)),
    ]);
    return orderedObject([
      ['type', tool.type ?? 'function'],
      ['function', f],
      ...jsonEntries(tool).filter(([k]) => k !== 'type' && k !== 'function'),
    ]);
  });
}

/** A node of @huggingface/jinja's AST, read by its fields. */
interface AstNode {
  type: string;
  [field: string]: unknown;
}

const isAstNode = (v: unknown): v is AstNode =>
  v !== null && typeof v === 'object' && typeof (v as { type?: unknown }).type === 'string';

/** Every node under `root` (itself first), depth first in source order, as jinja2's find_all walks. */
function astNodes(root: AstNode): AstNode[] {
  const out: AstNode[] = [];
  const stack: AstNode[] = [root];
  while (stack.length > 0) {
    const node = stack.pop()!;
    out.push(node);
    const children: AstNode[] = [];
    for (const value of Object.values(node)) {
      if (Array.isArray(value)) for (const item of value) if (isAstNode(item)) children.push(item);
      if (isAstNode(value)) children.push(value);
    }
    for (let i = children.length - 1; i >= 0; i--) stack.push(children[i]);
  }
  return out;
}

/** vLLM's _is_var_access: the variable itself. */
const isVarAccess = (node: AstNode, name: string): boolean => node.type === 'Identifier' && node.value === name;

/** vLLM's _is_attr_access: `name.key` or `name['key']`. */
function isAttrAccess(node: AstNode, name: string, key: string): boolean {
  if (node.type !== 'MemberExpression' || !isAstNode(node.object) || !isVarAccess(node.object, name)) return false;
  const property = node.property as AstNode;
  return node.computed
    ? property.type === 'StringLiteral' && property.value === key
    : property.type === 'Identifier' && property.value === key;
}

/**
 * vLLM's _is_var_or_elems_access: the variable (or its `key` member), through filters
 * (`| selectattr(...)`), tests and slices (`messages[1:]`).
 */
function isVarOrElemsAccess(node: AstNode, name: string, key?: string): boolean {
  if (node.type === 'FilterExpression' || node.type === 'TestExpression')
    return isAstNode(node.operand) && isVarOrElemsAccess(node.operand, name, key);
  if (node.type === 'MemberExpression' && node.computed && (node.property as AstNode).type === 'SliceExpression')
    return isAstNode(node.object) && isVarOrElemsAccess(node.object, name, key);
  return key !== undefined ? isAttrAccess(node, name, key) : isVarAccess(node, name);
}

/** What a for loop iterates over: jinja2 keeps a loop's `if` filter apart from it (For.test). */
const loopIterable = (loop: AstNode): AstNode => {
  const it = loop.iterable as AstNode;
  return it.type === 'SelectExpression' ? (it.lhs as AstNode) : it;
};

/**
 * The chat template's content format, as vLLM's _detect_content_format (vllm/renderers/hf.py)
 * finds it by walking the template's AST: "openai" when a loop iterates over the `content` of a
 * loop variable that iterates over `messages` or a variable set from it
 * (_iter_nodes_assign_var_or_elems, _iter_nodes_assign_messages_item,
 * _iter_nodes_assign_content_item), "string" otherwise. An assignment or loop target that is
 * not a plain name where vLLM asserts one makes it fall back to "string", as vLLM does.
 */
export function detectContentFormat(program: unknown): 'openai' | 'string' {
  try {
    const nodes = astNodes(program as AstNode);
    const loops = nodes.filter((n) => n.type === 'For');
    // messages and the variables set from it, breadth first (a name reached again is not
    // walked again: vLLM guards self-assignment only)
    const messagesNames = ['messages'];
    for (let i = 0; i < messagesNames.length; i++)
      for (const set of nodes)
        if (set.type === 'Set' && isAstNode(set.value) && isVarOrElemsAccess(set.value, messagesNames[i])) {
          const target = set.assignee as AstNode;
          if (target.type !== 'Identifier') throw new TypeError('an assignment target that is not a name');
          if (!messagesNames.includes(target.value as string)) messagesNames.push(target.value as string);
        }
    const messageNames: string[] = [];
    for (const loop of loops)
      if (messagesNames.some((name) => isVarOrElemsAccess(loopIterable(loop), name))) {
        const target = loop.loopvar as AstNode;
        if (target.type !== 'Identifier') throw new TypeError('a loop target that is not a name');
        messageNames.push(target.value as string);
      }
    for (const loop of loops)
      if (messageNames.some((name) => isVarOrElemsAccess(loopIterable(loop), name, 'content'))) {
        if ((loop.loopvar as AstNode).type !== 'Identifier') throw new TypeError('a loop target that is not a name');
        return 'openai';
      }
    return 'string';
  } catch {
    return 'string';
  }
}

// ---------------------------------------------------------------------------------------------
// SGLang's rules (`--chat-rendering sglang`), ported from sgl-project/sglang at commit
// 0b9c38484e78a43bca6419416f170aafb70180bb (python/sglang/srt/entrypoints/openai/serving_chat.py,
// python/sglang/srt/parser/jinja_template_utils.py) with the request and message models of
// python/sglang/srt/entrypoints/openai/protocol.py at 004c82e07d876f6e4a0ad6e15325706b0f478f1a.
// ---------------------------------------------------------------------------------------------

/** protocol.py ChatCompletionMessageGenericParam's roles (lower-cased by its _normalize_role). */
const SGLANG_GENERIC_ROLES = new Set(['system', 'assistant', 'tool', 'function', 'developer', 'latest_reminder']);
/** protocol.py ReasoningEffortTier. */
const SGLANG_EFFORT_TIERS = new Set(['none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max']);
/** apply_chat_template's own arguments that serving_chat.py passes: one in chat_template_kwargs is a TypeError (400). */
const SGLANG_REFUSED_KWARGS = new Set([
  'tokenize',
  'add_generation_prompt',
  'tools',
  'return_dict',
  'conversation',
  'messages',
]);
/** apply_chat_template's arguments a kwarg sets without reaching the template (tokenize=False). */
const SGLANG_CONSUMED_KWARGS = new Set([
  'padding',
  'truncation',
  'max_length',
  'return_tensors',
  'return_assistant_tokens_mask',
  'tokenizer_kwargs',
]);
/** Media parts: SGLang's multimodal processor makes their tokens. */
const SGLANG_MEDIA_PARTS = new Set(['image_url', 'video_url', 'audio_url']);

const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof JsonNumber);

/**
 * The chat template's content format as SGLang's detect_jinja_template_content_format
 * (jinja_template_utils.py) finds it: "openai" when the template's text names image, audio,
 * video or vision anywhere, or a loop iterates over `message.content`, `msg.content` or
 * `m.content` (through filters, tests and slices); "string" otherwise. Unlike vLLM it does not
 * follow the variables a template sets from `messages`.
 */
export function detectSglangContentFormat(source: string, program: unknown): 'openai' | 'string' {
  if (['image', 'audio', 'video', 'vision'].some((k) => source.includes(k))) return 'openai';
  try {
    for (const node of astNodes(program as AstNode))
      if (
        node.type === 'For' &&
        ['message', 'msg', 'm'].some((v) => isVarOrElemsAccess(loopIterable(node), v, 'content'))
      )
        return 'openai';
  } catch {
    // _try_extract_ast / the walk failing: "string"
  }
  return 'string';
}

/** protocol.py Tool.model_dump(): declared fields in order, unknown ones dropped. */
function sglangTool(t: unknown, where: string): Record<string, unknown> {
  const fn = isPlainObject(t) ? t.function : undefined;
  if (!isPlainObject(t) || !isPlainObject(fn) || typeof fn.name !== 'string')
    throw new RangeError(`${where} must be {type: "function", function: {name, …}}`);
  const toolDefer = t.defer_loading ?? null;
  const f: Record<string, unknown> = {
    description: fn.description ?? null,
    name: fn.name,
    parameters: fn.parameters ?? null,
    strict: fn.strict ?? false,
  };
  // Function's serializer drops defer_loading when None; Tool's validator copies its own down
  const fnDefer = fn.defer_loading ?? toolDefer;
  if (fnDefer !== null) f.defer_loading = fnDefer;
  return { type: t.type ?? 'function', function: f, defer_loading: toolDefer };
}

/**
 * One message as SGLang hands it to the template: the message model's model_dump() (a user
 * message keeps role and content; any other role role, content, tool_call_id, name,
 * reasoning_content, tool_calls and tools: other fields, `reasoning` among them, dropped), its
 * tool-call arguments parsed (normalize_assistant_tool_call_arguments), content null made "",
 * then process_content_for_template_format: fields that are None dropped; a list of parts
 * becomes, for a "string" template, its text parts joined with " " (empty ones kept, "" for
 * none), for an "openai" one its text parts as {type, text} (a tool message's joined back with
 * " " by normalize_tool_content). Thinking parts reach neither.
 */
function sglangMessage(raw: unknown, i: number, partsContent: boolean): Record<string, unknown> {
  const m = raw as Record<string, unknown>;
  const role = String(m.role);
  const generic = SGLANG_GENERIC_ROLES.has(role.toLowerCase());
  if (!generic && role !== 'user')
    throw new RangeError(`messages[${i}].role: SGLang takes no role ${quotedText(role)}`);
  const dump: Record<string, unknown> = { role: generic ? role.toLowerCase() : role, content: m.content ?? null };
  if (generic) {
    for (const k of ['tool_call_id', 'name', 'reasoning_content'])
      if (m[k] !== undefined && m[k] !== null) {
        if (typeof m[k] !== 'string') throw new RangeError(`messages[${i}].${k} must be a string`);
        dump[k] = m[k];
      }
    if (m.tool_calls !== undefined && m.tool_calls !== null) {
      if (!Array.isArray(m.tool_calls)) throw new RangeError(`messages[${i}].tool_calls must be a list`);
      dump.tool_calls = m.tool_calls.map((c, j) => sglangToolCall(c, `messages[${i}].tool_calls[${j}]`, role));
    }
    if (m.tools !== undefined && m.tools !== null) {
      if (!Array.isArray(m.tools)) throw new RangeError(`messages[${i}].tools must be a list`);
      dump.tools = m.tools.map((t, j) => sglangTool(t, `messages[${i}].tools[${j}]`));
    }
  }
  if (dump.content === null) dump.content = '';
  if (typeof dump.content === 'string') return dump;
  if (!Array.isArray(dump.content)) throw new RangeError(`messages[${i}].content must be a string or a list of parts`);
  const texts: string[] = [];
  const parts: Record<string, unknown>[] = [];
  for (const [k, part] of (dump.content as unknown[]).entries()) {
    const where = `messages[${i}].content[${k}]`;
    const p = (isPlainObject(part) ? part : {}) as Record<string, unknown>;
    const type = p.type;
    if (type === 'text') {
      if (typeof p.text !== 'string') throw new RangeError(`${where}.text must be a string`);
      texts.push(p.text);
      parts.push({ type: 'text', text: p.text });
    } else if (type === 'thinking' || type === 'reasoning') {
      if (role !== 'assistant')
        throw new RangeError(`${where}: thinking content parts are only valid in assistant messages`);
    } else if (type === 'tool_reference') {
      if (typeof p.name !== 'string') throw new RangeError(`${where}.name must be a string`);
      parts.push({ type: 'tool_reference', name: p.name });
    } else if (typeof type === 'string' && SGLANG_MEDIA_PARTS.has(type))
      throw new UntokenizableContentError(
        `${where}: a ${type} part cannot be tokenized by the router (text parts only)`,
      );
    else
      throw new RangeError(
        `${where}: SGLang takes text, thinking, image_url, video_url, audio_url and tool_reference parts, not ${typeof type === 'string' ? quotedText(type) : 'this'}`,
      );
  }
  if (!partsContent) dump.content = texts.join(' ');
  else if (role === 'tool' && parts.every((p) => p.type === 'text')) dump.content = texts.join(' ');
  else dump.content = parts;
  return dump;
}

/**
 * protocol.py ToolCall.model_dump() ({id, index, type, function: {name, arguments}}, None kept
 * inside), then serving_chat.py parse_tool_call_arguments: arguments given as a string must be
 * a JSON object (else SGLang answers 400); arguments given as an object are kept.
 */
function sglangToolCall(c: unknown, where: string, role: string): Record<string, unknown> {
  if (!isPlainObject(c) || !isPlainObject(c.function))
    throw new RangeError(`${where} must be {function: {name, arguments}}`);
  const fn = c.function;
  let args: unknown = fn.arguments ?? null;
  if (typeof args === 'string' && role === 'assistant') {
    try {
      args = parseLosslessJson(args, MAX_JSON_DEPTH);
    } catch (err) {
      throw new RangeError(`${where}.function.arguments must be valid JSON`, { cause: err });
    }
    if (!isPlainObject(args)) throw new RangeError(`${where}.function.arguments must be a JSON object`);
  } else if (args !== null && typeof args !== 'string' && !isPlainObject(args))
    throw new RangeError(`${where}.function.arguments must be a string or an object`);
  return {
    id: c.id ?? null,
    index: c.index ?? null,
    type: 'function',
    function: { name: fn.name ?? null, arguments: args },
  };
}

/**
 * A chat request as SGLang's OpenAIServingChat turns it into a conversation and template
 * variables (the Jinja path of _process_messages and _apply_jinja_template):
 *
 * - reasoning: protocol.py ChatCompletionRequest.normalize_reasoning_inputs reads `reasoning`
 *   ({effort | reasoning_effort, enabled | enable}) and, when an effort or `enabled` is given,
 *   sets chat_template_kwargs' `thinking` and `enable_thinking` unless given (false for effort
 *   "none"); _convert_to_internal_request then takes chat_template_kwargs.reasoning_effort
 *   over the request's; the template gets reasoning_effort, then every kwarg;
 * - tools: only when the request's tools, or a system/developer message's, are not empty and
 *   tool_choice (default "none" without any, else "auto") is not "none": the request's tools
 *   as Tool.model_dump() gives them (for a named tool_choice, that tool only);
 * - messages: sglangMessage each; then _handle_last_assistant_message: a final assistant
 *   message with string content is taken out and its text continued (continue_final_message)
 *   or becomes a user message of that text alone.
 */
function sglangConversation(
  request: ChatTemplateRequest,
  messages: readonly unknown[],
  partsContent: boolean,
): { conversation: Record<string, unknown>[]; context: Record<string, unknown>; prefix: string | undefined } {
  const given = request.chat_template_kwargs;
  if (given !== undefined && given !== null && !isPlainObject(given))
    throw new RangeError('chat_template_kwargs must be an object');
  let kwargs: Record<string, unknown> | undefined = given ? { ...given } : undefined;
  let effort: unknown = request.reasoning_effort ?? null;
  if (typeof effort === 'boolean') throw new RangeError('reasoning_effort must not be a boolean');
  let thinking: boolean | undefined;
  const r = request.reasoning;
  if (isPlainObject(r)) {
    const e = r.effort ?? r.reasoning_effort ?? null;
    if (typeof e === 'string' && SGLANG_EFFORT_TIERS.has(e)) effort = e;
    else if (typeof e === 'number' || e instanceof JsonNumber) effort = Number(e);
    else if (typeof e === 'string') {
      const n = e.trim() === '' ? NaN : Number(e);
      if (Number.isNaN(n)) throw new RangeError(`reasoning.effort: invalid reasoning effort ${quotedText(e)}`);
      effort = n;
    } else if (e !== null) throw new RangeError('reasoning.effort: invalid reasoning effort');
    let enabled = r.enabled !== undefined && r.enabled !== null ? r.enabled : (r.enable ?? false);
    if (typeof enabled === 'string') enabled = ['1', 'true', 'yes', 'y', 'on'].includes(enabled.trim().toLowerCase());
    if (enabled) thinking = true;
  }
  if (effort !== null) {
    if (
      typeof effort === 'string'
        ? !SGLANG_EFFORT_TIERS.has(effort)
        : !(typeof effort === 'number' && effort >= 0 && effort <= 0.99)
    )
      throw new RangeError(
        'reasoning_effort must be none, minimal, low, medium, high, xhigh, max or a number from 0 to 0.99',
      );
    thinking = effort !== 'none';
  }
  if (thinking !== undefined) {
    kwargs ??= {};
    if (!('thinking' in kwargs)) kwargs.thinking = thinking;
    if (!('enable_thinking' in kwargs)) kwargs.enable_thinking = thinking;
  }
  if (kwargs && 'reasoning_effort' in kwargs) {
    const e = kwargs.reasoning_effort;
    delete kwargs.reasoning_effort;
    if (e !== null && e !== undefined) effort = e;
  }
  const context: Record<string, unknown> = { documents: null };
  if (effort !== null) context.reasoning_effort = effort;
  for (const [k, v] of Object.entries(kwargs ?? {})) {
    if (SGLANG_REFUSED_KWARGS.has(k))
      throw new RangeError(`chat_template_kwargs.${k} cannot be given: it is an argument of the rendering itself`);
    if (k === 'chat_template' || k === 'continue_final_message')
      throw new UntokenizableContentError(
        `chat_template_kwargs.${k} changes the rendering in ways the router does not follow`,
      );
    if (SGLANG_CONSUMED_KWARGS.has(k)) continue;
    context[k] = v;
  }

  const tools =
    request.toolsJson !== undefined ? parseLosslessJson(request.toolsJson, MAX_JSON_DEPTH) : (request.tools ?? null);
  if (tools !== null && !Array.isArray(tools)) throw new RangeError('tools must be an array');
  const messageTools = messages.some((m) => {
    const x = m as Record<string, unknown>;
    return (
      typeof x.role === 'string' &&
      ['system', 'developer'].includes(x.role.toLowerCase()) &&
      Array.isArray(x.tools) &&
      x.tools.length > 0
    );
  });
  const choice = request.tool_choice ?? (tools === null && !messageTools ? 'none' : 'auto');
  const dumped = (tools ?? []).map((t, j) => sglangTool(t, `tools[${j}]`));
  context.tools = null;
  if ((dumped.length > 0 || messageTools) && choice !== 'none') {
    if (isPlainObject(choice)) {
      const name = isPlainObject(choice.function) ? choice.function.name : undefined;
      const chosen = dumped.filter((t) => (t.function as { name: string }).name === name);
      context.tools = chosen.length > 0 ? chosen : null;
    } else if (typeof choice === 'string' && ['auto', 'required'].includes(choice)) {
      if (dumped.length > 0) context.tools = dumped;
    } else throw new RangeError('tool_choice must be none, auto, required or {type: "function", function: {name}}');
  }

  let conversation = messages.map((m, i) => sglangMessage(m, i, partsContent));
  let prefix: string | undefined;
  const last = conversation[conversation.length - 1];
  if (last?.role === 'assistant' && typeof last.content === 'string') {
    if (request.continue_final_message === true) {
      prefix = last.content;
      conversation = conversation.slice(0, -1);
    } else conversation[conversation.length - 1] = { role: 'user', content: last.content };
  }
  return { conversation, context, prefix };
}

function templateOf(config: Record<string, unknown>): string | undefined {
  const t = config.chat_template;
  if (typeof t === 'string') return t;
  // newer configs: a list of named templates; the default one is what vLLM uses
  if (Array.isArray(t)) {
    const named = t as Array<{ name?: string; template?: string }>;
    return (named.find((x) => x.name === 'default') ?? named[0])?.template;
  }
  return undefined;
}

/** Digest of the previous key and one message: keys a conversation prefix without keeping its text. */
function digest(previous: string, message: unknown): string {
  return createHash('sha256').update(previous).update('\u0000').update(JSON.stringify(message)).digest('base64');
}

function readJson(file: string, what: string, maxBytes: number): Record<string, unknown> {
  const text = readText(file, what, maxBytes);
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch (err) {
    // JSON.parse's message quotes the text: of a binary file, bytes a terminal would act on
    throw new RangeError(`${what}: cannot read ${quotedText(file)}: ${escapedText((err as Error).message)}`, {
      cause: err,
    });
  }
}

/** A file of the model's as text, bounded (see bounded-file.ts); RangeError naming `what` and the file. */
function readText(file: string, what: string, maxBytes: number): string {
  try {
    return readRegularFile(file, maxBytes);
  } catch (err) {
    throw new RangeError(`${what}: cannot read ${quotedText(file)}: ${fileErrorMessage(err, file)}`, { cause: err });
  }
}

/**
 * A Jinja template compiled, or a RangeError naming `source` with the parser's first line: a
 * template that does not parse (or nests past the stack) stops the command with a message,
 * not a stack trace.
 */
function compileTemplate(text: string, source = 'chat template'): Template {
  try {
    return new Template(text);
  } catch (err) {
    const message =
      err instanceof RangeError && /call stack/i.test(err.message)
        ? 'nested too deeply'
        : String((err as Error).message ?? err);
    throw new RangeError(
      `${source}: the chat template does not compile: ${escapedText(message.split('\n')[0].slice(0, 300))}`,
      {
        cause: err,
      },
    );
  }
}

/** A trie of added tokens' texts by UTF-16 unit: `ends` where a token's text ends. */
interface TokenTrie {
  readonly next: Map<number, TokenTrie>;
  ends: boolean;
}

/** The trie of `texts` (none empty). */
function tokenTrie(texts: readonly string[]): TokenTrie {
  const root: TokenTrie = { next: new Map(), ends: false };
  for (const t of texts) {
    let node = root;
    for (let i = 0; i < t.length; i++) {
      let child = node.next.get(t.charCodeAt(i));
      if (child === undefined) node.next.set(t.charCodeAt(i), (child = { next: new Map(), ends: false }));
      node = child;
    }
    if (node !== root) node.ends = true;
  }
  return root;
}

/**
 * Whether a token of `trie` longer than `past` units occurs in `text` at `at`: one walk along
 * the text, as far as some token's text goes on matching it, nothing allocated (tokens that share
 * a long prefix, as DeepSeek-V3's 800 `<｜place▁holder▁no▁N｜>` do, cost that prefix once).
 */
function beginsAt(trie: TokenTrie, text: string, at: number, past: number): boolean {
  let node: TokenTrie | undefined = trie;
  for (let i = at; i < text.length; i++) {
    node = node.next.get(text.charCodeAt(i));
    if (node === undefined) return false;
    if (node.ends && i - at + 1 > past) return true;
  }
  return false;
}
