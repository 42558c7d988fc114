// Weight formats on the benchmark model (dim 768, 12 heads, ffn 2048, vocab
// 50257, loops 8): speed (prefill and decode tokens/s at 2 threads), file
// size, and the quality cost against fp16 on the same prompts: mean KL
// divergence KL(p_fp16 || p_quant) of the next-token distributions at every
// position, and how often the greedy (top-1) token agrees.
//
// `bun bench/quant.ts` prints the table and writes bench/results/quant.json;
// bench/run.ts can call measureQuant() for its own report.
import { existsSync, statSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { kernelLibrary, measureEngine } from "../src/cli/bench/engine.ts";
import { benchModel } from "../src/cli/bench/models.ts";
import { printTable, type Row } from "../src/cli/bench/table.ts";
import { NativeModel, NativeQuantizer } from "../src/engine/binding.ts";
import type { SimdChoice } from "../src/engine/types.ts";
import { formatQuantMix } from "../src/model/format.ts";
import { DEFAULT_MIX, type HeadQuant, type QuantMix, quantizeModelFile, type WeightQuant } from "../src/model/quantize.ts";
import { withProgress } from "../src/progress.ts";
import { argmax } from "../test/reference/forward.ts";
import { klDivergence, logSumExp } from "./logits.ts";
import { writeJson } from "./report.ts";

export interface WeightFormat {
  quant: "fp16" | WeightQuant;
  head: HeadQuant;
  /** Block matrices in the other block format (default: model quantize's, DEFAULT_MIX). */
  mix?: QuantMix;
}

/** The block format's name in tables: "int2 (wv=int4,wo=int4,w2=int4)" for a mix, else the format. */
export function weightsLabel(f: WeightFormat): string {
  if (f.quant === "fp16") return f.quant;
  const mix = formatQuantMix(f.mix ?? DEFAULT_MIX[f.quant]);
  return mix ? `${f.quant} (${mix})` : f.quant;
}

export interface QuantBenchOptions {
  formats?: WeightFormat[];
  groupSize?: number; // default 32
  threads?: number; // default 2
  loops?: number; // default 8
  prefillTokens?: number; // default 512
  decodeTokens?: number; // default 64
  repeats?: number; // speed repeats (median), default 3
  prompts?: number; // quality: prompts, default 4
  promptTokens?: number; // quality: tokens per prompt, default 128
  simd?: SimdChoice;
  library?: string;
}

/** The formats of the table: fp16, int4 and int2 with each quantized head, int4 with the fp16 head and fp16 with the int8 one for comparison. */
export const DEFAULT_FORMATS: WeightFormat[] = [
  { quant: "fp16", head: "fp16" },
  { quant: "fp16", head: "int8" },
  ...(["int4", "int2"] as const).flatMap((quant) => (["int8", "int6", "int4"] as const).map((head) => ({ quant, head }))),
  { quant: "int4", head: "fp16" },
];

/** The quantizer's source: a copy older than it was made by an earlier quantizer. */
export const QUANTIZER_SOURCE = join(import.meta.dir, "..", "src", "model", "quantize.ts");

/**
 * The quantized copy of `src` (made once, with its progress on stderr, cached
 * beside it, remade when `src` or the quantizer is newer).
 */
export function quantizedPath(src: string, f: WeightFormat, groupSize: number): string {
  if (f.quant === "fp16" && f.head === "fp16") return src;
  const mix = f.mix === undefined ? "" : `-mix${formatQuantMix(f.mix).replace(/[=,]/g, "") || "none"}`;
  const out = join(dirname(src), `${basename(src, ".safetensors")}-${f.quant}${mix}-g${groupSize}-head${f.head}.safetensors`);
  const newest = Math.max(statSync(src).mtimeMs, statSync(QUANTIZER_SOURCE).mtimeMs);
  if (!existsSync(out) || statSync(out).mtimeMs < newest) {
    const quantizer = NativeQuantizer.open(kernelLibrary(), 0);
    try {
      withProgress(`quantizing ${out} (once; reused afterwards)`, process.stderr, (onProgress) =>
        quantizeModelFile(src, out, { quant: f.quant, groupSize, head: f.head, mix: f.mix, onProgress, quantizer }),
      );
    } finally {
      quantizer.close();
    }
  }
  return out;
}

/** Deterministic prompt p of n tokens (the quality prompts of the quant and kv sections). */
export function prompt(p: number, n: number, vocab: number): Int32Array {
  let s = (p + 1) * 2654435761;
  return Int32Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s % vocab;
  });
}

