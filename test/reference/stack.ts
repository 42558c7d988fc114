// Reference forward pass of a stacked model (format version 2: n_layers
// distinct layers applied each step, sandwich norms, a norm after every
// step, the learned exit gate) in plain TypeScript, float64, one token at a
// time: the test oracle for the kernels on stacks (docs/model-format.md,
// docs/early-exit.md). fp16 weights and the fp16 key/value cache only; the
// single-block oracle (forward.ts) covers the quantized formats and cache
// modes, and its building blocks are reused here.
//
//   h = E[token]
//   for s in 0..steps-1:
//     for i in 0..n_layers-1:                cache unit (s, i)
//       a = attention(layer i) · Wo_i;  sandwich: a = rmsnorm(a, attn_out_norm_i)
//       h += a
//       f = SwiGLU(rmsnorm(h, ffn_norm_i));  sandwich: f = rmsnorm(f, ffn_out_norm_i)
//       h += f
//     step_norm: h = rmsnorm(h, norm)
//     exit gate (the sampled token only): lambda = sigmoid(h·w + b); stop once the
//       cumulative exit probability reaches the threshold; deeper units of each
//       layer get the exit step's keys/values
//   logits = (step_norm ? h : rmsnorm(h, norm)) · Wout

import { f16ArrayToF32, roundToF16 } from "../../src/model/fp16.ts";
import { asF16, layerPrefix, type ModelConfig, QUANT_MATRICES, type QuantMatrixName, validateModel } from "../../src/model/format.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { applyRope, matvec, rmsnorm, silu } from "./forward.ts";

interface LayerWeights {
  attnNorm: Float32Array;
  ffnNorm: Float32Array;
  attnOutNorm: Float32Array | null;
  ffnOutNorm: Float32Array | null;
  m: Record<QuantMatrixName, Float32Array>;
}

export class StackReference {
  private constructor(
    readonly config: ModelConfig,
    readonly layers: LayerWeights[],
    readonly tok: Float32Array,
    readonly norm: Float32Array,
    readonly output: Float32Array,
    readonly gate: { w: Float32Array; b: number } | null,
  ) {}

  /** Loads an fp16 model of any number of layers (validated as the server validates it). */
  static load(path: string): StackReference {
    const { config: c, tensors } = validateModel(readSafetensors(path));
    if (c.quant !== "fp16" || c.headQuant !== "fp16") throw new Error("StackReference reads fp16 models");
    const f = (name: string) => f16ArrayToF32(asF16(tensors.get(name)!));
    const layers: LayerWeights[] = [];
    for (let i = 0; i < c.nLayers; i++) {
      const p = layerPrefix(c, i);
      const sandwich = c.normLayout === "sandwich";
      const m = Object.fromEntries(QUANT_MATRICES.map((k) => [k, f(`${p}${k}.weight`)])) as Record<QuantMatrixName, Float32Array>;
      layers.push({
        attnNorm: f(`${p}attn_norm.weight`),
        ffnNorm: f(`${p}ffn_norm.weight`),
        attnOutNorm: sandwich ? f(`${p}attn_out_norm.weight`) : null,
        ffnOutNorm: sandwich ? f(`${p}ffn_out_norm.weight`) : null,
        m,
      });
    }
    const tok = f("tok_embeddings.weight");
    const gate = c.exitGate ? { w: f("exit_gate.weight"), b: f("exit_gate.bias")[0] } : null;
    return new StackReference(c, layers, tok, f("norm.weight"), c.tiedOutput ? tok : f("output.weight"), gate);
  }

  session(steps: number): StackSession {
    return new StackSession(this, steps);
  }
}

/** One token's result: its logits and the steps it ran. */
export interface StackStep {
  logits: Float32Array;
  steps: number;
}

export class StackSession {
  /** keys[unit][pos] (unit = step * n_layers + layer), as the fp16 cache holds them. */
  readonly keys: Float64Array[][] = [];
  readonly values: Float64Array[][] = [];

  constructor(
    readonly model: StackReference,
    readonly steps: number,
  ) {
    for (let u = 0; u < steps * model.config.nLayers; u++) {
      this.keys.push([]);
      this.values.push([]);
    }
  }

  get position(): number {
    return this.keys[0].length;
  }

