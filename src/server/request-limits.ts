/**
 * Limits on everything a client controls in a proxied request, and the checks that enforce
 * them. Pure functions: they read the parsed body and the headers and either return what to
 * route on or throw a RequestLimitError that names the offending field; the gateway answers it
 * as HTTP 400 (`{"error": {"message", "type", "param", "code"}}`). The checks run before
 * anything is hashed or recorded, so a rejected request leaves no trace in the index.
 */
import { z } from 'zod';
import {
  checkChatMessages,
  refusedTemplateKwarg,
  type ChatMessageFault,
  type MediaUrlCheck,
} from '../core/chat-messages.js';
import { memberSourceText } from '../core/lossless-json.js';
import { describeIssue, firstIssue, issueError } from '../core/schema-issues.js';
import type { ChatMessage } from '../core/hashing.js';
import type { ContentAnchor } from '../core/content-anchors.js';
import type { RouteRequest } from '../core/router/index.js';
import { MAX_ID_BYTES, typeName } from '../core/validate.js';
import { DEFAULT_MAX_CONTENT_ANCHORS, MAX_CONTENT_ANCHORS } from '../core/router/options-schema.js';

export interface RequestLimits {
  /**
   * Longest workflow id, agent role, content-anchor id and cache_salt, in UTF-8 bytes. What names
   * something the client chose outside the router — `model`, `user` and the ids an engine keeps
   * a request by (checkEngineKeys) — takes NAME_BYTES_PER_ID_BYTE times as many, and a stop
   * string or SGLang stop pattern STOP_BYTES_PER_ID_BYTE times.
   */
  maxIdBytes: number;
  /** Most content anchors per request. */
  maxAnchors: number;
  /** Deepest nesting of arrays and objects in a JSON body (checked before parsing). */
  maxJsonDepth: number;
  /**
   * Most arrays and objects in a JSON body (counted before parsing): JSON.parse takes about a
   * microsecond for each, so a 16 MiB body of `[1],` would hold the event loop for seconds.
   */
  maxJsonContainers: number;
  /**
   * Most members of any one object in a JSON body (counted before parsing; arrays are not
   * bounded by it). JSON.parse slows down on an object of very many distinct keys: a 16 MiB body
   * that is one object of 1.4 million keys holds the event loop for about 2.7 s, where the same
   * bytes as objects of 4,096 keys each take about 0.5 s. No object of the OpenAI API or of
   * SGLang's `/generate` has thousands of members (`logit_bias` holds at most MAX_BIASED_TOKENS,
   * a tool's JSON schema some hundreds of properties), so the default is 4,096.
   */
  maxJsonObjectMembers: number;
  /**
   * Largest constraint an engine compiles for one request, in UTF-8 bytes: a regex, a grammar or
   * a JSON schema (GRAMMAR_FIELDS, and SGLang's `sampling_params` on `/generate`), a string as it
   * is, an object or list as its compact JSON. The engine compiles it with its grammar backend
   * (xgrammar, outlines, guidance, llguidance) before the request's first token: xgrammar turns a
   * schema into a grammar and precomputes, for each of its states, the tokens of the whole
   * vocabulary it allows; outlines builds a regex's automaton and walks the vocabulary through
   * it. The work and the memory grow with the text (a regex's automaton can grow exponentially
   * with it), they are spent in the engine's process, and the compiled grammars are kept in a
   * cache keyed by the text, so every distinct one a client sends costs again. Without a bound
   * the body size alone (16 MiB) limits it. The default, 64 KiB, holds a JSON schema of several
   * hundred properties, the EBNF grammar of a whole language (JSON's is under 1 KiB, a SQL
   * dialect's tens of KiB) and a regex of any practical use; the router does not judge a regex's
   * complexity, only its size. OpenAI's structured outputs take larger schemas (up to 5,000
   * properties and 120,000 characters of names and enum values): a deployment serving such
   * clients raises it.
   */
  maxGrammarBytes: number;
  /**
   * Most choices a request may ask for: `n` and `best_of`, each a sequence the engine runs.
   * Without it a 30-byte body with `"n": 100000000` reaches the engine: recent vLLM refuses more
   * than VLLM_MAX_N_SEQUENCES (16,384 by default; vllm/sampling_params.py, _verify_args), older
   * vLLM only n < 1, and SGLang's SamplingParams.verify does not look at n. The default is the
   * OpenAI API's own maximum of `n`, 128, so nothing the OpenAI API accepts is refused.
   */
  maxChoices: number;
  /**
   * Most `stop` strings in a request. The engines check every stop string at every step of
   * generation, and neither bounds their number: vLLM's detokenizer (check_stop_strings in
   * vllm/v1/engine/detokenizer.py) searches the new text for each one; SGLang
   * (schedule_batch.py, Req.check_finished) decodes the output's last stop_str_max_len + 1
   * tokens and searches them and the whole output so far for each one. A 16 MiB body of `"a",`
   * would be four million searches per token, in the engine loop that serves every request. The
   * OpenAI API takes 4; the default, 64, leaves room for the end markers of many chat templates
   * at once. Each stop string is at most STOP_BYTES_PER_ID_BYTE × maxIdBytes UTF-8 bytes (1 KiB
   * by default): a stop string is a marker, as an id is, not content, and SGLang's work per
   * token grows with the longest one (it decodes that many of the output's last tokens at every
   * step, up to the whole output: quadratic in the output's length), as does the text vLLM holds
   * back from a stream (the longest stop string less one character). 1 KiB is past every end
   * marker and stop word in use (`\n\n`, `</s>`, `<|im_end|>`, `Observation:`) and what vLLM's
   * own tests send (tests/detokenizer/test_stop_strings.py: `.`, `group of peo`, `gani`); a
   * deployment that needs more raises maxIdBytes. vLLM's `bad_words` are bounded as stop
   * strings are, and `stop_token_ids` in number (checkBadWords, checkStopTokenIds).
   */
  maxStopSequences: number;
  /**
   * Most log probabilities a request may ask for at each token: `logprobs` (completions),
   * `top_logprobs` (chat), vLLM's `prompt_logprobs` and SGLang's `top_logprobs_num`, each an
   * integer from 0 to it. The engine ranks the whole vocabulary and answers that many
   * alternatives for every token it generates (and, with echo or prompt_logprobs, for every
   * prompt token), so the number multiplies both the work and the answer. vLLM refuses more than its max_logprobs (ModelConfig.max_logprobs in
   * vllm/config/model.py, 20 by default, "the default for the OpenAI Chat Completions API"), or
   * nothing when a server sets it to -1, where a client's -1 asks for the whole vocabulary;
   * SGLang's OpenAI layer hands either field to the engine as top_logprobs_num
   * (python/sglang/srt/entrypoints/openai/serving_completions.py, serving_chat.py). The
   * default, 20, is the OpenAI API's maximum of top_logprobs
   * (https://platform.openai.com/docs/api-reference/chat/create); a client's -1 is refused.
   * SGLang's `token_ids_logprob` (on `/generate`) and vLLM's `logprob_token_ids` (on the OpenAI
   * paths) name the ids to report at each token: at most this many (checkTokenIdsLogprob,
   * checkLogprobTokenIds).
   */
  maxLogprobs: number;
  /**
   * Most prompts in one request: the entries of a completions `prompt` list of strings or of
   * token-id lists (a list of token ids is one prompt) and of vLLM's `prompt_embeds` list,
   * together (vLLM runs both; a string of embeds is one prompt), and of
   * SGLang's `/generate` batch, `text`, `input_ids` (a list of lists) or `input_embeds` (a list of
   * embedding lists); a chat is one prompt. The engine runs every prompt as a request of its own
   * (n times over). SGLang bounds their number by nothing but the body size, and so did vLLM
   * before VLLM_MAX_COMPLETION_PROMPTS (recent vLLM: validate_prompt_list_length in
   * vllm/entrypoints/openai/completion/protocol.py). An engine runs at most max_num_seqs sequences
   * per step: vLLM's default is 256 on GPUs under 70 GiB and on the A100, 1024 on larger ones
   * (EngineArgs._set_default_args in vllm/engine/arg_utils.py, UsageContext.OPENAI_API_SERVER).
   * Beyond that a batch only queues inside the one request, where the router can neither see nor
   * spread it over the workers, so the default is 256: a client with more prompts sends more
   * requests, which the router routes one by one. The count is checked before any element is
   * read, so a long list costs nothing more.
   *
   * The product of prompts and `n` is not bounded apart: each factor has its bound, as every
   * field that multiplies the work has (the stop strings are checked at every token of every
   * sequence, and are bounded alone too), so a request refused always names the one field past
   * its own limit, and an operator lowers either. At the defaults a request holds at most
   * 256 × 128 sequences, a bounded multiple of what one prompt with the OpenAI API's largest `n`
   * may ask.
   */
  maxPrompts: number;
}

export const DEFAULT_REQUEST_LIMITS: Readonly<RequestLimits> = Object.freeze({
  maxIdBytes: 256,
  maxAnchors: DEFAULT_MAX_CONTENT_ANCHORS,
  maxJsonDepth: 64,
  maxJsonContainers: 100_000,
  maxJsonObjectMembers: 4096,
  maxGrammarBytes: 64 * 1024,
  maxChoices: 128,
  maxStopSequences: 64,
  maxLogprobs: 20,
  maxPrompts: 256,
});

/**
 * Bytes a tenant's id or salt has before the client's own: `tenant/<name>/`, with a name of at
 * most 64 characters of [A-Za-z0-9._-] (TENANT_NAME in api-keys.ts).
 */
const TENANT_PREFIX_BYTES = 'tenant/'.length + 64 + '/'.length;

/**
 * The longest id, in UTF-8 bytes, the gateway hands the router (KVAwareRouter's `maxIdBytes`)
 * when it lets ids of `maxIdBytes` through: the router refuses longer ones, and a request the
 * gateway took must not fail there. The longest are made of the client's: a LoRA adapter's
 * name (a `model` or `lora_path`, NAME_BYTES_PER_ID_BYTE × maxIdBytes), a tenant's workflow id,
 * content-anchor id or cache salt (TENANT_PREFIX_BYTES before it), and a /generate prompt's salt
 * with an `extra_key` (a name, NAME_BYTES_PER_ID_BYTE × maxIdBytes), the two spelt as a JSON
 * list in which an escaped character takes at most 6 bytes (`\u0000` for one) and the list's
 * own characters 9 (generateCacheSalt). Held at the router's bound, MAX_ID_BYTES.
 */
export function routerIdBytes(maxIdBytes: number): number {
  const generateSalt = 6 * (NAME_BYTES_PER_ID_BYTE + 1) * maxIdBytes + 9;
  return Math.min(Math.max(generateSalt, maxIdBytes + TENANT_PREFIX_BYTES), MAX_ID_BYTES);
}

/** A stop string's UTF-8 bytes at most, per byte of maxIdBytes (see RequestLimits.maxStopSequences). */
export const STOP_BYTES_PER_ID_BYTE = 4;

/**
 * A name's UTF-8 bytes at most, per byte of maxIdBytes: `model` and `user` (checkName), 1 KiB by
 * default. A model name is a Hugging Face repository id (at most 96 characters: huggingface_hub
 * validate_repo_id refuses longer ones, "max length is 96"), a local path, a
 * `--served-model-name` or a LoRA adapter's name (vLLM's `--lora-modules name=path`, SGLang's
 * `--lora-paths name=path`, or SGLang's `base-model:adapter` form), all far shorter; the OpenAI API's `user` is an end user's id or a hash of one. Without a bound a 16 MiB
 * model name would be looked up in every worker's model list, keyed into the index as a LoRA
 * name and hashed, for one request.
 */
export const NAME_BYTES_PER_ID_BYTE = 4;

/**
 * The longest SGLang `custom_logit_processor`, in UTF-8 bytes: 64 KiB. It is a serialized
 * class, `{"callable": "<hex>"}` where the hex is dill.dumps of the class, two characters a byte
 * (CustomLogitProcessor.to_str, python/sglang/srt/sampling/custom_logit_processor.py): 64 KiB
 * holds 32 KiB of pickled code, room for a processor of many methods (the ones SGLang ships have
 * a few each). The engine unpickles it through `_cache_from_str`, an lru_cache with maxsize=None
 * keyed by the string, so every distinct string a client sends stays in the engine's memory
 * with the class it makes, for the engine's lifetime: without a bound, up to a whole body per
 * request. A callable is not an id, so the bound does not follow maxIdBytes. The field is
 * removed from what is forwarded unless the operator keeps it (CLIENT_CODE_FIELDS); it is
 * bounded either way.
 */
export const CUSTOM_LOGIT_PROCESSOR_BYTES = 64 * 1024;

