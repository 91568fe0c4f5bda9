import type { Command } from 'commander';
import { createWriteStream } from 'node:fs';
import cliProgress from 'cli-progress';
import { POLICY_NAMES } from '../../core/policies/index.js';
import { assignmentLines, comparePolicies, policyVariant, type ComparisonReport } from '../../sim/compare.js';
import { loadTrace } from '../../sim/load-trace.js';
import { formatTable, pct } from '../format.js';
import { fractionOption, intOption, positiveNumberOption } from '../options.js';

interface SimulateFlags {
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
  scrapeIntervalMs: number;
  progress: boolean;
}

export function registerSimulateCommand(program: Command): void {
  program
    .command('simulate')
    .description('replay a trace on a simulated cluster, every policy on the same requests')
    .requiredOption('--trace <file>', 'Mooncake JSONL trace (.jsonl or .jsonl.gz), a RAGPulse directory, workflows:N[:SEED] or agentic:N[:SEED]')
    .option('--workers <n>', 'engines in the cluster', intOption('--workers', 1), 8)
    .option('--policies <list>', 'comma-separated policies (NAME-prefix-only: content anchors not scored)', 'cost,seed,dynamo,sglang,llmd,round-robin')
    .option('--speed <x>', 'arrival-rate multiplier', positiveNumberOption('--speed'), 1)
    .option('--format <table|json>', 'output format', 'table')
    .option('--kv-tokens <n>', 'KV capacity of each engine in tokens (default 300000)', intOption('--kv-tokens', 1))
    .option('--max-model-len <n>', 'longest request (prompt + output) an engine serves; longer ones are rejected (default 131072, capped by --kv-tokens)', intOption('--max-model-len', 1))
    .option('--blend-recompute <f>', 'fraction of a reused content anchor recomputed (CacheBlend-style)', fractionOption('--blend-recompute'), 0.15)
    .option('--event-delay-ms <n>', 'delay of KV events from engine to router', intOption('--event-delay-ms', 0), 50)
    .option('--scrape-interval-ms <n>', 'interval of load scrapes', intOption('--scrape-interval-ms', 1), 200)
    .option('--report <file>', 'write a self-contained HTML report')
    .option('--assignments <file>', 'write one JSON line per request and policy')
    .option('--no-progress', 'no progress bar on stderr')
    .action(async (flags: SimulateFlags) => {
      if (flags.format !== 'table' && flags.format !== 'json') throw new RangeError(`--format must be table or json, got '${flags.format}'`);
      const policies = flags.policies.split(',').map((p) => p.trim()).filter(Boolean);
      for (const p of policies) if (!POLICY_NAMES.includes(policyVariant(p).policy)) throw new RangeError(`--policies: unknown policy '${p}' (known: ${POLICY_NAMES.join(', ')})`);
      const { name, requests } = await loadTrace(flags.trace);
      const bar = flags.progress && process.stderr.isTTY ? new cliProgress.SingleBar({ format: '{policy} [{bar}] {value}/{total} requests', stream: process.stderr }, cliProgress.Presets.shades_classic) : undefined;
      let policyName = '';
      const { report, results } = comparePolicies(
        name,
        requests,
        policies,
        {
          workers: flags.workers,
          speed: flags.speed,
          eventDelayMs: flags.eventDelayMs,
          scrapeIntervalMs: flags.scrapeIntervalMs,
          engine: {
            ...(flags.kvTokens !== undefined ? { kvTokens: flags.kvTokens } : {}),
            ...(flags.maxModelLen !== undefined ? { maxModelLen: flags.maxModelLen } : {}),
            blendRecompute: flags.blendRecompute,
          },
          onProgress: (done) => bar?.update(done, { policy: policyName }),
        },
        (policy, i) => {
          policyName = policy;
          if (bar) {
            if (i > 0) bar.stop();
            bar.start(requests.length, 0, { policy });
          }
        },
      );
      bar?.stop();
      if (flags.assignments) {
        const out = createWriteStream(flags.assignments);
        for (const line of assignmentLines(results)) if (!out.write(line + '\n')) await new Promise<void>((r) => out.once('drain', () => r()));
        await new Promise<void>((resolve, reject) => {
          out.once('error', reject);
          out.end(() => resolve());
        });
      }
      if (flags.report) {
        const { writeHtmlReport } = await import('../../sim/html-report.js');
        await writeHtmlReport(flags.report, report, results);
      }
      process.stdout.write(flags.format === 'json' ? `${JSON.stringify(report)}\n` : renderTable(report));
    });
}

export function renderTable(r: ComparisonReport): string {
  const head =
    `${r.trace}: ${r.requests} requests, ${r.workers} workers, speed ×${r.speed}\n` +
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
  return head + formatTable(['policy', 'hit rate', 'TTFT mean s', 'p50', 'p90', 'p99', 'e2e mean s', 'e2e p99', 'tok/s', 'imbalance', 'rejected'], rows) + '\n';
}
