// Process and machine helpers for bench/peer.ts: running tools with clear
// errors, progress lines, and telling how busy the rest of the machine was
// while a number was taken (other engineers share the 2 cores; a 2-thread
// llama.cpp run with one core taken collapses, so each row says how much CPU
// others used).
import { readFileSync } from "node:fs";
import { cpus } from "node:os";

/** Progress on stderr, so stdout holds only the report. */
export const log = (s: string) => process.stderr.write(`[peer] ${s}\n`);

export class PeerBenchError extends Error {
  override name = "PeerBenchError";
}

/** Throws a PeerBenchError naming the missing tool and how to get it. */
export function requireTool(tool: string, hint: string): string {
  const path = Bun.which(tool);
  if (!path) throw new PeerBenchError(`'${tool}' not found on PATH: ${hint}`);
  return path;
}

export interface RunResult {
  stdout: string;
  stderr: string;
  /** CPU seconds the child used (user + system). */
  cpuS: number;
  wallS: number;
}

/** Runs a command to completion; a non-zero exit is a PeerBenchError with its stderr tail. */
export function run(cmd: string[], opts: { stderrToTerminal?: boolean; env?: Record<string, string> } = {}): RunResult {
  const t0 = performance.now();
  let r: ReturnType<typeof Bun.spawnSync>;
  try {
    r = Bun.spawnSync(cmd, {
      stdout: "pipe",
      stderr: opts.stderrToTerminal ? "inherit" : "pipe",
      env: opts.env ? { ...process.env, ...opts.env } : undefined,
    });
  } catch (e) {
    throw new PeerBenchError(`cannot run ${cmd[0]}: ${(e as Error).message}`);
  }
  const wallS = (performance.now() - t0) / 1000;
  const stdout = r.stdout ? new TextDecoder().decode(r.stdout as Uint8Array) : "";
  const stderr = r.stderr ? new TextDecoder().decode(r.stderr as Uint8Array) : "";
  if (r.exitCode !== 0) {
    const tail = (stderr || stdout).trim().split("\n").slice(-15).join("\n");
    throw new PeerBenchError(`${cmd.join(" ")} exited with ${r.exitCode ?? `signal ${r.signalCode}`}\n${tail}`);
  }
  const cpuS = r.resourceUsage ? Number(r.resourceUsage.cpuTime.total) / 1e6 : 0;
  return { stdout, stderr, cpuS, wallS };
}

// ---- machine load ----

export const CORES = cpus().length;

interface CpuTimes {
  busy: number;
  total: number;
}

/** The aggregate "cpu" line of /proc/stat (jiffies). */
function cpuTimes(): CpuTimes | null {
  try {
    const line = readFileSync("/proc/stat", "utf8").split("\n")[0];
    const f = line.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal
    const idle = (f[3] ?? 0) + (f[4] ?? 0);
    const total = f.slice(0, 8).reduce((a, b) => a + b, 0);
    return { busy: total - idle, total };
  } catch {
    return null;
  }
}

/** Measures while fn runs: the cores' busy time minus what fn reports as its own CPU. */
export class LoadMeter {
  private start: CpuTimes | null;
  private t0 = performance.now();

  constructor() {
    this.start = cpuTimes();
  }

  /** Average cores used by other processes since construction, given our own CPU seconds. */
  othersCores(ownCpuS: number): number {
    const end = cpuTimes();
    const wallS = (performance.now() - this.t0) / 1000;
    if (!this.start || !end || end.total === this.start.total || wallS <= 0) return NaN;
    const busyCoreS = ((end.busy - this.start.busy) / (end.total - this.start.total)) * CORES * wallS;
    return Math.max(0, (busyCoreS - ownCpuS) / wallS);
  }
}

/** Own-process CPU seconds so far (all threads, the kernel library's pool included). */
export function ownCpuS(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

/**
 * Waits (up to maxWaitS) until other processes use less than `threshold`
 * cores over a 0.5 s window. Returns the last window's load.
 */
export async function waitForQuiet(maxWaitS: number, threshold = 0.3): Promise<number> {
  const deadline = performance.now() + maxWaitS * 1000;
  for (;;) {
    const m = new LoadMeter();
    const c0 = ownCpuS();
    await Bun.sleep(500);
    const others = m.othersCores(ownCpuS() - c0);
    if (!(others >= threshold) || performance.now() >= deadline) return others;
  }
}

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor(s.length / 2)];
}

/** Least-squares slope and intercept of y over x. */
export function linearFit(x: number[], y: number[]): { slope: number; intercept: number } {
  const n = x.length;
  const mx = x.reduce((a, b) => a + b, 0) / n;
  const my = y.reduce((a, b) => a + b, 0) / n;
  let sxy = 0;
  let sxx = 0;
  for (let i = 0; i < n; i++) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) ** 2;
  }
  const slope = sxx === 0 ? NaN : sxy / sxx;
  return { slope, intercept: my - slope * mx };
}