/**
 * The most tokens a request may single out: entries of `logit_bias` (vLLM and SGLang, at the top
 * level of the OpenAI paths and in `/generate`'s `sampling_params`) and ids of vLLM's
 * `allowed_token_ids`: 1,024. The OpenAI API documents each bias's range (-100 to 100), not their
 * number; vLLM checks each id against the vocabulary (a bound of the vocabulary's size would pass
 * a hundred thousand) and neither engine bounds the count. The work is the engine's, in the loop
 * that serves every request: vLLM's LogitBiasLogitsProcessor (vllm/v1/sample/logits_processor/
 * builtin.py) rebuilds flat Python lists of every running request's entries whenever a biased
 * request joins, leaves or moves in the batch, and adds them all to the logits at every step;
 * SGLang writes each entry into a batch × vocabulary tensor on the device, one element (one
 * write) at a time in Python, whenever it forms a batch (SamplingBatchInfo.from_schedule_batch in
 * python/sglang/srt/sampling/sampling_batch_info.py), and checks each key against the vocabulary
 * in SamplingParams.verify. `allowed_token_ids`, vLLM's list of the only tokens a
 * request may produce, is what an OpenAI client says with a bias of 100 on each: vLLM checks
 * every id in Python and scatters them into a vocabulary mask when the request joins the batch.
 * Banning or favouring words, each a few tokens in each of its spellings, and classifying by a
 * few label tokens need tens or hundreds; a constraint over more tokens than that (a script, a
 * format) is what a grammar or regex says, bounded by RequestLimits.maxGrammarBytes, and what
 * the engine compiles to the same kind of mask. Like CUSTOM_LOGIT_PROCESSOR_BYTES, a fixed bound.
 */
export const MAX_BIASED_TOKENS = 1024;

/**
 * Top-level fields of the OpenAI paths that carry a constraint the engine compiles, bounded by
 * RequestLimits.maxGrammarBytes (checkGrammar):
 *
 * - vLLM's `structured_outputs` (StructuredOutputsParams in vllm/sampling_params.py: `json`,
 *   `regex`, `choice`, `grammar`, `structural_tag`, `whitespace_pattern`), measured whole, and
 *   the fields it replaced in older vLLM (vllm/entrypoints/openai/protocol.py): `guided_json` (a
 *   schema, as text or an object), `guided_regex`, `guided_choice` (a list of strings, compiled
 *   to one pattern), `guided_grammar` (EBNF or Lark), `guided_whitespace_pattern` (a regex
 *   compiled into the JSON grammar) and chat's `structural_tag`;
 * - `response_format` (both engines, as the OpenAI API: `json_schema`'s schema, or SGLang's and
 *   vLLM's `structural_tag` with a schema per structure), measured whole;
 * - SGLang's `regex` and `ebnf` (chat and completions) and completions' `json_schema` (a schema's
 *   text), python/sglang/srt/entrypoints/openai/protocol.py.
 *
 * A field's shape is the engine's to check; its size is bounded whatever the shape. Tools'
 * parameter schemas, which the engines compile too (when `tool_choice` names a tool or is
 * `required`, and SGLang a `strict` tool's under `auto`), are bounded alike, together
 * (checkToolGrammars).
 */
export const GRAMMAR_FIELDS: readonly string[] = [
  'structured_outputs',
  'guided_json',
  'guided_regex',
  'guided_choice',
  'guided_grammar',
  'guided_whitespace_pattern',
  'structural_tag',
  'response_format',
  'regex',
  'ebnf',
  'json_schema',
];

/**
 * The deepest JSON body an operator may allow (--max-json-depth). Every check of a body (its
 * size walk, its finite numbers, a chat's copy for its template) recurses once per level, and
 * Node's stack holds a few thousand such frames: a body nested deeper would end in the stack's
 * RangeError, a 500, not a 400 naming the field. The engines stop sooner: Python's recursion
 * limit is 1000.
 */
export const MAX_JSON_DEPTH = 1000;

/**
 * The limits' types and ranges, declared once: checkRequestLimits parses through it and
 * `serve`'s settings (flags, environment, config file) take their entries from it.
 */
export const REQUEST_LIMITS_SCHEMA = z.strictObject({
  maxIdBytes: z.int().min(1).default(DEFAULT_REQUEST_LIMITS.maxIdBytes),
  maxAnchors: z.int().min(1).max(MAX_CONTENT_ANCHORS).default(DEFAULT_REQUEST_LIMITS.maxAnchors),
  maxJsonDepth: z.int().min(1).max(MAX_JSON_DEPTH).default(DEFAULT_REQUEST_LIMITS.maxJsonDepth),
  maxJsonContainers: z.int().min(1).default(DEFAULT_REQUEST_LIMITS.maxJsonContainers),
  maxJsonObjectMembers: z.int().min(1).default(DEFAULT_REQUEST_LIMITS.maxJsonObjectMembers),
  maxGrammarBytes: z.int().min(1).default(DEFAULT_REQUEST_LIMITS.maxGrammarBytes),
  maxChoices: z.int().min(1).default(DEFAULT_REQUEST_LIMITS.maxChoices),
  maxStopSequences: z.int().min(1).default(DEFAULT_REQUEST_LIMITS.maxStopSequences),
  maxLogprobs: z.int().min(0).default(DEFAULT_REQUEST_LIMITS.maxLogprobs),
  maxPrompts: z.int().min(1).default(DEFAULT_REQUEST_LIMITS.maxPrompts),
});

/** Token ids are unsigned 32-bit integers in every engine the router fronts. */
export const MAX_TOKEN_ID = 0xffffffff;

/** A client error: HTTP `status` (400 unless said), naming the field in `param`. */
export class RequestLimitError extends Error {
  constructor(
    message: string,
    readonly param: string | null,
    readonly status = 400,
  ) {
    super(message);
    this.name = 'RequestLimitError';
  }
}

/**
 * Fills in the defaults and throws unless `limits` are usable (positive integers): a
 * RangeError or TypeError naming the field (`limits.maxAnchors must be >= 1 (got 0)`).
 */
export function checkRequestLimits(limits: Partial<RequestLimits> | undefined): RequestLimits {
  // a limit given as undefined means "not given"
  const given = Object.fromEntries(Object.entries(limits ?? {}).filter(([, v]) => v !== undefined));
  const parsed = REQUEST_LIMITS_SCHEMA.safeParse(given, { error: describeIssue });
  if (!parsed.success) throw issueError(firstIssue(parsed.error.issues), REQUEST_LIMITS_SCHEMA, 'limits');
  return parsed.data;
}

/**
 * The index of the closing quote of the JSON string whose opening quote is at `i` (found with
 * indexOf: the first quote not escaped by an odd run of backslashes), or -1 when it has none.
 */
export function jsonStringEnd(text: string, i: number): number {
  let end = text.indexOf('"', i + 1);
  while (end !== -1) {
    let k = end - 1;
    while (text.charCodeAt(k) === 0x5c) k--;
    if ((end - 1 - k) % 2 === 0) return end;
    end = text.indexOf('"', end + 1);
  }
  return -1;
}

/**
 * The members counted so far of each array or object open during a checkJsonDepth scan, by its
 * depth (1 for the body itself). One array for every scan (a scan is synchronous, so never two
 * at once), grown as a deeper body arrives, never past its maxDepth + 1 entries.
 */
let openMembers = new Int32Array(65);

/** openMembers with room for index `depth` (at most maxDepth), its counts so far kept. */
function growOpenMembers(depth: number, maxDepth: number): Int32Array<ArrayBuffer> {
  const grown = new Int32Array(Math.max(depth + 1, Math.min(maxDepth + 1, openMembers.length * 2)));
  grown.set(openMembers);
  openMembers = grown;
  return grown;
}

/**
 * Throws a RequestLimitError when `text` (a JSON document) nests arrays and objects deeper
 * than `maxDepth`, has more than `maxContainers` of them, or has an object of more than
 * `maxMembers` members. A linear scan that skips strings: it runs before JSON.parse, so a
 * 10,000-deep body is refused without recursion anywhere, a body of millions of `[1]` without
 * the seconds JSON.parse would spend building them, and one object of a million keys without
 * the seconds JSON.parse would spend adding them. A member is counted at its `:` (outside a
 * string, the only place one may stand is between an object's key and its value), against the
 * innermost open object; an array never has one, so its elements are not counted.
 */
export function checkJsonDepth(text: string, maxDepth: number, maxContainers = Infinity, maxMembers = Infinity): void {
  let depth = 0;
  let containers = 0;
  let members = openMembers;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // a string (most of a chat body): skipped to its closing quote
      const end = jsonStringEnd(text, i);
      if (end === -1) return; // unterminated: JSON.parse says so
      i = end;
    } else if (c === 0x3a) {
      // outside any object (before the body's first brace) a ':' is not JSON: JSON.parse says so
      if (depth > 0 && ++members[depth] > maxMembers)
        throw new RequestLimitError(`an object in the body has more than ${maxMembers} members`, 'body');
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > maxDepth) throw new RequestLimitError(`the body nests deeper than ${maxDepth} levels`, 'body');
      if (++containers > maxContainers)
        throw new RequestLimitError(`the body has more than ${maxContainers} arrays and objects`, 'body');
      if (depth >= members.length) members = growOpenMembers(depth, maxDepth);
      members[depth] = 0;
    } else if (c === 0x5d || c === 0x7d) {
      // a bracket closing none: not JSON, JSON.parse says so
      if (--depth < 0) return;
    }
  }
}

/** The limits a JSON body is checked against before it is parsed (a RequestLimits satisfies it). */
export type JsonLimits = Pick<RequestLimits, 'maxJsonDepth' | 'maxJsonContainers' | 'maxJsonObjectMembers'>;

/** JSON.parse behind the depth and size checks; a syntax error is a 400 that does not echo the body. */
export function parseJsonBody(text: string, limits: JsonLimits): unknown {
  checkJsonDepth(text, limits.maxJsonDepth, limits.maxJsonContainers, limits.maxJsonObjectMembers);
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw new RequestLimitError('the body is not valid JSON', 'body');
  }
  const tools = (body as { tools?: unknown } | null)?.tools;
  if (Array.isArray(tools)) bodiesOfMembers.set(tools, text);
  const messages = (body as { messages?: unknown } | null)?.messages;
  if (Array.isArray(messages)) bodiesOfMembers.set(messages, text);
  return body;
}

/**
 * The JSON text of each parsed body that has a `tools` or `messages` array, by the array (which a
 * body copied without some of its fields still holds): the tokenizer reads the tools (and
 * messages whose tool-call arguments are objects) again from it, to render their numbers as vLLM
 * does (JSON.parse turns `0.0` into `0`). The member's own text is found only when asked
 * (toolsSourceText, messagesSourceText): only `--tokenize tokenizer` reads it.
 */
const bodiesOfMembers = new WeakMap<unknown[], string>();

/**
 * The JSON text a body's `messages` array was parsed from (by parseJsonBody), or undefined: the
 * tokenizer reads tool-call arguments given as objects from it, as it reads the tools.
 */
export function messagesSourceText(messages: unknown): string | undefined {
  const text = Array.isArray(messages) ? bodiesOfMembers.get(messages) : undefined;
  return text === undefined ? undefined : memberSourceText(text, 'messages');
}

/** The JSON text a body's `tools` array was parsed from (by parseJsonBody), or undefined. */
export function toolsSourceText(tools: unknown): string | undefined {
  const text = Array.isArray(tools) ? bodiesOfMembers.get(tools) : undefined;
  return text === undefined ? undefined : memberSourceText(text, 'tools');
}

/** The request metadata of docs/architecture.md §5, from the `contextforge` body field or the headers. */
export interface RequestMetadata {
  workflowId?: string;
  workflowStep: number | null;
  agentRole?: string;
  claGroup: number | null;
  contentAnchors?: ContentAnchor[];
  isolate?: true;
}

type Headers = Readonly<Record<string, string | string[] | undefined>>;

/** A non-empty id of at most `maxBytes` UTF-8 bytes. */
export function checkId(value: unknown, param: string, maxBytes: number): string {
  if (typeof value !== 'string') throw new RequestLimitError(`${param} must be a string`, param);
  if (value === '') throw new RequestLimitError(`${param} must not be empty`, param);
  if (longerThanBytes(value, maxBytes)) throw new RequestLimitError(`${param} is longer than ${maxBytes} bytes`, param);
  return value;
}

/**
 * Whether `s` takes more than `maxBytes` bytes in UTF-8. The length is compared first (a UTF-16
 * unit is 1 to 3 UTF-8 bytes), so a short string costs no byte count.
 */
function longerThanBytes(s: string, maxBytes: number): boolean {
  return s.length > maxBytes || (s.length * 3 > maxBytes && Buffer.byteLength(s) > maxBytes);
}

const DECIMAL = /^\d{1,15}$/;

/** What a count that is not one was, for its refusal: a number past 2^53 has lost its digits. */
function shownCount(value: unknown): string {
  if (typeof value === 'number')
    return Number.isInteger(value) && Math.abs(value) > Number.MAX_SAFE_INTEGER
      ? 'a number past 2^53 - 1'
      : String(value);
  const kind = typeName(value);
  return kind === 'null' || kind === 'an array' ? kind : `a ${kind}`;
}

/** A non-negative integer: a JSON number, or (from a header, `x-…`) decimal digits only. */
function checkCount(value: unknown, param: string): number {
  if (typeof value === 'string' && param.startsWith('x-')) {
    // headers: decimal digits only, so "0x10", "1e3" and " 7" are refused, not read as numbers
    if (!DECIMAL.test(value))
      throw new RequestLimitError(`${param} must be a non-negative decimal integer of at most 15 digits`, param);
    return Number(value);
  }
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0)
    throw new RequestLimitError(
      `${param} must be a non-negative integer of at most 2^53 - 1, got ${shownCount(value)}`,
      param,
    );
  return value;
}

