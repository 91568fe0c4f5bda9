/**
 * The argument handling of the seed's anchor API (`reference/seed/kv_aware_router.py`):
 * selectWorker() is a route() of the anchor, and updateWorkerState() sets a worker's load,
 * registering an unknown worker as the seed does. Checks name the seed's arguments.
 */
import * as check from '../validate.js';
import { MAX_WORKER_CLA_GROUPS, type WorkerRegistry } from '../worker-registry.js';
import { PromptTooLongError } from './prompt-too-long.js';
import type { RouteRequest, SelectWorkerOptions, UpdateWorkerStateOptions } from './types.js';

const SELECT_WORKER_KEYS = check.keySet<SelectWorkerOptions>({
  claGroup: true,
  workflowStep: true,
  tokenLength: true,
  workflowId: true,
});
const UPDATE_WORKER_STATE_KEYS = check.keySet<UpdateWorkerStateOptions>({ claGroup: true, workflowStep: true });

/**
 * The route() request selectWorker(anchorHash, opts) makes (untracked, as the seed counts
 * nothing in flight). A tokenLength past `maxPromptTokens` is refused, as route() refuses
 * such a promptTokens, but named as the seed names it.
 */
export function seedRouteRequest(
  anchorHash: string,
  opts: SelectWorkerOptions,
  maxPromptTokens: number,
  maxIdBytes: number,
): RouteRequest {
  check.boundedId(anchorHash, 'anchorHash', maxIdBytes);
  check.object(opts, 'opts');
  check.knownKeys(opts, SELECT_WORKER_KEYS, 'opts');
  const tokenLength = check.nonNegativeInt(opts.tokenLength, 'tokenLength', 0);
  if (tokenLength > maxPromptTokens) throw new PromptTooLongError(tokenLength, maxPromptTokens, 'tokenLength');
  return {
    anchor: anchorHash,
    claGroup: opts.claGroup,
    workflowStep: opts.workflowStep,
    workflowId: opts.workflowId,
    promptTokens: tokenLength,
  };
}

/**
 * updateWorkerState(workerId, load, opts) on the router's workers. A CLA group a worker does
 * not serve yet is added to its groups, up to MAX_WORKER_CLA_GROUPS: past that the call is
 * refused, naming claGroup, and nothing changes.
 */
export function applySeedWorkerState(
  workers: WorkerRegistry,
  workerId: string,
  load: number,
  opts: UpdateWorkerStateOptions,
): void {
  check.workerId(workerId, 'workerId');
  const clamped = check.load(load, 'load');
  check.object(opts, 'opts');
  check.knownKeys(opts, UPDATE_WORKER_STATE_KEYS, 'opts');
  const claGroup = check.optionalNonNegativeInt(opts.claGroup, 'claGroup');
  const workflowStep = check.optionalNonNegativeInt(opts.workflowStep, 'workflowStep');
  const state = workers.register(workerId);
  if (claGroup !== null && state.claGroups.size >= MAX_WORKER_CLA_GROUPS && !state.claGroups.has(claGroup))
    throw new RangeError(
      `claGroup ${claGroup} not added: worker '${workerId}' serves ${MAX_WORKER_CLA_GROUPS} CLA groups already, the most a worker may`,
    );
  state.load = clamped;
  if (claGroup !== null) state.claGroups.add(claGroup);
  if (workflowStep !== null) state.lastUsedStep = workflowStep;
}
