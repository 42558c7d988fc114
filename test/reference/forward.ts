// Reference forward pass in plain TypeScript: the test oracle for the C
// kernels (docs/kernels.md). Written to be obviously correct, not fast: one
// token at a time, float64 arithmetic, no tricks. The only places it rounds
// on purpose are where the kernels do: K and V are stored in an fp16 cache
// (or, in a compressed cache mode, rotated / quantized exactly as the
// kernels store them: kvcache.ts storedKvRow), and in a quantized model
// (int4 / int2 block, int8 head) each input row of a quantized matrix is
// quantized to int8 as the kernels do it (quant.ts: quantizedMatvec),
// against the exactly dequantized weights. In the H cache modes q is
// rotated by the same Walsh–Hadamard transform and each head's output
// rotated back (in float64: the rotation is orthonormal).
//
//   h = E[token]
//   for l in 0..loops-1 (same weights every loop):
//     x = rmsnorm(h, attn_norm)
//     q, k, v = x·Wq^T, x·Wk^T, x·Wv^T; rope(q, k, pos)
//     K[l][pos], V[l][pos] = fp16(k), fp16(v)      (or the cache mode's stored rows)
//     h += attention(q, K[l], V[l]) · Wo^T
//     x = rmsnorm(h, ffn_norm)
//     h += (silu(x·W1^T) * (x·W3^T)) · W2^T
//   logits = rmsnorm(h, norm) · Wout^T

import { f16ArrayToF32, roundToF16 } from "../../src/model/fp16.ts";
import {
  asF16,
  loadModelFile,
  loadQuantModelFile,
  MAX_LOOPS,
  type ModelConfig,
  type ModelWeights,
  QUANT_MATRICES,
  quantizedHead,
  validateModel,
} from "../../src/model/format.ts";
import { type KvCacheMode, type KvModeSpec, kvModeSpec } from "../../src/model/kvcache.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { storedKvRow, whtF64 } from "./kvcache.ts";
import { dequantize, quantizedMatvec } from "./quant.ts";

// ---- building blocks (exported for tests) ----

/** x / sqrt(mean(x^2) + eps) * w */
export function rmsnorm(x: Float64Array, w: Float32Array, eps: number): Float64Array {
  let ss = 0;
  for (let i = 0; i < x.length; i++) ss += x[i] * x[i];
  const inv = 1 / Math.sqrt(ss / x.length + eps);
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] * inv * w[i];
  return out;
}

/** y = W x for W stored row-major [rows, cols] ([out_features, in_features]). */
export function matvec(w: Float32Array | Float64Array, rows: number, cols: number, x: Float64Array): Float64Array {
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    const base = r * cols;
    for (let c = 0; c < cols; c++) s += w[base + c] * x[c];
    y[r] = s;
  }
  return y;
}

/**
 * RoPE as Hugging Face's Llama applies it, in place, to each of `nHeads`
 * consecutive head vectors: the pair (i, i + headDim/2) is rotated by
 * pos * theta^(-2i / headDim).
 */
export function applyRope(v: Float64Array, nHeads: number, headDim: number, pos: number, theta: number): void {
  const half = headDim / 2;
  for (let h = 0; h < nHeads; h++) {
    const base = h * headDim;
    for (let i = 0; i < half; i++) {
      const angle = pos * Math.pow(theta, (-2 * i) / headDim);
      const c = Math.cos(angle);
      const s = Math.sin(angle);
      const a = v[base + i];
      const b = v[base + i + half];
      v[base + i] = a * c - b * s;
      v[base + i + half] = a * s + b * c;
    }
  }
}

export function silu(x: number): number {
  return x / (1 + Math.exp(-x));
}

// ---- model ----

export interface ForwardOptions {
  /** 0 (default) = full causal attention; W > 0 = position p sees [p-W+1, p]. */
  cacheWindow?: number;
  /** Key/value cache mode (default fp16), as the kernels' ls_session_params.kv_mode. */
  kvCacheMode?: KvCacheMode;
  /** With an H mode: q, k, v rounded to fp16 before the rotation (SERVICE_H_MODE_FP16_ATTN_QKV). */
  fp16AttnQkv?: boolean;
}