function header(h: Headers, name: string): string | undefined {
  const v = h[name];
  // an empty header is how many clients write "not set"
  if (v === undefined || v === '') return undefined;
  // a repeated metadata header is ambiguous: refuse it rather than pick one
  if (typeof v !== 'string') throw new RequestLimitError(`${name} must be given once`, name);
  return v;
}

const META_KEYS = new Set(['workflowId', 'workflowStep', 'agentRole', 'claGroup', 'anchors', 'isolate']);
/**
 * The snake_case spellings of the metadata fields, as the trace format and the seed spell them
 * (`workflow_id`, `cla_group`): each read as its camelCase field, named as the client wrote it.
 */
const META_SNAKE_KEYS: ReadonlyMap<string, string> = new Map([
  ['workflow_id', 'workflowId'],
  ['workflow_step', 'workflowStep'],
  ['agent_role', 'agentRole'],
  ['cla_group', 'claGroup'],
]);
/** The body's metadata fields by their camelCase names, and the spelling the client gave each (for errors). */
interface MetaFields {
  fields: Readonly<Record<string, unknown>>;
  named: ReadonlyMap<string, string>;
}
const NO_META: MetaFields = { fields: Object.freeze({}), named: new Map() };

/** The `contextforge` object's fields (MetaFields); a field given in both spellings or an unknown one is refused. */
function metaFields(given: Record<string, unknown>): MetaFields {
  const fields: Record<string, unknown> = {};
  const named = new Map<string, string>();
  for (const key of Object.keys(given)) {
    const field = META_KEYS.has(key) ? key : META_SNAKE_KEYS.get(key);
    if (field !== undefined) {
      const other = named.get(field);
      if (other !== undefined)
        throw new RequestLimitError(
          `contextforge.${key} and contextforge.${other} are one field given twice`,
          `contextforge.${key}`,
        );
      named.set(field, key);
      fields[field] = given[key];
      continue;
    }
    const known = `${[...META_KEYS].join(', ')}; or ${[...META_SNAKE_KEYS.keys()].join(', ')}`;
    // a typo of a field is named; anything else (a long or unprintable key) is not repeated
    if (FIELD_NAME.test(key))
      throw new RequestLimitError(`contextforge.${key} is not a known field (known: ${known})`, `contextforge.${key}`);
    throw new RequestLimitError(`contextforge has an unknown field (known: ${known})`, 'contextforge');
  }
  return { fields, named };
}
/** What a misspelt metadata field looks like: short, letters, digits and `_-.` (repeated in an error). */
const FIELD_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

/**
 * Reads and checks the metadata: the body field `contextforge` (an object; its fields win)
 * or the headers. Throws a RequestLimitError naming the field (`contextforge.workflowId`,
 * `x-workflow-step`, …).
 */
export function readMetadata(meta: unknown, headers: Headers, limits: RequestLimits): RequestMetadata {
  if (meta !== undefined && (meta === null || typeof meta !== 'object' || Array.isArray(meta)))
    throw new RequestLimitError('contextforge must be an object', 'contextforge');
  const { fields: m, named } = meta === undefined ? NO_META : metaFields(meta as Record<string, unknown>);
  const pick = (field: string, headerName: string): [unknown, string] =>
    m[field] !== undefined
      ? [m[field], `contextforge.${named.get(field)!}`]
      : [header(headers, headerName), headerName];
  const out: RequestMetadata = { workflowStep: null, claGroup: null };
  const [wf, wfParam] = pick('workflowId', 'x-workflow-id');
  if (wf !== undefined) out.workflowId = checkId(wf, wfParam, limits.maxIdBytes);
  const [role, roleParam] = pick('agentRole', 'x-agent-role');
  if (role !== undefined) out.agentRole = checkId(role, roleParam, limits.maxIdBytes);
  const [step, stepParam] = pick('workflowStep', 'x-workflow-step');
  if (step !== undefined && step !== null) out.workflowStep = checkCount(step, stepParam);
  const [cla, claParam] = pick('claGroup', 'x-cla-group');
  if (cla !== undefined && cla !== null) out.claGroup = checkCount(cla, claParam);
  if (m.anchors !== undefined) out.contentAnchors = readAnchorList(m.anchors, 'contextforge.anchors', limits);
  else {
    const h = header(headers, 'x-anchor-ids');
    if (h !== undefined) out.contentAnchors = readAnchorHeader(h, limits);
  }
  if (m.isolate !== undefined) {
    if (typeof m.isolate !== 'boolean')
      throw new RequestLimitError('contextforge.isolate must be true or false', 'contextforge.isolate');
    if (m.isolate) out.isolate = true;
  } else {
    const h = header(headers, 'x-kv-isolate');
    if (h !== undefined) {
      if (h === '1' || h === 'true') out.isolate = true;
      else if (h !== '0' && h !== 'false')
        throw new RequestLimitError('x-kv-isolate must be 1, 0, true or false', 'x-kv-isolate');
    }
  }
  return out;
}

function readAnchorList(value: unknown, param: string, limits: RequestLimits): ContentAnchor[] {
  if (!Array.isArray(value)) throw new RequestLimitError(`${param} must be a list`, param);
  if (value.length > limits.maxAnchors)
    throw new RequestLimitError(`${param} has more than ${limits.maxAnchors} anchors`, param);
  return value.map((a: unknown, i) => {
    const at = `${param}[${i}]`;
    if (typeof a === 'string') return anchorFromString(a, at, at, limits);
    if (a === null || typeof a !== 'object' || Array.isArray(a))
      throw new RequestLimitError(`${at} must be an id string or {id, tokens}`, at);
    const { id, tokens } = a as { id?: unknown; tokens?: unknown };
    return {
      id: checkId(id, `${at}.id`, limits.maxIdBytes),
      tokens: tokens === undefined ? 0 : checkCount(tokens, `${at}.tokens`),
    };
  });
}

function readAnchorHeader(h: string, limits: RequestLimits): ContentAnchor[] {
  const parts = h
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (parts.length > limits.maxAnchors)
    throw new RequestLimitError(`x-anchor-ids has more than ${limits.maxAnchors} anchors`, 'x-anchor-ids');
  return parts.map((p, i) => anchorFromString(p, `x-anchor-ids[${i}]`, 'x-anchor-ids', limits));
}

/**
 * `id` or `id:tokens` (`at` names it in a message, `param` in the error). What follows the last
 * ':' is the token count when it is decimal digits; when it reads as a number some other way
 * (Number(): `0x10`, `1e3`, ` 7`, `-1`, `1.5`, or nothing at all) it is a count written wrong,
 * refused as a header's count is (checkCount), not taken into the id; anything else is part of
 * the id, which may hold ':' (`urn:doc`; an id ending in what reads as a number is given with
 * its count: `v:1.5:0`). The message never repeats the value.
 */
function anchorFromString(s: string, at: string, param: string, limits: RequestLimits): ContentAnchor {
  const colon = s.lastIndexOf(':');
  if (colon > 0) {
    const count = s.slice(colon + 1);
    if (DECIMAL.test(count)) return { id: checkId(s.slice(0, colon), param, limits.maxIdBytes), tokens: Number(count) };
    if (!Number.isNaN(Number(count)))
      throw new RequestLimitError(
        `${at} must be id or id:tokens, the token count a non-negative decimal integer of at most 15 digits`,
        param,
      );
  }
  return { id: checkId(s, param, limits.maxIdBytes), tokens: 0 };
}

/**
 * Throws unless `value` is a string of at most `maxBytes` UTF-8 bytes; `at` names it in the
 * message (`rid[2]`), `param` in the error. The message never repeats the value.
 */
function checkString(value: unknown, at: string, param: string, maxBytes: number, what: string): void {
  if (typeof value !== 'string') throw new RequestLimitError(`${at} must be a string (${what})`, param);
  if (longerThanBytes(value, maxBytes)) throw new RequestLimitError(`${at} is longer than ${maxBytes} bytes`, param);
}

/**
 * `model` or `user`: absent, null (the engine's default) or a string of at most
 * NAME_BYTES_PER_ID_BYTE × `maxIdBytes` UTF-8 bytes; anything else is refused, as the
 * engines' request models refuse it (vLLM's and SGLang's protocol.py declare both `str`, and
 * pydantic reads no number or list as a string). The length is compared first, so the common
 * short name costs no byte count. The message never repeats the value.
 */
export function checkName(value: unknown, param: string, maxIdBytes: number, what: string): void {
  if (value === undefined || value === null) return;
  checkString(value, param, param, NAME_BYTES_PER_ID_BYTE * maxIdBytes, what);
}

/**
 * Absent, null, a string of at most `maxBytes` UTF-8 bytes, or a list of such strings and
 * nulls, at most one per prompt (checkPromptList): SGLang's form for a field given once per
 * prompt of a batch (`rid`, `lora_path`, `extra_key`, `custom_logit_processor`; a null in the
 * list is the engine's default for that prompt, where it takes one). Anything else is refused,
 * as SGLang's request models refuse it.
 */
function checkStringOrList(value: unknown, param: string, maxBytes: number, what: string, prompts: number): void {
  if (value === undefined || value === null) return;
  if (!Array.isArray(value)) {
    if (typeof value !== 'string')
      throw new RequestLimitError(`${param} must be a string or a list of strings (${what})`, param);
    checkString(value, param, param, maxBytes, what);
    return;
  }
  checkPromptList(value, param, prompts);
  for (let i = 0; i < value.length; i++)
    if (value[i] !== null) checkString(value[i], `${param}[${i}]`, param, maxBytes, what);
}

/**
 * The strings an engine keys, logs or looks up a request by, bounded as names are
 * (NAME_BYTES_PER_ID_BYTE × `limits.maxIdBytes` UTF-8 bytes; the gateway itself reads none of
 * them), and SGLang's `custom_logit_processor` (CUSTOM_LOGIT_PROCESSOR_BYTES):
 *
 * - vLLM's `request_id` (vllm/entrypoints/openai/chat_completion/protocol.py: "used through out
 *   the inference process and return in response"), the key of the request in the engine;
 * - SGLang's `rid` (python/sglang/srt/entrypoints/openai/protocol.py), the same for SGLang, one
 *   per prompt in a list; a single string is the prefix of every prompt's id
 *   (python/sglang/srt/managers/io_struct.py, GenerateReqInput.rid);
 * - `session_id` (vLLM and SGLang: a session's id shared by related requests), and SGLang's
 *   `session_params.id`, by which the scheduler looks up or creates a Session, and
 *   `session_params.rid`, a request in it (io_struct.py, SessionParams);
 * - SGLang's `lora_path`, an adapter looked up among the loaded ones, one per prompt in a list;
 * - SGLang's `extra_key`, a key of the engine's prefix cache for caller-defined classes of
 *   requests, beside `cache_salt` (bounded as an id: checkCacheSalt);
 * - SGLang's `custom_logit_processor` (see CUSTOM_LOGIT_PROCESSOR_BYTES).
 *
 * `request_id` and `session_id` are one string each (both engines declare `str`); the others
 * may be SGLang's lists, of at most `prompts` entries (checkPromptList). A `session_params` that
 * is not an object is the engine's to refuse.
 */
export function checkEngineKeys(body: Readonly<Record<string, unknown>>, limits: RequestLimits, prompts: number): void {
  checkName(body.request_id, 'request_id', limits.maxIdBytes, 'an id of the request');
  checkSGLangKeys(body, limits, prompts);
}

/** The SGLang fields of checkEngineKeys: all of them but vLLM's `request_id`. */
function checkSGLangKeys(body: Readonly<Record<string, unknown>>, limits: RequestLimits, prompts: number): void {
  const { maxIdBytes } = limits;
  const nameBytes = NAME_BYTES_PER_ID_BYTE * maxIdBytes;
  checkStringOrList(body.rid, 'rid', nameBytes, 'an id of the request', prompts);
  checkName(body.session_id, 'session_id', maxIdBytes, 'an id of the session');
  // SGLang's /generate takes a list of them too, one per prompt (GenerateReqInput.session_params)
  perPrompt(body.session_params, 'session_params', limits, prompts, checkSessionParams);
  checkStringOrList(body.lora_path, 'lora_path', nameBytes, 'the name or path of a LoRA adapter', prompts);
  checkStringOrList(body.extra_key, 'extra_key', nameBytes, 'a key of the prefix cache', prompts);
  checkStringOrList(
    body.custom_logit_processor,
    'custom_logit_processor',
    CUSTOM_LOGIT_PROCESSOR_BYTES,
    'a serialized CustomLogitProcessor',
    prompts,
  );
}

/** One SGLang `session_params` object (`at` names it): its `id` and `rid` are bounded as names; anything else is the engine's. */
function checkSessionParams(session: unknown, at: string, limits: RequestLimits): void {
  if (session === null || typeof session !== 'object' || Array.isArray(session)) return;
  const { id, rid } = session as { id?: unknown; rid?: unknown };
  checkName(id, `${at}.id`, limits.maxIdBytes, 'an id of the session');
  checkName(rid, `${at}.rid`, limits.maxIdBytes, 'an id of a request in the session');
}

