// Deterministic synthetic models: random fp16 weights from a seed, for tests
// and speed benchmarks (the demo serves the trained model, src/model/trained.ts).
//
// Same seed and options => byte-identical file on every run and machine. That
// rules out Math.log/Math.cos (JS does not require them to be correctly
// rounded, so engines and platforms may differ in the last bit): the normal
// deviates are Irwin-Hall sums of four uniforms, which need only integer
// arithmetic, + and * by constants.
//
// Each tensor draws from its own stream (seed, tensor name), so changing the
// vocabulary size leaves the block's weights as they were.

import { F16_TO_F32, f32ArrayToF16 } from "./fp16.ts";
import { fillNormal, streamState } from "./normal_stream.ts";
import {
  ARCH,
  attentionHeadDim,
  configToMetadata,
  exitThresholdRefusal,
  expectedTensorShapes,
  formatVersionOf,
  type ModelConfig,
  type Injection,
  type ModelShape,
  type NormLayout,
  type RopeLayout,
  SETTING_RANGES,
  TOKENIZER,
} from "./format.ts";
import { ModelFormatError, type TensorToWrite, writeSafetensors } from "./safetensors.ts";

export interface SyntheticOptions {
  dim: number;
  nHeads: number;
  nKvHeads: number;
  ffnDim: number;
  vocabSize: number;
  loops: number; // default_loops in the file
  seed: number; // non-negative integer
  tiedOutput?: boolean; // default false: write output.weight
  maxSeqLen?: number; // default 2048
  ropeTheta?: number; // default 10000
  normEps?: number; // default 1e-5
  /**
   * Multiplies Wo and W2 (default 1): small residual updates per loop make
   * shallow loops agree with deep ones (see the scales below). A tied model
   * with a small scale falls into short cycles (its logit form is symmetric
   * in input and output token): use untied models for speculative tests.
   */
  residualScale?: number;
  /** A stack (format version 2): layers per step (default 1), sandwich norms, a norm after every step, an exit gate. */
  nLayers?: number;
  sandwichNorm?: boolean;
  stepNorm?: boolean;
  exitGate?: boolean;
  /** The model's default exit threshold (needs exitGate); default none: fixed depth. */
  exitThreshold?: number | null;
  /** Recurrent depth (docs/model-format.md); each default is a model without it. normLayout overrides sandwichNorm. */
  normLayout?: NormLayout;
  headDim?: number; // default dim / nHeads
  nPrelude?: number;
  nCoda?: number;
  injection?: Injection;
  embedScale?: number;
  stateStd?: number;
  midNorm?: boolean;
  ropeLayout?: RopeLayout;
  qkBias?: boolean;
}

export interface SyntheticResult {
  path: string;
  bytes: number; // file size
  parameters: number; // stored weights (tied output counted once)
  config: ModelConfig;
}

// ---- weight scales ----

/**
 * Scales, chosen so that greedy output is varied and `residualScale` means
 * something:
 * - Embedding rows ~N(0, 1): the residual stream starts at RMS 1, the size
 *   of one loop's update at residualScale 1. At residualScale r each loop
 *   moves h by ~r, so a small r makes shallow and deep loops agree (dim 64,
 *   untied: greedy top-1 of 2 vs 4 loops agrees ~25% at r=1, ~70% at 0.1,
 *   ~90% at 0.03).
 * - Output rows ~N(0, (EMBED_GAIN / sqrt(dim))^2): rmsnorm(h) has norm
 *   ~sqrt(dim), so logits have std ~EMBED_GAIN (top-1 probability ~0.1 over
 *   50k tokens): greedy is not a coin flip, sampling is not deterministic.
 * - Projections ~1/sqrt(fan_in), so each keeps its output O(1).
 */
const EMBED_GAIN = 3;
/** Norm weights are 1 + NORM_JITTER * N(0, 1): near 1, but not a no-op. */
const NORM_JITTER = 0.05;

const CHUNK = 1 << 16;

/** An fp16 tensor of `count` values mean + std * N(0,1) from stream (seed, name). */
function randomF16(count: number, mean: number, std: number, seed: number, name: string): Uint16Array {
  const out = new Uint16Array(count);
  const scratch = new Float32Array(Math.min(CHUNK, count));
  const state = streamState(seed, name);
  for (let off = 0; off < count; off += CHUNK) {
    const n = Math.min(CHUNK, count - off);
    const chunk = n === scratch.length ? scratch : scratch.subarray(0, n);
    fillNormal(chunk, mean, std, state);
    f32ArrayToF16(chunk, out.subarray(off, off + n));
  }
  return out;
}

