import { createWriteStream } from 'node:fs';
import cliProgress from 'cli-progress';
import {
  assignmentLines,
  comparePolicies,
  comparisonWarnings,
  policyVariant,
  type ComparisonReport,
} from '../../sim/compare.js';
import { loadTrace, namingTrace, traceFiles } from '../../sim/load-trace.js';
import { distinctTraceBlocks } from '../../sim/trace.js';
import type { PolicyResult } from '../../sim/simulator.js';
import { formatTable, pct } from '../format.js';
import { escapeUnprintable, fileErrorMessage, quotedText, shownText } from '../../core/shown-text.js';
import { parseWorkerEvents, type ScenarioOptions } from '../../sim/scenarios.js';
import { ENGINE_DEFAULTS } from '../../engine-model/config.js';
import {
  checkClusterKv,
  checkClusterKvBlocks,
  checkPolicyNames,
  checkReplicaBlocks,
  policyList,
  SIM_LIMITS,
} from '../options.js';
import {
  checkDistinctOutputs,
  checkOutputFile,
  pendingOutput,
  readerGone,
  type OutputFile,
  type PendingOutput,
} from '../output-file.js';
import type { SimulateFlags } from './simulate.js';

const DEFAULT_KV_TOKENS = ENGINE_DEFAULTS.kvTokens;

/** `simulate` with its flags parsed: every policy over the trace, the comparison on stdout. */
export async function runSimulate(flags: SimulateFlags): Promise<void> {
  if (flags.format !== 'table' && flags.format !== 'json')
    throw new RangeError(`--format must be table or json, got ${quotedText(flags.format)}`);
  const policies = policyList(flags.policies);
  checkPolicyNames(policies, (p) => policyVariant(p).policy);
  const scenario = scenarioFromFlags(flags);
  // the output paths are checked before the run, so that one that cannot be written stops it at
  // once; nothing is written until the results are complete (an existing file stays as it is
  // if the run fails), and never over the trace (every file read from a RAGPulse directory) or
  // the other output
  const report = flags.report !== undefined ? checkOutputFile('--report', flags.report) : undefined;
  const assignments = flags.assignments !== undefined ? checkOutputFile('--assignments', flags.assignments) : undefined;
  const outputs = [report, assignments].filter((o) => o !== undefined);
  checkDistinctOutputs(outputs, [['--trace', flags.trace, traceFiles(flags.trace)]]);
  const { name, requests } = await loadTrace(flags.trace);
  checkKvHoldsBlock(flags, requests[0]?.blockSize);
  // the cluster's KV counts in blocks once the trace's block size is known
  if (requests.length > 0)
    checkClusterKvBlocks(flags.workers, clusterKvTokens(flags), requests[0].blockSize, clusterKvFlags(flags));
  // a judge role's lines are isolated everywhere the run reads them, as `isolate: true` lines
  // are: the engines' keys, the seed's anchor, the bounds (the router is told the roles too)
  if (flags.judgeRoles) {
    const judges = new Set(flags.judgeRoles);
    for (const r of requests) if (r.agentRole !== undefined && judges.has(r.agentRole)) r.isolate = true;
  }
  // every router replica holds an index of the distinct blocks it is told of: their number multiplies it
  if (flags.replicas !== undefined && flags.replicas >= 2)
    checkReplicaBlocks(flags.replicas, distinctTraceBlocks(requests, Math.floor(SIM_LIMITS.replicaBlocks / 2)));
  const bar =
    flags.progress && process.stderr.isTTY
      ? new cliProgress.SingleBar(
          { format: '{policy} [{bar}] {value}/{total} requests', stream: process.stderr },
          cliProgress.Presets.shades_classic,
        )
      : undefined;
  let policyName = '';
  // also the settings line of the HTML report
  const simulation = {
    workers: flags.workers,
    speed: flags.speed,
    eventDelayMs: flags.eventDelayMs,
    scrapeIntervalMs: flags.scrapeIntervalMs,
    engine: {
      ...(flags.kvTokens !== undefined ? { kvTokens: flags.kvTokens } : {}),
      ...(flags.maxModelLen !== undefined ? { maxModelLen: flags.maxModelLen } : {}),
      blendRecompute: flags.blendRecompute,
    },
    scenario,
    router:
      flags.policyOptions || flags.judgeRoles
        ? {
            ...(flags.policyOptions ? { policyOptions: flags.policyOptions } : {}),
            ...(flags.judgeRoles ? { judgeRoles: flags.judgeRoles } : {}),
          }
        : undefined,
  };
  let run;
  try {
    run = namingTrace(flags.trace, () =>
      comparePolicies(
        name,
        requests,
        policies,
        { ...simulation, onProgress: (done) => bar?.update(done, { policy: policyName }) },
        (policy, i) => {
          policyName = policy;
          if (bar) {
            if (i > 0) bar.stop();
            bar.start(requests.length, 0, { policy });
          }
        },
      ),
    );
  } finally {
    bar?.stop();
  }
  const { report: comparison, results } = run;
  // each output is written whole to a file of its own, then both are put in place
  const pending: PendingOutput[] = [];
  try {
    if (assignments !== undefined) {
      const p = pendingOutput(assignments);
      pending.push(p);
      await writeLines(p.writePath, assignmentLines(results), assignments);
    }
    if (report !== undefined) {
      const p = pendingOutput(report);
      pending.push(p);
      const { writeHtmlReport } = await import('../../sim/html-report.js');
      try {
        await writeHtmlReport(p.writePath, comparison, results, { simulation, blockSize: requests[0]?.blockSize });
      } catch (err) {
        if (!readerGone(report, err))
          throw new RangeError(
            `--report ${shownText(report.path)}: cannot write: ${fileErrorMessage(err, report.path)}`,
            { cause: err },
          );
      }
    }
  } catch (err) {
    for (const p of pending) p.discard();
    throw err;
  }
  for (const p of pending) p.commit();
  // on stderr too, so that a reader of the JSON alone is told
  for (const w of [...comparisonWarnings(comparison), ...lateEventWarnings(flags, results)])
    process.stderr.write(`warning: ${w}\n`);
  process.stdout.write(flags.format === 'json' ? `${JSON.stringify(comparison)}\n` : renderTable(comparison));
}