/**
 * `check` on a field SGLang takes once or as a list, one per prompt of a batch (`session_params`,
 * `top_logprobs_num`, `sampling_params`): on the value, or on each of at most `prompts` elements
 * (checkPromptList), named `at[i]`.
 */
function perPrompt(
  value: unknown,
  at: string,
  limits: RequestLimits,
  prompts: number,
  check: (value: unknown, at: string, limits: RequestLimits) => void,
): void {
  if (!Array.isArray(value)) return check(value, at, limits);
  checkPromptList(value, at, prompts);
  for (let i = 0; i < value.length; i++) check(value[i], `${at}[${i}]`, limits);
}

/**
 * A list SGLang takes one entry of per prompt of a batch has at most `prompts` entries. SGLang
 * (python/sglang/srt/managers/io_struct.py, GenerateReqInput.normalize_batch_and_arguments)
 * refuses a `rid` or `extra_key` list of another length than the batch, and reads the others
 * by the prompt's index (`__getitem__`), so entries past the last prompt are never used; `n`
 * does not lengthen them (SGLang repeats the lists n times itself, or refuses a list with n > 1).
 * Without the bound the body size alone limits them, and the elements are checked and parsed
 * one by one, here and in the engine. Checked before the elements, so a long list costs no
 * element checks. A shorter list is the engine's to refuse.
 */
function checkPromptList(value: readonly unknown[], param: string, prompts: number): void {
  if (value.length > prompts)
    throw new RequestLimitError(
      `${param} must have at most ${prompts} ${prompts === 1 ? 'entry' : 'entries'}, one per prompt`,
      param,
    );
}

/**
 * How many prompts a completions `prompt` holds: a list of strings or of token-id lists has
 * one per element; a string or a list of token ids is one. Reads the list's length and first
 * element only, so it is counted before readPrompt checks the elements.
 */
function completionPrompts(prompt: unknown): number {
  return Array.isArray(prompt) && typeof prompt[0] !== 'number' ? prompt.length : 1;
}

/**
 * How many prompts vLLM's `prompt_embeds` holds (CompletionRequest: `bytes | list[bytes]`, each
 * a base64 tensor): a list one per element, a string one, absent or null none. A value of
 * another shape is refused, naming the field. Reads the list's elements' types only.
 */
function embedPrompts(value: unknown): number {
  if (value === undefined || value === null) return 0;
  const bad = () =>
    new RequestLimitError('prompt_embeds must be a base64 string of a tensor, or a list of them', 'prompt_embeds');
  if (typeof value === 'string') return 1;
  if (!Array.isArray(value)) throw bad();
  for (const e of value) if (typeof e !== 'string') throw bad();
  return value.length;
}

/**
 * Whether a completions body gives vLLM's `prompt_embeds` and no `prompt` (absent or null). Read
 * after completionPromptCount checked the embeds' shape: their elements are not read again.
 */
function onlyPromptEmbeds(body: Readonly<Record<string, unknown>>): boolean {
  const embeds = body.prompt_embeds;
  return (
    (body.prompt === undefined || body.prompt === null) &&
    (typeof embeds === 'string' || (Array.isArray(embeds) && embeds.length > 0))
  );
}

/**
 * The prompts of a completions request: those of `prompt` and of vLLM's `prompt_embeds`
 * together, each field and their sum at most `limits.maxPrompts`. vLLM runs both when both are
 * given (one of them is required; "prompt embeds are always returned first", then the text
 * and token prompts: serving_completion.py), so either alone within the bound is no way past
 * it. `prompt` counts unless it is absent or null and there are prompt embeds: then the body
 * holds only those (a body with neither counts the prompt, and readPrompt refuses it). Counted
 * before the prompt's elements are read; the embeds' are counted first, as
 * checkPromptCount refuses a long list before its elements are looked at.
 */
function completionPromptCount(body: Readonly<Record<string, unknown>>, limits: RequestLimits): number {
  const given = body.prompt_embeds;
  if (Array.isArray(given)) checkPromptCount(given.length, 'prompt_embeds', limits);
  const embeds = embedPrompts(given);
  const textPrompts = onlyPromptEmbeds(body) ? 0 : checkPromptCount(completionPrompts(body.prompt), 'prompt', limits);
  if (textPrompts + embeds > limits.maxPrompts)
    throw new RequestLimitError(
      `prompt and prompt_embeds have more than ${limits.maxPrompts} prompts together (--max-prompts)`,
      'prompt_embeds',
    );
  return textPrompts + embeds;
}

/**
 * `count`, the prompts of the field `param`, unless more than `limits.maxPrompts`: then a
 * RequestLimitError naming the field.
 */
function checkPromptCount(count: number, param: string, limits: RequestLimits): number {
  if (count > limits.maxPrompts)
    throw new RequestLimitError(`${param} has more than ${limits.maxPrompts} prompts (--max-prompts)`, param);
  return count;
}

/** The prompt fields of SGLang's `/generate`, in the order SGLang reads them. */
const GENERATE_PROMPT_FIELDS = ['text', 'input_ids', 'input_embeds'] as const;

/**
 * How many prompts one prompt field of SGLang's `/generate` holds, or undefined when it is
 * absent: `text` (a string is one, a list one per element), `input_ids` (a list of token ids is
 * one, a list of lists one per list), `input_embeds` (a list of vectors is one, a list of such
 * lists one per element). Reads the length and the first element only.
 */
function generateFieldPrompts(field: (typeof GENERATE_PROMPT_FIELDS)[number], value: unknown): number | undefined {
  if (value === undefined || value === null) return undefined;
  if (!Array.isArray(value)) return 1;
  if (field === 'text') return value.length;
  const first: unknown = value[0];
  if (field === 'input_ids') return Array.isArray(first) ? value.length : 1;
  return Array.isArray(first) && Array.isArray(first[0]) ? value.length : 1;
}

/**
 * How many prompts a body of SGLang's `/generate` holds, as SGLang counts them
 * (GenerateReqInput._determine_batch_size in python/sglang/srt/managers/io_struct.py): those of
 * `text`, else `input_ids`, else `input_embeds` (generateFieldPrompts). Each of the three fields
 * present holds at most `limits.maxPrompts` (checkPromptCount names the one past it), whichever
 * SGLang reads: a body with two of them is SGLang's to refuse, not a way past the bound. A body
 * with none, or one SGLang cannot read, is refused by SGLang; it counts as one prompt here.
 */
function generatePrompts(body: Readonly<Record<string, unknown>>, limits: RequestLimits): number {
  let prompts: number | undefined;
  for (const field of GENERATE_PROMPT_FIELDS) {
    const count = generateFieldPrompts(field, body[field]);
    if (count === undefined) continue;
    checkPromptCount(count, field, limits);
    prompts ??= count;
  }
  return prompts ?? 1;
}

/**
 * `logprobs` (completions), `top_logprobs` (chat), vLLM's `prompt_logprobs` or SGLang's
 * `top_logprobs_num`: absent, null or an integer from 0 to `max` (RequestLimits.maxLogprobs).
 * vLLM's -1 ("the whole vocabulary") is refused, and so is a string, as checkChoices refuses one.
 * A boolean counts as 0 or 1: vLLM's request models declare these Optional[int], and pydantic's
 * lax mode reads true as 1. `isSwitch`: chat's `logprobs`, where true or false only turns the
 * log probabilities on or off (a number is bounded as the count, though the engines take only 0
 * and 1).
 */
export function checkLogprobs(value: unknown, param: string, max: number, isSwitch = false): void {
  if (value === undefined || value === null) return;
  if (typeof value === 'boolean') {
    if (isSwitch || !value || max >= 1) return;
    throw new RequestLimitError(
      `${param} must be false or an integer from 0 to ${max} (the most log probabilities a token may report)`,
      param,
    );
  }
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > max)
    throw new RequestLimitError(
      `${param} must be ${isSwitch ? 'true, false or ' : ''}an integer from 0 to ${max} (the most log probabilities a token may report)`,
      param,
    );
}

/**
 * A `cache_salt` as vLLM takes it: absent, null or a non-empty string (and no longer than an id
 * here). Null is no salt: vLLM declares the field Optional[str] and checks it only when it is not
 * None (check_cache_salt_support), as SGLang declares it Optional, so the engine keeps the
 * prompt's blocks unsalted and the router routes it unsalted too (undefined), as a request without
 * the field. The body keeps the null as written; a tenant's salt or an isolated request's private
 * one replaces it as it replaces any other.
 *
 * A list is refused, naming the field. SGLang's request models declare
 * `Optional[Union[List[str], str]]` (python/sglang/srt/entrypoints/openai/protocol.py), but the
 * only code that reads the field, OpenAIServingBase._compute_extra_key (serving_base.py), raises
 * a TypeError on any non-empty value that is not a string, which its handle_request answers as a
 * 500, and treats an empty list as no salt; vLLM's pydantic model refuses a list. Forwarded, a
 * list would come back as an engine's failure counted against the worker, so it is refused here
 * as a client error. A tenant's salt and an isolated request's salt are one string for the whole
 * request, which is all either engine takes.
 */
export function checkCacheSalt(value: unknown, limits: RequestLimits): string | undefined {
  if (value === undefined || value === null) return undefined;
  if (Array.isArray(value))
    throw new RequestLimitError(
      'cache_salt must be a string, not a list (one salt for the whole request)',
      'cache_salt',
    );
  return checkId(value, 'cache_salt', limits.maxIdBytes);
}

/** A token id as every engine the router fronts takes it: an integer in [0, 2^32). */
export function isTokenId(t: unknown): t is number {
  return typeof t === 'number' && Number.isInteger(t) && t >= 0 && t <= MAX_TOKEN_ID;
}

/**
 * `n` or `best_of`: absent, null (the engine's default) or an integer from 1 to `max`. A string
 * is refused too, as the OpenAI API refuses it: the engines' pydantic models would read
 * "100000000" as the integer, past the bound.
 */
export function checkChoices(value: unknown, param: string, max: number): void {
  if (value === undefined || value === null) return;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > max)
    throw new RequestLimitError(
      `${param} must be an integer from 1 to ${max} (the most choices a request may ask for)`,
      param,
    );
}

/**
 * `max_tokens` or `max_completion_tokens` (SGLang's `max_new_tokens` in `/generate`'s
 * sampling_params): absent, null (the engine's default) or a non-negative integer, as vLLM's and
 * SGLang's request models declare them (Optional[int]; 0 is vLLM's completion that only echoes
 * its prompt). A string, a boolean or a fraction is refused, as checkChoices refuses one for `n`;
 * the bound is the engine's (its context length), but past 2^53 is no count of tokens.
 */
export function checkTokenBudget(value: unknown, param: string): void {
  if (value === undefined || value === null) return;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0)
    throw new RequestLimitError(`${param} must be a non-negative integer (the most tokens to generate)`, param);
}

/** What vLLM's and SGLang's `/v1/completions` generate when `max_tokens` is absent (CompletionRequest's default). */
export const COMPLETION_DEFAULT_MAX_TOKENS = 16;

/**
 * The output tokens a request asks for, as the engine on `path` checks them against its context
 * length; undefined when the engine is left to fill what the context leaves (an explicit null).
 * Read after checkTokenBudget passed the fields.
 * - a chat: `max_completion_tokens` when it is more than 0, else `max_tokens` (vLLM's
 *   `request.max_completion_tokens or request.max_tokens`), undefined when neither is given;
 * - a completion: `max_tokens`, 16 when absent (vLLM's CompletionRequest, vllm-project/vllm
 *   vllm/entrypoints/openai/completion/protocol.py, `max_tokens: int | None = 16`; SGLang's
 *   CompletionRequest alike). The endpoint has no `max_completion_tokens`: one sent there is
 *   ignored by the engine, and so here.
 */
export function requestedOutputTokens(body: Readonly<Record<string, unknown>>, path: string): number | undefined {
  if (path === '/v1/completions') {
    const given = body.max_tokens;
    return typeof given === 'number' ? given : given === undefined ? COMPLETION_DEFAULT_MAX_TOKENS : undefined;
  }
  const completion = body.max_completion_tokens;
  if (typeof completion === 'number' && completion > 0) return completion;
  return typeof body.max_tokens === 'number' ? body.max_tokens : undefined;
}

/**
 * The prompt length an engine checks against its context length: the longest prompt of a
 * completion's batch of token-id lists (the engine checks each, though the router hashes the
 * first), else the length of the token ids the request is routed on; undefined when they are not
 * known (a prompt routed on its text).
 */
export function longestPromptTokens(
  body: Readonly<Record<string, unknown>>,
  path: string,
  tokens: ArrayLike<number> | undefined,
): number | undefined {
  if (tokens === undefined) return undefined;
  const prompt = path === '/v1/completions' ? body.prompt : undefined;
  if (!Array.isArray(prompt) || !Array.isArray(prompt[0])) return tokens.length;
  let longest = tokens.length;
  for (const p of prompt as readonly unknown[]) if (Array.isArray(p) && p.length > longest) longest = p.length;
  return longest;
}

