// Engine throughput: prefill and decode tokens/s of the C kernels on a model
// file, one row per thread count (`loopserve bench`, `bun run bench`).
import { join } from "node:path";
import { formatProfile, NativeModel } from "../../engine/binding.ts";
import { CPU_LIBRARY_NAME, cacheDirCandidates, resolveKernelLibrary } from "../../engine/library.ts";
import { GREEDY, type SimdChoice } from "../../engine/types.ts";
import type { ProgressCallback } from "../../progress.ts";
import { promptOf } from "./models.ts";
import { median, type Row } from "./table.ts";

/** The kernel library of this checkout, or the one embedded in the executable. */
export function kernelLibrary(buildDir = join(import.meta.dir, "..", "..", "..", "build")): string {
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
      let next = session.step(promptOf(o.prefillTokens, vocab), o.loops, GREEDY);
      prefill.push((o.prefillTokens * 1000) / (performance.now() - t));
      ran(o.prefillTokens);
      const pp = profiling ? model.readProfile(true) : null;
      if (pp) console.error(formatProfile(pp, `prefill ${o.prefillTokens} tokens, ${threads} threads, loops ${o.loops}, ${model.info.simd} (profiled run)`));
      t = performance.now();
      const one = new Int32Array(1);
      for (let i = 0; i < o.decodeTokens; i++) {
        one[0] = next;
        next = session.step(one, o.loops, GREEDY);
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