// ---- options ----

function checkInt(name: string, v: unknown, min: number, max = 2147483647): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw new ModelFormatError(`synthetic model: ${name} must be an integer in [${min}, ${max}], got ${String(v)}`);
  }
  return v;
}

function checkNumber(name: string, v: unknown, positive: boolean): number {
  if (typeof v !== "number" || !Number.isFinite(v) || (positive ? v <= 0 : v < 0)) {
    throw new ModelFormatError(
      `synthetic model: ${name} must be a ${positive ? "positive" : "non-negative"} finite number, got ${String(v)}`,
    );
  }
  return v;
}

/** Fills defaults and checks the options (the same rules the loader applies). */
export function resolveSyntheticOptions(o: SyntheticOptions): Required<SyntheticOptions> {
  const r: Required<SyntheticOptions> = {
    dim: checkInt("dim", o.dim, ...SETTING_RANGES.dim),
    nHeads: checkInt("nHeads", o.nHeads, ...SETTING_RANGES.nHeads),
    nKvHeads: checkInt("nKvHeads", o.nKvHeads, ...SETTING_RANGES.nKvHeads),
    ffnDim: checkInt("ffnDim", o.ffnDim, ...SETTING_RANGES.ffnDim),
    vocabSize: checkInt("vocabSize", o.vocabSize, ...SETTING_RANGES.vocabSize),
    loops: checkInt("loops", o.loops, ...SETTING_RANGES.loops),
    seed: checkInt("seed", o.seed, 0, Number.MAX_SAFE_INTEGER),
    tiedOutput: o.tiedOutput ?? false,
    maxSeqLen: checkInt("maxSeqLen", o.maxSeqLen ?? 2048, ...SETTING_RANGES.maxSeqLen),
    ropeTheta: checkNumber("ropeTheta", o.ropeTheta ?? 10000, true),
    normEps: checkNumber("normEps", o.normEps ?? 1e-5, true),
    residualScale: checkNumber("residualScale", o.residualScale ?? 1, false),
    nLayers: checkInt("nLayers", o.nLayers ?? 1, ...SETTING_RANGES.nLayers),
    sandwichNorm: o.sandwichNorm ?? false,
    stepNorm: o.stepNorm ?? false,
    exitGate: o.exitGate ?? false,
    exitThreshold: o.exitThreshold ?? null,
    normLayout: o.normLayout ?? (o.sandwichNorm ? "sandwich" : "pre"),
    headDim: o.headDim === undefined ? Math.max(1, Math.floor(o.dim / o.nHeads)) : checkInt("headDim", o.headDim, ...SETTING_RANGES.headDim),
    nPrelude: checkInt("nPrelude", o.nPrelude ?? 0, ...SETTING_RANGES.outerLayers),
    nCoda: checkInt("nCoda", o.nCoda ?? 0, ...SETTING_RANGES.outerLayers),
    injection: o.injection ?? "none",
    embedScale: checkNumber("embedScale", o.embedScale ?? 1, true),
    stateStd: checkNumber("stateStd", o.stateStd ?? 0, false),
    midNorm: o.midNorm ?? false,
    ropeLayout: o.ropeLayout ?? "half",
    qkBias: o.qkBias ?? false,
  };
  const refused = r.exitThreshold === null ? null : exitThresholdRefusal(r.exitThreshold, r.exitGate);
  if (refused) throw new ModelFormatError(`synthetic model: exitThreshold ${refused}`);
  if (typeof r.tiedOutput !== "boolean") throw new ModelFormatError(`synthetic model: tiedOutput must be a boolean`);
  const attention = attentionHeadDim(r.dim, r.nHeads, r.nKvHeads, o.headDim === undefined ? undefined : r.headDim, {
    dim: "dim",
    nHeads: "nHeads",
    nKvHeads: "nKvHeads",
    headDim: "headDim",
  });
  if (typeof attention === "string") throw new ModelFormatError(`synthetic model: ${attention}`);
  return r;
}

/**
 * Tied output: logits = (rmsnorm(h) * norm) · E^T, and h still holds E[token].
 * With a positive norm the token's own logit gets +|E[token]|^2 / rms(h) and
 * the model echoes its input; random signs cancel that bias. Since E has unit
 * rows here, the final norm also sets the logit scale: magnitude
 * EMBED_GAIN / sqrt(dim) gives logits of std ~EMBED_GAIN, as untied output.
 */
