// Engine throughput: prefill and decode tokens/s of the C kernels on the
// benchmark model at 1 and 2 threads, and the C-vs-TypeScript-reference
// speed ratio on the same file.
import { join } from "node:path";
import { formatProfile, NativeModel, type SimdChoice } from "../src/engine/binding.ts";
import { CPU_LIBRARY_NAME, cacheDirCandidates, resolveKernelLibrary } from "../src/engine/library.ts";
import { ReferenceModel } from "../src/model/reference.ts";
import type { ProgressCallback } from "../src/progress.ts";
import { benchModel, promptOf } from "./models.ts";
import { median, printTable, type Row } from "./report.ts";

/** The kernel library of this checkout, or the one embedded in the executable. */
export function kernelLibrary(buildDir = join(import.meta.dir, "..", "build")): string {
  return resolveKernelLibrary(buildDir, CPU_LIBRARY_NAME, cacheDirCandidates());
}

export interface EngineBenchOptions {
  threads: number[];
  loops: number;
  prefillTokens: number;
  decodeTokens: number;
  simd?: SimdChoice;
  repeats?: number;
  library?: string;
  /** print the per-op time breakdown of prefill and decode (stderr) */
  profile?: boolean;
  /** Told the tokens run so far (prefill and decode, every repeat and thread count). */
  onProgress?: ProgressCallback;
}

/** Measures one model file; returns one row per thread count. */
export function measureEngine(modelPath: string, o: EngineBenchOptions): Row[] {
  const rows: Row[] = [];
  const repeats = o.repeats ?? 3;
  const total = o.threads.length * repeats * (o.prefillTokens + o.decodeTokens);
  let done = 0;
  const ran = (tokens: number) => o.onProgress?.((done += tokens), total);
  for (const threads of o.threads) {
    const model = NativeModel.load(o.library ?? kernelLibrary(), modelPath, threads, o.simd ?? "auto");
    const vocab = model.info.vocabSize;
    const prefill: number[] = [];
    const decode: number[] = [];
    for (let r = 0; r < repeats; r++) {
      const session = model.newSession(o.prefillTokens + o.decodeTokens + 1, o.loops, 0);
      const profiling = o.profile === true && r === 0 && model.setProfile(true);
      model.readProfile(true);
      let t = performance.now();
      let next = session.step(promptOf(o.prefillTokens, vocab), o.loops, 0, 0, 1, 1, 0n);
      prefill.push((o.prefillTokens * 1000) / (performance.now() - t));
      ran(o.prefillTokens);
      const pp = profiling ? model.readProfile(true) : null;
      if (pp) console.error(formatProfile(pp, `prefill ${o.prefillTokens} tokens, ${threads} threads, loops ${o.loops}, ${model.info.simd} (profiled run)`));
      t = performance.now();
      const one = new Int32Array(1);
      for (let i = 0; i < o.decodeTokens; i++) {
        one[0] = next;
        next = session.step(one, o.loops, 0, 0, 1, 1, 0n);
        ran(1);
      }
      decode.push((o.decodeTokens * 1000) / (performance.now() - t));
      const dp = profiling ? model.readProfile(true) : null;
      if (dp) console.error(formatProfile(dp, `decode ${o.decodeTokens} tokens, ${threads} threads, loops ${o.loops}, ${model.info.simd} (profiled run)`));
      if (profiling) model.setProfile(false);
      session.close();
    }
    rows.push({
      threads,
      simd: model.info.simd,
      loops: o.loops,
      "prefill tok/s": median(prefill),
      "decode tok/s": median(decode),
      "decode ms/tok": 1000 / median(decode),
    });
    model.close();
  }
  return rows;
}

/** C kernels (1 thread) vs the TypeScript reference on the same short prompt. */
export function measureReferenceRatio(modelPath: string, loops: number, tokens: number): Row {
  const prompt = promptOf(tokens, 50257);
  const ref = ReferenceModel.load(modelPath);
  let t = performance.now();
  ref.forward(Array.from(prompt), loops);
  const tsMs = performance.now() - t;
  const model = NativeModel.load(kernelLibrary(), modelPath, 1, "auto");
  const session = model.newSession(tokens, loops, 0);
  const logits = new Float32Array(tokens * model.info.vocabSize);
  t = performance.now();
  session.forward(prompt, loops, logits, tokens);
  const cMs = performance.now() - t;
  session.close();
  model.close();
  return { tokens, loops, "TS ref ms": tsMs, "C ms (1 thread)": cMs, "C speed-up": tsMs / cMs };
}

if (import.meta.main) {
  const path = await benchModel();
  const profile = process.argv.includes("--profile");
  const rows = measureEngine(path, { threads: [1, 2], loops: 8, prefillTokens: 512, decodeTokens: 64, profile });
  printTable("fp16 engine, dim 768, 12 heads, ffn 2048, vocab 50257, loops 8", rows);
  printTable("C kernels vs TypeScript reference", [measureReferenceRatio(path, 8, 4)]);
}
