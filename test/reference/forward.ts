// Reference forward pass in plain TypeScript: the test oracle for the C
// kernels (docs/kernels.md, docs/model-format.md, docs/early-exit.md), for
// every model the format describes: a stack of n_layers layers applied
// `loops` times (steps), a single-block file being the stack of one layer
// (its loops the steps, its cache units the loops), in every weight format
// and key/value cache mode. Written to be obviously correct, not fast: one
// token at a time, float64 arithmetic, no tricks. The only places it rounds
// on purpose are where the kernels do: K and V are stored in an fp16 cache
// (or, in a compressed cache mode, rotated / quantized exactly as the
// kernels store them: kvcache.ts storedKvRow); each input row of a
// quantized matrix (int4 / int2 layers, int8 / int6 / int4 head) is
// quantized to int8 as the kernels do it (quant.ts: quantizedMatvec),
// against the exactly dequantized weights; and the exit gate decides in
// fp32, as the kernels decide. In the H cache modes q is rotated by the
// same Walsh–Hadamard transform and each head's output rotated back (in
// float64: the rotation is orthonormal).
//
//   h = E[token]
//   for s in 0..loops-1:                         a step
//     for i in 0..n_layers-1:                    layer i's own weights; cache unit u = s * n_layers + i
//       x = rmsnorm(h, attn_norm_i)
//       q, k, v = x·Wq_i^T, x·Wk_i^T, x·Wv_i^T; rope(q, k, pos)
//       K[u][pos], V[u][pos] = fp16(k), fp16(v)  (or the cache mode's stored rows)
//       a = attention(q, K[u], V[u]) · Wo_i^T;  sandwich: a = rmsnorm(a, attn_out_norm_i)
//       h += a
//       x = rmsnorm(h, ffn_norm_i)
//       f = (silu(x·W1_i^T) * (x·W3_i^T)) · W2_i^T;  sandwich: f = rmsnorm(f, ffn_out_norm_i)
//       h += f
//     step_norm: h = rmsnorm(h, norm)
//     exit gate (an exit rule given, the step not the last): lambda = sigmoid(h·w + b); the
//       logits come from the first step whose cumulative exit probability reaches the
//       threshold; "exact": every step still runs (the published Ouro code's every-step,
//       select), "copy": the deeper units of each layer get the exit step's keys/values
//   logits = (step_norm ? h : rmsnorm(h, norm)) · Wout^T

import { f16ArrayToF32, roundToF16 } from "../../src/model/fp16.ts";
import {
  asF16,
  layerPrefix,
  MAX_LOOPS,
  matrixBits,
  matrixShapes,
  type ModelConfig,
  QUANT_MATRICES,
  type QuantMatrix,
  type QuantMatrixName,
  quantizedHead,
  quantTensorShapes,
  validateModel,
} from "../../src/model/format.ts";
import type { ExitPlan } from "../../src/engine/types.ts";
import { type KvCacheMode, type KvModeSpec, kvModeSpec } from "../../src/model/kvcache.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { storedKvRow, whtF64 } from "./kvcache.ts";
import { dequantize, quantizedMatvec } from "./quant.ts";

// ---- building blocks ----

/** x / sqrt(mean(x^2) + eps) * w */
function rmsnorm(x: Float64Array, w: Float32Array, eps: number): Float64Array {
  let ss = 0;
  for (let i = 0; i < x.length; i++) ss += x[i] * x[i];
  const inv = 1 / Math.sqrt(ss / x.length + eps);
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] * inv * w[i];
  return out;
}