function tiedFinalNorm(w: Uint16Array, magnitude: number, seed: number): void {
  const signs = streamState(seed, "norm.weight/signs");
  const scratch = new Float32Array(w.length);
  fillNormal(scratch, 0, 1, signs);
  for (let i = 0; i < w.length; i++) {
    const v = F16_TO_F32[w[i]] * magnitude * (scratch[i] < 0 ? -1 : 1);
    scratch[i] = v;
  }
  f32ArrayToF16(scratch, w);
}

// ---- writer ----

/** Writes a deterministic fp16 synthetic model to `path`. */
export function writeSyntheticModel(path: string, opts: SyntheticOptions): SyntheticResult {
  const o = resolveSyntheticOptions(opts);
  const stack = {
    nLayers: o.nLayers,
    normLayout: o.normLayout,
    stepNorm: o.stepNorm,
    exitThreshold: o.exitThreshold,
    tokenizer: TOKENIZER,
    nPrelude: o.nPrelude,
    nCoda: o.nCoda,
    injection: o.injection,
    embedScale: o.embedScale,
    stateStd: o.stateStd,
    midNorm: o.midNorm,
    ropeLayout: o.ropeLayout,
    qkBias: o.qkBias,
  } as const;
  const base: ModelShape = {
    arch: ARCH,
    formatVersion: formatVersionOf({ ...stack, headDim: o.headDim, dim: o.dim, nHeads: o.nHeads }, o.exitGate),
    ...stack,
    dim: o.dim,
    nHeads: o.nHeads,
    nKvHeads: o.nKvHeads,
    headDim: o.headDim,
    ffnDim: o.ffnDim,
    vocabSize: o.vocabSize,
    defaultLoops: o.loops,
    maxSeqLen: o.maxSeqLen,
    ropeTheta: o.ropeTheta,
    normEps: o.normEps,
    quant: "fp16",
    groupSize: 0,
    quantMix: {},
  };
  const metadata = {
    ...configToMetadata(base),
    generator: "loopserve synthetic",
    seed: String(o.seed),
    residual_scale: String(o.residualScale),
  };

  const outStd = EMBED_GAIN / Math.sqrt(o.dim);
  const qDim = o.nHeads * base.headDim;
  // name (after a layer's prefix) -> [mean, std]; fan_in scaling keeps every projection's output O(1).
  const dist: Record<string, [number, number]> = {
    "tok_embeddings.weight": [0, 1],
    "attn_norm.weight": [1, NORM_JITTER],
    "attn_out_norm.weight": [1, NORM_JITTER],
    "wq.weight": [0, 1 / Math.sqrt(o.dim)],
    "wk.weight": [0, 1 / Math.sqrt(o.dim)],
    "wv.weight": [0, 1 / Math.sqrt(o.dim)],
    "wo.weight": [0, o.residualScale / Math.sqrt(qDim)],
    "ffn_norm.weight": [1, NORM_JITTER],
    "ffn_out_norm.weight": [1, NORM_JITTER],
    "w1.weight": [0, 1 / Math.sqrt(o.dim)],
    "w2.weight": [0, o.residualScale / Math.sqrt(o.ffnDim)],
    "w3.weight": [0, 1 / Math.sqrt(o.dim)],
    "norm.weight": [1, NORM_JITTER],
    // a gate of this scale exits at varied steps on unit-rms hidden states
    "exit_gate.weight": [0, 1 / Math.sqrt(o.dim)],
    "exit_gate.bias": [0, 1],
    "output.weight": [0, outStd],
    "wq.bias": [0, 0.5],
    "wk.bias": [0, 0.5],
    "adapter.weight": [0, 1 / Math.sqrt(2 * o.dim)],
  };

  const tensors: TensorToWrite[] = [];
  let parameters = 0;
  for (const [name, shape] of expectedTensorShapes(base, o.exitGate)) {
    if (name === "output.weight" && o.tiedOutput) continue;
    const count = shape.reduce((a, b) => a * b, 1);
    const [mean, std] = dist[name.replace(/^(block|(layers|prelude|coda)\.\d+)\./, "")];
    // a one-layer model's streams are named as they always were (its files unchanged)
    const w = randomF16(count, mean, std, o.seed, name);
    if (name === "norm.weight" && o.tiedOutput) tiedFinalNorm(w, outStd, o.seed);
    tensors.push({ name, dtype: "F16", shape, data: new Uint8Array(w.buffer, w.byteOffset, w.byteLength) });
    parameters += count;
  }
  const bytes = writeSafetensors(path, metadata, tensors);
  return { path, bytes, parameters, config: { ...base, tiedOutput: o.tiedOutput, headQuant: "fp16", headGroupSize: 0, embeddingFromHead: false, exitGate: o.exitGate } };
}
