// Quality of the trained model (models/kjv-looped-256.safetensors) on its
// held-out text, the King James Bible's every 20th block of 30 verses,
// which training never saw (bench/kjv.ts):
//
// 1. Perplexity at each loop depth, beside counting baselines from the
//    training split (unigram, interpolated bigram, Kneser-Ney bigram and
//    trigram): what a user buys with `loops`, and where the model stands
//    against counting. The Kneser-Ney trigram is the baseline to beat.
// 2. Weight formats (int4, int2 block; int8, int6, int4 head) and KV cache modes at the default depth:
//    perplexity, mean KL(p_fp16 || p_variant) and top-1 agreement with
//    fp16, teacher-forced at every position. Sliding cache windows are
//    measured on 1024-token texts (twice the trained context) against the
//    full cache on the same texts.
// 3. Generated text against held-out text: the share of token 4-grams that
//    repeat earlier ones within a continuation, and of words the training
//    text never uses, for greedy and sampled continuations of held-out
//    prompts and for the held-out text that follows the same prompts.
// 4. Self-speculative decoding on prompts cut from the held-out text: tokens
//    per verify call, draft acceptance and speed-up over plain decoding at
//    the same verify depth, greedy (asserted bit-identical to plain) and
//    sampled at temperature 0.8 with one seed.
//
// Texts are windows of max_seq_len tokens; each predicts its tokens 2..T.
//
//   bun bench/quality.ts     the tables; writes bench/results/quality.json
import { kernelLibrary } from "../src/cli/bench/engine.ts";
import { median, printTable, type Row } from "../src/cli/bench/table.ts";
import { type KvCacheSettings, NativeModel } from "../src/engine/binding.ts";
import { KV_CACHE_MODES } from "../src/model/kvcache.ts";
import { TRAINED_MODEL_PATH } from "../src/model/trained.ts";
import { readFileSync, statSync } from "node:fs";
import { Tokenizer } from "../src/tokenizer/tokenizer.ts";
import { kjvText, kjvTokens } from "./kjv.ts";
import { kneserNeyPerplexity } from "./kneser_ney.ts";
import { Tally, withLse } from "./logits.ts";
import { quantizedPath, type WeightFormat, weightsLabel } from "./quant.ts";
import { writeJson } from "./report.ts";
import { decode, GREEDY, type Run, same, type Sampling } from "./speculative.ts";
import { repeatedNgramShare, unknownWordShare, wordsOf } from "./text_stats.ts";

export interface QualityOptions {
  model?: string; // default: the trained model
  threads?: number; // default 2
  depths?: number[]; // default 1, 2, 4, 8, 12, 16
  windows?: number; // held-out texts of max_seq_len tokens (default 32)
  longWindows?: number; // 1024-token texts for the sliding-window rows (default 8)
  cacheWindows?: number[]; // default 256, 512
  specPrompts?: number; // held-out prompts of the generation and speculative rows (default 20)
  specPromptTokens?: number; // default 48
  specTokens?: number; // tokens decoded per prompt (default 128)
  draftLoops?: number[]; // default 1, 2, 4
  draftAhead?: number; // default 4 (the API's default)
  library?: string;
}

/** Teacher-forced logits of every position of `text`, into `out`. */
function logitsOf(m: NativeModel, text: Int32Array, loops: number, out: Float32Array, kv?: KvCacheSettings, cacheWindow = 0): Float32Array {
  const s = m.newSession(text.length, loops, cacheWindow, kv);
  try {
    s.forward(text, loops, out, text.length);
  } finally {
    s.close();
  }
  return out;
}

/** `count` texts of `len` tokens spread evenly over `tokens`. */
function texts(tokens: Uint16Array, len: number, count: number): Int32Array[] {
  const avail = Math.floor(tokens.length / len);
  if (avail < count) throw new Error(`held-out text has ${avail} windows of ${len} tokens, ${count} asked for`);
  const stride = Math.floor(avail / count);
  return Array.from({ length: count }, (_, i) => Int32Array.from(tokens.subarray(i * stride * len, (i * stride + 1) * len)));
}

// ---- counting baselines ----

