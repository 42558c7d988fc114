// The single executable: its size, and cold start-up time (process spawn to
// the first 200 on /healthz, i.e. configuration, tokenizer, kernel library,
// model load and listening socket all done).
//
// Two cases, each the median of several runs:
//   first start  an empty cache directory: includes extracting the embedded
//                kernel library (what a fresh host or a new version pays once)
//   later start  the library already extracted (every restart after that)
// The binary runs from an empty directory with a bare environment, as on a
// host with only the file; SERVICE_BUILD_DIR points nowhere so the embedded
// library is the one used.
//
//   bun bench/binary.ts                    build if needed, measure, print, write JSON
//   import { measureBinary } from "./binary.ts"   (bench/run.ts)
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { benchModel } from "../src/cli/bench/models.ts";
import { median, printTable, type Row } from "../src/cli/bench/table.ts";
import { freePort } from "../test/helpers/server.ts";
import { writeJson } from "./report.ts";

const ROOT = resolve(import.meta.dir, "..");
const DIST = join(ROOT, "dist", "loopserve");

export interface BinaryBenchOptions {
  /** The executable; default dist/loopserve (built first when missing or `build`). */
  binary?: string;
  /** Run `bun build.ts` first. Default: only when the binary is missing. */
  build?: boolean;
  /** Model served; default the benchmark model (src/cli/bench/models.ts). */
  modelPath?: string;
  /** Starts per case; the median is reported. */
  runs?: number;
}

/** Spawns the binary and returns ms from spawn to the first 200 on /healthz. */
async function startupMs(binary: string, cwd: string, env: Record<string, string>): Promise<number> {
  const port = freePort();
  const t0 = performance.now();
  const proc = Bun.spawn([binary, "serve", "--host", "127.0.0.1", "--port", String(port)], {
    cwd,
    env,
    stdout: "ignore",
    stderr: "pipe",
  });
  try {
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`loopserve exited with ${proc.exitCode}: ${await new Response(proc.stderr).text()}`);
      try {
        const r = await fetch(`http://127.0.0.1:${port}/healthz`);
        if (r.status === 200) return performance.now() - t0;
        if (r.status === 503) {
          const body = await r.text();
          if (/not loaded/i.test(body)) throw new Error(`loopserve started without its model: ${body}`);
        }
      } catch (e) {
        if (e instanceof Error && /without its model/.test(e.message)) throw e;
      }
      if (performance.now() - t0 > 60_000) throw new Error("loopserve did not become healthy within 60 s");
      await Bun.sleep(2);
    }
  } finally {
    proc.kill("SIGTERM");
    await proc.exited;
  }
}

function mib(bytes: number): number {
  return bytes / (1024 * 1024);
}

/** Size and start-up rows; the caller prints them (printTable) or stores them. */
export async function measureBinary(o: BinaryBenchOptions = {}): Promise<Row[]> {
  const source = o.binary ?? DIST;
  if (o.build ?? !existsSync(source)) {
    const b = Bun.spawnSync([process.execPath, join(ROOT, "build.ts")], { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
    if (b.exitCode !== 0) throw new Error(`bun build.ts failed:\n${b.stderr.toString()}`);
  }
  const runs = o.runs ?? 7;
  const modelPath = o.modelPath ?? (await benchModel());
  const work = mkdtempSync(join(tmpdir(), "loopserve-bench-binary-"));
  try {
    const binary = join(work, "loopserve");
    copyFileSync(source, binary);
    Bun.spawnSync(["chmod", "755", binary]);
    const cwd = join(work, "run");
    mkdirSync(cwd);
    const env = (cache: string): Record<string, string> => ({
      PATH: "/usr/bin:/bin",
      HOME: cwd,
      XDG_CACHE_HOME: cache,
      TMPDIR: cwd,
      SERVICE_MODEL_PATH: modelPath,
      SERVICE_BUILD_DIR: join(work, "no-build-dir"),
    });
    // One unmeasured start warms the page cache for the binary and the model,
    // so "cold" means a cold process, not a cold disk.
    await startupMs(binary, cwd, env(join(work, "warmup")));

    const first: number[] = [];
    const later: number[] = [];
    const shared = join(work, "cache");
    await startupMs(binary, cwd, env(shared)); // fills the shared cache
    // Interleaved, so background load on a shared machine hits both alike.
    for (let i = 0; i < runs; i++) {
      first.push(await startupMs(binary, cwd, env(join(work, `empty-${i}`))));
      later.push(await startupMs(binary, cwd, env(shared)));
    }

    const size = statSync(binary).size;
    const embedded = readdirSync(join(ROOT, "build"))
      .filter((f) => /^libloopserve(_cuda)?\.so$/.test(f))
      .map((f) => `${f} ${mib(statSync(join(ROOT, "build", f)).size).toFixed(2)} MiB`)
      .join(", ");
    const model = `${mib(statSync(modelPath).size).toFixed(0)} MiB model`;
    return [
      { measure: "binary size", value: mib(size), unit: "MiB", note: `dist/loopserve; embeds ${embedded}` },
      { measure: "cold start, first (empty cache)", value: median(first), unit: "ms", note: `spawn to first 200 on /healthz, median of ${runs}, ${model}` },
      { measure: "cold start, later (cached library)", value: median(later), unit: "ms", note: `same, library already extracted, median of ${runs}` },
    ];
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

if (import.meta.main) {
  const rows = await measureBinary({ build: true });
  printTable("single executable: size and cold start-up", rows);
  console.log(`\nwrote ${writeJson("binary", rows)}`);
}