/**
 * `stream_options`: absent, null or an object whose `include_usage` and `continuous_usage_stats`
 * are each absent, null, true or false, as vLLM's and SGLang's StreamOptions declare them
 * (Optional[bool]; other members are the engine's to ignore). A string such as `"true"` is
 * refused, as `stream`'s is: pydantic's lax mode would read it as true, and the gateway reads
 * `include_usage: true` alone as a request for the usage chunk (whole-answer-stream.ts), so the
 * two would disagree. A non-empty object is refused unless `stream` is true, as vLLM refuses it
 * ("Stream options can only be defined when `stream=True`", its validate_stream_options) and the
 * OpenAI API does (SGLang would ignore it); `{}` passes, as vLLM reads it as none. Two own-key
 * lookups, and a look for any member when the request does not stream: nothing is allocated for a
 * valid request.
 */
export function checkStreamOptions(value: unknown, stream: boolean): void {
  if (value === undefined || value === null) return;
  if (typeof value !== 'object' || Array.isArray(value))
    throw new RequestLimitError('stream_options must be an object', 'stream_options');
  const options = value as Readonly<Record<string, unknown>>;
  for (const key of STREAM_OPTION_SWITCHES) {
    const v = Object.hasOwn(options, key) ? options[key] : undefined;
    if (v !== undefined && v !== null && typeof v !== 'boolean')
      throw new RequestLimitError(`stream_options.${key} must be true or false`, `stream_options.${key}`);
  }
  if (!stream && hasOwnMember(options))
    throw new RequestLimitError('stream_options may only be given when stream is true', 'stream_options');
}

/** The switches of `stream_options`. */
const STREAM_OPTION_SWITCHES: readonly string[] = ['include_usage', 'continuous_usage_stats'];

/** Whether a parsed JSON object has a member (JSON.parse makes every member an own one). */
function hasOwnMember(o: object): boolean {
  for (const _ in o) return true;
  return false;
}

/**
 * The members of a body whose JSON the engine renders into the prompt (`messages`, `tools`,
 * `documents`, `chat_template_kwargs`) or compiles into a grammar (GRAMMAR_FIELDS): their numbers
 * are data, not parameters. Python's json reads a literal past the largest double as inf there
 * and writes it back as `Infinity`, as the router's tokenizer does (lossless-json.ts), so an
 * overflow in them is left to the engine.
 */
const JSON_DATA_FIELDS: ReadonlySet<string> = new Set([
  'messages',
  'tools',
  'documents',
  'chat_template_kwargs',
  ...GRAMMAR_FIELDS,
]);

/** An object or list being walked by checkFiniteNumbers: where it sits, and how far it is read. */
interface WalkedNode {
  value: object;
  /** An object's keys (undefined for a list). */
  keys: string[] | undefined;
  /** The next member or element to read. */
  next: number;
  parent: WalkedNode | undefined;
  key: string | number;
}

/** A key as a path names it: `.name`, or `["…"]` (at most 64 characters of it) for any other. */
const PATH_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

function pathOf(node: WalkedNode, key: string | number): string {
  const steps: Array<string | number> = [key];
  for (let n: WalkedNode = node; n.parent !== undefined; n = n.parent) steps.push(n.key);
  let path = '';
  for (let i = steps.length - 1; i >= 0; i--) {
    const k = steps[i];
    if (typeof k === 'number') path += `[${k}]`;
    else if (PATH_NAME.test(k)) path += path === '' ? k : `.${k}`;
    else path += `[${JSON.stringify(k.length > 64 ? k.slice(0, 64) + '…' : k)}]`;
  }
  return path;
}

/**
 * Throws a RequestLimitError naming the first number of `body` (in the body's order) that
 * JSON.parse read as ±Infinity: a literal past the largest double (1e999, a 400-digit integer).
 * The body is forwarded as the client wrote it and the engines read it with Python's json, which
 * makes the literal inf. Older vLLM bounds temperature and repetition_penalty from below only
 * (SamplingParams._verify_args), so inf passed them; newer vLLM refuses a non-finite value of
 * either itself. Refused here wherever it stands (but in the JSON_DATA_FIELDS), such a number
 * reaches no engine, whatever its version. JSON.parse never makes NaN. Walked without recursion
 * (a body nests as deep as maxJsonDepth allows); a list of numbers (token ids, embeddings) costs
 * one test per element.
 */
export function checkFiniteNumbers(body: Readonly<Record<string, unknown>>): void {
  const stack: WalkedNode[] = [walked(body, undefined, '')];
  while (stack.length > 0) {
    const node = stack[stack.length - 1];
    const { value, keys } = node;
    if (keys === undefined) {
      // a list: its numbers in one tight loop, up to the next list or object in it
      const list = value as unknown[];
      let i = node.next;
      for (; i < list.length; i++) {
        const v = list[i];
        if (typeof v === 'number') {
          if (v === Infinity || v === -Infinity) throw overflow(node, i);
        } else if (v !== null && typeof v === 'object') break;
      }
      if (i === list.length) stack.pop();
      else {
        node.next = i + 1;
        stack.push(walked(list[i] as object, node, i));
      }
      continue;
    }
    if (node.next === keys.length) {
      stack.pop();
      continue;
    }
    const key = keys[node.next++];
    if (node.parent === undefined && JSON_DATA_FIELDS.has(key)) continue;
    const v = (value as Record<string, unknown>)[key];
    if (typeof v === 'number') {
      if (v === Infinity || v === -Infinity) throw overflow(node, key);
    } else if (v !== null && typeof v === 'object') stack.push(walked(v, node, key));
  }
}

function overflow(node: WalkedNode, key: string | number): RequestLimitError {
  const at = pathOf(node, key);
  return new RequestLimitError(
    `${at} must be a finite number: its literal is past the largest double, which the engine reads as infinity`,
    at,
  );
}

function walked(value: object, parent: WalkedNode | undefined, key: string | number): WalkedNode {
  return { value, keys: Array.isArray(value) ? undefined : Object.keys(value), next: 0, parent, key };
}

/**
 * Throws unless `s` (when a string) is at most `maxBytes` UTF-8 bytes; `at` names it in the
 * message (`stop[3]`), `param` in the error. A module function, not a closure per call.
 */
function checkStopString(s: unknown, at: string, param: string, maxBytes: number): void {
  if (typeof s === 'string' && longerThanBytes(s, maxBytes))
    throw new RequestLimitError(`${at} is longer than ${maxBytes} bytes`, param);
}

/**
 * A list of markers the engine checks the output against at every step (`stop`, `bad_words`):
 * at most `limits.maxStopSequences` of them (`noun` names them in the message), each string at
 * most STOP_BYTES_PER_ID_BYTE × `limits.maxIdBytes` UTF-8 bytes. Anything that is not a list,
 * and elements that are not strings, are the engine's to refuse.
 */
function checkMarkers(value: unknown, param: string, noun: string, limits: RequestLimits): void {
  if (!Array.isArray(value)) return;
  if (value.length > limits.maxStopSequences)
    throw new RequestLimitError(`${param} has more than ${limits.maxStopSequences} ${noun}`, param);
  const maxBytes = STOP_BYTES_PER_ID_BYTE * limits.maxIdBytes;
  for (let i = 0; i < value.length; i++) checkStopString(value[i], `${param}[${i}]`, param, maxBytes);
}

/**
 * `stop`, or SGLang's `stop_regex` (`noun` 'patterns'): absent, null, a string or a list of at
 * most `limits.maxStopSequences`; each string at most STOP_BYTES_PER_ID_BYTE × `limits.maxIdBytes`
 * UTF-8 bytes. Elements that are not strings are the engine's to refuse. `param` names the field
 * (SGLang's `/generate` has both inside `sampling_params`). At every step SGLang decodes the
 * output's last tokens and searches them for each stop string and each pattern
 * (python/sglang/srt/managers/schedule_batch.py, Req's check_finished: stop_strs and
 * stop_regex_strs), in the loop that serves every request.
 */
export function checkStop(value: unknown, limits: RequestLimits, param = 'stop', noun = 'sequences'): void {
  if (Array.isArray(value)) return checkMarkers(value, param, noun, limits);
  checkStopString(value, param, param, STOP_BYTES_PER_ID_BYTE * limits.maxIdBytes);
}

/**
 * vLLM's `bad_words`: absent, null or a list of at most `limits.maxStopSequences` strings, each
 * at most STOP_BYTES_PER_ID_BYTE × `limits.maxIdBytes` UTF-8 bytes, as stop strings are. vLLM
 * bounds neither: SamplingParams.update_from_tokenizer (vllm/sampling_params.py) tokenizes each
 * one twice (with and without a leading space), and at every step apply_bad_words
 * (vllm/v1/sample/ops/bad_words.py) compares the output's last tokens with every bad word's
 * prefix, in Python, in the loop that samples for every request. Anything that is not a list
 * is the engine's to refuse.
 */
export function checkBadWords(value: unknown, limits: RequestLimits): void {
  checkMarkers(value, 'bad_words', 'words', limits);
}

/**
 * `stop_token_ids`: absent, null or a list of at most `limits.maxStopSequences` ids. vLLM's
 * check_stop (vllm/v1/core/sched/utils.py) tests `last_token_id in
 * sampling_params.stop_token_ids`, a list: every id is compared at every step of every request,
 * in the scheduler's loop, so their number multiplies the work as stop strings do (SGLang keeps
 * them in a set). A few ids are what models need (Llama 3's end markers are three); the elements
 * are the engine's to check. `param` names the field, as checkStop's.
 */
export function checkStopTokenIds(value: unknown, limits: RequestLimits, param = 'stop_token_ids'): void {
  if (Array.isArray(value) && value.length > limits.maxStopSequences)
    throw new RequestLimitError(`${param} has more than ${limits.maxStopSequences} ids`, param);
}

/**
 * `logit_bias`: absent, null or an object of at most MAX_BIASED_TOKENS entries, each a number
 * from -100 to 100, the range the OpenAI API documents (vLLM clamps into it; SGLang adds the
 * value as it is). A bias that is not a number (a string, a boolean, null, or 1e400, which
 * JSON.parse reads as Infinity) is refused, as is anything but an object: both engines declare
 * Dict[str, float]. The keys are the engine's to check against its vocabulary. Counted before
 * the values are read, so a long map costs no value checks. `param` names the field (SGLang's
 * `/generate` has it inside `sampling_params`).
 */
export function checkLogitBias(value: unknown, param = 'logit_bias'): void {
  if (value === undefined || value === null) return;
  if (typeof value !== 'object' || Array.isArray(value))
    throw new RequestLimitError(`${param} must be an object mapping token ids to biases`, param);
  // counted by its keys (strings JSON.parse already made) before any value is read: a map of a
  // million entries costs one list of its keys, not one of its values too
  const tokens = Object.keys(value);
  if (tokens.length > MAX_BIASED_TOKENS)
    throw new RequestLimitError(
      `${param} has more than ${MAX_BIASED_TOKENS} entries (the most tokens a request may bias)`,
      param,
    );
  const biases = value as Record<string, unknown>;
  for (const token of tokens) {
    const b = biases[token];
    if (typeof b !== 'number' || !(b >= -100 && b <= 100))
      throw new RequestLimitError(
        `${param} values must be numbers from -100 to 100 (the bias added to a token’s logit)`,
        param,
      );
  }
}

/**
 * vLLM's `allowed_token_ids` (ChatCompletionRequest and CompletionRequest): absent, null or a
 * list of at most MAX_BIASED_TOKENS ids. Anything that is not a list, and the ids themselves,
 * are the engine's to check (it refuses an empty list and ids past its vocabulary).
 */
export function checkAllowedTokenIds(value: unknown): void {
  if (Array.isArray(value) && value.length > MAX_BIASED_TOKENS)
    throw new RequestLimitError(
      `allowed_token_ids has more than ${MAX_BIASED_TOKENS} ids (the most tokens a request may bias)`,
      'allowed_token_ids',
    );
}

/**
 * A constraint the engine compiles (GRAMMAR_FIELDS): absent, null, a string of at most
 * `maxBytes` UTF-8 bytes, or any other JSON value whose compact JSON text is at most `maxBytes`
 * bytes (RequestLimits.maxGrammarBytes). `param` names the field; the message never repeats the
 * value.
 */
export function checkGrammar(value: unknown, param: string, maxBytes: number): void {
  if (value === undefined || value === null) return;
  const what = 'the largest grammar, regex or schema an engine compiles';
  if (typeof value === 'string') {
    if (longerThanBytes(value, maxBytes))
      throw new RequestLimitError(`${param} is longer than ${maxBytes} bytes (${what})`, param);
  } else if (jsonBytesLeft(value, maxBytes) < 0)
    throw new RequestLimitError(`${param} is longer than ${maxBytes} bytes as JSON (${what})`, param);
}

/**
 * The `parameters` schemas of a chat's tools that an engine compiles into a constraint on the
 * output, bounded together by `limits.maxGrammarBytes` (as GRAMMAR_FIELDS are, checkGrammar)
 * and named by the tool that takes them past it (`tools[i].function.parameters`). The engine
 * compiles one constraint of them, so a schema split over many tools is no smaller. Which tools:
 * - `tool_choice` `required`: every tool's (vLLM and SGLang constrain the output to a call of one
 *   of them; vLLM's ChatCompletionRequest._get_json_schema_from_tool, SGLang's serving_chat.py
 *   tool_call_constraint, made the request's structured output by ChatCompletionRequest
 *   .to_sampling_params, python/sglang/srt/entrypoints/openai/protocol.py);
 * - a named function (`{"type": "function", "function": {"name": "f"}}`): that one's;
 * - `auto` or none given: the tools marked `strict` (SGLang's FunctionCallParser
 *   .get_structure_constraint, python/sglang/srt/function_call/function_call_parser.py, builds a
 *   structural tag of them under `auto`); an agent's long list of other tools is not bounded
 *   here (the body size bounds it);
 * - `none`: nothing is compiled.
 * Tools or a tool_choice of another shape are the engine's to refuse (checkToolShapes refuses a
 * `tools` that is no list of objects, a `tool_choice` that is neither a string nor an object).
 */