/** A weight matrix: fp16 decoded exactly to float32, or a quantized one dequantized exactly to float64. */
type RefMatrix = Float32Array | Float64Array;
type MatrixKey = "wq" | "wk" | "wv" | "wo" | "w1" | "w2" | "w3" | "output";

/** Weights decoded exactly from the file (shapes: format.ts ModelWeights; output is tokEmbeddings when tied). */
type RefWeights = { [K in keyof ModelWeights]: K extends MatrixKey ? RefMatrix : Float32Array };

export class ReferenceModel {
  private constructor(
    readonly config: ModelConfig,
    readonly weights: RefWeights,
    /** Matrices stored quantized: their inputs are quantized to int8 per row, as the kernels do. */
    readonly quantized: ReadonlySet<MatrixKey> = new Set(),
  ) {}

  /** y = W x for one of the model's matrices, the way the kernels compute it. */
  apply(key: MatrixKey, rows: number, cols: number, x: Float64Array): Float64Array {
    const w = this.weights[key];
    return this.quantized.has(key) ? quantizedMatvec(w, rows, cols, x) : matvec(w, rows, cols, x);
  }

  /** Loads and validates a model (fp16, int4 or int2, any output head; see format.ts). */
  static load(path: string): ReferenceModel {
    const file = readSafetensors(path);
    const { config, tensors } = validateModel(file);
    if (config.quant !== "fp16") return ReferenceModel.loadQuantized(path);
    if (config.headQuant !== "fp16") {
      // fp16 block, quantized head: the fp16 tensors by name, the head dequantized (the embedding too where tied to it).
      const f = (name: string) => f16ArrayToF32(asF16(tensors.get(name)!));
      const m = (name: string) => f(`block.${name}.weight`);
      const head = quantizedHead(file, config);
      return new ReferenceModel(
        config,
        {
          tokEmbeddings: config.embeddingFromHead ? Float32Array.from(dequantize(head)) : f("tok_embeddings.weight"),
          attnNorm: f("block.attn_norm.weight"),
          wq: m("wq"),
          wk: m("wk"),
          wv: m("wv"),
          wo: m("wo"),
          ffnNorm: f("block.ffn_norm.weight"),
          w1: m("w1"),
          w2: m("w2"),
          w3: m("w3"),
          norm: f("norm.weight"),
          output: dequantize(head),
        },
        new Set<MatrixKey>(["output"]),
      );
    }
    const { weights: w } = loadModelFile(path);
    const tok = f16ArrayToF32(w.tokEmbeddings);
    return new ReferenceModel(config, {
      tokEmbeddings: tok,
      attnNorm: f16ArrayToF32(w.attnNorm),
      wq: f16ArrayToF32(w.wq),
      wk: f16ArrayToF32(w.wk),
      wv: f16ArrayToF32(w.wv),
      wo: f16ArrayToF32(w.wo),
      ffnNorm: f16ArrayToF32(w.ffnNorm),
      w1: f16ArrayToF32(w.w1),
      w2: f16ArrayToF32(w.w2),
      w3: f16ArrayToF32(w.w3),
      norm: f16ArrayToF32(w.norm),
      output: config.tiedOutput ? tok : f16ArrayToF32(w.output),
    });
  }

