import { createHash } from 'node:crypto';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import type { ChatMessage } from '../core/hashing.js';
import type { RouteRequest } from '../core/router/index.js';

/** Turns a request into the token ids the engine will see (`--tokenize tokenizer`). */
export interface PromptTokenizer {
  tokenize(request: RouteRequest): number[];
}

export interface ChatTokenizerOptions {
  /** A Jinja chat template overriding tokenizer_config.json's `chat_template`. */
  chatTemplate?: string;
  /** Cached message segments, least recently used dropped first (default 50,000). */
  cacheEntries?: number;
}

export interface ChatTokenizerStats {
  /** Messages whose tokens came from the cache. */
  segmentHits: number;
  /** Messages rendered and tokenized. */
  segmentMisses: number;
  /** Conversations whose template output was not prefix-stable: tokenized whole, not cached. */
  wholeRenders: number;
}

interface Segment {
  /** The template's output for this message, after the previous messages' output. */
  text: string;
  tokens: number[];
}

/**
 * The model's own tokenizer (tokenizer.json, @huggingface/tokenizers) and chat template
 * (@huggingface/jinja), as vLLM applies them: a chat is rendered with the template and
 * tokenized without adding special tokens (the template has them); a completions prompt is
 * tokenized with them.
 *
 * Multi-turn requests resend the whole conversation, so re-rendering and re-tokenizing it every
 * turn would cost O(turns²). Instead the template's output is cut at message boundaries — the
 * output for messages[0..i] minus that for messages[0..i-1] — and each cut is tokenized alone
 * and cached under a digest of the messages up to it. Cutting there gives the same ids as
 * tokenizing the whole text because chat templates end each message with a special token or a
 * newline that pre-tokenization splits on anyway (checked against whole-text tokenization in
 * the tests). A template whose output for a prefix is not a prefix of the whole (one that
 * counts messages, say) is detected, and such a conversation is tokenized whole.
 */
export class ChatTokenizer implements PromptTokenizer {
  readonly stats: ChatTokenizerStats = { segmentHits: 0, segmentMisses: 0, wholeRenders: 0 };
  private readonly template: Template | undefined;
  private readonly specialTokens: Record<string, string>;
  private readonly segments = new Map<string, Segment>();
  private readonly cacheEntries: number;

  constructor(
    private readonly tokenizer: Tokenizer,
    config: Record<string, unknown>,
    options: ChatTokenizerOptions = {},
  ) {
    const source = options.chatTemplate ?? templateOf(config);
    this.template = source === undefined ? undefined : new Template(source);
    this.specialTokens = {};
    for (const key of ['bos_token', 'eos_token', 'pad_token', 'unk_token']) {
      const v = config[key];
      const content = typeof v === 'string' ? v : v && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string' ? (v as { content: string }).content : undefined;
      if (content !== undefined) this.specialTokens[key] = content;
    }
    this.cacheEntries = options.cacheEntries ?? 50_000;
    if (!Number.isInteger(this.cacheEntries) || this.cacheEntries < 0) throw new RangeError(`cacheEntries must be a non-negative integer, got ${options.cacheEntries}`);
  }

  /**
   * Loads tokenizer.json and, next to it, tokenizer_config.json (which holds the chat template
   * and special tokens). `path` is the file or the directory holding both (a Hugging Face
   * model snapshot).
   */
  static load(path: string, options: ChatTokenizerOptions = {}): ChatTokenizer {
    if (!existsSync(path)) throw new RangeError(`tokenizer: no such file or directory '${path}'`);
    const file = statSync(path).isDirectory() ? join(path, 'tokenizer.json') : path;
    if (!existsSync(file)) throw new RangeError(`tokenizer: '${file}' does not exist`);
    const configFile = join(dirname(file), 'tokenizer_config.json');
    const tokenizerJson = readJson(file, 'tokenizer');
    const config = existsSync(configFile) ? readJson(configFile, 'tokenizer config') : {};
    let tokenizer: Tokenizer;
    try {
      tokenizer = new Tokenizer(tokenizerJson, config);
    } catch (err) {
      throw new RangeError(`tokenizer: '${file}' is not a tokenizer this library reads: ${(err as Error).message}`);
    }
    return new ChatTokenizer(tokenizer, config, options);
  }

  tokenize(request: RouteRequest): number[] {
    if (request.tokens) return Array.from(request.tokens);
    if (request.messages) return this.tokenizeChat(request.messages);
    return this.tokenizer.encode(request.text ?? '', { add_special_tokens: true }).ids;
  }

  /** Token ids of a chat as the engine renders it (with the generation prompt). */
  tokenizeChat(messages: readonly ChatMessage[]): number[] {
    if (!this.template) throw new RangeError('the tokenizer has no chat template (give one with --chat-template)');
    const out: number[] = [];
    let rendered = '';
    let key = '';
    let i = 0;
    // the longest cached run of leading messages
    for (; i < messages.length; i++) {
      const next = digest(key, messages[i]);
      const seg = this.segments.get(next);
      if (!seg) break;
      this.segments.delete(next); // most recently used last: eviction takes the coldest
      this.segments.set(next, seg);
      key = next;
      rendered += seg.text;
      for (const t of seg.tokens) out.push(t);
      this.stats.segmentHits++;
    }
    for (; i <= messages.length; i++) {
      // i === messages.length: the generation prompt that follows the last message
      const last = i === messages.length;
      const next = last ? `${key}+gen` : digest(key, messages[i]);
      const cached = last ? this.segments.get(next) : undefined;
      if (cached) {
        for (const t of cached.tokens) out.push(t);
        break;
      }
      const text = this.render(messages.slice(0, last ? i : i + 1), last);
      if (!text.startsWith(rendered)) {
        this.stats.wholeRenders++;
        return this.tokenizer.encode(this.render(messages, true), { add_special_tokens: false }).ids;
      }
      const segText = text.slice(rendered.length);
      const tokens = this.tokenizer.encode(segText, { add_special_tokens: false }).ids;
      this.remember(next, { text: segText, tokens });
      if (!last) this.stats.segmentMisses++;
      for (const t of tokens) out.push(t);
      rendered = text;
      key = next;
    }
    return out;
  }

  private render(messages: readonly ChatMessage[], addGenerationPrompt: boolean): string {
    return this.template!.render({ messages, add_generation_prompt: addGenerationPrompt, ...this.specialTokens });
  }

  private remember(key: string, seg: Segment): void {
    if (this.cacheEntries === 0) return;
    if (this.segments.size >= this.cacheEntries) this.segments.delete(this.segments.keys().next().value!);
    this.segments.set(key, seg);
  }
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
function digest(previous: string, message: ChatMessage): string {
  return createHash('sha256').update(previous).update('\u0000').update(JSON.stringify(message)).digest('base64');
}

function readJson(file: string, what: string): Record<string, unknown> {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
  } catch (err) {
    throw new RangeError(`${what}: cannot read '${file}': ${(err as Error).message}`);
  }
}
