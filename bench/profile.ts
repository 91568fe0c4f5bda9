/**
 * CPU profiling for the benchmark programs: records a V8 CPU profile of one phase through the
 * inspector, writes it as a .cpuprofile (open it in Chrome DevTools' Performance panel or
 * speedscope), and summarises the functions with the most self time.
 */
import { Session } from 'node:inspector/promises';
import { writeFileSync } from 'node:fs';
import { relative } from 'node:path';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
}

interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples?: number[];
}

export interface HotFunction {
  function: string;
  /** Share of the phase's samples spent in the function itself. */
  selfPct: number;
}

export class CpuProfiler {
  private readonly session = new Session();

  async start(samplingIntervalUs = 100): Promise<void> {
    this.session.connect();
    await this.session.post('Profiler.enable');
    await this.session.post('Profiler.setSamplingInterval', { interval: samplingIntervalUs });
    await this.session.post('Profiler.start');
  }

  /** Stops, writes the profile to `file` and returns the `top` functions by self time. */
  async stop(file: string, top = 15): Promise<HotFunction[]> {
    const { profile } = (await this.session.post('Profiler.stop')) as { profile: CpuProfile };
    await this.session.post('Profiler.disable');
    this.session.disconnect();
    writeFileSync(file, JSON.stringify(profile));
    return hottest(profile, top);
  }
}

function hottest(profile: CpuProfile, top: number): HotFunction[] {
  const self = new Map<string, number>();
  let total = 0;
  for (const node of profile.nodes) {
    const hits = node.hitCount ?? 0;
    if (hits === 0) continue;
    const f = node.callFrame;
    const where = f.url ? `${relative(process.cwd(), f.url.replace(/^file:\/\//, ''))}:${f.lineNumber + 1}` : '';
    const name = `${f.functionName || '(anonymous)'}${where ? ` ${where}` : ''}`;
    self.set(name, (self.get(name) ?? 0) + hits);
    total += hits;
  }
  return [...self.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, top)
    .map(([fn, hits]) => ({ function: fn, selfPct: Math.round((hits / total) * 1000) / 10 }));
}