function checkToolGrammars(tools: unknown, toolChoice: unknown, maxBytes: number): void {
  if (!Array.isArray(tools)) return;
  let name: unknown;
  let strictOnly = false;
  if (toolChoice === 'required') name = undefined;
  else if (toolChoice === undefined || toolChoice === null || toolChoice === 'auto') strictOnly = true;
  else if (typeof toolChoice === 'object' && !Array.isArray(toolChoice)) {
    const fn = (toolChoice as { function?: unknown }).function;
    if (fn === null || typeof fn !== 'object') return;
    name = (fn as { name?: unknown }).name;
    if (typeof name !== 'string') return;
  } else return;
  let left = maxBytes;
  for (let i = 0; i < tools.length; i++) {
    const tool: unknown = tools[i];
    if (tool === null || typeof tool !== 'object') continue;
    const fn = (tool as { function?: unknown }).function;
    if (fn === null || typeof fn !== 'object') continue;
    const { name: toolName, parameters, strict } = fn as { name?: unknown; parameters?: unknown; strict?: unknown };
    if ((name !== undefined && toolName !== name) || (strictOnly && strict !== true)) continue;
    if (parameters === undefined || parameters === null) continue;
    left = jsonBytesLeft(parameters, left);
    if (left < 0) {
      const param = `tools[${i}].function.parameters`;
      throw new RequestLimitError(
        `${param} takes the tools' parameters the engine compiles past ${maxBytes} bytes as JSON (the largest grammar, regex or schema an engine compiles)`,
        param,
      );
    }
  }
}

/**
 * A chat's `tools` and `tool_choice` by their shape, as both engines' request models refuse any
 * other (vLLM's `Optional[list[ChatCompletionToolsParam]]` and its tool_choice of a string or a
 * named function; SGLang's likewise): `tools` absent, null or a list of objects, `tool_choice`
 * absent, null, a string or an object. What the objects and strings hold is the engine's to check
 * (checkToolGrammars bounds what it compiles of them).
 */
function checkToolShapes(tools: unknown, toolChoice: unknown): void {
  if (tools !== undefined && tools !== null) {
    if (!Array.isArray(tools)) throw new RequestLimitError('tools must be a list', 'tools');
    for (let i = 0; i < tools.length; i++) {
      const tool: unknown = tools[i];
      if (tool === null || typeof tool !== 'object' || Array.isArray(tool))
        throw new RequestLimitError(
          `tools[${i}] must be an object ({type: "function", function: {name, …}})`,
          `tools[${i}]`,
        );
    }
  }
  if (
    toolChoice !== undefined &&
    toolChoice !== null &&
    typeof toolChoice !== 'string' &&
    (typeof toolChoice !== 'object' || Array.isArray(toolChoice))
  )
    throw new RequestLimitError(
      'tool_choice must be "none", "auto", "required" or an object naming a function',
      'tool_choice',
    );
}

/**
 * `response_format`: absent, null or an object, as both engines' request models declare it (a
 * model of `type` and its schema); its size is checkGrammar's, the rest the engine's to check.
 */
function checkResponseFormat(value: unknown): void {
  if (value !== undefined && value !== null && (typeof value !== 'object' || Array.isArray(value)))
    throw new RequestLimitError('response_format must be an object ({type: …})', 'response_format');
}

/**
 * `budget` less the UTF-8 bytes of `value`'s compact JSON text (as JSON.stringify writes it), or
 * a negative number as soon as the text is known to be longer: the walk stops there, so a large
 * value costs about `budget` bytes of work, not its own size, and nothing is serialized but
 * strings shorter than what is left. Its depth is bounded by maxJsonDepth, checked before the
 * body was parsed.
 */
function jsonBytesLeft(value: unknown, budget: number): number {
  if (typeof value === 'string') {
    // quotes and escapes only add to a string's length, so a longer string is over at once
    if (value.length + 2 > budget) return -1;
    return budget - Buffer.byteLength(JSON.stringify(value));
  }
  if (value === null || typeof value !== 'object') return budget - (JSON.stringify(value) ?? 'null').length;
  if (Array.isArray(value)) {
    // the brackets and the commas between the elements
    budget -= 1 + Math.max(value.length, 1);
    for (let i = 0; i < value.length && budget >= 0; i++) budget = jsonBytesLeft(value[i], budget);
    return budget;
  }
  const keys = Object.keys(value);
  // the braces, and a colon and a comma (one fewer) for each member
  budget -= 1 + Math.max(keys.length, 1) + keys.length;
  for (let i = 0; i < keys.length && budget >= 0; i++)
    budget = jsonBytesLeft((value as Record<string, unknown>)[keys[i]], jsonBytesLeft(keys[i], budget));
  return budget;
}

/**
 * Token ids: integers in [0, 2^32); throws a RequestLimitError naming the first that is not (in
 * its message and its param: `prompt[1]`, `prompt[1][0]` in a list of lists).
 */
export function checkTokenIds(value: readonly unknown[], param: string): number[] {
  for (let i = 0; i < value.length; i++) {
    if (!isTokenId(value[i])) {
      const at = `${param}[${i}]`;
      throw new RequestLimitError(`${at} must be a token id (an integer from 0 to ${MAX_TOKEN_ID})`, at);
    }
  }
  return value as number[];
}

/**
 * The prompt of a completions request: a string, a list of strings, token ids, or a list of
 * token-id lists; every element is checked (the router hashes the first). `param` names the
 * field in errors and `forms` says what it takes (SGLang's `text` and `input_ids` on
 * `/generate`, read by readGenerateRouteRequest, each take some of these forms only).
 */
export function readPrompt(
  prompt: unknown,
  param = 'prompt',
  forms = 'a string, a list of strings, token ids, or a list of token-id lists',
): Pick<RouteRequest, 'text' | 'tokens'> {
  if (typeof prompt === 'string') return { text: prompt };
  const bad = () => new RequestLimitError(`${param} must be ${forms}`, param);
  if (!Array.isArray(prompt) || prompt.length === 0) throw bad();
  if (typeof prompt[0] === 'string') {
    if (!prompt.every((p) => typeof p === 'string')) throw bad();
    return { text: prompt[0] as string };
  }
  if (Array.isArray(prompt[0])) {
    prompt.forEach((p, i) => {
      if (!Array.isArray(p) || p.length === 0) throw bad();
      checkTokenIds(p, `${param}[${i}]`);
    });
    return { tokens: prompt[0] as number[] };
  }
  return { tokens: checkTokenIds(prompt, param) };
}

/**
 * Chat messages, checked as everywhere (core/chat-messages.ts); a bad one is a 400 naming the
 * field. `onMediaUrl` is called with each media URL an engine would fetch (media-domains.ts).
 */
export function readMessages(messages: unknown, onMediaUrl?: MediaUrlCheck): ChatMessage[] {
  return checkChatMessages(messages, limitFault, false, onMediaUrl, true);
}

/** A bad message's error: a RequestLimitError naming the field (one function for every request). */
const limitFault: ChatMessageFault = (message, field) => new RequestLimitError(message, field);

/**
 * An error's message for a client: the checks' own messages (which name an argument, "x must
 * be …") pass; anything else (a runtime error from deep inside) becomes a generic sentence so
 * nothing internal leaks into a response.
 */
export function clientMessage(err: unknown, fallback = 'the request could not be routed'): string {
  if (err instanceof RequestLimitError) return err.message;
  if (
    (err instanceof RangeError || err instanceof TypeError) &&
    err.message.length <= 300 &&
    !RUNTIME_MESSAGE.test(err.message)
  )
    return err.message;
  return fallback;
}

/** Messages of errors the JavaScript runtime itself throws (V8): internal, never shown. */
const RUNTIME_MESSAGE =
  /call stack|Cannot (read|set) propert|is not a function|is not iterable|is not a constructor|Cannot convert|Cannot access|Cannot destructure|Cannot mix BigInt|Invalid (array|string) length|Invalid (time|count) value|Invalid code point|circular structure|serialize a BigInt|Reduce of empty array|out of memory/i;

/**
 * Top-level body fields that direct an engine's KV transfer in disaggregated prefill/decode
 * serving. In such a deployment the component that pairs a prefill engine with a decode engine
 * sets them; from a client they are an instruction to the engine's KV connector:
 *
 * - vLLM, vllm/entrypoints/openai/protocol.py: CompletionRequest and ChatCompletionRequest take
 *   `kv_transfer_params` (any JSON object) and hand it to the engine in SamplingParams.extra_args,
 *   which vllm/v1/request.py makes the request's kv_transfer_params.
 * - vLLM, vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py: with
 *   `do_remote_prefill`, the decode engine's scheduler (update_state_after_alloc) queues a read of
 *   `remote_block_ids` from `remote_engine_id`, and its worker handshakes over ZeroMQ with
 *   `remote_host`:`remote_port` and reads those blocks over NIXL as the prompt's KV: a client
 *   would make the engine connect to a host of its choosing and take in blocks it names. With
 *   `do_remote_decode`, a prefill engine keeps the request's blocks after it ends, for a remote
 *   reader, until VLLM_NIXL_ABORT_REQUEST_TIMEOUT.
 * - vLLM, vllm/entrypoints/openai/completion/protocol.py: CompletionRequest takes
 *   `ec_transfer_params`, "ECTransfer parameters used for encoder-cache disaggregated serving",
 *   and hands it to the engine in extra_args as it does kv_transfer_params: the engine's EC
 *   connector (vllm/distributed/ec_transfer/ec_connector/) takes a multimodal input's encoder
 *   output from the remote instance they name instead of computing it.
 * - SGLang, python/sglang/srt/entrypoints/openai/protocol.py: CompletionRequest and
 *   ChatCompletionRequest take `bootstrap_host`, `bootstrap_port` and `bootstrap_room` "for PD
 *   disaggregation": the bootstrap server a decode engine asks for the prefill engine's KV, and
 *   the transfer it joins; and `disagg_prefill_dp_rank`, a "hint telling decode which prefill DP
 *   worker has the KV cache".
 * - SGLang, python/sglang/srt/managers/io_struct.py: GenerateReqInput (the native `/generate`)
 *   takes those and, with them "for disaggregated inference", `bootstrap_pair_key` and
 *   `decode_tp_size`, which the tokenizer manager passes on to the scheduler with the bootstrap
 *   fields (TokenizedGenerateReqInput); and `kv_router_hint`, a router's hint naming the peer
 *   (`source_control_endpoint`) the engine's hierarchical cache fetches a reusable prefix's KV
 *   from.
 *
 * The gateway removes them from what it forwards unless `forwardKvTransferParams` keeps them (a
 * gateway behind the component that sets them); the endpoint picker removes them from every JSON
 * object body it reads, whatever its path.
 */
export const KV_TRANSFER_FIELDS: readonly string[] = [
  'kv_transfer_params',
  'ec_transfer_params',
  'bootstrap_host',
  'bootstrap_port',
  'bootstrap_room',
  'bootstrap_pair_key',
  'decode_tp_size',
  'disagg_prefill_dp_rank',
  'kv_router_hint',
];

/**
 * Top-level body fields that carry a client's code for an engine to run. An engine runs it only
 * when its operator allowed that at its start, and then for whoever reaches it: the gateway
 * fronts clients its operator may not trust with code execution on the engines, while callers
 * that reach the engines directly may be trusted with it.
 *
 * - SGLang's `custom_logit_processor`: `{"callable": "<hex>"}`, the hex dill.dumps of a class
 *   (CustomLogitProcessor.to_str, python/sglang/srt/sampling/custom_logit_processor.py). An
 *   engine started with `--enable-custom-logit-processor` unpickles it (`_cache_from_str`:
 *   dill.loads, when SamplingBatchInfo.from_schedule_batch builds the batch), and unpickling
 *   runs whatever code the pickle names, in the scheduler process; without the flag the
 *   tokenizer manager refuses the request (_validate_one_request). Taken at the top level of
 *   GenerateReqInput (python/sglang/srt/managers/io_struct.py, the native `/generate`: a string
 *   or a list of one per prompt), of CompletionRequest (a string) and of ChatCompletionRequest
 *   (a string or a list) in python/sglang/srt/entrypoints/openai/protocol.py; no other request
 *   model there takes it (EmbeddingRequest, ClassifyRequest, ScoringRequest, V1RerankReqInput,
 *   ResponsesRequest). `custom_params` (top level, or in `/generate`'s `sampling_params`) is
 *   kept: a JSON object the processor reads as its per-request arguments, data only.
 * - vLLM's `logits_processors` (ChatCompletionRequest and CompletionRequest in
 *   vllm/entrypoints/openai/protocol.py, later chat_completion/protocol.py and
 *   completion/protocol.py): a list of qualified names, or of `{"qualname", "args", "kwargs"}`
 *   (LogitsProcessorConstructor). When a name matches the server's `--logits-processor-pattern`
 *   (re.match; no pattern, the default, refuses the field), get_logits_processors resolves it
 *   with resolve_obj_by_qualname, importlib.import_module of the module the client named (its
 *   top-level code runs on first import) and getattr, and calls a constructor object with the
 *   client's args and kwargs, in the API server, while building the request's SamplingParams:
 *   before the V1 engine refuses per-request processors ("vLLM V1 does not support per request
 *   user provided logits processors", v1/engine/processor.py), so a V1 server with a pattern
 *   still imports and constructs what a client names. A pattern wide enough for a package's
 *   processors admits every object of that package and of any module whose name starts alike,
 *   with constructor arguments the client chooses. The same trust as SGLang's field: removed
 *   with it, by the same setting. vLLM dropped the field with the pattern
 *   (vllm-project/vllm#34400); a newer engine ignores it, so removing it costs nothing there.
 *
 * The gateway removes them from what it forwards unless `forwardCustomLogitProcessor` keeps them
 * (engines whose operator trusts the gateway's clients with code); the endpoint picker removes
 * them from every JSON object body it reads, whatever its path, as it removes the
 * KV_TRANSFER_FIELDS.
 */
