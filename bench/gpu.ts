// `bun run bench:gpu`: the GPU host in one command. Builds the libraries,
// runs the CUDA tests (test/deploy/cuda.test.ts), then measures on the same
// GPU in the same run: loopserve's decode (bench/batch.ts on the CUDA
// library: one stream at several loop depths, and 64 rows) for the trained
// model and a dim-2048 model (GQA 16/4, ffn 5632), beside the peers of
// bench/gpu/torch_decode.py (a PyTorch decode of the same block captured as
// one CUDA graph, Hugging Face transformers eager, a device copy for the
// bandwidth). Writes bench/results/gpu.json (GPU name, commit, every cell,
// the targets with their bars) and a dated copy under bench/gpu-runs/.
//
//   bun run bench:gpu [--quick] [--profile] [--commit SHA] [--out DIR]
//
// --quick: loops 1 and 8 only, no Hugging Face peer. --profile: where
// Nsight Compute (ncu) runs, each kernel's time in a stretch of one-stream
// dim-2048 decode at loops 8, kept in the JSON. --out: also copy the JSON
// and the log there.
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { benchModel } from "../src/cli/bench/models.ts";
import { formatTable, type Row } from "../src/cli/bench/table.ts";
import { CUDA_LIBRARY_NAME } from "../src/engine/library.ts";
import { kernelDecode, torchPeers } from "./gpu/kernel.ts";
import { writeJson } from "./report.ts";

const ROOT = join(import.meta.dir, "..");
const { values } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    profile: { type: "boolean", default: false },
    commit: { type: "string" },
    out: { type: "string" },
  },
});
const started = performance.now();
const log: string[] = [];
const say = (line: string) => {
  console.log(line);
  log.push(line);
};

function sh(cmd: string[], opts: { allowFail?: boolean } = {}): string {
  say(`$ ${cmd.join(" ")}`);
  const r = spawnSync(cmd[0], cmd.slice(1), { cwd: ROOT, encoding: "utf8", maxBuffer: 1 << 26 });
  const out = `${r.stdout ?? ""}${r.stderr ?? ""}`;
  log.push(out);
  if (r.status !== 0 && !opts.allowFail) throw new Error(`${cmd.join(" ")} exited ${r.status}:\n${out.slice(-4000)}`);
  return out;
}

const bun = process.execPath;
const gpuName = sh(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).trim().split("\n")[0];
const commit = values.commit ?? (sh(["git", "rev-parse", "HEAD"], { allowFail: true }).trim().match(/^[0-9a-f]{40}$/m)?.[0] ?? "unknown");
say(`bench:gpu on ${gpuName}, commit ${commit}`);

sh([bun, "build.ts", "--lib"]);
const lib = join(ROOT, "build", CUDA_LIBRARY_NAME);
if (!existsSync(lib)) throw new Error(`${lib} was not built: bench:gpu needs nvcc on the GPU host`);

const testOut = sh([bun, "test", "test/deploy/cuda.test.ts"], { allowFail: true });
const count = (word: string) => Number(testOut.match(new RegExp(`^\\s*(\\d+) ${word}$`, "m"))?.[1] ?? 0);
const tests = { pass: count("pass"), fail: count("fail"), skip: count("skip") };
say(`cuda tests: ${tests.pass} pass, ${tests.fail} fail, ${tests.skip} skip`);

const models = {
  trained: join(ROOT, "models", "kjv-looped-256.safetensors"),
  "dim-2048": await benchModel({ dim: 2048, nHeads: 16, nKvHeads: 4, ffnDim: 5632, loops: 8 }),
};
const depths = values.quick ? [1, 8] : [1, 2, 4, 8, 16];

type Cell = { engine: string; model: string; weights: string; loops: number; clients: number; tok_s: number };
const cells: Cell[] = [];

/** loopserve's batched decode of `rows` sessions through ls_batch_step (the server's path). */
function loopserve(model: keyof typeof models, loops: number, rows: number): void {
  cells.push({ engine: "loopserve", model, weights: "fp16", loops, clients: rows, tok_s: kernelDecode(sh, lib, models[model], loops, rows) });
}

for (const model of Object.keys(models) as (keyof typeof models)[]) {
  for (const loops of depths) loopserve(model, loops, 1);
  loopserve(model, 8, 64);
}

/** Runs bench/gpu/torch_decode.py on one model; its decode cells join `cells`, and the copy probe's GB/s is returned (0 when not asked). */
function peers(model: keyof typeof models, rows: string, which: string): number {
  const run = torchPeers(sh, models[model], 8, rows, which);
  for (const r of run.cells) cells.push({ engine: r.engine, model, weights: "fp16", loops: r.loops, clients: r.rows, tok_s: r.tok_s });
  return run.copyGbS;
}
const copyGbS = peers("dim-2048", "1,64", values.quick ? "graph,copy" : "graph,hf,copy");
peers("trained", "1", "graph");