/**
 * Each --fail and --drain whose time came after every policy's last request had ended: the
 * simulation stops with its last answer, so such a worker event changed nothing, and a run that
 * was meant to show it (a time in minutes read as seconds, a trace shorter than thought) says so
 * rather than reporting the undisturbed fleet as if it had been disturbed.
 */
export function lateEventWarnings(flags: SimulateFlags, results: readonly PolicyResult[]): string[] {
  let endMs = 0;
  for (const r of results) for (const o of r.outcomes) endMs = Math.max(endMs, (o.arrival + o.e2e) * 1000);
  const warnings: string[] = [];
  for (const [flag, specs] of [
    ['--fail', flags.fail],
    ['--drain', flags.drain],
  ] as const)
    for (const spec of specs)
      if (parseWorkerEvents([spec], flag, flags.workers)[0].atMs > endMs)
        warnings.push(
          `${flag} ${quotedText(spec)} comes after every policy's last request ended (${(endMs / 1000).toFixed(1)} s of simulated time): it changed nothing`,
        );
  return warnings;
}

/** The scenario a simulate invocation asks for (undefined when it asks for none). */
export function scenarioFromFlags(flags: SimulateFlags): ScenarioOptions | undefined {
  const s: ScenarioOptions = {};
  if (flags.fail.length > 0) s.fail = parseWorkerEvents(flags.fail, '--fail', flags.workers);
  if (flags.drain.length > 0) s.drain = parseWorkerEvents(flags.drain, '--drain', flags.workers);
  // a worker drained, then failed, stops taking requests and then loses what it held; failed
  // first (or at the same time), it has nothing left to drain: the drain would be ignored
  for (const [i, d] of (s.drain ?? []).entries()) {
    const j = (s.fail ?? []).findIndex((f) => f.worker === d.worker && f.atMs <= d.atMs);
    if (j !== -1)
      throw new RangeError(
        `--drain ${quotedText(flags.drain[i])} comes at or after --fail ${quotedText(flags.fail[j])}: a failed worker has nothing to drain (drain it before it fails, or leave one out)`,
      );
  }
  const keys = [
    'eventJitterMs',
    'eventLoss',
    'replicas',
    'stateLagMs',
    'cancelRate',
    'cancelWithinMs',
    'nonStreamingShare',
  ] as const;
  for (const key of keys) {
    if (flags[key] !== undefined) s[key] = flags[key];
  }
  if (flags.closedLoop === true) s.closedLoop = true;
  // a flag that only shapes another one's effect would be ignored without it: refused, as
  // mock-engine refuses --replay without --events, not run as if it had been taken
  if (flags.stateLagMs !== undefined && (flags.replicas ?? 1) < 2)
    throw new RangeError(
      '--state-lag-ms needs --replicas 2 or more: it delays the state router replicas share, and one router shares none',
    );
  if (flags.cancelWithinMs !== undefined && !(flags.cancelRate !== undefined && flags.cancelRate > 0))
    throw new RangeError('--cancel-within-ms needs --cancel-rate above 0: it times the cancellations that rate draws');
  if (flags.workerKvTokens !== undefined) {
    if (flags.kvTokens !== undefined)
      throw new RangeError(
        "--kv-tokens and --worker-kv-tokens both set the engines' KV: give one (--worker-kv-tokens sets each worker's, and --kv-tokens would be ignored)",
      );
    if (flags.workerKvTokens.length !== flags.workers) {
      throw new RangeError(
        `--worker-kv-tokens lists ${flags.workerKvTokens.length} workers but --workers is ${flags.workers}`,
      );
    }
    s.workerKvTokens = flags.workerKvTokens;
  }
  checkClusterKv(flags.workers, clusterKvTokens(flags), clusterKvFlags(flags));
  if (flags.scenarioSeed !== undefined) {
    const draws = [flags.eventJitterMs, flags.eventLoss, flags.cancelRate, flags.nonStreamingShare];
    if (!draws.some((v) => v !== undefined && v > 0))
      throw new RangeError(
        '--scenario-seed needs --event-jitter-ms, --event-loss, --cancel-rate or --non-streaming-share above 0: it seeds their draws, and a run without them draws nothing',
      );
    s.seed = flags.scenarioSeed;
  }
  return Object.keys(s).length > 0 ? s : undefined;
}