export const CLIENT_CODE_FIELDS: readonly string[] = ['custom_logit_processor', 'logits_processors'];

/**
 * Members of a top-level object the gateway always removes from what it forwards, named
 * `outer.inner` in ReadRequest.removed.
 *
 * - vLLM's `kv_cache_report_mode` in `vllm_xargs` (vllm-project/vllm#45261): vLLM's CompletionRequest
 *   and ChatCompletionRequest hand `vllm_xargs` to the engine as SamplingParams.extra_args, and
 *   with `"full"` there the engine emits BlockStored again for each block the request reuses from
 *   its prefix cache, the block's state unchanged; evicting the block still emits one
 *   BlockRemoved. The router counts every BlockStored as one more copy of the block (vLLM may
 *   hold two physical blocks of one hash, stored and removed apart: kv-events/applier.ts), so a
 *   client sending it would keep the router's entries alive past the engine's cache: hits routed
 *   to an engine that no longer holds the blocks. The report mode is for a caller that reads the
 *   engine's events itself; the gateway's own index must not take it from its clients. The other
 *   members of `vllm_xargs` are kept, and one emptied is forwarded as an empty object.
 */
export const REMOVED_MEMBERS: Readonly<Record<string, readonly string[]>> = {
  vllm_xargs: ['kv_cache_report_mode'],
};

const REMOVED_MEMBER_ENTRIES = Object.entries(REMOVED_MEMBERS);

/** Which of the fields the gateway removes by default it forwards instead: the operator's settings. */
export interface ForwardedFields {
  /** Forward the KV_TRANSFER_FIELDS a client sends. */
  forwardKvTransferParams?: boolean;
  /** Forward the CLIENT_CODE_FIELDS a client sends. */
  forwardCustomLogitProcessor?: boolean;
}

/**
 * The fields of KV_TRANSFER_FIELDS and CLIENT_CODE_FIELDS that are own keys of `body` and that
 * `forward` does not keep, and the REMOVED_MEMBERS found (as `outer.inner`), or undefined when
 * there are none: a few own-key lookups on the parsed object (escaped spellings of a key are
 * parsed to it), no list unless one is found.
 */
export function removedFieldsIn(
  body: Readonly<Record<string, unknown>>,
  forward: Readonly<ForwardedFields>,
): string[] | undefined {
  let found: string[] | undefined;
  if (forward.forwardKvTransferParams !== true)
    for (const key of KV_TRANSFER_FIELDS) if (Object.hasOwn(body, key)) (found ??= []).push(key);
  if (forward.forwardCustomLogitProcessor !== true)
    for (const key of CLIENT_CODE_FIELDS) if (Object.hasOwn(body, key)) (found ??= []).push(key);
  for (const [outer, inners] of REMOVED_MEMBER_ENTRIES) {
    const value = Object.hasOwn(body, outer) ? body[outer] : undefined;
    if (value === null || typeof value !== 'object' || Array.isArray(value)) continue;
    for (const inner of inners) if (Object.hasOwn(value, inner)) (found ??= []).push(`${outer}.${inner}`);
  }
  return found;
}

/**
 * Deletes the `removed` fields (removedFieldsIn's: top-level keys, and `outer.inner` members of
 * REMOVED_MEMBERS) from `body`, a copy of the body received: an object member is removed from a
 * copy of that object, never from the object received.
 */
export function deleteRemovedFields(body: Record<string, unknown>, removed: readonly string[]): void {
  for (const key of removed) {
    const dot = key.indexOf('.');
    const outer = dot < 0 ? undefined : key.slice(0, dot);
    if (outer === undefined || !Object.hasOwn(REMOVED_MEMBERS, outer)) {
      delete body[key];
      continue;
    }
    const value = body[outer];
    if (value === null || typeof value !== 'object' || Array.isArray(value)) continue;
    const copy = { ...(value as Record<string, unknown>) };
    delete copy[key.slice(dot + 1)];
    body[outer] = copy;
  }
}

/** The `removed` of every request with nothing to remove: one frozen list, not one per request. */
const NO_FIELDS_REMOVED: readonly string[] = Object.freeze([]);

/** What a proxied request routes on, and the body to forward (the `contextforge` field removed). */
export interface ReadRequest {
  routeRequest: RouteRequest;
  body: Record<string, unknown>;
  /** True when the body to forward is the body as received (nothing removed). */
  unchanged: boolean;
  /**
   * The fields removed from the body as received (`contextforge`, removedFieldsIn): top-level
   * keys, and `outer.inner` for a member of a top-level object (REMOVED_MEMBERS).
   */
  removed: readonly string[];
}

/**
 * Reads and checks an OpenAI request (`/v1/chat/completions` or `/v1/completions`): the body
 * must be an object; metadata, model, user, cache_salt, stream, stream_options, n, best_of,
 * max_tokens, max_completion_tokens, stop, stop_regex, bad_words, stop_token_ids, logit_bias,
 * allowed_token_ids, the shapes of a chat's tools and tool_choice and of
 * response_format, the constraints the engine compiles (GRAMMAR_FIELDS, and the tools'
 * parameters when tool_choice makes the engine compile them), the log-probability counts and
 * vLLM's logprob_token_ids, the number of prompts (checked before the prompt is read), the ids
 * the engine keeps (checkEngineKeys) and the prompt or messages are checked against `limits`,
 * and every number of the body but those of its JSON data must be finite (checkFiniteNumbers).
 * Throws a RequestLimitError naming the field. The body to forward is the one received without
 * `contextforge`, without the KV_TRANSFER_FIELDS and CLIENT_CODE_FIELDS that `forward` does not
 * keep and without the REMOVED_MEMBERS (removedFieldsIn). `onMediaUrl` is called with each media
 * URL of a chat's messages (the allowlist of media hosts, media-domains.ts), in the walk that
 * checks them.
 */
export function readRouteRequest(
  path: string,
  raw: unknown,
  headers: Headers,
  limits: RequestLimits,
  forward: Readonly<ForwardedFields> = {},
  onMediaUrl?: MediaUrlCheck,
): ReadRequest {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw))
    throw new RequestLimitError('the body must be a JSON object', 'body');
  const received = raw as Record<string, unknown>;
  const { body, removed } = bodyToForward(received, forward);
  const routeRequest = metadataRouteRequest(readMetadata(received.contextforge, headers, limits));
  // the gateway routes on it (workers that list their models): a model it cannot read would be
  // routed past every list, and an engine failing on it would count against the worker
  checkName(body.model, 'model', limits.maxIdBytes, 'the name of a model the workers serve');
  // the engines refuse a user that is not a string: refused here, it costs no worker a request
  checkName(body.user, 'user', limits.maxIdBytes, 'an id of the end user');
  const salt = checkCacheSalt(body.cache_salt, limits);
  if (salt !== undefined) routeRequest.cacheSalt = salt;
  // the gateway's timeouts and accounting follow it, so it must mean what the engine reads
  if (body.stream !== undefined && body.stream !== null && typeof body.stream !== 'boolean')
    throw new RequestLimitError('stream must be a boolean', 'stream');
  checkStreamOptions(body.stream_options, body.stream === true);
  // the router's token ids follow it (a BOS or not), on the engine's /tokenize and in process
  const special = body.add_special_tokens;
  if (special !== undefined && special !== null && typeof special !== 'boolean')
    throw new RequestLimitError('add_special_tokens must be true or false', 'add_special_tokens');
  // what multiplies the engine's work for this one request
  checkChoices(body.n, 'n', limits.maxChoices);
  checkChoices(body.best_of, 'best_of', limits.maxChoices);
  checkTokenBudget(body.max_tokens, 'max_tokens');
  checkTokenBudget(body.max_completion_tokens, 'max_completion_tokens');
  checkStop(body.stop, limits);
  checkStop(body.stop_regex, limits, 'stop_regex', 'patterns');
  checkBadWords(body.bad_words, limits);
  checkStopTokenIds(body.stop_token_ids, limits);
  checkLogitBias(body.logit_bias);
  checkAllowedTokenIds(body.allowed_token_ids);
  for (const key of GRAMMAR_FIELDS) checkGrammar(body[key], key, limits.maxGrammarBytes);
  const chat = path === '/v1/chat/completions';
  // tools are a chat's: neither engine's completions request reads them
  if (chat) {
    checkToolShapes(body.tools, body.tool_choice);
    checkToolGrammars(body.tools, body.tool_choice, limits.maxGrammarBytes);
    // keys the engine refuses (REFUSED_TEMPLATE_KWARGS): refused here, they cost no worker a request
    const refused = refusedTemplateKwarg(body.chat_template_kwargs);
    if (refused !== undefined)
      throw new RequestLimitError(
        `chat_template_kwargs.${refused} cannot be given: it is an argument of the chat template's rendering itself`,
        'chat_template_kwargs',
      );
  }
  checkResponseFormat(body.response_format);
  checkLogprobs(body.logprobs, 'logprobs', limits.maxLogprobs, chat);
  checkLogprobs(body.top_logprobs, 'top_logprobs', limits.maxLogprobs);
  checkLogprobs(body.top_logprobs_num, 'top_logprobs_num', limits.maxLogprobs);
  checkLogprobs(body.prompt_logprobs, 'prompt_logprobs', limits.maxLogprobs);
  checkLogprobTokenIds(body.logprob_token_ids, limits);
  // a chat is one prompt (SGLang's serving_chat.py makes one GenerateReqInput of the
  // conversation, vLLM's serving one engine request); a completion's are counted before read
  const prompts = chat ? 1 : completionPromptCount(body, limits);
  if (chat) routeRequest.messages = readMessages(body.messages, onMediaUrl);
  // vLLM takes prompt_embeds without prompt: nothing the router can hash, so it routes on the
  // metadata and the workers' load alone
  else if (!onlyPromptEmbeds(body)) Object.assign(routeRequest, readPrompt(body.prompt));
  // what the engine keeps the request by: SGLang's lists hold one entry per prompt. Read on the
  // body as received, so a custom_logit_processor is bounded whether it is forwarded or removed,
  // as the endpoint picker bounds it on /generate before removing it
  checkEngineKeys(received, limits, prompts);
  // last, so that a field with its own check (n, logit_bias) is named by that check's message
  checkFiniteNumbers(body);
  return { routeRequest, body, unchanged: removed === undefined, removed: removed ?? NO_FIELDS_REMOVED };
}

/**
 * The body to forward: the one received unless it has a field to drop (`contextforge`, the
 * KV_TRANSFER_FIELDS and CLIENT_CODE_FIELDS that `forward` does not keep, the REMOVED_MEMBERS),
 * then a copy without them. A few own-key lookups on the parsed object (escaped spellings of a key are parsed to
 * it), no copy per request.
 */
function bodyToForward(
  received: Record<string, unknown>,
  forward: Readonly<ForwardedFields>,
): { body: Record<string, unknown>; removed: string[] | undefined } {
  let removed: string[] | undefined;
  if (Object.hasOwn(received, 'contextforge')) removed = ['contextforge'];
  const fields = removedFieldsIn(received, forward);
  if (fields !== undefined) removed = removed === undefined ? fields : removed.concat(fields);
  if (removed === undefined) return { body: received, removed };
  // spread defines every key as an own property ("__proto__" included), never a prototype
  const body = { ...received };
  deleteRemovedFields(body, removed);
  return { body, removed };
}

/** A RouteRequest of the request's metadata alone, its prompt still to be read. */
function metadataRouteRequest(m: RequestMetadata): RouteRequest {
  return {
    workflowId: m.workflowId,
    workflowStep: m.workflowStep,
    agentRole: m.agentRole,
    claGroup: m.claGroup,
    contentAnchors: m.contentAnchors,
    isolate: m.isolate,
  };
}