/** Logits of every position of every prompt, teacher-forced (one prefill call per prompt). */
function allLogits(lib: string, path: string, o: Required<QuantBenchOptions>): Float32Array[] {
  const m = NativeModel.load(lib, path, o.threads, o.simd);
  const V = m.info.vocabSize;
  const out: Float32Array[] = [];
  for (let p = 0; p < o.prompts; p++) {
    const s = m.newSession(o.promptTokens, o.loops, 0);
    const buf = new Float32Array(o.promptTokens * V);
    s.forward(prompt(p, o.promptTokens, V), o.loops, buf, o.promptTokens);
    s.close();
    for (let t = 0; t < o.promptTokens; t++) out.push(buf.subarray(t * V, (t + 1) * V));
  }
  m.close();
  return out;
}

/** Mean KL(base || other) and top-1 agreement over positions. */
export function compareLogits(base: Float32Array[], other: Float32Array[]): { kl: number; top1: number } {
  let kl = 0;
  let agree = 0;
  for (let t = 0; t < base.length; t++) {
    const k = klDivergence(base[t], logSumExp(base[t]), other[t], logSumExp(other[t]));
    kl += k;
    if (argmax(base[t]) === argmax(other[t])) agree++;
  }
  return { kl: kl / base.length, top1: agree / base.length };
}

/** What this benchmark and bench/kv.ts measure with unless told otherwise. */
export const RUN_DEFAULTS = { threads: 2, loops: 8, prefillTokens: 512, decodeTokens: 64, prompts: 4, promptTokens: 128, simd: "auto" } as const;

/** One row per weight format. */
export async function measureQuant(opts: QuantBenchOptions = {}): Promise<Row[]> {
  const o: Required<QuantBenchOptions> = {
    ...RUN_DEFAULTS,
    formats: DEFAULT_FORMATS,
    groupSize: 32,
    repeats: 3,
    library: kernelLibrary(),
    ...opts,
  };
  const src = await benchModel();
  const base = allLogits(o.library, src, o);
  const rows: Row[] = [];
  for (const f of o.formats) {
    const path = quantizedPath(src, f, o.groupSize);
    const [speed] = measureEngine(path, {
      threads: [o.threads],
      loops: o.loops,
      prefillTokens: o.prefillTokens,
      decodeTokens: o.decodeTokens,
      repeats: o.repeats,
      simd: o.simd,
      library: o.library,
    });
    const q = f.quant === "fp16" ? { kl: 0, top1: 1 } : compareLogits(base, allLogits(o.library, path, o));
    rows.push({
      weights: weightsLabel(f),
      group: f.quant === "fp16" ? "-" : o.groupSize,
      head: f.head,
      "file MB": statSync(path).size / 1e6,
      simd: speed.simd,
      threads: o.threads,
      "prefill tok/s": speed["prefill tok/s"],
      "decode tok/s": speed["decode tok/s"],
      "KL vs fp16": q.kl.toExponential(2),
      "top-1 agree": `${(100 * q.top1).toFixed(1)}%`,
    });
  }
  return rows;
}

if (import.meta.main) {
  const rows = await measureQuant();
  printTable(
    "weight formats, dim 768, 12 heads, ffn 2048, vocab 50257, loops 8, 2 threads (quality: 4 prompts x 128 tokens, teacher-forced)",
    rows,
  );
  console.log(`\nwrote ${writeJson("quant", rows)}`);
}
