import type { Command } from 'commander';
import { InvalidArgumentError } from 'commander';
import { checkPolicyOptions, type PolicyOptions } from '../../core/policies/index.js';
import { MAX_JUDGE_ROLES } from '../../core/router/options-schema.js';
import { MAX_SEED } from '../../core/rng.js';
import { quotedText } from '../../core/shown-text.js';
import { DEFAULT_MAX_ID_BYTES, longerThanUtf8Bytes } from '../../core/validate.js';
import type { ScenarioOptions } from '../../sim/scenarios.js';
import { fractionOption, intOption, pathOption, positiveNumberOption, SIM_LIMITS } from '../options.js';

/** Scenario flags that map one to one onto ScenarioOptions. */
type ScenarioFlags = Pick<
  ScenarioOptions,
  'eventJitterMs' | 'eventLoss' | 'replicas' | 'stateLagMs' | 'cancelRate' | 'cancelWithinMs' | 'nonStreamingShare'
>;

export interface SimulateFlags extends ScenarioFlags {
  trace: string;
  workers: number;
  policies: string;
  speed: number;
  format: string;
  report?: string;
  assignments?: string;
  kvTokens?: number;
  maxModelLen?: number;
  blendRecompute: number;
  eventDelayMs: number;
  scrapeIntervalMs?: number;
  progress: boolean;
  closedLoop?: boolean;
  fail: string[];
  drain: string[];
  workerKvTokens?: number[];
  scenarioSeed?: number;
  policyOptions?: PolicyOptions;
  judgeRoles?: string[];
}

function policyOptionsOption(value: string): PolicyOptions {
  let parsed: unknown;
  try {
    parsed = JSON.parse(value);
  } catch {
    throw new InvalidArgumentError(`--policy-options must be a JSON object, got ${quotedText(value)}`);
  }
  try {
    checkPolicyOptions(parsed);
  } catch (e) {
    throw new InvalidArgumentError(`--policy-options: ${(e as Error).message}`);
  }
  if ((parsed as Record<string, unknown>).costWeights !== undefined)
    throw new InvalidArgumentError('--policy-options: cost weights are not peer options');
  return parsed as PolicyOptions;
}

/**
 * `--judge-roles a,b` (repeatable): the agent roles (a trace's `agent_role`) whose requests reuse
 * no other request's KV, as the router's `judgeRoles` (at most MAX_JUDGE_ROLES, each at most as
 * long as a trace's ids).
 */
function judgeRolesOption(value: string, previous: string[] = []): string[] {
  const roles = value.split(',').map((v) => v.trim());
  if (roles.some((r) => r === ''))
    throw new InvalidArgumentError(`--judge-roles must be comma-separated roles, got ${quotedText(value)}`);
  const all = [...previous, ...roles];
  if (all.length > MAX_JUDGE_ROLES)
    throw new InvalidArgumentError(`--judge-roles names ${all.length} roles, more than ${MAX_JUDGE_ROLES}`);
  const long = roles.find((r) => longerThanUtf8Bytes(r, DEFAULT_MAX_ID_BYTES));
  if (long !== undefined)
    throw new InvalidArgumentError(
      `--judge-roles: a role must be at most ${DEFAULT_MAX_ID_BYTES} bytes of UTF-8, got ${long.length} characters`,
    );
  return all;
}

// an empty item (`--fail ''`, `w1@1s,`) is kept: it is refused as no WORKER@TIME, not dropped unseen
const collect = (value: string, previous: string[]) => [...previous, ...value.split(',').map((v) => v.trim())];

function tokenListOption(value: string): number[] {
  const list = value.split(',').map((v) => v.trim());
  return list.map((v, i) => {
    const n = Number(v);
    if (!/^\d+$/.test(v) || !Number.isSafeInteger(n) || n < 1 || n > SIM_LIMITS.kvTokens)
      throw new InvalidArgumentError(
        `--worker-kv-tokens: entry ${i + 1} must be an integer from 1 to ${SIM_LIMITS.kvTokens}, got ${quotedText(v)}`,
      );
    return n;
  });
}

