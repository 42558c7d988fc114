// Key/value cache modes (docs/kv-cache.md) on the benchmark model (dim 768, 12
// heads, ffn 2048, vocab 50257, loops 8): prefill and decode tokens/s at 2
// threads, cache bytes per token, and the quality cost against the fp16
// cache on the same weights and prompts: mean KL(p_fp16-cache || p_mode) of
// the next-token distributions at every position (teacher-forced) and how
// often the greedy (top-1) token agrees. Optionally the same for int4
// weights (their own fp16-cache run is the baseline).
//
// `bun bench/kv.ts` prints the table and writes bench/results/kv.json;
// bench/run.ts can call measureKv() for its own report.
import { kernelLibrary } from "../src/cli/bench/engine.ts";
import { benchModel } from "../src/cli/bench/models.ts";
import { median, printTable, type Row } from "../src/cli/bench/table.ts";
import { type KvCacheSettings, NativeModel } from "../src/engine/binding.ts";
import { GREEDY, type SimdChoice } from "../src/engine/types.ts";
import { KV_CACHE_MODES } from "../src/model/kvcache.ts";
import { kvBytesPerToken } from "../test/reference/kvcache.ts";
import { compareLogits, prompt, quantizedPath, RUN_DEFAULTS } from "./quant.ts";
import { writeJson } from "./report.ts";

export interface KvBenchOptions {
  modes?: KvCacheSettings[];
  /** Weight formats to run the modes on (int4: the bench model quantized, int8 head, group 32). */
  weights?: ("fp16" | "int4")[];
  threads?: number; // default 2
  loops?: number; // default 8
  prefillTokens?: number; // default 512
  decodeTokens?: number; // default 64
  repeats?: number; // speed repeats (median), default 6 (one round starting at each default mode)
  prompts?: number; // quality: prompts, default 4
  promptTokens?: number; // quality: tokens per prompt, default 128
  simd?: SimdChoice;
  library?: string;
}

export const DEFAULT_KV_MODES: KvCacheSettings[] = KV_CACHE_MODES.map((mode) => ({ mode }));

/** Logits of every position of every prompt, teacher-forced, in cache mode kv. */
function allLogits(m: NativeModel, kv: KvCacheSettings, o: Required<KvBenchOptions>): Float32Array[] {
  const V = m.info.vocabSize;
  const out: Float32Array[] = [];
  for (let p = 0; p < o.prompts; p++) {
    const s = m.newSession(o.promptTokens, o.loops, 0, kv);
    const buf = new Float32Array(o.promptTokens * V);
    s.forward(prompt(p, o.promptTokens, V), o.loops, buf, o.promptTokens);
    s.close();
    for (let t = 0; t < o.promptTokens; t++) out.push(buf.subarray(t * V, (t + 1) * V));
  }
  return out;
}

/** One prefill (one call) and greedy decode run: tokens/s of each. */
function speedOnce(m: NativeModel, kv: KvCacheSettings, o: Required<KvBenchOptions>): { prefill: number; decode: number } {
  const tokens = prompt(99, o.prefillTokens, m.info.vocabSize);
  const s = m.newSession(o.prefillTokens + o.decodeTokens + 1, o.loops, 0, kv);
  let t = performance.now();
  let next = s.step(tokens, o.loops, GREEDY);
  const prefill = (o.prefillTokens * 1000) / (performance.now() - t);
  const one = new Int32Array(1);
  t = performance.now();
  for (let i = 0; i < o.decodeTokens; i++) {
    one[0] = next;
    next = s.step(one, o.loops, GREEDY);
  }
  const decode = (o.decodeTokens * 1000) / (performance.now() - t);
  s.close();
  return { prefill, decode };
}

/**
 * Medians per mode. The repeats go round the modes in turn, each round
 * starting one mode later: on a shared machine a slow spell, or a slot in
 * the order that runs slower (seen: +-20% by position alone), hits every
 * mode alike.
 */
function speeds(m: NativeModel, o: Required<KvBenchOptions>): { prefill: number; decode: number }[] {
  const n = o.modes.length;
  const runs = o.modes.map(() => ({ prefill: [] as number[], decode: [] as number[] }));
  for (let r = 0; r < o.repeats; r++)
    for (let k = 0; k < n; k++) {
      const i = (r + k) % n;
      const one = speedOnce(m, o.modes[i], o);
      runs[i].prefill.push(one.prefill);
      runs[i].decode.push(one.decode);
    }
  return runs.map((x) => ({ prefill: median(x.prefill), decode: median(x.decode) }));
}

const modeName = (kv: KvCacheSettings) => `${kv.mode}${kv.fp16AttnQkv ? "+fp16qkv" : ""}`;

/** One row per (weights, cache mode). */
export async function measureKv(opts: KvBenchOptions = {}): Promise<Row[]> {
  const o: Required<KvBenchOptions> = {
    ...RUN_DEFAULTS,
    modes: DEFAULT_KV_MODES,
    weights: ["fp16"],
    repeats: 6,
    library: kernelLibrary(),
    ...opts,
  };
  const src = await benchModel();
  const rows: Row[] = [];
  for (const w of o.weights) {
    const m = NativeModel.load(o.library, quantizedPath(src, w === "fp16" ? { quant: "fp16", head: "fp16" } : { quant: "int4", head: "int8" }, 32), o.threads, o.simd);
    try {
      const base = allLogits(m, { mode: "fp16" }, o);
      const shape = { loops: o.loops, nKvHeads: m.info.nKvHeads, headDim: m.info.headDim };
      const sps = speeds(m, o);
      for (const [i, kv] of o.modes.entries()) {
        const q = kv.mode === "fp16" && !kv.fp16AttnQkv ? { kl: 0, top1: 1 } : compareLogits(base, allLogits(m, kv, o));
        const sp = sps[i];
        rows.push({
          weights: w,
          kv_cache_mode: modeName(kv),
          simd: m.info.simd,
          threads: o.threads,
          "KV bytes/token": kvBytesPerToken(kv.mode, shape),
          "prefill tok/s": sp.prefill,
          "decode tok/s": sp.decode,
          "KL vs fp16 KV": q.kl.toExponential(2),
          "top-1 agree": `${(100 * q.top1).toFixed(1)}%`,
        });
      }
    } finally {
      m.close();
    }
  }
  return rows;
}

if (import.meta.main) {
  const withInt4 = process.argv.includes("--int4");
  const rows = await measureKv({ weights: withInt4 ? ["fp16", "int4"] : ["fp16"] });
  printTable(
    "KV cache modes, dim 768, 12 heads, ffn 2048, vocab 50257, loops 8, 2 threads (prefill 512, decode 64; quality: 4 prompts x 128 tokens, teacher-forced, vs the fp16 cache on the same weights)",
    rows,
  );
  console.log(`\nwrote ${writeJson("kv", rows)}`);
}
