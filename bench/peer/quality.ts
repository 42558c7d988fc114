// bench:peer's equal-quality columns: for each quantized format, loopserve's
// and llama.cpp's perplexity, KL divergence to their own fp16 / F16 and
// top-1 agreement with it, on the same tokens of the trained model's
// held-out text (bench/kjv.ts), scored the way llama-perplexity scores:
// chunks of n_ctx tokens, each from an empty cache, predicting the second
// half of each chunk (positions n_ctx/2 .. n_ctx-2 predict the next token).
//
// llama.cpp's figures are llama-perplexity's own: the F16 run with
// --kl-divergence-base writes the tokens it scored and its log-probabilities;
// each quantized file is then run with --kl-divergence against them.
// loopserve scores the very tokens read back from that file, and the table
// says whether they are also what loopserve's tokenizer makes of the text.
//
// Both sides quantize their own way, as users get them: loopserve's
// `model quantize` (group 32, its default head) and llama-quantize's default
// recipe for the type (which keeps some tensors at higher precision).
// llama-perplexity stores the base log-probabilities in 16 bits over the
// top 16 nats of each row and drops base probabilities below e^-16 from its
// KL sum; loopserve's KL beside it is computed by that same rule
// (klLikeLlamaPerplexity), so the two columns compare like with like, and
// its exact float64 KL is reported too.
import { readFileSync, unlinkSync } from "node:fs";
import { join } from "node:path";
import { NativeModel } from "../../src/engine/binding.ts";
import { Tally, withLse } from "../logits.ts";
import { cacheDir, firstThatRuns, type Format, ggufFor, LLAMA_TYPE, type LlamaTools, REPACK_OFF } from "./llama.ts";
import { PeerBenchError, run } from "./system.ts";

export interface QualityVariant {
  format: Format;
  loopserve: string; // the loopserve file of this format (fp16: the model itself)
}

export interface QualityOptions {
  library: string;
  fp16: string; // the trained model, fp16 safetensors
  text: string; // held-out text file
  tokenize: (text: string) => Int32Array; // loopserve's tokenizer
  variants: QualityVariant[]; // fp16 first
  loops: number;
  nCtx: number;
  chunks: number;
  threads: number;
  log: (s: string) => void;
}

export interface QualityFigures {
  /** llama.cpp's: "" (its defaults), "repack off", or "crashed (...)" with the figures NaN. */
  way?: string;
  perplexity: number;
  kl: number; // mean KL(p_fp16 || p_format), nats per position, by llama-perplexity's rule
  top1: number; // fraction of positions whose argmax agrees with fp16
  klExact?: number; // loopserve: the full float64 sum
}

/**
 * KL(base || q) of one position as llama-perplexity computes it: the base
 * row's log-probabilities clamped 16 nats below its maximum and stored in
 * 16 bits, then summed over the base probabilities above e^-16. Also
 * whether the two rows' argmax agree (first index on ties, as it does).
 */
export function klLikeLlamaPerplexity(base: Float32Array, q: Float32Array): { kl: number; sameTop: boolean } {
  const V = base.length;
  let maxB = base[0], minB = base[0], maxQ = q[0], topQ = 0;
  for (let i = 1; i < V; i++) {
    if (base[i] > maxB) maxB = base[i];
    if (base[i] < minB) minB = base[i];
    if (q[i] > maxQ) {
      maxQ = q[i];
      topQ = i;
    }
  }
  minB = Math.max(minB, maxB - 16);
  let sumB = 0, sumQ = 0;
  for (let i = 0; i < V; i++) {
    sumB += Math.exp(base[i] - maxB);
    sumQ += Math.exp(q[i] - maxQ);
  }
  const minLogProb = minB - maxB - Math.log(sumB);
  const lseQ = maxQ + Math.log(sumQ);
  const scale = (maxB - minB) / 65535;
  let kl = 0, topB = 0, topLogB = -Infinity;
  for (let i = 0; i < V; i++) {
    const stored = scale > 0 && base[i] > minB ? Math.round((base[i] - minB) / scale) : 0;
    const logB = scale * stored + minLogProb;
    if (logB > topLogB) {
      topLogB = logB;
      topB = i;
    }
    if (logB > -16) kl += Math.exp(logB) * (logB - (q[i] - lseQ));
  }
  return { kl, sameTop: topB === topQ };
}

