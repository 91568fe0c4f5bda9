/**
 * The request's routing metadata (CLA group, workflow, anchors, isolation), checked once as
 * route() receives it. Every message names the field; the hot path then trusts the values.
 */
import type { ContentAnchor } from '../content-anchors.js';
import * as check from '../validate.js';
import type { RouteRequest } from './types.js';

/** The checked metadata of the request being routed (one instance per router, reused). */
export class RouteFields {
  claGroup: number | null = null;
  workflowStep: number | null = null;
  workflowId: string | undefined = undefined;
  anchor: string | undefined = undefined;
  contentAnchors: ContentAnchor[] | undefined = undefined;
  /**
   * The namespace the content anchors are keyed under: the root (hi, lo) of the request's
   * block chain (hashing.ts chainRoot()), set by route() once the namespace is known.
   */
  readonly anchorNamespace = new Uint32Array(2);
  /** Never reuse other requests' KV (asked for, or the agent role is a judge's). */
  isolated = false;
}

/**
 * Checks the request's metadata into `into`; `judgeRoles` are the agent roles routed isolated,
 * `maxIdBytes` the longest id (UTF-8 bytes) it takes, `maxAnchors` the most content anchors. Also checks the type of each way of
 * naming the prompt, and that the request names it one way only (see checkPromptFields).
 */
export function readRouteFields(
  request: RouteRequest,
  judgeRoles: ReadonlySet<string>,
  maxIdBytes: number,
  maxAnchors: number,
  into: RouteFields,
): void {
  checkPromptFields(request);
  into.claGroup = check.optionalNonNegativeInt(request.claGroup, 'claGroup');
  into.workflowStep = check.optionalNonNegativeInt(request.workflowStep, 'workflowStep');
  into.workflowId = check.optionalBoundedId(request.workflowId, 'workflowId', maxIdBytes);
  into.anchor = check.optionalBoundedId(request.anchor, 'anchor', maxIdBytes);
  into.contentAnchors = request.contentAnchors
    ? checkContentAnchors(request.contentAnchors, maxIdBytes, maxAnchors)
    : undefined;
  check.optionalBoolean(request.isolate, 'isolate');
  const agentRole = check.optionalBoundedId(request.agentRole, 'agentRole', maxIdBytes);
  into.isolated = request.isolate === true || (agentRole !== undefined && judgeRoles.has(agentRole));
}

/** The ways a request names its prompt (RouteRequest), in the order a refusal names them. */
const PROMPT_FORMS = ['tokens', 'blockHashes', 'messages', 'text'] as const;

/**
 * The types of the prompt's fields, by typeof (allocating nothing): what route() reads of the
 * one it uses is checked further as it reads it. `promptTokens` and `blockTokens` are checked
 * as numbers whether or not they are read. A request names its prompt one way (RouteRequest,
 * docs/routing.md §1): two given (`{ text, tokens }`) are refused with a TypeError naming
 * both, as one of them would otherwise be routed on and the other silently dropped. None given
 * (`route({})`, the seed API's requests) is a prompt of no blocks.
 */
function checkPromptFields(request: RouteRequest): void {
  const { text, messages, blockHashes, blockTokens, promptTokens } = request;
  if (text !== undefined && typeof text !== 'string')
    throw new TypeError(`text must be a string, got ${check.typeName(text)}`);
  if (messages !== undefined && !Array.isArray(messages)) throw new TypeError('messages must be an array'); // as checkChatMessages says it
  if (blockHashes !== undefined && (blockHashes === null || typeof blockHashes !== 'object'))
    throw new TypeError(`blockHashes must be an array, got ${check.typeName(blockHashes)}`);
  if (blockTokens !== undefined) check.positiveInt(blockTokens, 'blockTokens', 0);
  if (promptTokens !== undefined) check.nonNegativeInt(promptTokens, 'promptTokens', 0);
  let given: (typeof PROMPT_FORMS)[number] | undefined;
  for (const form of PROMPT_FORMS) {
    if (request[form] === undefined) continue;
    if (given !== undefined)
      throw new TypeError(
        `${given} and ${form} both given: a request names its prompt one way (tokens, blockHashes, messages or text)`,
      );
    given = form;
  }
}

/**
 * Content anchors: at most `maxAnchors` (the router's maxContentAnchors, checked before any is
 * read), each an id of at most `maxIdBytes` UTF-8 bytes and a count of the prompt's
 * tokens it covers: an integer from 0 to 2^53 - 1 (0 when left out). Past that a count is no
 * integer a sum can keep apart (1e308 would be taken as one); what an anchor credits a
 * worker is held at the prompt's length where it is scored, so anchors whose tokens add up to
 * more than the prompt are not refused (a gateway knows a text prompt's length only roughly;
 * the simulator refuses such a trace line, whose lengths are exact).
 */
export function checkContentAnchors(anchors: unknown, maxIdBytes: number, maxAnchors: number): ContentAnchor[] {
  if (!Array.isArray(anchors)) throw new TypeError('contentAnchors must be an array of { id, tokens }');
  if (anchors.length > maxAnchors)
    throw new RangeError(
      `contentAnchors must hold at most ${maxAnchors} anchors (the router's maxContentAnchors), got ${anchors.length}`,
    );
  for (let i = 0; i < anchors.length; i++) {
    const a: unknown = anchors[i];
    if (a === null || typeof a !== 'object') throw new TypeError(`contentAnchors[${i}] must be an object`);
    check.boundedId((a as ContentAnchor).id, `contentAnchors[${i}].id`, maxIdBytes);
    const tokens = (a as ContentAnchor).tokens;
    if (tokens !== undefined) check.requiredNonNegativeInt(tokens, `contentAnchors[${i}].tokens`);
  }
  return anchors as ContentAnchor[];
}
