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
//   e = prelude(E[token] * embed_scale)           the prelude's layers, once (fixed cache units)
//   h = injection ? state0(pos) : e
//   for s in 0..loops-1:                         a step
//     injection: h = adapter · concat[h, e]
//     for i in 0..n_layers-1:                    layer i's own weights; cache unit u = s * n_layers + i
//       layer(h, u)                              (below)
//     step_norm: h = rmsnorm(h, norm)
//     exit (an exit rule given, the step not the last): the gate's lambda = sigmoid(h·w + b), the
//       token exiting at the first step whose cumulative exit probability reaches the threshold;
//       or a zero-shot rule's probe of this step's logits (KL or entropy against the previous
//       step's, below the threshold); "exact": every step still runs (every step, select),
//       "copy": the deeper units of each layer get the exit step's keys/values
//   mid_norm: h = rmsnorm(h, norm); h = coda(h)  the coda's layers, once
//   logits = (step_norm and no coda ? h : rmsnorm(h, norm)) · Wout^T
//
//   layer(h, u):
//       x = rmsnorm(h, attn_norm)
//       q, k, v = x·Wq^T (+ bq), x·Wk^T (+ bk), x·Wv^T; rope(q, k, pos) on halves or adjacent pairs
//       K[u][pos], V[u][pos] = fp16(k), fp16(v)  (or the cache mode's stored rows)
//       a = attention(q, K[u], V[u]) · Wo^T
//       pre: h += a;  sandwich: h += rmsnorm(a, attn_out_norm);  sandwich_sum: h = rmsnorm(h + a, attn_out_norm)
//       x = rmsnorm(h, ffn_norm)
//       f = (silu(x·W1^T) * (x·W3^T)) · W2^T, added as a is (ffn_out_norm)
//
// With shared steps' caches (cacheSteps S), core unit u is kept in slot
// u mod (S * n_layers), a position's later steps overwriting its earlier
// ones; tokens are fed one at a time, so each reads the earlier positions'
// last writes (the kernels' semantics for prompts fed a token per call).