export interface QualityRow {
  format: Format;
  llamaType: string;
  loopserve: QualityFigures;
  llama: QualityFigures;
  /** loopserve's KL to its fp16 is at most llama.cpp's to its F16 (fp16: trivially); null where llama.cpp crashed. */
  holds: boolean | null;
}

export interface QualityResult {
  rows: QualityRow[];
  positions: number; // scored per engine and format
  sameTokens: boolean; // llama.cpp's tokens of the text are loopserve's
}

/** The tokens a --kl-divergence-base file holds: n_ctx, vocab, chunks, then chunks * n_ctx int32 ids. */
function baseFileTokens(path: string): { nCtx: number; chunks: number; tokens: Int32Array } {
  const b = readFileSync(path);
  if (b.subarray(0, 8).toString("latin1") !== "_logits_") throw new PeerBenchError(`${path} is not a llama-perplexity logits file`);
  const nCtx = b.readUInt32LE(8);
  const chunks = b.readInt32LE(16);
  const bytes = b.subarray(20, 20 + 4 * nCtx * chunks);
  if (bytes.length !== 4 * nCtx * chunks) throw new PeerBenchError(`${path} is shorter than its ${chunks} chunks of ${nCtx} tokens`);
  return { nCtx, chunks, tokens: new Int32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length)) };
}

/** One number after `label` in llama-perplexity's output. */
function figure(out: string, label: RegExp, what: string): number {
  const m = label.exec(out);
  if (!m) throw new PeerBenchError(`llama-perplexity printed no ${what}:\n${out.trim().split("\n").slice(-12).join("\n")}`);
  return Number(m[1]);
}

const NUM = "([-+0-9.eE]+|nan|inf)";

/** llama-perplexity's output; a crash (its repacked kernels, on some hosts) is taken again with repacking off. */
function llamaPerplexity(tools: LlamaTools, what: string, args: string[], o: QualityOptions): { out: string; way: string } | { crashed: string } {
  const once = (extra: string[]) => {
    const r = run([tools.perplexity, ...args, ...extra, "-t", String(o.threads), "--no-warmup"]);
    return `${r.stdout}\n${r.stderr}`;
  };
  const r = firstThatRuns(`llama-perplexity ${what}`, [["", () => once([])], ["repack off", () => once(REPACK_OFF.perplexity)]], o.log);
  return "crashed" in r ? r : { out: r.value, way: r.way };
}

const CRASHED = (how: string): QualityFigures => ({ way: `crashed (${how})`, perplexity: NaN, kl: NaN, top1: NaN });

/** llama.cpp: the F16 base (which writes baseFile), then each quantized type against it. */
function measureLlama(tools: LlamaTools, o: QualityOptions, baseFile: string): Map<Format, QualityFigures> {
  const out = new Map<Format, QualityFigures>();
  const f16 = ggufFor(tools, o.fp16, o.loops, "fp16", o.log);
  o.log(`llama-perplexity ${LLAMA_TYPE.fp16} (base)`);
  const base = llamaPerplexity(tools, `${LLAMA_TYPE.fp16} base`, ["-m", f16, "-f", o.text, "-c", String(o.nCtx), "--chunks", String(o.chunks), "--kl-divergence-base", baseFile], o);
  if ("crashed" in base) {
    for (const v of o.variants) out.set(v.format, CRASHED(base.crashed));
    return out;
  }
  out.set("fp16", { way: base.way, perplexity: figure(base.out, new RegExp(`Final estimate: PPL = ${NUM}`), "final perplexity"), kl: 0, top1: 1 });
  for (const v of o.variants) {
    if (v.format === "fp16") continue;
    const gguf = ggufFor(tools, o.fp16, o.loops, v.format, o.log);
    o.log(`llama-perplexity ${LLAMA_TYPE[v.format]} --kl-divergence`);
    const q = llamaPerplexity(tools, `${LLAMA_TYPE[v.format]} --kl-divergence`, ["-m", gguf, "-c", String(o.nCtx), "--kl-divergence-base", baseFile, "--kl-divergence"], o);
    out.set(
      v.format,
      "crashed" in q
        ? CRASHED(q.crashed)
        : {
            way: q.way,
            perplexity: figure(q.out, new RegExp(`Mean PPL\\(Q\\)\\s*:\\s*${NUM}`), "Mean PPL(Q)"),
            kl: figure(q.out, new RegExp(`Mean\\s+KLD:\\s*${NUM}`), "Mean KLD"),
            top1: figure(q.out, new RegExp(`Same top p:\\s*${NUM}`), "Same top p") / 100,
          },
    );
  }
  return out;
}

