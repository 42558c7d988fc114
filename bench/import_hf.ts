// `model import-hf` on an Ouro-1.4B-shaped checkpoint (24 layers, hidden 2048,
// ffn 5632, 16 heads, vocab 49152: 1.43 G parameters, 2.9 GB of bf16): writes
// a random-weight checkpoint in Ouro's exact layout (test/helpers/hf_fixture.ts),
// then times the CLI importing it (a fresh `bun src/cli/main.ts model import-hf`
// process, so start-up is counted) and reads its peak resident memory, then
// deletes both (about 6 GB under /tmp while it runs).
//
//   bun bench/import_hf.ts [--shards N] [--repeats N] [--cold] [--dir DIR] [--keep]
//
// Each import starts after `sync`, so no earlier write is still being flushed.
// The checkpoint was just written, so its pages are in the page cache: the
// warm runs read it from memory. --cold adds a run after dropping the page
// cache (root, writable /proc/sys/vm/drop_caches; it empties the cache of the
// whole machine, hence opt-in): the checkpoint read from disk. An import's time ends
// when the process exits, its output complete in the page cache; the `sync`
// after it (the output flushed to disk) is timed separately.
// Writes bench/results/import_hf.json.
import { mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { formatDuration, withProgress } from "../src/progress.ts";
import { readSafetensors } from "../src/model/safetensors.ts";
import { OURO_1_4B, writeHfFixture } from "../test/helpers/hf_fixture.ts";
import { writeJson } from "./report.ts";

function flag(name: string, dflt: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

const shards = Number(flag("--shards", "2"));
const repeats = Number(flag("--repeats", "3"));
const keep = process.argv.includes("--keep");
const cold = process.argv.includes("--cold");
const dir = process.argv.includes("--dir") ? flag("--dir", "") : mkdtempSync(join(tmpdir(), "loopserve-import-hf-bench-"));
const ckpt = join(dir, "ouro-1.4b-random");
const out = join(dir, "imported.safetensors");
const CLI = join(import.meta.dir, "..", "src", "cli.ts");

interface Run {
  cache: "warm" | "cold";
  seconds: number;
  syncSeconds: number; // the sync after it: the output written back to disk
  maxRssMiB: number;
  cpuSeconds: number;
}

function dropCaches(): boolean {
  try {
    writeFileSync("/proc/sys/vm/drop_caches", "3");
    return true;
  } catch {
    return false;
  }
}

function sync(): number {
  const t0 = performance.now();
  Bun.spawnSync(["sync"]);
  return (performance.now() - t0) / 1000;
}

function importOnce(cache: Run["cache"]): Run {
  sync();
  if (cache === "cold" && !dropCaches()) throw new Error("cannot drop the page cache");
  const t0 = performance.now();
  const p = Bun.spawnSync([process.execPath, CLI, "model", "import-hf", ckpt, out], { stdout: "pipe", stderr: "pipe" });
  const seconds = (performance.now() - t0) / 1000;
  if (p.exitCode !== 0) throw new Error(`import-hf failed (${p.exitCode}): ${p.stderr.toString()}`);
  const ru = p.resourceUsage;
  const cpu = ru ? Number(ru.cpuTime.user + ru.cpuTime.system) / 1e6 : NaN;
  // Bun reports maxRSS in bytes, cpuTime in microseconds.
  return { cache, seconds, syncSeconds: sync(), maxRssMiB: ru ? ru.maxRSS / 2 ** 20 : NaN, cpuSeconds: cpu };
}

try {
  const t0 = performance.now();
  const fx = withProgress("write checkpoint", process.stderr, (onProgress) =>
    writeHfFixture(ckpt, { ...OURO_1_4B, seed: 1, dtype: "BF16", shards, earlyExitThreshold: 1, onProgress }),
  );
  const genSeconds = (performance.now() - t0) / 1000;
  console.log(`checkpoint: ${fx.parameters} parameters, ${fx.bytes} bytes of bf16 in ${fx.files.length} file(s), written in ${formatDuration(genSeconds * 1000)}`);

  const runs: Run[] = [];
  for (let i = 0; i < repeats; i++) runs.push(importOnce("warm"));
  if (cold) runs.push(importOnce("cold"));

  const f = readSafetensors(out);
  const outBytes = statSync(out).size;
  if (f.metadata.n_layers !== "24" || f.tensors.size !== 1 + 24 * 11 + 4) throw new Error("unexpected imported file");
  for (const r of runs) {
    console.log(
      `import-hf (${r.cache} cache): ${r.seconds.toFixed(1)} s wall, ${r.cpuSeconds.toFixed(1)} s CPU, peak RSS ${r.maxRssMiB.toFixed(0)} MiB; ` +
        `then sync ${r.syncSeconds.toFixed(1)} s`,
    );
  }
  console.log(`output: ${outBytes} bytes, ${f.tensors.size} tensors`);
  const warm = runs.filter((r) => r.cache === "warm").map((r) => r.seconds).sort((a, b) => a - b);
  const report = {
    shape: OURO_1_4B,
    shards,
    parameters: fx.parameters,
    checkpointBytes: fx.bytes,
    outputBytes: outBytes,
    checkpointWriteSeconds: genSeconds,
    runs,
    warmMedianSeconds: warm[Math.floor(warm.length / 2)],
  };
  console.log(`wrote ${writeJson("import_hf", report)}`);
} finally {
  if (keep) console.log(`kept ${dir}`);
  else rmSync(dir, { recursive: true, force: true });
}