  /**
   * Runs one token at the next position. exitThreshold > 0 (a model with a
   * gate): the token stops after the first step whose cumulative exit
   * probability reaches it (fp32 arithmetic, as the kernels decide).
   */
  feed(token: number, exitThreshold = 0): StackStep {
    const c = this.model.config;
    const L = c.nLayers;
    const pos = this.position;
    const h = Float64Array.from(this.model.tok.subarray(token * c.dim, (token + 1) * c.dim));
    let remaining = 1;
    let cdf = 0;
    let ran = this.steps;
    for (let s = 0; s < this.steps; s++) {
      for (let i = 0; i < L; i++) this.layer(h, s * L + i, this.model.layers[i], pos);
      if (c.stepNorm) h.set(rmsnorm(h, this.model.norm, c.normEps));
      const gate = this.model.gate;
      if (exitThreshold > 0 && gate && s < this.steps - 1) {
        let z = Math.fround(gate.b);
        for (let d = 0; d < c.dim; d++) z = Math.fround(z + Math.fround(Math.fround(h[d]) * gate.w[d]));
        const lambda = Math.fround(1 / Math.fround(1 + Math.fround(Math.exp(-z))));
        const p = Math.fround(lambda * remaining);
        remaining = Math.fround(remaining * Math.fround(1 - lambda));
        cdf = Math.fround(cdf + p);
        if (cdf >= exitThreshold) {
          ran = s + 1;
          break;
        }
      }
    }
    for (let u = ran * L; u < this.steps * L; u++) {
      this.keys[u].push(this.keys[(ran - 1) * L + (u % L)][pos]);
      this.values[u].push(this.values[(ran - 1) * L + (u % L)][pos]);
    }
    const x = c.stepNorm ? h : rmsnorm(h, this.model.norm, c.normEps);
    return { logits: Float32Array.from(matvec(this.model.output, c.vocabSize, c.dim, x)), steps: ran };
  }

  private layer(h: Float64Array, unit: number, w: LayerWeights, pos: number): void {
    const c = this.model.config;
    const { dim, nHeads, nKvHeads, headDim: hd, ffnDim } = c;
    const qDim = nHeads * hd;
    const kvDim = nKvHeads * hd;
    let x = rmsnorm(h, w.attnNorm, c.normEps);
    const q = matvec(w.m.wq, qDim, dim, x);
    const k = matvec(w.m.wk, kvDim, dim, x);
    const v = matvec(w.m.wv, kvDim, dim, x);
    applyRope(q, nHeads, hd, pos, c.ropeTheta);
    applyRope(k, nKvHeads, hd, pos, c.ropeTheta);
    this.keys[unit].push(k.map(roundToF16));
    this.values[unit].push(v.map(roundToF16));
    const K = this.keys[unit];
    const V = this.values[unit];
    const att = new Float64Array(qDim);
    const group = nHeads / nKvHeads;
    for (let head = 0; head < nHeads; head++) {
      const kvOff = Math.floor(head / group) * hd;
      const qOff = head * hd;
      const scores: number[] = [];
      for (let j = 0; j <= pos; j++) {
        let s = 0;
        for (let i = 0; i < hd; i++) s += q[qOff + i] * K[j][kvOff + i];
        scores.push(s / Math.sqrt(hd));
      }
      const m = Math.max(...scores);
      const e = scores.map((s) => Math.exp(s - m));
      const z = e.reduce((a, b) => a + b, 0);
      for (let j = 0; j <= pos; j++) for (let i = 0; i < hd; i++) att[qOff + i] += (e[j] / z) * V[j][kvOff + i];
    }
    let o = matvec(w.m.wo, dim, qDim, att);
    if (w.attnOutNorm) o = rmsnorm(o, w.attnOutNorm, c.normEps);
    for (let i = 0; i < dim; i++) h[i] += o[i];
    x = rmsnorm(h, w.ffnNorm, c.normEps);
    const gate = matvec(w.m.w1, ffnDim, dim, x);
    const up = matvec(w.m.w3, ffnDim, dim, x);
    const act = new Float64Array(ffnDim);
    for (let i = 0; i < ffnDim; i++) act[i] = silu(gate[i]) * up[i];
    let down = matvec(w.m.w2, dim, ffnDim, act);
    if (w.ffnOutNorm) down = rmsnorm(down, w.ffnOutNorm, c.normEps);
    for (let i = 0; i < dim; i++) h[i] += down[i];
  }
}
