import type { Command } from 'commander';
import { intOption, positiveNumberOption, SIM_LIMITS } from '../options.js';
import type { LiveDemoFlags } from './live-demo-run.js';

export function registerLiveDemoCommand(program: Command): void {
  program
    .command('live-demo')
    .description(
      '4 mock engines + the router over HTTP: a multi-agent workload through the openai client, cost vs round-robin',
    )
    .option('--workflows <n>', 'workflows to replay', intOption('--workflows', 1, 1000), 40)
    .option('--workers <n>', 'mock engines', intOption('--workers', 1, 64), 4)
    // simulate's bounds: at the slowest, the longest workload (1000 workflows, under 8 minutes of
    // arrivals) stretches to under 6 days, within what one timer waits (2^31 - 1 ms, 24.8 days)
    .option('--speed <x>', 'arrival speed-up', positiveNumberOption('--speed', SIM_LIMITS.speed), 4)
    .option('--json', 'print one JSON object')
    // the engines, the gateway and the openai client are loaded only to run them
    .action(async (o: LiveDemoFlags) => (await import('./live-demo-run.js')).runLiveDemo(o));
}