/** Each engine's KV tokens as the flags set them: one value for all, or --worker-kv-tokens. */
const clusterKvTokens = (flags: SimulateFlags): readonly number[] =>
  flags.workerKvTokens ?? [flags.kvTokens ?? DEFAULT_KV_TOKENS];

/** The flags that set the cluster's KV, as its limits' messages name them. */
const clusterKvFlags = (flags: SimulateFlags): string =>
  flags.workerKvTokens
    ? '--worker-kv-tokens'
    : flags.kvTokens !== undefined
      ? '--workers × --kv-tokens'
      : `--workers × --kv-tokens (default ${DEFAULT_KV_TOKENS})`;

/**
 * An engine smaller than one KV block, or serving requests shorter than one, can hold no
 * request: every one would be rejected and the run would print figures of nothing. The block
 * size is the trace's, known once it is read.
 */
function checkKvHoldsBlock(flags: SimulateFlags, blockSize: number | undefined): void {
  if (blockSize === undefined) return;
  const why = `less than one KV block (${blockSize} tokens, the trace's block size): the engine could hold no request`;
  if (flags.workerKvTokens !== undefined) {
    flags.workerKvTokens.forEach((t, i) => {
      if (t < blockSize) throw new RangeError(`--worker-kv-tokens: entry ${i + 1} (${t}) is ${why}`);
    });
  } else if (flags.kvTokens !== undefined && flags.kvTokens < blockSize) {
    throw new RangeError(`--kv-tokens ${flags.kvTokens} is ${why}`);
  }
  if (flags.maxModelLen !== undefined && flags.maxModelLen < blockSize)
    throw new RangeError(`--max-model-len ${flags.maxModelLen} is ${why}`);
}