  private static loadQuantized(path: string): ReferenceModel {
    const { config, weights: w } = loadQuantModelFile(path);
    // An embedding tied to the quantized head: its rows dequantized (s * c, exact in fp32).
    const tok = w.tokEmbeddings instanceof Uint16Array ? f16ArrayToF32(w.tokEmbeddings) : Float32Array.from(dequantize(w.tokEmbeddings));
    const quantized = new Set<MatrixKey>(QUANT_MATRICES);
    let output: RefMatrix;
    if (w.output instanceof Uint16Array) output = w.output === w.tokEmbeddings ? tok : f16ArrayToF32(w.output);
    else {
      output = dequantize(w.output);
      quantized.add("output");
    }
    const b = w.block;
    return new ReferenceModel(
      config,
      {
        tokEmbeddings: tok,
        attnNorm: f16ArrayToF32(w.attnNorm),
        wq: dequantize(b.wq),
        wk: dequantize(b.wk),
        wv: dequantize(b.wv),
        wo: dequantize(b.wo),
        ffnNorm: f16ArrayToF32(w.ffnNorm),
        w1: dequantize(b.w1),
        w2: dequantize(b.w2),
        w3: dequantize(b.w3),
        norm: f16ArrayToF32(w.norm),
        output,
      },
      quantized,
    );
  }

  /** A fresh incremental session (empty cache) running `loops` loops per token. */
  session(loops: number, opts: ForwardOptions = {}): ReferenceSession {
    return new ReferenceSession(this, loops, opts.cacheWindow ?? 0, kvModeSpec(opts.kvCacheMode ?? "fp16", opts.fp16AttnQkv ?? false));
  }

  /** Logits (vocab_size floats) for every token of `tokens`, from an empty cache. */
  forward(tokens: number[], loops: number, opts: ForwardOptions = {}): Float32Array[] {
    const s = this.session(loops, opts);
    return tokens.map((t) => s.feed(t));
  }

  /** Greedy continuation (lowest id on ties, as ls_sample does). */
  greedy(prompt: number[], maxTokens: number, loops: number, opts: ForwardOptions = {}): number[] {
    const s = this.session(loops, opts);
    let logits: Float32Array | null = null;
    for (const t of prompt) logits = s.feed(t);
    const out: number[] = [];
    while (logits !== null && out.length < maxTokens) {
      const next = argmax(logits);
      out.push(next);
      if (out.length < maxTokens) logits = s.feed(next);
    }
    return out;
  }
}

/** max|c - r| / max|r|: how far computed logits are from the reference's. */
export function relErr(c: ArrayLike<number>, r: ArrayLike<number>): number {
  let d = 0;
  let m = 0;
  for (let i = 0; i < r.length; i++) {
    d = Math.max(d, Math.abs(c[i] - r[i]));
    m = Math.max(m, Math.abs(r[i]));
  }
  return d / m;
}

/** Index of the largest value, lowest index on ties. */
export function argmax(v: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < v.length; i++) if (v[i] > v[best]) best = i;
  return best;
}

export class ReferenceSession {
  /** keys[l][pos], values[l][pos]: rows of n_kv_heads * head_dim as attention reads them back (fp16 values). */
  readonly keys: Float64Array[][] = [];
  readonly values: Float64Array[][] = [];

  constructor(
    readonly model: ReferenceModel,
    readonly loops: number,
    readonly cacheWindow: number,
    readonly kv: KvModeSpec = kvModeSpec("fp16"),
  ) {
    if (!Number.isInteger(loops) || loops < 1 || loops > MAX_LOOPS) {
      throw new RangeError(`loops must be an integer in [1, ${MAX_LOOPS}], got ${loops}`);
    }
    if (!Number.isInteger(cacheWindow) || cacheWindow < 0) {
      throw new RangeError(`cacheWindow must be a non-negative integer, got ${cacheWindow}`);
    }
    for (let l = 0; l < loops; l++) {
      this.keys.push([]);
      this.values.push([]);
    }
  }

  /** Positions held so far. */
  get position(): number {
    return this.keys[0].length;
  }

  /** Forgets positions >= pos. */
  rollback(pos: number): void {
    if (!Number.isInteger(pos) || pos < 0 || pos > this.position) {
      throw new RangeError(`rollback position must be in [0, ${this.position}], got ${pos}`);
    }
    for (let l = 0; l < this.loops; l++) {
      this.keys[l].length = pos;
      this.values[l].length = pos;
    }
  }

