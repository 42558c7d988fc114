// The quantized matmul kernels alone (bench/gemm/gemm.c, one thread) on the
// trained model's shapes, against the machine's VNNI peak measured by the
// same probe bench:peer uses: integer multiply-adds per second (2 ops each)
// per matrix and for the whole block, at 1 to 64 tokens per call (decode,
// batched decode, prefill chunks).
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { C_FLAGS, QUANT_KERNEL_SOURCES, simdFlags } from "../build.ts";
import type { Row } from "../src/cli/bench/table.ts";
import { parseModelConfig } from "../src/model/format.ts";
import { readSafetensors } from "../src/model/safetensors.ts";
import { TRAINED_MODEL_PATH } from "../src/model/trained.ts";
import { compileProbe, probeJson } from "./peer/roofline.ts";
import { run } from "./peer/system.ts";

const ROOT = resolve(import.meta.dir, "..");
const TOKENS = [1, 2, 4, 8, 16, 64];
const SECONDS = 0.25;
const SIMD_AVX512 = 3;

function buildGemm(): string {
  const dir = join(ROOT, "build", "bench-gemm");
  mkdirSync(dir, { recursive: true });
  const kernels = QUANT_KERNEL_SOURCES.map((f) => join(ROOT, "kernels", f));
  const sources = [...kernels, join(import.meta.dir, "gemm", "gemm.c")];
  const objects = sources.map((src, i) => {
    const obj = join(dir, `${i}.o`);
    run(["gcc", ...C_FLAGS, "-O2", "-pthread", ...simdFlags(src), "-I", join(ROOT, "kernels"), "-c", src, "-o", obj]);
    return obj;
  });
  const exe = join(dir, "gemm");
  run(["gcc", "-pthread", "-o", exe, ...objects, "-lm"]);
  return exe;
}

interface Shape {
  name: string;
  rows: number;
  in: number;
  count: number; // matrices of this shape in the block
}

/** The block's matrices and the output head, each a table of its own (the head's has time and bandwidth columns). */
export async function measureGemm(): Promise<{ block: Row[]; head: Row[] }> {
  const c = parseModelConfig(readSafetensors(TRAINED_MODEL_PATH));
  const headDim = c.dim / c.nHeads;
  const block: Shape[] = [
    { name: "q,o", rows: c.dim, in: c.dim, count: 2 },
    { name: "k,v", rows: c.nKvHeads * headDim, in: c.dim, count: 2 },
    { name: "gate,up", rows: c.ffnDim, in: c.dim, count: 2 },
    { name: "down", rows: c.dim, in: c.ffnDim, count: 1 },
  ];
  const gemm = buildGemm();
  const peakProbe = compileProbe("peak");
  const peaks = [0, 1, 2].map(() => probeJson([peakProbe, "vnni", "1", "0.5"]));
  if (!peaks[0].supported) throw new Error("bench gemm: this CPU has no VNNI; the quantized kernels' peak is not defined");
  const peak = Math.max(...peaks.map((p) => Number(p.Gops)));
  const time = (bits: number, s: Shape, T: number, head = false) => {
    const r = probeJson([gemm, String(bits), head ? "1" : "0", "32", String(s.rows), String(s.in), String(T), String(SIMD_AVX512), String(SECONDS)]);
    return { us: Number(r.matmul_us), path: String(r.path) };
  };
  const rows: Row[] = [];
  for (const bits of [4, 2]) {
    for (const T of TOKENS) {
      const row: Row = { format: `int${bits} block`, tokens: T };
      let ops = 0;
      let us = 0;
      for (const s of block) {
        const t = time(bits, s, T);
        const o = 2 * s.rows * s.in * T;
        row[`${s.name} ${s.rows}x${s.in} %peak`] = (100 * o) / (t.us * 1e3) / peak;
        ops += s.count * o;
        us += s.count * t.us;
      }
      row["Gops"] = ops / (us * 1e3);
      row["%peak"] = (100 * ops) / (us * 1e3) / peak;
      rows.push(row);
    }
  }
  const headRows: Row[] = [];
  const head: Shape = { name: "head", rows: c.vocabSize, in: c.dim, count: 1 };
  for (const bits of [8, 6, 4]) {
    for (const T of TOKENS) {
      const t = time(bits, head, T, true);
      const ops = 2 * head.rows * head.in * T;
      const bytes = (head.rows * head.in * bits) / 8 + (head.rows * head.in * 2) / 32; // codes + fp16 scales
      headRows.push({
        format: `int${bits} head ${head.rows}x${head.in}`,
        tokens: T,
        us: t.us,
        "GB/s": bytes / (t.us * 1e3),
        Gops: ops / (t.us * 1e3),
        "%peak": (100 * ops) / (t.us * 1e3) / peak,
      });
    }
  }
  console.log(`VNNI peak, one thread: ${peak.toFixed(0)} GOP/s (bench/peer/probes/peak.c)`);
  return { block: rows, head: headRows };
}