/**
 * Writes lines to a file (emptied first); a failed write is a RangeError naming the output, but
 * for the reader of the standard output going away (readerGone): the rest is dropped quietly.
 */
async function writeLines(path: string, lines: Iterable<string>, output: OutputFile): Promise<void> {
  const out = createWriteStream(path);
  const failed = new Promise<never>((_, reject) => out.once('error', reject));
  failed.catch(() => {}); // raced below; a late error must not go unhandled
  try {
    for (const line of lines)
      if (!out.write(`${line}\n`)) await Promise.race([new Promise<void>((r) => out.once('drain', () => r())), failed]);
    await Promise.race([
      new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve()))),
      failed,
    ]);
  } catch (err) {
    out.destroy();
    if (readerGone(output, err)) return;
    throw new RangeError(`${output.flag} ${shownText(output.path)}: cannot write: ${(err as Error).message}`, {
      cause: err,
    });
  }
}

export function renderTable(r: ComparisonReport): string {
  // the trace's name is a file name: its control characters escaped, it stays on its line
  const head =
    `${escapeUnprintable(r.trace)}: ${r.requests} requests, ${r.workers} workers, speed ×${r.speed}\n` +
    `bounds: infinite-cache hit rate ${pct(r.bounds.infiniteCacheHitRate)}, ideal mean TTFT ${r.bounds.idealTtftMean.toFixed(3)} s\n\n`;
  const rows = r.policies.map((p) => [
    p.policy,
    pct(p.hitRate),
    p.ttft.mean.toFixed(3),
    p.ttft.p50.toFixed(3),
    p.ttft.p90.toFixed(3),
    p.ttft.p99.toFixed(3),
    p.e2e.mean.toFixed(2),
    p.e2e.p99.toFixed(2),
    String(p.throughputTokPerS),
    p.loadImbalance.toFixed(3),
    String(p.rejected),
  ]);
  // scenario counts, when a run has any
  const events = r.policies
    .map((p) => {
      const parts = (['cancelled', 'failed', 'retried', 'eventBatchesLost'] as const)
        .filter((k) => (p[k] ?? 0) > 0)
        .map((k) => `${k} ${p[k]}`);
      return parts.length > 0 ? `${p.policy}: ${parts.join(', ')}` : '';
    })
    .filter(Boolean);
  // policies held to bounds of their own, and what must not be missed, under the table
  const own = r.policies
    .filter((p) => p.bounds)
    .map(
      (p) =>
        `${p.policy}: bounds over the ${p.answered} requests it answered: hit rate ${pct(p.bounds!.infiniteCacheHitRate)}, ideal mean TTFT ${p.bounds!.idealTtftMean.toFixed(3)} s`,
    );
  const notes = [...events, ...own, ...comparisonWarnings(r).map((w) => `warning: ${w}`)];
  const tail = notes.length > 0 ? `\n${notes.join('\n')}\n` : '';
  return (
    head +
    formatTable(
      [
        'policy',
        'hit rate',
        'TTFT mean s',
        'p50',
        'p90',
        'p99',
        'e2e mean s',
        'e2e p99',
        'tok/s',
        'imbalance',
        'rejected',
      ],
      rows,
    ) +
    '\n' +
    tail
  );
}