/** Per-kernel times (ncu's summary) over a window of a one-stream decode: graph nodes are profiled one by one. */
function profile(): string {
  const out = sh(["ncu", "--clock-control", "none", "--target-processes", "all", "--launch-skip", "1500", "--launch-count", "160", "--print-summary", "per-kernel",
    bun, "bench/batch.ts", "--lib", lib, "--model", models["dim-2048"], "--loops", "8", "--rows", "1", "--steps", "8", "--rounds", "1"], { allowFail: true });
  const from = out.indexOf("k_");
  return out.slice(Math.max(0, out.lastIndexOf("\n", from)));
}
const kernelProfile = values.profile ? profile() : "";
if (kernelProfile) say(kernelProfile);

const cell = (engine: string, model: string, loops: number, clients: number) =>
  cells.find((c) => c.engine === engine && c.model === model && c.loops === loops && c.clients === clients)?.tok_s ?? 0;

// Bytes a dim-2048 token reads at loops 8: the block per loop, the head once.
const d = 2048, kv = 512, ffn = 5632, vocab = 50257;
const blockBytes = 2 * (d * d * 2 + 2 * kv * d + 3 * ffn * d);
const tokenBytes = 8 * blockBytes + 2 * vocab * d;
const one2048 = cell("loopserve", "dim-2048", 8, 1);
const perLoopMs = (1000 / cell("loopserve", "dim-2048", 16, 1) - 1000 / cell("loopserve", "dim-2048", 8, 1)) / 8;
const seconds = (performance.now() - started) / 1000;

type Target = { name: string; value: number | string; bar: string; met: boolean };
const targets: Target[] = [
  { name: "CUDA tests failing (test/deploy/cuda.test.ts)", value: tests.fail, bar: `0 of ${tests.pass + tests.fail}`, met: tests.fail === 0 && tests.pass > 0 },
  { name: "one stream dim-2048 fp16 loops 8 tok/s", value: one2048, bar: ">= 3000", met: one2048 >= 3000 },
  { name: "one stream dim-2048 fp16 loops 8 x pytorch cuda graph", value: one2048 / cell("pytorch cuda graph", "dim-2048", 8, 1), bar: ">= 3", met: one2048 / cell("pytorch cuda graph", "dim-2048", 8, 1) >= 3 },
  { name: "one stream dim-2048 fp16 loops 8: fraction of the copy bandwidth", value: copyGbS ? (one2048 * tokenBytes) / (copyGbS * 1e9) : "no probe", bar: ">= 0.65", met: copyGbS > 0 && (one2048 * tokenBytes) / (copyGbS * 1e9) >= 0.65 },
  { name: "extra loop dim-2048 fp16 ms (loops 8 -> 16)", value: Number.isFinite(perLoopMs) ? perLoopMs : "not measured", bar: "<= 0.04", met: perLoopMs <= 0.04 },
  { name: "one stream trained model loops 8 tok/s", value: cell("loopserve", "trained", 8, 1), bar: ">= 5000", met: cell("loopserve", "trained", 8, 1) >= 5000 },
  { name: "64 rows dim-2048 fp16 loops 8 x pytorch cuda graph (kernel level)", value: cell("loopserve", "dim-2048", 8, 64) / cell("pytorch cuda graph", "dim-2048", 8, 64), bar: ">= 1.5", met: cell("loopserve", "dim-2048", 8, 64) / cell("pytorch cuda graph", "dim-2048", 8, 64) >= 1.5 },
  { name: "self-speculative greedy draft 2 on the GPU x plain (trained)", value: "not served on the GPU", bar: ">= 1.5", met: false },
  { name: "int4 dim-2048 one stream x fp16 on the GPU", value: "int4 not served on the GPU", bar: ">= 1.5", met: false },
  { name: "llama.cpp CUDA peer beside loopserve", value: "not built in this run", bar: "present", met: false },
  { name: "bench:gpu wall seconds", value: Math.round(seconds), bar: "< 360", met: seconds < 360 },
];

const result = { gpu: gpuName, commit, date: new Date().toISOString(), copy_gb_s: copyGbS, dim2048_token_bytes: tokenBytes, tests, cells, targets, profile: kernelProfile };
const table: Row[] = cells.map((c) => ({ engine: c.engine, model: c.model, loops: c.loops, clients: c.clients, "tok/s": c.tok_s }));
say(formatTable(`decode on ${gpuName} (${commit.slice(0, 10)}), fp16`, table));
say(formatTable("targets", targets.map((t) => ({ target: t.name, value: t.value, bar: t.bar, met: t.met ? "yes" : "no" }))));
const file = writeJson("gpu", result);
const day = result.date.slice(0, 10);
const slug = gpuName.replace(/^NVIDIA /, "").replace(/[^A-Za-z0-9]+/g, "-").toLowerCase();
const runs = join(ROOT, "bench", "gpu-runs");
mkdirSync(runs, { recursive: true });
const copy = join(runs, `gpu-${day}-${slug}.json`);
copyFileSync(file, copy);
say(`wrote ${file} and ${copy}`);
if (values.out) {
  copyFileSync(file, join(values.out, "gpu.json"));
  writeFileSync(join(values.out, "bench-gpu.log"), log.join("\n"));
}