/** y = W x for W stored row-major [rows, cols] ([out_features, in_features]). */
function matvec(w: RefMatrix, rows: number, cols: number, x: Float64Array): Float64Array {
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

function silu(x: number): number {
  return x / (1 + Math.exp(-x));
}

/** The exit gate's lambda = sigmoid(h·w + b) in fp32, summed in order, as the kernels compute it (batch.c exit_lambda). */
function exitLambda(h: Float64Array, gate: { w: Float32Array; b: number }): number {
  const f = Math.fround;
  let z = f(gate.b);
  for (let d = 0; d < h.length; d++) z = f(z + f(f(h[d]) * gate.w[d]));
  return f(1 / f(1 + f(Math.exp(-z))));
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

/** One layer's weights, decoded exactly from the file (shapes: format.ts matrixShapes). */
export interface ReferenceLayer {
  attnNorm: Float32Array;
  ffnNorm: Float32Array;
  /** Sandwich norms of the sublayers' outputs; null in the pre-norm layout. */
  attnOutNorm: Float32Array | null;
  ffnOutNorm: Float32Array | null;
  matrices: Record<QuantMatrixName, RefMatrix>;
}

export class ReferenceModel {
  private constructor(
    readonly config: ModelConfig,
    readonly layers: ReferenceLayer[],
    readonly tokEmbeddings: Float32Array,
    readonly norm: Float32Array,
    /** The head; tokEmbeddings itself when tied to an fp16 embedding. */
    readonly output: RefMatrix,
    readonly gate: { w: Float32Array; b: number } | null,
  ) {}

  /** Loads a model of any number of layers, weight format and output head (validated as the server validates it). */
  static load(path: string): ReferenceModel {
    const file = readSafetensors(path);
    const { config: c, tensors } = validateModel(file);
    const f32 = (name: string) => f16ArrayToF32(asF16(tensors.get(name)!));
    const shapes = matrixShapes(c);
    const matrix = (prefix: string, m: QuantMatrixName): RefMatrix => {
      if (c.quant === "fp16") return f32(`${prefix}${m}.weight`);
      const [rows, cols] = shapes[m];
      const bits = matrixBits(c, m) as QuantMatrix["bits"];
      const [qweight, scales, zeros] = quantTensorShapes(`${prefix}${m}`, bits, rows, cols, c.groupSize).map(([name]) => tensors.get(name)!);
      return dequantize({ bits, rows, cols, groupSize: c.groupSize, qweight: qweight.data, scales: asF16(scales), zeros: zeros && asF16(zeros) });
    };
    const sandwich = c.normLayout === "sandwich";
    const layers = Array.from({ length: c.nLayers }, (_, i): ReferenceLayer => {
      const p = layerPrefix(c, i);
      return {
        attnNorm: f32(`${p}attn_norm.weight`),
        ffnNorm: f32(`${p}ffn_norm.weight`),
        attnOutNorm: sandwich ? f32(`${p}attn_out_norm.weight`) : null,
        ffnOutNorm: sandwich ? f32(`${p}ffn_out_norm.weight`) : null,
        matrices: Object.fromEntries(QUANT_MATRICES.map((m) => [m, matrix(p, m)])) as Record<QuantMatrixName, RefMatrix>,
      };
    });
    const head = c.headQuant === "fp16" ? null : dequantize(quantizedHead(file, c));
    // An embedding tied to the quantized head: its rows dequantized (s * c, exact in fp32).
    const tok = c.embeddingFromHead ? Float32Array.from(head!) : f32("tok_embeddings.weight");
    const output = head ?? (c.tiedOutput ? tok : f32("output.weight"));
    const gate = c.exitGate ? { w: f32("exit_gate.weight"), b: f32("exit_gate.bias")[0] } : null;
    return new ReferenceModel(c, layers, tok, f32("norm.weight"), output, gate);
  }

  /** y = W x for a layer matrix, the way the kernels compute it: a quantized matrix takes its input quantized to int8 per row. */
  layerMatvec(w: RefMatrix, rows: number, cols: number, x: Float64Array): Float64Array {
    return this.config.quant !== "fp16" ? quantizedMatvec(w, rows, cols, x) : matvec(w, rows, cols, x);
  }

  /** logits = Wout x, as layerMatvec for the head's own format. */
  head(x: Float64Array): Float32Array {
    const { vocabSize, dim, headQuant } = this.config;
    return Float32Array.from(headQuant !== "fp16" ? quantizedMatvec(this.output, vocabSize, dim, x) : matvec(this.output, vocabSize, dim, x));
  }

  /** A fresh incremental session (empty cache) running `loops` steps per token. */
  session(loops: number, opts: ForwardOptions = {}): ReferenceSession {
    return new ReferenceSession(this, loops, opts.cacheWindow ?? 0, kvModeSpec(opts.kvCacheMode ?? "fp16", opts.fp16AttnQkv ?? false));
  }

  /** Logits (vocab_size floats) for every token of `tokens`, from an empty cache, at full depth. */
  forward(tokens: number[], loops: number, opts: ForwardOptions = {}): Float32Array[] {
    const s = this.session(loops, opts);
    return tokens.map((t) => s.feed(t));
  }

  /** Greedy continuation at full depth (lowest id on ties, as ls_sample does). */
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

export class ReferenceSession {
  /**
   * keys[u][pos], values[u][pos]: cache unit u = step * n_layers + layer (a
   * single block: u = the loop); rows of n_kv_heads * head_dim as attention
   * reads them back (fp16 values, or the cache mode's decoded rows).
   */
  readonly keys: Float64Array[][] = [];
  readonly values: Float64Array[][] = [];
  /** Steps the last fed token ran: `loops`, or its exit step + 1 (ls_session_last_steps). */
  lastSteps = 0;

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
    for (let u = 0; u < loops * model.config.nLayers; u++) {
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
    for (let u = 0; u < this.keys.length; u++) {
      this.keys[u].length = pos;
      this.values[u].length = pos;
    }
  }

  /**
   * Runs one token at the next position; returns its logits. With an exit
   * rule (a model with a gate), the token's logits come from the first step
   * whose cumulative exit probability reaches the threshold, as the
   * kernels' sampled token does: "exact" computes every step of the token
   * regardless (what the published Ouro code does), "copy" stops there and
   * gives the deeper units of each layer the exit step's keys/values.
   * Without one every step runs.
   */
  feed(token: number, exit?: ExitPlan): Float32Array {
    const c = this.model.config;
    if (!Number.isInteger(token) || token < 0 || token >= c.vocabSize) {
      throw new RangeError(`token id must be an integer in [0, ${c.vocabSize}), got ${token}`);
    }
    if (exit && !(this.model.gate && exit.threshold >= 0 && exit.threshold <= 1)) {
      throw new RangeError(`an exit threshold must be in [0, 1], with a model that has an exit gate, got ${exit.threshold}`);
    }
    const L = c.nLayers;
    const pos = this.position;
    const h = Float64Array.from(this.model.tokEmbeddings.subarray(token * c.dim, (token + 1) * c.dim));
    // The exit distribution (loopserve.h, learned early exit), in fp32 as the kernels keep it:
    // p_s = lambda_s * r_s, r_{s+1} = r_s * (1 - lambda_s); the token exits once sum p reaches the threshold.
    let remaining = 1;
    let cdf = 0;
    let ran = this.loops;
    let exitState: Float64Array | null = null;
    for (let s = 0; s < this.loops; s++) {
      for (let i = 0; i < L; i++) this.layer(h, s * L + i, this.model.layers[i], pos);
      if (c.stepNorm) h.set(rmsnorm(h, this.model.norm, c.normEps));
      if (exit && exitState === null && s < this.loops - 1) {
        const lambda = exitLambda(h, this.model.gate!);
        const p = Math.fround(lambda * remaining);
        remaining = Math.fround(remaining * Math.fround(1 - lambda));
        cdf = Math.fround(cdf + p);
        if (cdf >= exit.threshold) {
          ran = s + 1;
          exitState = Float64Array.from(h);
          if (exit.policy === "copy") break;
        }
      }
    }
    // copy: the deeper units of each layer hold the exit step's rows, so later tokens see this one at every depth
    if (exit?.policy === "copy")
      for (let u = ran * L; u < this.loops * L; u++) {
        this.keys[u].push(this.keys[(ran - 1) * L + (u % L)][pos]);
        this.values[u].push(this.values[(ran - 1) * L + (u % L)][pos]);
      }
    this.lastSteps = ran;
    const out = exitState ?? h;
    return this.model.head(c.stepNorm ? out : rmsnorm(out, this.model.norm, c.normEps));
  }

  /** One layer on h in place, storing its keys and values in cache unit `unit`. */
  private layer(h: Float64Array, unit: number, w: ReferenceLayer, pos: number): void {
    const c = this.model.config;
    const mv = (m: QuantMatrixName, rows: number, cols: number, x: Float64Array) => this.model.layerMatvec(w.matrices[m], rows, cols, x);
    const { dim, nHeads, nKvHeads, headDim: hd, ffnDim } = c;
    const qDim = nHeads * hd;
    const kvDim = nKvHeads * hd;

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
      this.keys[unit].push(k.map(roundToF16));
      this.values[unit].push(v.map(roundToF16));
    } else {
      const ks = new Float64Array(kvDim);
      const vs = new Float64Array(kvDim);
      for (let o = 0; o < kvDim; o += hd) {
        ks.set(storedKvRow(this.kv, k.subarray(o, o + hd), hd), o);
        vs.set(storedKvRow(this.kv, v.subarray(o, o + hd), hd), o);
      }
      this.keys[unit].push(ks);
      this.values[unit].push(vs);
    }
    if (this.kv.hadamard)
      for (let o = 0; o < qDim; o += hd) {
        if (this.kv.fp16Qkv) for (let i = o; i < o + hd; i++) q[i] = roundToF16(q[i]);
        whtF64(q, o, hd);
      }
    const att = this.attention(q, this.keys[unit], this.values[unit], pos);
    let a = mv("wo", dim, qDim, att);
    if (w.attnOutNorm) a = rmsnorm(a, w.attnOutNorm, c.normEps);
    for (let i = 0; i < dim; i++) h[i] += a[i];

    // ---- SwiGLU feed-forward ----
    x = rmsnorm(h, w.ffnNorm, c.normEps);
    const gate = mv("w1", ffnDim, dim, x);
    const up = mv("w3", ffnDim, dim, x);
    const act = new Float64Array(ffnDim);
    for (let i = 0; i < ffnDim; i++) act[i] = silu(gate[i]) * up[i];
    let f = mv("w2", dim, ffnDim, act);
    if (w.ffnOutNorm) f = rmsnorm(f, w.ffnOutNorm, c.normEps);
    for (let i = 0; i < dim; i++) h[i] += f[i];
  }

  /** Each head's softmax(q·K / sqrt(head_dim)) · V over the positions in the window (GQA: query head j reads kv head j / group). */
  private attention(q: Float64Array, K: Float64Array[], V: Float64Array[], pos: number): Float64Array {
    const { nHeads, nKvHeads, headDim: hd } = this.model.config;
    const group = nHeads / nKvHeads;
    const first = this.cacheWindow > 0 ? Math.max(0, pos - this.cacheWindow + 1) : 0;
    // The kernels multiply by the fp32 1/sqrt(head_dim) (attention.c); in float64 the same product.
    const scale = 1 / Math.sqrt(hd);
    const att = new Float64Array(nHeads * hd);
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
    return att;
  }
}
