/**
 * A routing policy given as an object (a user's own, as Dynamo's custom worker selector and
 * SGLang's policy registry allow) is checked once, when the router is built: a missing or
 * mistyped member is reported by name then, not as a TypeError deep inside route().
 */
import type { PolicyChoice, RoutingPolicy } from './types.js';
import { typeName } from '../validate.js';

const OPTIONAL_HOOKS = ['scoreTerms', 'onRouted', 'onReleased', 'onPrefillDone', 'onWorkerRemoved'] as const;

/** Returns `value` as a RoutingPolicy, or throws a TypeError naming the member that is wrong. */
export function checkPolicyObject(value: unknown, name = 'policy'): RoutingPolicy {
  if (value === null || typeof value !== 'object')
    throw new TypeError(`${name} must be a policy name or an object implementing RoutingPolicy`);
  const p = value as Partial<Record<keyof RoutingPolicy, unknown>>;
  if (typeof p.name !== 'string' || p.name.length === 0)
    throw new TypeError(`${name}.name must be a non-empty string (RoutingPolicy.name)`);
  if (typeof p.choose !== 'function')
    throw new TypeError(`${name}.choose must be a function (RoutingPolicy.choose(candidates, request))`);
  for (const hook of OPTIONAL_HOOKS) {
    if (p[hook] !== undefined && typeof p[hook] !== 'function')
      throw new TypeError(`${name}.${hook} must be a function when given`);
  }
  if (p.speculative !== undefined && typeof p.speculative !== 'boolean' && p.speculative !== 'untracked')
    throw new TypeError(`${name}.speculative must be a boolean or 'untracked' when given`);
  if (p.readsBlocks !== undefined && typeof p.readsBlocks !== 'boolean')
    throw new TypeError(`${name}.readsBlocks must be a boolean when given`);
  return value as RoutingPolicy;
}

/** What is wrong with a choice checkChoice() refused, naming the policy (a TypeError or a RangeError). */
export function choiceError(policy: string, choice: unknown, n: number): TypeError | RangeError {
  if (typeof choice !== 'object' || choice === null)
    return new TypeError(
      `policy '${policy}': choose() must return a PolicyChoice { index, confidence, reason }, got ${typeName(choice)}`,
    );
  const { index, confidence } = choice as PolicyChoice;
  if (!(Number.isInteger(index) && index >= -1 && index < n))
    return new RangeError(`policy '${policy}' chose index ${String(index)} of ${n} candidates`);
  if (typeof confidence !== 'number')
    return new TypeError(
      `policy '${policy}' chose a confidence of type ${typeName(confidence)}; it must be a number from 0 to 1`,
    );
  return new RangeError(`policy '${policy}' chose confidence ${confidence}; it must be a number from 0 to 1`);
}

/** Longest `reason` a policy's choice may give, in UTF-16 code units (the built-in ones are a dozen at most). */
export const MAX_REASON_LENGTH = 64;

/**
 * Checks a policy's choice over `n` candidates, its members read once into the arguments (a user's
 * policy is not trusted to keep to PolicyChoice; the built-in ones always do): an index of -1 or a
 * candidate's, a confidence from 0 to 1, a reason of 1 to MAX_REASON_LENGTH characters. A TypeError
 * or RangeError names the policy and the member. Allocates only to throw.
 */
export function checkChoice(policy: string, index: number, confidence: number, reason: unknown, n: number): void {
  if (
    !(Number.isInteger(index) && index >= -1 && index < n) ||
    !(typeof confidence === 'number' && confidence >= 0 && confidence <= 1)
  )
    throw choiceError(policy, { index, confidence }, n);
  if (typeof reason !== 'string')
    throw new TypeError(
      `policy '${policy}' chose a reason of type ${typeName(reason)}; it must be a string of 1 to ${MAX_REASON_LENGTH} characters`,
    );
  if (reason.length === 0 || reason.length > MAX_REASON_LENGTH)
    throw new RangeError(
      `policy '${policy}' chose a reason of ${reason.length} characters; it must be a string of 1 to ${MAX_REASON_LENGTH} characters`,
    );
}
