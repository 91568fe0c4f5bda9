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
  /** Never reuse other requests' KV (asked for, or the agent role is a judge's). */
  isolated = false;
}

/** Checks the request's metadata into `into`; `judgeRoles` are the agent roles routed isolated. */
export function readRouteFields(request: RouteRequest, judgeRoles: ReadonlySet<string>, into: RouteFields): void {
  into.claGroup = check.optionalNonNegativeInt(request.claGroup, 'claGroup');
  into.workflowStep = check.optionalNonNegativeInt(request.workflowStep, 'workflowStep');
  into.workflowId = check.optionalId(request.workflowId, 'workflowId');
  into.anchor = check.optionalId(request.anchor, 'anchor');
  into.contentAnchors = request.contentAnchors ? checkContentAnchors(request.contentAnchors) : undefined;
  check.optionalBoolean(request.isolate, 'isolate');
  const agentRole = check.optionalId(request.agentRole, 'agentRole');
  into.isolated = request.isolate === true || (agentRole !== undefined && judgeRoles.has(agentRole));
}

export function checkContentAnchors(anchors: unknown): ContentAnchor[] {
  if (!Array.isArray(anchors)) throw new TypeError('contentAnchors must be an array of { id, tokens }');
  anchors.forEach((a, i) => {
    if (a === null || typeof a !== 'object') throw new TypeError(`contentAnchors[${i}] must be an object`);
    check.requireId((a as ContentAnchor).id, `contentAnchors[${i}].id`);
    check.nonNegativeInt((a as ContentAnchor).tokens, `contentAnchors[${i}].tokens`, 0);
  });
  return anchors as ContentAnchor[];
}