import { f16ArrayToF32, roundToF16 } from "../../src/model/fp16.ts";
import {
  allLayerPrefixes,
  asF16,
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
 * pos * theta^(-2i / headDim); with `interleaved`, the adjacent pair
 * (2i, 2i + 1) (as Huginn's code does).
 */
export function applyRope(v: Float64Array, nHeads: number, headDim: number, pos: number, theta: number, interleaved = false): void {
  const half = headDim / 2;
  for (let h = 0; h < nHeads; h++) {
    const base = h * headDim;
    for (let i = 0; i < half; i++) {
      const angle = pos * Math.pow(theta, (-2 * i) / headDim);
      const c = Math.cos(angle);
      const s = Math.sin(angle);
      const [ia, ib] = interleaved ? [base + 2 * i, base + 2 * i + 1] : [base + i, base + i + half];
      const a = v[ia];
      const b = v[ib];
      v[ia] = a * c - b * s;
      v[ib] = a * s + b * c;
    }
  }
}

// ---- the first state of an adapter model (kernels/loopserve.h, ls_model_config.state_std) ----

const MASK64 = (1n << 64n) - 1n;

/** splitmix64's finaliser (kernels/sampling.h ls_mix64). */
function mix64(z: bigint): bigint {
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  return z ^ (z >> 31n);
}

/** The uniform in [0, 1) of (seed, counter) (kernels/sampling.h ls_uniform). */
function uniform(seed: bigint, counter: bigint): number {
  const x = mix64((mix64(seed) + (counter + 1n) * 0x9e3779b97f4a7c15n) & MASK64);
  return Number(x >> 11n) * 2 ** -53;
}

/** The first step's state at position pos: std times the standard normal truncated to [-3, 3] loopserve.h writes out, in float64 then fp32. */
export function state0(pos: number, dim: number, std: number): Float64Array {
  const seed = mix64(0x7374617465n ^ BigInt(pos));
  const out = new Float64Array(dim);
  for (let i = 0; i < dim; i++) {
    let z = 0;
    for (let a = 0; a < 64; a++) {
      const c = 2n * (BigInt(i) * 64n + BigInt(a));
      const v = Math.sqrt(-2 * Math.log(1 - uniform(seed, c))) * Math.cos(6.283185307179586 * uniform(seed, c + 1n));
      if (Math.abs(v) <= 3) {
        z = v;
        break;
      }
    }
    out[i] = Math.fround(std * z);
  }
  return out;
}

/** log(sum exp(l)), float64. */
function logSumExp(l: ArrayLike<number>): number {
  let mx = -Infinity;
  for (let i = 0; i < l.length; i++) mx = Math.max(mx, l[i]);
  let sum = 0;
  for (let i = 0; i < l.length; i++) sum += Math.exp(l[i] - mx);
  return mx + Math.log(sum);
}

/** log-softmax of l, float64: each entry's log-probability. */
export function logSoftmax(l: ArrayLike<number>): Float64Array {
  const lse = logSumExp(l);
  return Float64Array.from(l, (v) => v - lse);
}

/** A zero-shot exit rule's state over a token's steps (kernels/loopserve.h): the previous step's distribution. */
class ProbeState {
  private prev: Float32Array | null = null;
  private prevLse = 0;
  private prevEntropy = 100;

  constructor(private readonly rule: "kl" | "entropy") {}

  /** This step's value from its logits (and keeps them for the next step's). */
  value(l: Float32Array): number {
    const lse = logSumExp(l);
    if (this.rule === "kl") {
      let v = 0;
      if (this.prev === null) {
        const lu = -Math.log(l.length);
        for (let i = 0; i < l.length; i++) v += Math.exp(lu) * (lu - (l[i] - lse));
      } else {
        for (let i = 0; i < l.length; i++) {
          const lp = this.prev[i] - this.prevLse;
          v += Math.exp(lp) * (lp - (l[i] - lse));
        }
      }
      this.prev = l;
      this.prevLse = lse;
      return v;
    }
    let H = 0;
    for (let i = 0; i < l.length; i++) {
      const p = Math.exp(l[i] - lse);
      H -= p * Math.log(p + 1e-10);
    }
    const v = Math.abs(H - this.prevEntropy);
    this.prevEntropy = H;
    return v;
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
  /** 0 (default) = every cache unit its own; S > 0: the core's units share S steps of caches (ls_session_params.cache_steps). */
  cacheSteps?: number;
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
  /** Sandwich norms (of either layout); null in the pre-norm layout. */
  attnOutNorm: Float32Array | null;
  ffnOutNorm: Float32Array | null;
  /** The q and k biases (qk_bias), or null. */
  qBias: Float32Array | null;
  kBias: Float32Array | null;
  matrices: Record<QuantMatrixName, RefMatrix>;
}

export class ReferenceModel {
  private constructor(
    readonly config: ModelConfig,
    /** The core's layers, then the prelude's, then the coda's (the kernels' descriptor order). */
    readonly layers: ReferenceLayer[],
    readonly tokEmbeddings: Float32Array,
    readonly norm: Float32Array,
    /** The head; tokEmbeddings itself when tied to an fp16 embedding. */
    readonly output: RefMatrix,
    readonly gate: { w: Float32Array; b: number } | null,
    /** The input injection's [dim, 2 dim] matrix, or null. */
    readonly adapter: Float32Array | null,
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
    const sandwich = c.normLayout !== "pre";
    const layers = allLayerPrefixes(c).map((p): ReferenceLayer => ({
      attnNorm: f32(`${p}attn_norm.weight`),
      ffnNorm: f32(`${p}ffn_norm.weight`),
      attnOutNorm: sandwich ? f32(`${p}attn_out_norm.weight`) : null,
      ffnOutNorm: sandwich ? f32(`${p}ffn_out_norm.weight`) : null,
      qBias: c.qkBias ? f32(`${p}wq.bias`) : null,
      kBias: c.qkBias ? f32(`${p}wk.bias`) : null,
      matrices: Object.fromEntries(QUANT_MATRICES.map((m) => [m, matrix(p, m)])) as Record<QuantMatrixName, RefMatrix>,
    }));
    const head = c.headQuant === "fp16" ? null : dequantize(quantizedHead(file, c));
    // An embedding tied to the quantized head: its rows dequantized (s * c, exact in fp32).
    const tok = c.embeddingFromHead ? Float32Array.from(head!) : f32("tok_embeddings.weight");
    const output = head ?? (c.tiedOutput ? tok : f32("output.weight"));
    const gate = c.exitGate ? { w: f32("exit_gate.weight"), b: f32("exit_gate.bias")[0] } : null;
    return new ReferenceModel(c, layers, tok, f32("norm.weight"), output, gate, c.injection === "adapter" ? f32("adapter.weight") : null);
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
    return new ReferenceSession(this, loops, opts.cacheWindow ?? 0, kvModeSpec(opts.kvCacheMode ?? "fp16", opts.fp16AttnQkv ?? false), opts.cacheSteps ?? 0);
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
   * keys[slot][pos], values[slot][pos]: the core's cache slots (slot u = step
   * * n_layers + layer, or with shared steps u mod (cacheSteps * n_layers)),
   * then one per fixed unit (the prelude's layers, then the coda's); rows of
   * n_kv_heads * head_dim as attention reads them back (fp16 values, or the
   * cache mode's decoded rows).
   */
  readonly keys: Float64Array[][] = [];
  readonly values: Float64Array[][] = [];
  /** Steps the last fed token ran: `loops`, or its exit step + 1 (ls_session_last_steps). */
  lastSteps = 0;
  /** Slots of the core's units. */
  private readonly coreSlots: number;
  private held = 0;

  constructor(
    readonly model: ReferenceModel,
    readonly loops: number,
    readonly cacheWindow: number,
    readonly kv: KvModeSpec = kvModeSpec("fp16"),
    readonly cacheSteps = 0,
  ) {
    if (!Number.isInteger(loops) || loops < 1 || loops > MAX_LOOPS) {
      throw new RangeError(`loops must be an integer in [1, ${MAX_LOOPS}], got ${loops}`);
    }
    if (!Number.isInteger(cacheWindow) || cacheWindow < 0) {
      throw new RangeError(`cacheWindow must be a non-negative integer, got ${cacheWindow}`);
    }
    if (!Number.isInteger(cacheSteps) || cacheSteps < 0 || cacheSteps >= loops || (cacheSteps > 0 && cacheWindow > 0)) {
      throw new RangeError(`cacheSteps must be 0 or in [1, loops) without a window, got ${cacheSteps}`);
    }
    const c = model.config;
    this.coreSlots = (cacheSteps > 0 ? cacheSteps : loops) * c.nLayers;
    for (let u = 0; u < this.coreSlots + c.nPrelude + c.nCoda; u++) {
      this.keys.push([]);
      this.values.push([]);
    }
  }

  /** Positions held so far. */
  get position(): number {
    return this.held;
  }

  /** Forgets positions >= pos. */
  rollback(pos: number): void {
    if (!Number.isInteger(pos) || pos < 0 || pos > this.position) {
      throw new RangeError(`rollback position must be in [0, ${this.position}], got ${pos}`);
    }
    for (let u = 0; u < this.keys.length; u++) {
      this.keys[u].length = Math.min(pos, this.keys[u].length);
      this.values[u].length = Math.min(pos, this.values[u].length);
    }
    this.held = pos;
  }

  /** Where core unit u is kept. */
  private slot(u: number): number {
    return u % this.coreSlots;
  }

  /** Where the prelude's layer j (j < n_prelude), then the coda's, is kept; and its layer. */
  private fixed(j: number): { slot: number; layer: ReferenceLayer } {
    return { slot: this.coreSlots + j, layer: this.model.layers[this.model.config.nLayers + j] };
  }

  /**
   * Runs one token at the next position; returns its logits. With an exit
   * rule the token's logits come from its exit step, as the kernels'
   * sampled token does: the gate's (a model with one: the first step whose
   * cumulative exit probability reaches the threshold) or a zero-shot
   * rule's (a probe of each step's logits below the threshold). "exact"
   * computes every step of the token regardless (every step, select),
   * "copy" stops there and gives the deeper units of each layer the exit
   * step's keys/values. Without one every step runs.
   */
  feed(token: number, exit?: ExitPlan): Float32Array {
    const c = this.model.config;
    if (!Number.isInteger(token) || token < 0 || token >= c.vocabSize) {
      throw new RangeError(`token id must be an integer in [0, ${c.vocabSize}), got ${token}`);
    }
    const rule = exit?.rule ?? "gate";
    if (exit && rule === "gate" && !(this.model.gate && exit.threshold >= 0 && exit.threshold <= 1)) {
      throw new RangeError(`an exit threshold must be in [0, 1], with a model that has an exit gate, got ${exit.threshold}`);
    }
    const L = c.nLayers;
    const pos = this.position;
    this.held = pos + 1;
    const e = Float64Array.from(this.model.tokEmbeddings.subarray(token * c.dim, (token + 1) * c.dim));
    if (c.embedScale !== 1) for (let i = 0; i < c.dim; i++) e[i] = Math.fround(e[i] * Math.fround(c.embedScale));
    for (let j = 0; j < c.nPrelude; j++) this.layer(e, this.fixed(j), pos);
    let h = c.injection === "adapter" ? state0(pos, c.dim, Math.fround(c.stateStd)) : Float64Array.from(e);
    // The gate's exit distribution (loopserve.h, learned early exit), in fp32 as the kernels keep it:
    // p_s = lambda_s * r_s, r_{s+1} = r_s * (1 - lambda_s); the token exits once sum p reaches the threshold.
    let remaining = 1;
    let cdf = 0;
    const probe = exit && rule !== "gate" ? new ProbeState(rule) : null;
    let ran = this.loops;
    let exitState: Float64Array | null = null;
    for (let s = 0; s < this.loops; s++) {
      if (this.model.adapter) h = matvec(this.model.adapter, c.dim, 2 * c.dim, Float64Array.of(...h, ...e));
      for (let i = 0; i < L; i++) this.layer(h, { slot: this.slot(s * L + i), layer: this.model.layers[i] }, pos);
      if (c.stepNorm) h.set(rmsnorm(h, this.model.norm, c.normEps));
      if (!exit || exitState !== null || s >= this.loops - 1) continue;
      let stop: boolean;
      if (probe) {
        stop = probe.value(this.finish(Float64Array.from(h), pos)) < exit.threshold;
      } else {
        const lambda = exitLambda(h, this.model.gate!);
        const p = Math.fround(lambda * remaining);
        remaining = Math.fround(remaining * Math.fround(1 - lambda));
        cdf = Math.fround(cdf + p);
        stop = cdf >= exit.threshold;
      }
      if (stop) {
        ran = s + 1;
        exitState = Float64Array.from(h);
        if (exit.policy === "copy") break;
      }
    }
    // copy: the deeper units of each layer hold the exit step's rows, so later tokens see this one at every depth
    // (with shared steps, in the slots its steps did not reach: one they reached keeps its latest write)
    if (exit?.policy === "copy")
      for (let u = ran * L; u < Math.min(this.loops * L, this.coreSlots); u++) {
        const from = this.slot((ran - 1) * L + (u % L));
        this.keys[this.slot(u)][pos] = this.keys[from][pos];
        this.values[this.slot(u)][pos] = this.values[from][pos];
      }
    this.lastSteps = ran;
    return this.finish(exitState ?? h, pos);
  }

  /** The core's output h of position pos through the mid norm, the coda (its keys and values at pos) and the head. */
  private finish(h: Float64Array, pos: number): Float32Array {
    const c = this.model.config;
    if (c.midNorm) h.set(rmsnorm(h, this.model.norm, c.normEps));
    for (let j = 0; j < c.nCoda; j++) this.layer(h, this.fixed(c.nPrelude + j), pos);
    return this.model.head(c.stepNorm && c.nCoda === 0 ? h : rmsnorm(h, this.model.norm, c.normEps));
  }

  /** One layer on h in place, storing its keys and values in its cache slot at pos. */
  private layer(h: Float64Array, at: { slot: number; layer: ReferenceLayer }, pos: number): void {
    const c = this.model.config;
    const w = at.layer;
    const mv = (m: QuantMatrixName, rows: number, cols: number, x: Float64Array) => this.model.layerMatvec(w.matrices[m], rows, cols, x);
    const { dim, nHeads, nKvHeads, headDim: hd, ffnDim } = c;
    const qDim = nHeads * hd;
    const kvDim = nKvHeads * hd;
    const interleaved = c.ropeLayout === "interleaved";

    // ---- attention ----
    let x = rmsnorm(h, w.attnNorm, c.normEps);
    const q = mv("wq", qDim, dim, x);
    const k = mv("wk", kvDim, dim, x);
    const v = mv("wv", kvDim, dim, x);
    if (w.qBias && w.kBias) {
      for (let i = 0; i < qDim; i++) q[i] += w.qBias[i];
      for (let i = 0; i < kvDim; i++) k[i] += w.kBias[i];
    }
    applyRope(q, nHeads, hd, pos, c.ropeTheta, interleaved);
    applyRope(k, nKvHeads, hd, pos, c.ropeTheta, interleaved);
    // The current token reads its own entry back from the cache like
    // every other: fp16, or the cache mode's rotated / quantized row.
    if (this.kv.format === "fp16" && !this.kv.hadamard) {
      this.keys[at.slot][pos] = k.map(roundToF16);
      this.values[at.slot][pos] = v.map(roundToF16);
    } else {
      const ks = new Float64Array(kvDim);
      const vs = new Float64Array(kvDim);
      for (let o = 0; o < kvDim; o += hd) {
        ks.set(storedKvRow(this.kv, k.subarray(o, o + hd), hd), o);
        vs.set(storedKvRow(this.kv, v.subarray(o, o + hd), hd), o);
      }
      this.keys[at.slot][pos] = ks;
      this.values[at.slot][pos] = vs;
    }
    if (this.kv.hadamard)
      for (let o = 0; o < qDim; o += hd) {
        if (this.kv.fp16Qkv) for (let i = o; i < o + hd; i++) q[i] = roundToF16(q[i]);
        whtF64(q, o, hd);
      }
    const att = this.attention(q, this.keys[at.slot], this.values[at.slot], pos);
    this.residual(h, mv("wo", dim, qDim, att), w.attnOutNorm);

    // ---- SwiGLU feed-forward ----
    x = rmsnorm(h, w.ffnNorm, c.normEps);
    const gate = mv("w1", ffnDim, dim, x);
    const up = mv("w3", ffnDim, dim, x);
    const act = new Float64Array(ffnDim);
    for (let i = 0; i < ffnDim; i++) act[i] = silu(gate[i]) * up[i];
    this.residual(h, mv("w2", dim, ffnDim, act), w.ffnOutNorm);
  }

  /** A sublayer's output y onto h in place, as the norm layout says (outNorm: its sandwich norm, null pre-norm). */
  private residual(h: Float64Array, y: Float64Array, outNorm: Float32Array | null): void {
    const c = this.model.config;
    if (outNorm && c.normLayout === "sandwich") y = rmsnorm(y, outNorm, c.normEps);
    for (let i = 0; i < c.dim; i++) h[i] += y[i];
    if (outNorm && c.normLayout === "sandwich_sum") h.set(rmsnorm(h, outNorm, c.normEps));
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