  /** Runs one token at the next position; returns its logits. */
  feed(token: number): Float32Array {
    const c = this.model.config;
    const w = this.model.weights;
    const mv = (key: MatrixKey, rows: number, cols: number, x: Float64Array) => this.model.apply(key, rows, cols, x);
    if (!Number.isInteger(token) || token < 0 || token >= c.vocabSize) {
      throw new RangeError(`token id must be an integer in [0, ${c.vocabSize}), got ${token}`);
    }
    const pos = this.position;
    const { dim, nHeads, nKvHeads, headDim: hd, ffnDim } = c;
    const qDim = nHeads * hd;
    const kvDim = nKvHeads * hd;
    const group = nHeads / nKvHeads;
    const first = this.cacheWindow > 0 ? Math.max(0, pos - this.cacheWindow + 1) : 0;
    const scale = 1 / Math.sqrt(hd);

    const h = Float64Array.from(w.tokEmbeddings.subarray(token * dim, (token + 1) * dim));

    for (let l = 0; l < this.loops; l++) {
      // ---- attention ----
      let x = rmsnorm(h, w.attnNorm, c.normEps);
      const q = mv("wq", qDim, dim, x);
      const k = mv("wk", kvDim, dim, x);
      const v = mv("wv", kvDim, dim, x);
      applyRope(q, nHeads, hd, pos, c.ropeTheta);
      applyRope(k, nKvHeads, hd, pos, c.ropeTheta);
      // The current token reads its own entry back from the cache like
      // every other: fp16, or the cache mode's rotated / quantized row.
      if (this.kv.format === "fp16" && !this.kv.hadamard) {
        this.keys[l].push(k.map(roundToF16));
        this.values[l].push(v.map(roundToF16));
      } else {
        const ks = new Float64Array(kvDim);
        const vs = new Float64Array(kvDim);
        for (let o = 0; o < kvDim; o += hd) {
          ks.set(storedKvRow(this.kv, k.subarray(o, o + hd), hd), o);
          vs.set(storedKvRow(this.kv, v.subarray(o, o + hd), hd), o);
        }
        this.keys[l].push(ks);
        this.values[l].push(vs);
      }
      if (this.kv.hadamard)
        for (let o = 0; o < qDim; o += hd) {
          if (this.kv.fp16Qkv) for (let i = o; i < o + hd; i++) q[i] = roundToF16(q[i]);
          whtF64(q, o, hd);
        }
      const K = this.keys[l];
      const V = this.values[l];

      const att = new Float64Array(qDim);
      for (let head = 0; head < nHeads; head++) {
        const kvOff = Math.floor(head / group) * hd;
        const qOff = head * hd;
        const scores: number[] = [];
        for (let j = first; j <= pos; j++) {
          let s = 0;
          for (let i = 0; i < hd; i++) s += q[qOff + i] * K[j][kvOff + i];
          scores.push(s * scale);
        }
        const m = scores.reduce((a, b) => Math.max(a, b), -Infinity);
        const e = scores.map((s) => Math.exp(s - m));
        const z = e.reduce((a, b) => a + b, 0);
        for (let j = first; j <= pos; j++) {
          const p = e[j - first] / z;
          for (let i = 0; i < hd; i++) att[qOff + i] += p * V[j][kvOff + i];
        }
        if (this.kv.hadamard) whtF64(att, qOff, hd);
      }
      const o = mv("wo", dim, qDim, att);
      for (let i = 0; i < dim; i++) h[i] += o[i];

      // ---- SwiGLU feed-forward ----
      x = rmsnorm(h, w.ffnNorm, c.normEps);
      const gate = mv("w1", ffnDim, dim, x);
      const up = mv("w3", ffnDim, dim, x);
      const act = new Float64Array(ffnDim);
      for (let i = 0; i < ffnDim; i++) act[i] = silu(gate[i]) * up[i];
      const down = mv("w2", dim, ffnDim, act);
      for (let i = 0; i < dim; i++) h[i] += down[i];
    }

    // ---- output ----
    const xf = rmsnorm(h, w.norm, c.normEps);
    return Float32Array.from(mv("output", c.vocabSize, dim, xf));
  }
}