export function registerSimulateCommand(program: Command): void {
  program
    .command('simulate')
    .description('replay a trace on a simulated cluster, every policy on the same requests')
    .requiredOption(
      '--trace <file>',
      'Mooncake JSONL trace (.jsonl or .jsonl.gz), a RAGPulse directory, workflows:N[:SEED] or agentic:N[:SEED]',
      pathOption('--trace'),
    )
    .option('--workers <n>', 'engines in the cluster', intOption('--workers', 1, SIM_LIMITS.workers), 8)
    .option(
      '--policies <list>',
      'comma-separated policies (NAME-prefix-only: content anchors not scored)',
      'cost,seed,dynamo,sglang,llmd,round-robin',
    )
    .option('--speed <x>', 'arrival-rate multiplier', positiveNumberOption('--speed', SIM_LIMITS.speed), 1)
    .option('--format <table|json>', 'output format', 'table')
    .option(
      '--kv-tokens <n>',
      'KV capacity of each engine in tokens (default 300000)',
      intOption('--kv-tokens', 1, SIM_LIMITS.kvTokens),
    )
    .option(
      '--max-model-len <n>',
      'longest request (prompt + output) an engine serves; longer ones are rejected (default 131072, capped by --kv-tokens)',
      intOption('--max-model-len', 1, SIM_LIMITS.kvTokens),
    )
    .option(
      '--blend-recompute <f>',
      'fraction of a reused content anchor recomputed (CacheBlend-style)',
      fractionOption('--blend-recompute'),
      0.15,
    )
    .option(
      '--event-delay-ms <n>',
      'delay of KV events from engine to router',
      intOption('--event-delay-ms', 0, SIM_LIMITS.delayMs),
      50,
    )
    .option(
      '--scrape-interval-ms <n>',
      "interval of load scrapes (default 200; llmd, llmd-affinity: 50, llm-d's refresh interval)",
      intOption('--scrape-interval-ms', 1, SIM_LIMITS.delayMs),
    )
    .option(
      '--fail <worker@time...>',
      'a worker fails at a time, e.g. w3@600s (repeatable or comma-separated)',
      collect,
      [],
    )
    .option('--drain <worker@time...>', 'a worker is drained at a time, e.g. w3@600s', collect, [])
    .option(
      '--event-jitter-ms <n>',
      'extra KV-event delay, uniform in [0, n] ms per batch',
      intOption('--event-jitter-ms', 0, SIM_LIMITS.delayMs),
    )
    .option(
      '--event-loss <fraction>',
      'fraction of KV-event batches the router never receives',
      fractionOption('--event-loss'),
    )
    .option('--replicas <n>', 'router replicas sharing state (round-robin in front)', intOption('--replicas', 1, 64))
    .option(
      '--state-lag-ms <n>',
      'delay of shared state between replicas (default 20)',
      intOption('--state-lag-ms', 0, SIM_LIMITS.delayMs),
    )
    .option('--cancel-rate <fraction>', 'fraction of requests whose client cancels', fractionOption('--cancel-rate'))
    .option(
      '--cancel-within-ms <n>',
      'a cancelling client gives up uniformly within n ms (default 10000)',
      intOption('--cancel-within-ms', 1, SIM_LIMITS.delayMs),
    )
    .option(
      '--non-streaming-share <fraction>',
      'fraction of requests whose answer is not streamed (the router reads their prefill off the engines)',
      fractionOption('--non-streaming-share'),
    )
    .option(
      '--closed-loop',
      "send a session's next request only once its previous one has ended (trace session_id; default: at trace times)",
    )
    .option(
      '--worker-kv-tokens <list>',
      'KV tokens of each worker, comma-separated (heterogeneous workers)',
      tokenListOption,
    )
    .option(
      '--scenario-seed <n>',
      'seed of jitter, loss and cancellations (default 1)',
      intOption('--scenario-seed', 0, MAX_SEED),
    )
    .option(
      '--policy-options <json>',
      'peer policy knobs, e.g. \'{"sglang":{"cacheThreshold":0.5}}\' (see policyOptions)',
      policyOptionsOption,
    )
    .option(
      '--judge-roles <list>',
      "agent roles (a trace's agent_role) whose requests reuse no other request's KV, as serve's (default: none)",
      judgeRolesOption,
    )
    .option('--report <file>', 'write a self-contained HTML report', pathOption('--report'))
    .option('--assignments <file>', 'write one JSON line per request and policy', pathOption('--assignments'))
    .option('--no-progress', 'no progress bar on stderr')
    // the simulator and the trace readers are loaded only to run them
    .action(async (flags: SimulateFlags) => (await import('./simulate-run.js')).runSimulate(flags));
}