/** loopserve: every variant on the same chunks, KL and top-1 against its fp16. */
function measureLoopserve(o: QualityOptions, tokens: Int32Array, chunks: number): Map<Format, QualityFigures> {
  const first = o.nCtx >> 1;
  const rows = o.nCtx - first; // logits of positions first..n_ctx-1 (the last predicts nothing)
  const models = o.variants.map((v) => ({ v, m: NativeModel.load(o.library, v.loopserve, o.threads, "auto"), tally: new Tally(), kl: 0, same: 0 }));
  try {
    const V = models[0].m.info.vocabSize;
    const baseBuf = new Float32Array(rows * V);
    const buf = new Float32Array(rows * V);
    const logits = (m: NativeModel, text: Int32Array, out: Float32Array) => {
      const s = m.newSession(o.nCtx, o.loops, 0);
      try {
        s.forward(text, o.loops, out, rows);
      } finally {
        s.close();
      }
      return out;
    };
    for (let c = 0; c < chunks; c++) {
      const text = tokens.subarray(c * o.nCtx, (c + 1) * o.nCtx);
      const base = withLse(logits(models[0].m, text, baseBuf), rows, V);
      models[0].tally.add(base.logits, text, V, null, first);
      for (const x of models.slice(1)) {
        x.tally.add(logits(x.m, text, buf), text, V, base, first);
        for (let r = 0; r + 1 < rows; r++) {
          const k = klLikeLlamaPerplexity(baseBuf.subarray(r * V, (r + 1) * V), buf.subarray(r * V, (r + 1) * V));
          x.kl += k.kl;
          x.same += k.sameTop ? 1 : 0;
        }
      }
    }
    return new Map(
      models.map((x, i) => {
        const n = x.tally.n;
        const f: QualityFigures = i === 0 ? { perplexity: x.tally.perplexity, kl: 0, top1: 1, klExact: 0 } : { perplexity: x.tally.perplexity, kl: x.kl / n, top1: x.same / n, klExact: x.tally.meanKl };
        return [x.v.format, f];
      }),
    );
  } finally {
    for (const x of models) x.m.close();
  }
}

/**
 * The tokens both engines score: those llama-perplexity's base run wrote, or,
 * where it crashed every way, loopserve's own tokens of the text in chunks of
 * n_ctx (loopserve is then scored alone).
 */
function scoredTokens(o: QualityOptions, baseFile: string, llamaRan: boolean): ReturnType<typeof baseFileTokens> {
  if (llamaRan) return baseFileTokens(baseFile);
  const ours = o.tokenize(readFileSync(o.text, "utf8"));
  const chunks = Math.min(o.chunks, Math.floor(ours.length / o.nCtx));
  return { nCtx: o.nCtx, chunks, tokens: ours.subarray(0, chunks * o.nCtx) };
}

export function equalQuality(tools: LlamaTools, o: QualityOptions): QualityResult {
  if (o.variants[0]?.format !== "fp16") throw new PeerBenchError("equalQuality: the fp16 variant comes first");
  const baseFile = join(cacheDir(), `kld-base-${process.pid}.bin`);
  let llama: Map<Format, QualityFigures>;
  let base: ReturnType<typeof baseFileTokens>;
  try {
    llama = measureLlama(tools, o, baseFile);
    base = scoredTokens(o, baseFile, !llama.get("fp16")?.way?.startsWith("crashed"));
  } finally {
    try {
      unlinkSync(baseFile);
    } catch {
      // never written
    }
  }
  const { nCtx, chunks, tokens } = base;
  if (nCtx !== o.nCtx) throw new PeerBenchError(`llama-perplexity scored chunks of ${nCtx} tokens, ${o.nCtx} asked for`);
  const ours = o.tokenize(readFileSync(o.text, "utf8")).subarray(0, tokens.length);
  const sameTokens = ours.length === tokens.length && ours.every((t, i) => t === tokens[i]);
  o.log(`loopserve on ${chunks} chunks of ${nCtx} tokens`);
  const loopserve = measureLoopserve(o, tokens, chunks);
  const rows = o.variants.map((v) => {
    const ls = loopserve.get(v.format)!;
    const ll = llama.get(v.format)!;
    return { format: v.format, llamaType: LLAMA_TYPE[v.format], loopserve: ls, llama: ll, holds: Number.isNaN(ll.kl) ? null : ls.kl <= ll.kl };
  });
  return { rows, positions: chunks * (nCtx - 1 - (nCtx >> 1)), sameTokens };
}