/** Unigram (add-one), interpolated bigram and Kneser-Ney bigram and trigram perplexities of the same predicted positions. */
function countingBaselines(train: Uint16Array, evalTexts: Int32Array[], V: number): Row[] {
  const uni = new Float64Array(V);
  const bi = new Map<number, number>();
  for (let i = 0; i < train.length; i++) {
    uni[train[i]]++;
    if (i > 0) {
      const key = train[i - 1] * 65536 + train[i];
      bi.set(key, (bi.get(key) ?? 0) + 1);
    }
  }
  const pUni = (w: number) => (uni[w] + 1) / (train.length + V);
  const pairs: [number, number][] = evalTexts.flatMap((t) => Array.from({ length: t.length - 1 }, (_, i): [number, number] => [t[i], t[i + 1]]));
  const uniNll = pairs.reduce((s, [, w]) => s - Math.log(pUni(w)), 0);
  // Jelinek-Mercer: λ P(w|v) + (1-λ) P(w). λ is tuned on these very
  // positions: the baseline at its best, never flattered by a poor λ.
  let best = { lambda: 0, nll: Infinity };
  for (let lambda = 0.05; lambda < 0.999; lambda += 0.05) {
    const nll = pairs.reduce((s, [v, w]) => {
      const cv = uni[v];
      const cond = cv > 0 ? (bi.get(v * 65536 + w) ?? 0) / cv : 0;
      return s - Math.log(lambda * cond + (1 - lambda) * pUni(w));
    }, 0);
    if (nll < best.nll) best = { lambda, nll };
  }
  return [
    { model: "unigram (add-one), training split counts", loops: "-", perplexity: Math.exp(uniNll / pairs.length) },
    { model: `interpolated bigram (λ ${best.lambda.toFixed(2)}), training split counts`, loops: "-", perplexity: Math.exp(best.nll / pairs.length) },
    ...[2, 3].map((order) => ({
      model: `Kneser-Ney ${order === 2 ? "bigram" : "trigram"} (interpolated, modified), training split counts`,
      loops: "-",
      perplexity: kneserNeyPerplexity(train, evalTexts, V, order),
    })),
  ];
}

// ---- generated text ----

/** The held-out continuation of each prompt, and the model's greedy and sampled ones, side by side. */
async function generationRows(m: NativeModel, windows: Int32Array[], o: Required<QualityOptions>): Promise<Row[]> {
  const tokenizer = await Tokenizer.load();
  const vocabulary = new Set(wordsOf(readFileSync(kjvText("train"), "utf8")));
  const L = m.info.defaultLoops;
  const split = windows.map((w) => ({ prompt: w.slice(0, o.specPromptTokens), next: Array.from(w.subarray(o.specPromptTokens)) }));
  const sources: [string, (prompt: Int32Array, next: number[]) => number[]][] = [
    ["held-out text after the prompt", (_, next) => next],
    [`greedy, loops ${L}`, (prompt) => decode(m, prompt, L, o.specTokens, null, GREEDY).tokens],
    [`temperature 0.8, loops ${L}, seed 1`, (prompt) => decode(m, prompt, L, o.specTokens, null, { temperature: 0.8, seed: 1 }).tokens],
  ];
  return sources.map(([text, continuation]) => {
    const outs = split.map(({ prompt, next }) => continuation(prompt, next));
    const mean = (f: (tokens: number[]) => number) => outs.reduce((sum, t) => sum + f(t), 0) / outs.length;
    return {
      text,
      [`repeated token 4-grams within ${o.specTokens} tokens`]: `${(100 * mean((t) => repeatedNgramShare(t, 4))).toFixed(1)}%`,
      "words the training text never uses": `${(100 * mean((t) => unknownWordShare(tokenizer.decode(t), vocabulary))).toFixed(2)}%`,
    };
  });
}

// ---- speculative ----