/**
 * Reads and checks a body of SGLang's native `/generate` (GenerateReqInput in
 * python/sglang/srt/managers/io_struct.py) into what the router routes on, as readRouteRequest
 * reads a completion: the metadata (the `contextforge` field or the headers), and the prompt
 * SGLang computes, as a completion's prompt of that text or those token ids:
 *
 * - `input_ids` when given (token ids, or a list of token-id lists: the first, as a completion's
 *   list). SGLang's TokenizerManager._tokenize_one_request takes them over `text` when a body
 *   has both, so they are what its radix cache holds;
 * - else `text` (a string, or a list of them: the first);
 * - else nothing: a body of `input_embeds` alone (SGLang caches none of it: it needs
 *   `--disable-radix-cache`) or without a prompt is routed on its metadata and the workers' load.
 *
 * A `prompt` or `messages` in the body is nothing SGLang reads, and is not read here.
 * The blocks are keyed as SGLang keys its radix cache (RadixKey in
 * python/sglang/srt/mem_cache/radix_cache.py: the token ids under `extra_key` and, since
 * sgl-project/sglang#30827, `cache_salt` apart from it; an adapter's blocks apart from the base
 * model's). Of SGLang's per-prompt lists, the first prompt's entry keys it, as that prompt's
 * blocks are the ones hashed; a null or empty entry is none, as SGLang reads `""`
 * (GenerateReqInput._normalize_single_inputs):
 *
 * - `lora_path` names the adapter (SGLang looks it up by name), the LoRA of the chain's root, as
 *   an OpenAI request's `model` naming an adapter is;
 * - `cache_salt` is the chain's salt, as an OpenAI request's: SGLang's KV events carry it, so the
 *   router's keys meet the engine's;
 * - `extra_key` makes a salt of its own with it (generateCacheSalt): SGLang's KV events do not
 *   carry it, so such blocks are matched by the router's own decisions only.
 *
 * The limits are checkGenerateRequest's; a prompt of the wrong shape is refused naming `text` or
 * `input_ids` (`input_ids[1]` for an element of a batch). The body to forward is the one received
 * without `contextforge` and the fields `forward` does not keep, as readRouteRequest's. Read for
 * the endpoint picker, which serves no API keys: a tenant's salt is not joined to it. Throws a
 * RequestLimitError naming the field.
 */
export function readGenerateRouteRequest(
  raw: unknown,
  headers: Headers,
  limits: RequestLimits,
  forward: Readonly<ForwardedFields> = {},
): ReadRequest {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw))
    throw new RequestLimitError('the body must be a JSON object', 'body');
  const received = raw as Record<string, unknown>;
  checkGenerateRequest(received, limits);
  const { body, removed } = bodyToForward(received, forward);
  checkFiniteNumbers(body);
  const routeRequest = metadataRouteRequest(readMetadata(received.contextforge, headers, limits));
  const prompt = readGeneratePrompt(received);
  if (prompt !== undefined) Object.assign(routeRequest, prompt);
  const lora = firstPromptEntry(received.lora_path);
  if (lora !== undefined) routeRequest.lora = lora;
  const salt = generateCacheSalt(firstPromptEntry(received.cache_salt), firstPromptEntry(received.extra_key));
  if (salt !== undefined) routeRequest.cacheSalt = salt;
  return { routeRequest, body, unchanged: removed === undefined, removed: removed ?? NO_FIELDS_REMOVED };
}

/** The prompt SGLang computes for a `/generate` body (see readGenerateRouteRequest), or undefined for none. */
function readGeneratePrompt(
  body: Readonly<Record<string, unknown>>,
): Pick<RouteRequest, 'text' | 'tokens'> | undefined {
  const ids = body.input_ids;
  if (ids !== undefined && ids !== null) {
    const forms = 'token ids or a list of token-id lists';
    // a list of strings is a completion's prompt, not SGLang's input_ids
    if (!Array.isArray(ids) || typeof ids[0] === 'string')
      throw new RequestLimitError(`input_ids must be ${forms}`, 'input_ids');
    return readPrompt(ids, 'input_ids', forms);
  }
  const text = body.text;
  if (text === undefined || text === null) return undefined;
  const forms = 'a string or a list of strings';
  // token ids are a completion's prompt, not SGLang's text
  if (Array.isArray(text) && text.length > 0 && typeof text[0] !== 'string')
    throw new RequestLimitError(`text must be ${forms}`, 'text');
  return readPrompt(text, 'text', forms);
}

/**
 * The string of one of SGLang's fields given once or as a list, one per prompt (`lora_path`,
 * `cache_salt`, `extra_key`), for the first prompt: undefined when it is absent, null or empty.
 * Its shape was checked by checkGenerateRequest.
 */
export function firstPromptEntry(value: unknown): string | undefined {
  const entry: unknown = Array.isArray(value) ? value[0] : value;
  return typeof entry === 'string' && entry !== '' ? entry : undefined;
}

/**
 * The salt a `/generate` prompt's blocks are keyed by: its `cache_salt` alone, as an OpenAI
 * request's (SGLang's KV events carry it, so precise mode matches them), unless the prompt has an
 * `extra_key`. SGLang keys its radix cache by the pair (sgl-project/sglang#30827 keeps them apart,
 * because a concatenation collides), so the pair is spelled unambiguously as a JSON list: requests
 * differing in either never share a chain, and a client's own `cache_salt` meets it only by
 * spelling out that list.
 */
function generateCacheSalt(cacheSalt: string | undefined, extraKey: string | undefined): string | undefined {
  if (extraKey === undefined) return cacheSalt;
  return JSON.stringify([extraKey, cacheSalt ?? null]);
}

/**
 * Checks the body of SGLang's native `/generate` (GenerateReqInput in
 * python/sglang/srt/managers/io_struct.py) against `limits`, on the fields where they sit
 * there: `rid`, `session_id`, `session_params`, `lora_path`, `extra_key` and
 * `custom_logit_processor` as checkEngineKeys bounds them (vLLM's `request_id` is no field of
 * it); `cache_salt`, a string of at most `limits.maxIdBytes` bytes as an OpenAI request's, or
 * SGLang's list of them, one per prompt (sgl-project/sglang#30827; `""` is none); `top_logprobs_num`, an integer or SGLang's list of one per prompt, as checkLogprobs
 * (`return_logprob` is the switch, true or false, and sizes nothing); `token_ids_logprob`
 * (checkTokenIdsLogprob); and inside `sampling_params`, an object or a list of one per prompt
 * (SamplingParams in python/sglang/srt/sampling/sampling_params.py), `n`, `max_new_tokens`,
 * `stop`, `stop_regex`, `stop_token_ids`, `logit_bias` and the constraints SGLang compiles (`json_schema`, `regex`,
 * `ebnf`, `structural_tag`: RequestLimits.maxGrammarBytes), named by their path
 * (`sampling_params.n`, `sampling_params[1].stop`).
 * SGLang multiplies the batch by `n` (GenerateReqInput._handle_parallel_sampling) and checks
 * every stop string and pattern at every step, as the OpenAI paths' engines do. Each of SGLang's
 * per-prompt lists has at most one entry per prompt of the body, and the body at most
 * `limits.maxPrompts` prompts (generatePrompts). Nothing else is read here: the prompt the
 * router routes on is read by readGenerateRouteRequest, which also refuses a number past the
 * largest double (checkFiniteNumbers); the other prompts of a batch, the other sampling
 * parameters and anything of the wrong shape are the engine's to check. Throws a
 * RequestLimitError naming the field.
 */
export function checkGenerateRequest(body: Readonly<Record<string, unknown>>, limits: RequestLimits): void {
  const prompts = generatePrompts(body, limits);
  checkSGLangKeys(body, limits, prompts);
  // the router keys the prompt's blocks by it (readGenerateRouteRequest), as it keys an OpenAI
  // request's; SGLang takes one per prompt too, and reads "" as none
  checkStringOrList(body.cache_salt, 'cache_salt', limits.maxIdBytes, 'a salt of the prefix cache', prompts);
  perPrompt(body.top_logprobs_num, 'top_logprobs_num', limits, prompts, checkTopLogprobsNum);
  checkTokenIdsLogprob(body.token_ids_logprob, limits, prompts);
  perPrompt(body.sampling_params, 'sampling_params', limits, prompts, checkSamplingParams);
}

/**
 * SGLang's `token_ids_logprob` on `/generate`: absent, null, a list of at most
 * `limits.maxLogprobs` token ids (isTokenId), or a list of such lists, one per prompt
 * (checkPromptList). SGLang reports the log probability of every listed id at every position it
 * reports on, as it reports `top_logprobs_num` alternatives: at every generated token (the
 * sampler's get_token_ids_logprobs in python/sglang/srt/layers/: `logprobs[i,
 * token_ids].tolist()`, in the step that serves the whole batch) and, from `logprob_start_len`,
 * at every prompt token (get_token_ids_logprobs_prefill in logits_processor.py: a positions ×
 * ids block of the prompt's log probabilities made a Python list). It bounds neither the number
 * of ids nor, before recent versions, their range (an id past the vocabulary indexes past the
 * tensor). The bound is `--max-logprobs`, "the most log probabilities a request may ask for at
 * each token": an id listed is one more log probability per token, as an alternative ranked
 * is, so an operator who allows 20 (or none) allows 20 (or none) either way; classification by
 * a few label tokens (SGLang's own scoring API lists them here) stays well within it. A flat
 * list is copied to every prompt of a batch (GenerateReqInput._normalize_logprob_params); an
 * empty one is none. Only `/generate` reads the field: SGLang's OpenAI request models have none
 * (python/sglang/srt/entrypoints/openai/protocol.py).
 */
function checkTokenIdsLogprob(value: unknown, limits: RequestLimits, prompts: number): void {
  if (value === undefined || value === null) return;
  const param = 'token_ids_logprob';
  if (!Array.isArray(value))
    throw new RequestLimitError(`${param} must be a list of token ids, or one such list per prompt`, param);
  if (!Array.isArray(value[0])) return checkLogprobIds(value, param, limits.maxLogprobs);
  checkPromptList(value, param, prompts);
  for (let i = 0; i < value.length; i++) {
    const at = `${param}[${i}]`;
    const ids: unknown = value[i];
    if (!Array.isArray(ids)) throw new RequestLimitError(`${at} must be a list of token ids`, at);
    checkLogprobIds(ids, at, limits.maxLogprobs);
  }
}

/**
 * vLLM's `logprob_token_ids` on the OpenAI paths (CompletionRequest and ChatCompletionRequest
 * in vllm/entrypoints/openai/completion/protocol.py and chat_completion/protocol.py,
 * vllm-project/vllm#43463): absent, null or a list of at most `limits.maxLogprobs` token ids
 * (isTokenId); an empty list is none. vLLM reports the log probability of every listed id at
 * every generated token, in place of the `logprobs` ranked alternatives (SamplingParams
 * .logprob_token_ids, gathered by the sampler at every step), so an id listed is one more log
 * probability per token, as with SGLang's `token_ids_logprob` (checkTokenIdsLogprob), and is
 * bounded alike. vLLM's own bound, MAX_LOGPROB_TOKEN_IDS (vllm/sampling_params.py), is 128;
 * older vLLM ignores the field. Anything but a list is refused, as vLLM's `list[int]` refuses
 * it. The endpoint picker reads OpenAI bodies through the same checks.
 */
function checkLogprobTokenIds(value: unknown, limits: RequestLimits): void {
  if (value === undefined || value === null) return;
  const param = 'logprob_token_ids';
  if (!Array.isArray(value)) throw new RequestLimitError(`${param} must be a list of token ids`, param);
  checkLogprobIds(value, param, limits.maxLogprobs);
}

/** One list of `token_ids_logprob` or `logprob_token_ids` (`param` names it): at most `max` token ids. */
function checkLogprobIds(ids: readonly unknown[], param: string, max: number): void {
  if (ids.length > max)
    throw new RequestLimitError(
      `${param} has more than ${max} token ids (the most log probabilities a token may report)`,
      param,
    );
  checkTokenIds(ids, param);
}

/** One of SGLang's `top_logprobs_num` (`at` names it), as checkLogprobs bounds it. */
function checkTopLogprobsNum(value: unknown, at: string, limits: RequestLimits): void {
  checkLogprobs(value, at, limits.maxLogprobs);
}

/** One of SGLang's `sampling_params` objects (`at` names it); anything but an object is the engine's. */
function checkSamplingParams(value: unknown, at: string, limits: RequestLimits): void {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return;
  const params = value as Record<string, unknown>;
  checkChoices(params.n, `${at}.n`, limits.maxChoices);
  checkTokenBudget(params.max_new_tokens, `${at}.max_new_tokens`);
  checkStop(params.stop, limits, `${at}.stop`);
  checkStop(params.stop_regex, limits, `${at}.stop_regex`, 'patterns');
  checkStopTokenIds(params.stop_token_ids, limits, `${at}.stop_token_ids`);
  checkLogitBias(params.logit_bias, `${at}.logit_bias`);
  for (const key of SAMPLING_GRAMMAR_FIELDS) checkGrammar(params[key], `${at}.${key}`, limits.maxGrammarBytes);
}

/**
 * The constraints SGLang compiles, in `/generate`'s `sampling_params` (SamplingParams in
 * python/sglang/srt/sampling/sampling_params.py): a JSON schema's text, a regex, an EBNF grammar
 * and a structural tag's JSON, each a string.
 */
const SAMPLING_GRAMMAR_FIELDS: readonly string[] = ['json_schema', 'regex', 'ebnf', 'structural_tag'];