function speculativeRows(m: NativeModel, prompts: Int32Array[], o: Required<QualityOptions>): Row[] {
  const V = m.info.defaultLoops;
  const n = o.specTokens;
  decode(m, prompts[0], 2, 8, { D: 1, k: 2, K: 1 }); // warm-up: builds the draft head once
  const rows: Row[] = [];
  const samplings: [string, Sampling][] = [
    ["greedy", GREEDY],
    ["T 0.8, seed 1", { temperature: 0.8, seed: 1 }],
  ];
  for (const [label, sampling] of samplings) {
    for (const D of o.draftLoops) {
      const plain: Run[] = [];
      const spec: Run[] = [];
      for (const p of prompts) {
        // plain and speculative back to back: neighbours share the machine's load
        plain.push(decode(m, p, V, n, null, sampling));
        spec.push(decode(m, p, V, n, { D, k: o.draftAhead, K: 1 }, sampling));
      }
      const exact = spec.every((r, i) => same(r.tokens, plain[i].tokens));
      if (sampling.temperature === 0 && !exact) throw new Error(`greedy speculative output differs from plain decoding (draft_loops ${D})`);
      const drafted = spec.reduce((s, r) => s + r.drafted, 0);
      const accepted = spec.reduce((s, r) => s + r.accepted, 0);
      rows.push({
        sampling: label,
        verify_loops: V,
        draft_loops: D,
        draft_ahead: o.draftAhead,
        "plain tok/s": median(plain.map((r) => r.tokensPerSecond)),
        "spec tok/s": median(spec.map((r) => r.tokensPerSecond)),
        "tokens/verify (mean)": spec.reduce((s, r) => s + r.perCycle, 0) / spec.length,
        "draft acceptance": `${((100 * accepted) / Math.max(1, drafted)).toFixed(1)}%`,
        "speed-up": median(spec.map((r, i) => r.tokensPerSecond / plain[i].tokensPerSecond)),
        "identical to plain": sampling.temperature === 0 ? "yes (asserted)" : `${spec.filter((r, i) => same(r.tokens, plain[i].tokens)).length}/${spec.length} (not required)`,
      });
    }
  }
  return rows;
}

// ---- the section ----

export interface QualityTables {
  depth: Row[];
  variants: Row[];
  generation: Row[];
  speculative: Row[];
}

/** The weight formats of the variants table: each block format with each quantized head, and an fp16 block with one;
 * int2 as model quantize writes it (wv, wo, w2 at int4) and with every matrix int2. */
const QUALITY_FORMATS: WeightFormat[] = [
  ...(["int4", "int2"] as const).flatMap((quant) => (["int8", "int6", "int4"] as const).map((head) => ({ quant, head }))),
  ...(["int8", "int6"] as const).map((head) => ({ quant: "int2" as const, head, mix: {} })),
  ...(["int8", "int6", "int4"] as const).map((head) => ({ quant: "fp16" as const, head })),
];

export async function measureQuality(opts: QualityOptions = {}): Promise<QualityTables> {
  const o: Required<QualityOptions> = {
    model: TRAINED_MODEL_PATH,
    threads: 2,
    depths: [1, 2, 4, 8, 12, 16],
    windows: 32,
    longWindows: 8,
    cacheWindows: [256, 512],
    specPrompts: 20,
    specPromptTokens: 48,
    specTokens: 128,
    draftLoops: [1, 2, 4],
    draftAhead: 4,
    library: kernelLibrary(),
    ...opts,
  };
  const lib = o.library;
  const fp16 = NativeModel.load(lib, o.model, o.threads, "auto");
  const formats = QUALITY_FORMATS.map((f) => {
    const path = quantizedPath(o.model, f, 32);
    return { name: `${weightsLabel(f)} weights, ${f.head} head (group 32)`, model: NativeModel.load(lib, path, o.threads, "auto"), bytes: statSync(path).size };
  });
  const fileMb = (bytes: number) => (bytes / 1e6).toFixed(1);
  const sizeOf = new Map(formats.map((f) => [f.name, fileMb(f.bytes)]));
  try {
    const { vocabSize: V, defaultLoops: L, maxSeqLen: T } = fp16.info;
    const held = await kjvTokens("val");
    const evalTexts = texts(held, T, o.windows);
    const buf = new Float32Array(2 * T * V);
    const baseBuf = new Float32Array(2 * T * V);

    // depths, weight formats and KV modes on texts of the trained context
    const depth = new Map(o.depths.map((d) => [d, new Tally()]));
    const kvModes = KV_CACHE_MODES.filter((mode) => mode !== "fp16");
    const variants = new Map<string, Tally>([...formats.map((f) => f.name), ...kvModes.map((m) => `KV cache ${m}`)].map((n) => [n, new Tally()]));
    for (const text of evalTexts) {
      const base = withLse(logitsOf(fp16, text, L, baseBuf.subarray(0, T * V)), T, V);
      for (const d of o.depths) depth.get(d)!.add(d === L ? base.logits : logitsOf(fp16, text, d, buf.subarray(0, T * V)), text, V, null);
      for (const f of formats) variants.get(f.name)!.add(logitsOf(f.model, text, L, buf.subarray(0, T * V)), text, V, base);
      for (const mode of kvModes) variants.get(`KV cache ${mode}`)!.add(logitsOf(fp16, text, L, buf.subarray(0, T * V), { mode }), text, V, base);
    }
    // sliding cache windows on texts twice the trained context
    const long = texts(held, 2 * T, o.longWindows);
    const fullLong = new Tally();
    const windowed = new Map(o.cacheWindows.map((w) => [w, new Tally()]));
    for (const text of long) {
      const base = withLse(logitsOf(fp16, text, L, baseBuf), 2 * T, V);
      fullLong.add(base.logits, text, V, null);
      for (const w of o.cacheWindows) windowed.get(w)!.add(logitsOf(fp16, text, L, buf, undefined, w), text, V, base);
    }

    const predicted = evalTexts.length * (T - 1);
    const depthRows: Row[] = [
      ...o.depths.map((d) => ({ model: `looped, fp16${d === L ? " (default depth)" : ""}`, loops: d, perplexity: depth.get(d)!.perplexity })),
      ...countingBaselines(await kjvTokens("train"), evalTexts, V),
    ];
    const fp16Ppl = depth.get(L)!.perplexity;
    const variantRows: Row[] = [
      { variant: `fp16 weights, fp16 cache (${predicted} positions)`, "file MB": fileMb(statSync(o.model).size), perplexity: fp16Ppl, "KL vs fp16": "0", "top-1 agree": "100%" },
      ...[...variants].map(([name, t]) => ({
        variant: name,
        "file MB": sizeOf.get(name) ?? "-",
        perplexity: t.perplexity,
        "KL vs fp16": t.meanKl.toExponential(2),
        "top-1 agree": `${(100 * t.top1).toFixed(1)}%`,
      })),
      { variant: `full cache, ${2 * T}-token texts (${long.length * (2 * T - 1)} positions)`, "file MB": "-", perplexity: fullLong.perplexity, "KL vs fp16": "0", "top-1 agree": "100%" },
      ...[...windowed].map(([w, t]) => ({
        variant: `cache_window ${w}, ${2 * T}-token texts`,
        "file MB": "-",
        perplexity: t.perplexity,
        "KL vs fp16": t.meanKl.toExponential(2),
        "top-1 agree": `${(100 * t.top1).toFixed(1)}%`,
      })),
    ];
    // prompts followed by the held-out text's own continuation of each
    const windows = texts(held, o.specPromptTokens + o.specTokens, o.specPrompts);
    const prompts = windows.map((w) => w.slice(0, o.specPromptTokens));
    return {
      depth: depthRows,
      variants: variantRows,
      generation: await generationRows(fp16, windows, o),
      speculative: speculativeRows(fp16, prompts, o),
    };
  } finally {
    fp16.close();
    for (const f of formats) f.model.close();
  }
}

export const QUALITY_TITLES = {
  depth: "trained model: held-out perplexity by loop depth, and counting baselines",
  variants: "trained model at its default depth: weight formats and KV cache modes against fp16 (held-out text, teacher-forced)",
  generation: "trained model: continuations of held-out prompts against the held-out text (means over prompts)",
  speculative: "trained model: self-speculative decoding on held-out prompts (tok/s and speed-up: medians over prompts)",
} as const;

if (import.meta.main) {
  const t = await measureQuality();
  printTable(QUALITY_TITLES.depth, t.depth);
  printTable(QUALITY_TITLES.variants, t.variants);
  printTable(QUALITY_TITLES.generation, t.generation);
  printTable(QUALITY_TITLES.speculative, t.speculative);
  console.log(`\nwrote ${writeJson("quality", t)}`);
}
