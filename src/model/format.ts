// The loopserve model schema (docs/model-format.md) on top of safetensors: the one
// validator of model files. validateModel judges a file and names the
// tensors the model consists of; the kernel library is then given only
// their byte ranges and the dimensions (src/engine/binding.ts builds the
// descriptor) and checks those against the mapped bytes.

import {
  LS_MAX_DIM,
  LS_MAX_LAYERS,
  LS_MAX_FFN_DIM,
  LS_MAX_HEADS,
  LS_MAX_LOOPS,
  LS_MAX_NORM_EPS,
  LS_MAX_ROPE_THETA,
  LS_MAX_SEQ_LEN,
  LS_MAX_VOCAB,
  LS_QUANT_GROUP_MAX,
  LS_QUANT_GROUP_MIN,
} from "../abi/abi.generated.ts";
import { DTYPE_SIZES, type Dtype, ModelFormatError, readSafetensors, type SafetensorsFile, type TensorView } from "./safetensors.ts";

// ---- schema ----

export type Quant = "fp16" | "int4" | "int2";
/** The output head's format (metadata `output_quant`): fp16 (its own tensor, or tied), or quantized. */
export type HeadQuant = "fp16" | "int8" | "int6" | "int4";
/** Bits per code of each quantized head format (kernels/loopserve.h head_bits). */
export const HEAD_BITS = { int8: 8, int6: 6, int4: 4 } as const;
export type QuantizedHead = keyof typeof HEAD_BITS;
export const HEAD_QUANTS: readonly HeadQuant[] = ["fp16", "int8", "int6", "int4"];
/** Group sizes the kernels handle (kernels/quant.h). */
/** Quantization group sizes: the powers of two from LS_QUANT_GROUP_MIN to LS_QUANT_GROUP_MAX (kernels/loopserve.h). */
export const GROUP_SIZES: readonly number[] = Array.from(
  { length: Math.log2(LS_QUANT_GROUP_MAX / LS_QUANT_GROUP_MIN) + 1 },
  (_, i) => LS_QUANT_GROUP_MIN << i,
);

export const FORMAT_NAME = "loopserve";
/** Format revisions: 2 adds stacks of layers, sandwich and step norms, the exit gate and model-carried tokenizers. */
export const FORMAT_VERSIONS = [1, 2] as const;
export type FormatVersion = (typeof FORMAT_VERSIONS)[number];
export const ARCH = "looped-llama";
export const TOKENIZER = "gpt2";
/** Token ids: GPT-2 BPE (the default), or the BPE (byte-level or SentencePiece-style) the file carries (metadata tokenizer_json). */
export type TokenizerKind = "gpt2" | "bpe";
export const MAX_LOOPS = LS_MAX_LOOPS;
export const MAX_LAYERS = LS_MAX_LAYERS;

/**
 * The range of each integer setting of a model: the kernels' limits
 * (kernels/loopserve.h LS_MAX_*), which keep sizes far from overflow. Every
 * reader of a model's settings (the file's metadata, import-hf's configs,
 * the synthetic writer) checks against these, in its own field names.
 */
export const SETTING_RANGES = {
  dim: [1, LS_MAX_DIM],
  nHeads: [1, LS_MAX_HEADS],
  nKvHeads: [1, LS_MAX_HEADS],
  headDim: [2, LS_MAX_DIM],
  ffnDim: [1, LS_MAX_FFN_DIM],
  vocabSize: [1, LS_MAX_VOCAB],
  loops: [1, LS_MAX_LOOPS],
  maxSeqLen: [1, LS_MAX_SEQ_LEN],
  nLayers: [1, LS_MAX_LAYERS],
  outerLayers: [0, LS_MAX_LAYERS], // a prelude's or a coda's
} as const satisfies Record<string, readonly [number, number]>;
/** How a layer norms: before each sublayer only (Llama), its output too (sandwich, as Ouro), or the residual sum after each add (sandwich_sum, as Huginn). */
export type NormLayout = "pre" | "sandwich" | "sandwich_sum";
export const NORM_LAYOUTS: readonly NormLayout[] = ["pre", "sandwich", "sandwich_sum"];
/** The core's input at each step: the previous step's output, or an adapter of it and the prelude's output (docs/model-format.md). */
export type Injection = "none" | "adapter";
/** Which pairs RoPE rotates: (i, i + head_dim/2) as Llama, or adjacent (2i, 2i + 1) as Huginn. */
export type RopeLayout = "half" | "interleaved";

export interface ModelConfig {
  arch: "looped-llama";
  formatVersion: FormatVersion;
  dim: number; // residual width
  nHeads: number; // query heads
  nKvHeads: number; // key/value heads (GQA: nHeads % nKvHeads == 0)
  headDim: number; // dim / nHeads, even (RoPE rotates pairs)
  ffnDim: number; // SwiGLU hidden width
  vocabSize: number;
  defaultLoops: number; // 1..64
  maxSeqLen: number;
  ropeTheta: number;
  normEps: number;
  quant: Quant;
  groupSize: number; // quantization group; 0 for fp16
  tokenizer: TokenizerKind;
  nLayers: number; // distinct layers applied in order each step (loop); 1 = the weight-shared block
  normLayout: NormLayout;
  stepNorm: boolean; // norm.weight applied after every step; the head then norms no further
  exitThreshold: number | null; // the exit gate's default threshold (metadata exit_threshold); null: fixed depth
  /** Recurrent depth (docs/model-format.md): layers run once before and after the core, how each step's input is made. */
  nPrelude: number;
  nCoda: number;
  injection: Injection;
  embedScale: number; // the embedding's factor (1: none)
  stateStd: number; // the first step's state with an adapter (0: zeros)
  midNorm: boolean; // norm.weight on the core's output before the coda
  ropeLayout: RopeLayout;
  qkBias: boolean; // wq.bias / wk.bias in every layer
  exitGate: boolean; // exit_gate.weight / exit_gate.bias present
  tiedOutput: boolean; // true when output.weight is absent and tok_embeddings is reused
  headQuant: HeadQuant; // the output head's format (fp16 also when tied)
  embeddingFromHead: boolean; // true when tok_embeddings.weight is absent: token t's embedding is the quantized head's row t
  headGroupSize: number; // its quantization group; 0 for an fp16 head
  quantMix: QuantMix; // block matrices in another format than `quant` (metadata quant_mix); {} when none
}

/** What the metadata alone fixes: the config but for the output head, which the tensors decide. */
export type ModelShape = Omit<ModelConfig, "tiedOutput" | "headQuant" | "headGroupSize" | "embeddingFromHead" | "exitGate">;

/** The recurrent-depth fields of a model without any (every stack before them). */
export const NO_RECURRENCE = {
  nPrelude: 0,
  nCoda: 0,
  injection: "none",
  embedScale: 1,
  stateStd: 0,
  midNorm: false,
  ropeLayout: "half",
  qkBias: false,
} as const;
export type RecurrenceFields = keyof typeof NO_RECURRENCE;

/** The shape fields of a single-block GPT-2 model (format version 1), for writers that build one. */
export const SINGLE_BLOCK = { nLayers: 1, normLayout: "pre", stepNorm: false, exitThreshold: null, tokenizer: TOKENIZER, ...NO_RECURRENCE } as const;

/** Whether a model uses any recurrent-depth field (docs/model-format.md, "recurrent depth"). */
export function isRecurrent(c: Pick<ModelShape, RecurrenceFields> & { headDim?: number; dim?: number; nHeads?: number }): boolean {
  return (
    c.nPrelude > 0 ||
    c.nCoda > 0 ||
    c.injection !== "none" ||
    c.embedScale !== 1 ||
    c.stateStd !== 0 ||
    c.midNorm ||
    c.ropeLayout !== "half" ||
    c.qkBias ||
    (c.headDim !== undefined && c.dim !== undefined && c.nHeads !== undefined && c.headDim * c.nHeads !== c.dim)
  );
}

/** The format revision a model needs: 2 when it uses anything version 1 lacks. */
export function formatVersionOf(
  c: Pick<ModelShape, "nLayers" | "normLayout" | "stepNorm" | "exitThreshold" | "tokenizer" | RecurrenceFields> & { headDim?: number; dim?: number; nHeads?: number },
  exitGate = false,
): FormatVersion {
  return c.nLayers !== 1 || c.normLayout !== "pre" || c.stepNorm || c.exitThreshold !== null || c.tokenizer !== "gpt2" || exitGate || isRecurrent(c) ? 2 : 1;
}

/** Where core layer i's tensors are named: "block." in a one-layer core, "layers.<i>." otherwise. */
export function layerPrefix(c: Pick<ModelShape, "nLayers">, i: number): string {
  return c.nLayers === 1 ? "block." : `layers.${i}.`;
}

/** Every layer's prefix, in the kernels' descriptor order: the core's, the prelude's ("prelude.<i>."), the coda's ("coda.<i>."). */
export function allLayerPrefixes(c: Pick<ModelShape, "nLayers" | "nPrelude" | "nCoda">): string[] {
  return [
    ...Array.from({ length: c.nLayers }, (_, i) => layerPrefix(c, i)),
    ...Array.from({ length: c.nPrelude }, (_, i) => `prelude.${i}.`),
    ...Array.from({ length: c.nCoda }, (_, i) => `coda.${i}.`),
  ];
}

/** Metadata as the writer stores it; every value a string (the format requires it). */
export function configToMetadata(c: ModelShape): Record<string, string> {
  return {
    format: FORMAT_NAME,
    format_version: String(c.formatVersion),
    ...(c.nLayers !== 1 ? { n_layers: String(c.nLayers) } : {}),
    ...(c.normLayout !== "pre" ? { norm_layout: c.normLayout } : {}),
    ...(c.stepNorm ? { step_norm: "1" } : {}),
    ...(c.exitThreshold !== null ? { exit_threshold: String(c.exitThreshold) } : {}),
    ...recurrenceMetadata(c),
    arch: c.arch,
    dim: String(c.dim),
    n_heads: String(c.nHeads),
    n_kv_heads: String(c.nKvHeads),
    ffn_dim: String(c.ffnDim),
    vocab_size: String(c.vocabSize),
    default_loops: String(c.defaultLoops),
    max_seq_len: String(c.maxSeqLen),
    rope_theta: String(c.ropeTheta),
    norm_eps: String(c.normEps),
    quant: c.quant,
    group_size: String(c.groupSize),
    tokenizer: c.tokenizer,
    ...(Object.keys(c.quantMix).length > 0 ? { quant_mix: formatQuantMix(c.quantMix) } : {}),
  };
}

/** The recurrent-depth metadata keys of a model (only those differing from a model without them). */
function recurrenceMetadata(c: ModelShape): Record<string, string> {
  const m: Record<string, string> = {};
  if (c.headDim * c.nHeads !== c.dim) m.head_dim = String(c.headDim);
  if (c.nPrelude > 0) m.n_prelude = String(c.nPrelude);
  if (c.nCoda > 0) m.n_coda = String(c.nCoda);
  if (c.injection !== "none") m.injection = c.injection;
  if (c.embedScale !== 1) m.embed_scale = String(c.embedScale);
  if (c.stateStd !== 0) m.state_std = String(c.stateStd);
  if (c.midNorm) m.mid_norm = "1";
  if (c.ropeLayout !== "half") m.rope_layout = c.ropeLayout;
  if (c.qkBias) m.qk_bias = "1";
  return m;
}

/** One layer's norms (with sandwich norms of either kind, four), as named after the layer's prefix. */
export function layerNorms(c: Pick<ModelShape, "normLayout">): string[] {
  return c.normLayout !== "pre" ? ["attn_norm", "attn_out_norm", "ffn_norm", "ffn_out_norm"] : ["attn_norm", "ffn_norm"];
}

/** A layer's fp16 tensors besides its matrices: its norms and, with qk_bias, the q and k biases. */
export function layerVectorShapes(c: ModelShape, prefix: string): [string, number[]][] {
  const out: [string, number[]][] = layerNorms(c).map((n) => [`${prefix}${n}.weight`, [c.dim]]);
  if (c.qkBias) out.push([`${prefix}wq.bias`, [c.nHeads * c.headDim]], [`${prefix}wk.bias`, [c.nKvHeads * c.headDim]]);
  return out;
}

/** Every fp16 tensor of a model and its shape, layer by layer. `output.weight` is optional; the exit gate's two are listed when exitGate. */
export function expectedTensorShapes(c: ModelShape, exitGate = false): [string, number[]][] {
  const shapes = matrixShapes(c);
  const out: [string, number[]][] = [["tok_embeddings.weight", [c.vocabSize, c.dim]]];
  const sandwich = c.normLayout !== "pre";
  for (const p of allLayerPrefixes(c)) {
    const norm = (n: string): [string, number[]] => [`${p}${n}.weight`, [c.dim]];
    const mat = (m: QuantMatrixName): [string, number[]] => [`${p}${m}.weight`, shapes[m]];
    out.push(norm("attn_norm"), mat("wq"), mat("wk"), mat("wv"), mat("wo"));
    if (sandwich) out.push(norm("attn_out_norm"));
    out.push(norm("ffn_norm"), mat("w1"), mat("w2"), mat("w3"));
    if (sandwich) out.push(norm("ffn_out_norm"));
    if (c.qkBias) out.push([`${p}wq.bias`, [c.nHeads * c.headDim]], [`${p}wk.bias`, [c.nKvHeads * c.headDim]]);
  }
  if (c.injection === "adapter") out.push(["adapter.weight", [c.dim, 2 * c.dim]]);
  out.push(["norm.weight", [c.dim]]);
  if (exitGate) out.push(["exit_gate.weight", [1, c.dim]], ["exit_gate.bias", [1]]);
  out.push(["output.weight", [c.vocabSize, c.dim]]);
  return out;
}

/** Weights as fp16 bit patterns, row-major [out, in]. */
export interface ModelWeights {
  tokEmbeddings: Uint16Array; // (vocab_size, dim)
  attnNorm: Uint16Array; // (dim)
  wq: Uint16Array; // (n_heads * head_dim, dim)
  wk: Uint16Array; // (n_kv_heads * head_dim, dim)
  wv: Uint16Array; // (n_kv_heads * head_dim, dim)
  wo: Uint16Array; // (dim, n_heads * head_dim)
  ffnNorm: Uint16Array; // (dim)
  w1: Uint16Array; // (ffn_dim, dim) gate
  w2: Uint16Array; // (dim, ffn_dim) down
  w3: Uint16Array; // (ffn_dim, dim) up
  norm: Uint16Array; // (dim)
  output: Uint16Array; // (vocab_size, dim); the same array as tokEmbeddings when tied
}

/**
 * A quantized matrix [rows, cols] (packing: kernels/loopserve.h). Groups of
 * `groupSize` consecutive inputs of a row share one fp16 scale (and, int2,
 * one fp16 offset):
 * - bits 4 (int4): code c in [-8, 7], stored as the nibble c + 8, two per
 *   byte, input 2j in the low nibble of byte j; value = scale * c.
 * - bits 2 (int2): code c in 0..3, four per byte, input 4j + k in bits
 *   2k..2k+1 of byte j; value = scale * c + zero.
 * - bits 8 (int8, output head only): one signed byte per input; value = scale * c.
 * - bits 6 (int6, output head only): code c in [-32, 31] as u = c + 32, the
 *   low four bits as int4's nibbles, then the high two bits in 16-byte
 *   blocks per 64 inputs (kernels/loopserve.h); value = scale * c.
 */
export interface QuantMatrix {
  bits: 2 | 4 | 6 | 8;
  rows: number;
  cols: number;
  groupSize: number;
  qweight: Uint8Array; // (rows, cols * bits / 8)
  scales: Uint16Array; // (rows, cols / groupSize) fp16 bits
  zeros?: Uint16Array; // (rows, cols / groupSize) fp16 bits, int2 only
}

/** The quantized block matrices, as named in the file ("block.wq", ...). */
export const QUANT_MATRICES = ["wq", "wk", "wv", "wo", "w1", "w2", "w3"] as const;
export type QuantMatrixName = (typeof QUANT_MATRICES)[number];

/** A block matrix's format in a quantized model, and its bits per code. */
export type BlockQuant = "int4" | "int2";
export const BLOCK_BITS = { int4: 4, int2: 2 } as const;
/** Block matrices stored in the other block format than the model's `quant` (metadata `quant_mix`). */
export type QuantMix = Partial<Record<QuantMatrixName, BlockQuant>>;

/** The format of block matrix m: the model's quant unless quant_mix names another. */
export function matrixQuant(c: Pick<ModelShape, "quant" | "quantMix">, m: QuantMatrixName): Quant {
  return c.quant === "fp16" ? "fp16" : (c.quantMix[m] ?? c.quant);
}

/** Bits per code of block matrix m (kernels/loopserve.h block_bits): 4 or 2, 0 in an fp16 model. */
export function matrixBits(c: Pick<ModelShape, "quant" | "quantMix">, m: QuantMatrixName): 0 | 2 | 4 {
  const q = matrixQuant(c, m);
  return q === "fp16" ? 0 : BLOCK_BITS[q];
}

/** ", with wv=int4,..." for a model mixing block formats, else "" (for messages). */
export function quantMixNote(mix: QuantMix): string {
  return Object.keys(mix).length > 0 ? `, with ${formatQuantMix(mix)}` : "";
}

/** quant_mix as written: "name=format" for each matrix of the mix, in block order. */
export function formatQuantMix(mix: QuantMix): string {
  return QUANT_MATRICES.filter((m) => mix[m] !== undefined).map((m) => `${m}=${mix[m]}`).join(",");
}

/**
 * Parses a quant_mix list ("wv=int4,wo=int4,w2=int4") for a model of format
 * `quant`: the matrices whose format differs from it (entries naming quant
 * itself change nothing). w1 and w3 run as one job, so they share a format.
 * Throws a message (without the file's name) when the list is not one.
 */
export function parseQuantMix(text: string, quant: Quant): QuantMix {
  const mix: QuantMix = {};
  if (text.trim() === "") return mix;
  if (quant === "fp16") throw new Error(`quant_mix "${text}" needs an int4 or int2 model (quant is fp16)`);
  const seen = new Set<string>();
  for (const entry of text.split(",")) {
    const m = /^\s*(\w+)\s*=\s*(\w+)\s*$/.exec(entry);
    if (!m) throw new Error(`quant_mix entry "${entry}" is not name=format (e.g. wv=int4)`);
    const [, name, format] = m;
    if (!(QUANT_MATRICES as readonly string[]).includes(name)) {
      throw new Error(`quant_mix names "${name}", which is not a block matrix (${QUANT_MATRICES.join(", ")})`);
    }
    if (format !== "int4" && format !== "int2") throw new Error(`quant_mix gives ${name} the format "${format}": int4 or int2`);
    if (seen.has(name)) throw new Error(`quant_mix names ${name} twice`);
    seen.add(name);
    if (format !== quant) mix[name as QuantMatrixName] = format;
  }
  if (matrixQuant({ quant, quantMix: mix }, "w1") !== matrixQuant({ quant, quantMix: mix }, "w3")) {
    throw new Error(`quant_mix must give w1 and w3 the same format (the gate and up matrices run as one)`);
  }
  return mix;
}

/** [rows, cols] of each block matrix and of the output head. */
export function matrixShapes(c: ModelShape): Record<QuantMatrixName | "output", [number, number]> {
  const q = c.nHeads * c.headDim;
  const kv = c.nKvHeads * c.headDim;
  return {
    wq: [q, c.dim],
    wk: [kv, c.dim],
    wv: [kv, c.dim],
    wo: [c.dim, q],
    w1: [c.ffnDim, c.dim],
    w2: [c.dim, c.ffnDim],
    w3: [c.ffnDim, c.dim],
    output: [c.vocabSize, c.dim],
  };
}

/** Tensors holding one quantized matrix `base` ("block.wq", "output"): name, dtype, shape. */
export function quantTensorShapes(base: string, bits: QuantMatrix["bits"], rows: number, cols: number, groupSize: number): [string, "U8" | "I8" | "F16", number[]][] {
  const out: [string, "U8" | "I8" | "F16", number[]][] = [
    [`${base}.qweight`, bits === 8 ? "I8" : "U8", [rows, (cols * bits) / 8]],
    [`${base}.scales`, "F16", [rows, cols / groupSize]],
  ];
  if (bits === 2) out.push([`${base}.zeros`, "F16", [rows, cols / groupSize]]);
  return out;
}

/** Weights of a quantized (int4 / int2) model. */
export interface QuantModelWeights {
  /** (vocab_size, dim) fp16: rows are gathered, never multiplied; or the quantized head itself (embeddingFromHead). */
  tokEmbeddings: Uint16Array | QuantMatrix;
  attnNorm: Uint16Array; // (dim)
  ffnNorm: Uint16Array; // (dim)
  norm: Uint16Array; // (dim)
  block: Record<QuantMatrixName, QuantMatrix>; // the block's matrices, in the model's format
  /** (vocab_size, dim): quantized, fp16 (its own tensor), or tokEmbeddings itself when tied. */
  output: QuantMatrix | Uint16Array;
}

export interface LoadedQuantModel {
  path: string;
  config: ModelConfig;
  tensors: Map<string, TensorView>;
  weights: QuantModelWeights;
}

export interface LoadedModel {
  path: string;
  config: ModelConfig;
  /** Every tensor of the file, as mapped. */
  tensors: Map<string, TensorView>;
  /** fp16 weights (views into the mapping when aligned, which this writer guarantees). */
  weights: ModelWeights;
}

// ---- metadata parsing ----

const INT_RE = /^(0|[1-9][0-9]*)$/;
const FLOAT_RE = /^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$/;

type Meta = Record<string, string>;

function need(meta: Meta, key: string, where: string): string {
  const v = meta[key];
  if (v === undefined) throw ModelFormatError.about(where, `metadata: missing required key "${key}"`);
  return v;
}

function parseInt32(meta: Meta, key: string, where: string, min: number, max: number): number {
  const s = need(meta, key, where);
  if (!INT_RE.test(s)) {
    throw ModelFormatError.about(where, `metadata: ${key} must be a decimal integer, got "${s}"`);
  }
  const n = Number(s);
  if (n < min || n > max) {
    throw ModelFormatError.about(where, `metadata: ${key} must be in [${min}, ${max}], got ${s}`);
  }
  return n;
}

/** A positive number below `max`, also once rounded to fp32 (what the kernels compute with). */
function parsePositiveFloat(meta: Meta, key: string, where: string, max: number): number {
  const s = need(meta, key, where);
  const n = Number(s);
  const f = Math.fround(n);
  if (!FLOAT_RE.test(s) || !(f > 0 && n < max && f < max)) {
    throw ModelFormatError.about(where, `metadata: ${key} must be a positive finite number below ${max}, got "${s}"`);
  }
  return n;
}

/** A reader's own names for the attention's shape fields, which its refusals use. */
export type AttentionFieldNames = Record<"dim" | "nHeads" | "nKvHeads" | "headDim", string>;

const METADATA_ATTENTION_NAMES: AttentionFieldNames = { dim: "dim", nHeads: "n_heads", nKvHeads: "n_kv_heads", headDim: "head_dim" };

/**
 * The attention's shape (head_dim and the heads' relations), checked here
 * for every reader of one (model files, Hugging Face configs, synthetic
 * models), each refusal in the reader's own field names: head_dim as given,
 * else dim / n_heads, which must then divide; even, since RoPE rotates
 * pairs; n_heads x head_dim within LS_MAX_DIM; n_heads a multiple of
 * n_kv_heads, since each key/value head serves a whole group. Returns
 * head_dim, or why the shape is refused.
 */
export function attentionHeadDim(
  dim: number,
  nHeads: number,
  nKvHeads: number,
  headDim: number | undefined,
  names: AttentionFieldNames,
): number | string {
  if (headDim === undefined && dim % nHeads !== 0) return `${names.dim} (${dim}) must be a multiple of ${names.nHeads} (${nHeads})`;
  const hd = headDim ?? dim / nHeads;
  if (hd % 2 !== 0) {
    const which = headDim === undefined ? `head_dim = ${names.dim} / ${names.nHeads} = ${hd}` : `${names.headDim} (${hd})`;
    return `${which} must be even (RoPE rotates pairs)`;
  }
  if (nHeads * hd > LS_MAX_DIM) return `${names.nHeads} x ${names.headDim} (${nHeads * hd}) must be at most ${LS_MAX_DIM}`;
  if (nKvHeads > nHeads || nHeads % nKvHeads !== 0) return `${names.nHeads} (${nHeads}) must be a multiple of ${names.nKvHeads} (${nKvHeads})`;
  return hd;
}

/**
 * A model's default early-exit threshold (docs/early-exit.md), checked here
 * for every reader of one (model files, Hugging Face configs, synthetic
 * models): in (0, 1], and only beside an exit gate. Returns why it is
 * refused, to follow the setting's name, or null.
 */
export function exitThresholdRefusal(threshold: number, exitGate: boolean): string | null {
  if (!(Number.isFinite(threshold) && threshold > 0 && threshold <= 1)) return `must be in (0, 1], got ${threshold}`;
  return exitGate ? null : "given, but the model has no exit gate (exit_gate.weight, exit_gate.bias)";
}

function expectString(meta: Meta, key: string, expected: string, where: string): void {
  const s = need(meta, key, where);
  if (s !== expected) throw ModelFormatError.about(where, `metadata: ${key} must be "${expected}", got "${s}"`);
}

/** A "0" / "1" metadata flag (absent: false). */
function parseFlag(meta: Meta, key: string, where: string): boolean {
  const v = meta[key] ?? "0";
  if (v !== "0" && v !== "1") throw ModelFormatError.about(where, `metadata: ${key} must be "0" or "1", got "${v}"`);
  return v === "1";
}

/** A finite number >= 0 (metadata), also once rounded to fp32; `dflt` when absent. */
function parseNonNegativeFloat(meta: Meta, key: string, where: string, dflt: number): number {
  const s = meta[key];
  if (s === undefined) return dflt;
  const n = Number(s);
  if (!FLOAT_RE.test(s) || !(n >= 0 && Number.isFinite(Math.fround(n)))) {
    throw ModelFormatError.about(where, `metadata: ${key} must be a finite number >= 0, got "${s}"`);
  }
  return n;
}

/** The recurrent-depth keys (docs/model-format.md); absent ones read as a model without them. */
function parseRecurrence(meta: Meta, where: string, nLayers: number): Pick<ModelShape, RecurrenceFields> {
  const bad = (msg: string): never => {
    throw ModelFormatError.about(where, `metadata: ${msg}`);
  };
  const nPrelude = meta.n_prelude === undefined ? 0 : parseInt32(meta, "n_prelude", where, ...SETTING_RANGES.outerLayers);
  const nCoda = meta.n_coda === undefined ? 0 : parseInt32(meta, "n_coda", where, ...SETTING_RANGES.outerLayers);
  if (nLayers + nPrelude + nCoda > LS_MAX_LAYERS) bad(`n_layers + n_prelude + n_coda (${nLayers + nPrelude + nCoda}) must be at most ${LS_MAX_LAYERS}`);
  const injection = meta.injection ?? "none";
  if (injection !== "none" && injection !== "adapter") bad(`injection must be "none" or "adapter", got "${injection}"`);
  const ropeLayout = meta.rope_layout ?? "half";
  if (ropeLayout !== "half" && ropeLayout !== "interleaved") bad(`rope_layout must be "half" or "interleaved", got "${ropeLayout}"`);
  const embedScale = meta.embed_scale === undefined ? 1 : parsePositiveFloat(meta, "embed_scale", where, 3e38);
  const stateStd = parseNonNegativeFloat(meta, "state_std", where, 0);
  if (stateStd !== 0 && injection !== "adapter") bad(`state_std needs injection "adapter" (the first step's state is the adapter's)`);
  const midNorm = parseFlag(meta, "mid_norm", where);
  if (midNorm && nCoda === 0) bad(`mid_norm needs a coda (n_coda > 0): it norms the core's output before it`);
  return {
    nPrelude,
    nCoda,
    injection: injection as Injection,
    embedScale,
    stateStd,
    midNorm,
    ropeLayout: ropeLayout as RopeLayout,
    qkBias: parseFlag(meta, "qk_bias", where),
  };
}

/**
 * Validates the metadata of a loopserve file (values and their consistency)
 * and returns the config, without looking at tensors.
 */
export function parseModelMetadata(meta: Meta, where: string): ModelShape {
  expectString(meta, "format", FORMAT_NAME, where);
  const version = need(meta, "format_version", where);
  if (!FORMAT_VERSIONS.map(String).includes(version)) {
    throw ModelFormatError.about(where, `metadata: format_version must be one of ${FORMAT_VERSIONS.join(", ")}, got "${version}"`);
  }
  const formatVersion = Number(version) as FormatVersion;
  expectString(meta, "arch", ARCH, where);
  const tokenizer = need(meta, "tokenizer", where);
  if (tokenizer !== "gpt2" && tokenizer !== "bpe") {
    throw ModelFormatError.about(where, `metadata: tokenizer must be "gpt2" or "bpe", got "${tokenizer}"`);
  }
  if (tokenizer === "bpe" && !meta.tokenizer_json) {
    throw ModelFormatError.about(where, `metadata: tokenizer "bpe" needs tokenizer_json (the tokenizer.json text)`);
  }
  const nLayers = meta.n_layers === undefined ? 1 : parseInt32(meta, "n_layers", where, ...SETTING_RANGES.nLayers);
  const normLayout = (meta.norm_layout ?? "pre") as NormLayout;
  if (!NORM_LAYOUTS.includes(normLayout)) {
    throw ModelFormatError.about(where, `metadata: norm_layout must be one of ${NORM_LAYOUTS.join(", ")}, got "${normLayout}"`);
  }
  const stepNorm = meta.step_norm ?? "0";
  if (stepNorm !== "0" && stepNorm !== "1") throw ModelFormatError.about(where, `metadata: step_norm must be "0" or "1", got "${stepNorm}"`);
  let exitThreshold: number | null = null;
  if (meta.exit_threshold !== undefined) {
    exitThreshold = parsePositiveFloat(meta, "exit_threshold", where, 2);
    // The gate is judged with the tensors (validateModel).
    const refused = exitThresholdRefusal(exitThreshold, true);
    if (refused) throw ModelFormatError.about(where, `metadata: exit_threshold ${refused}`);
  }
  const recurrence = parseRecurrence(meta, where, nLayers);
  const stack = { nLayers, normLayout, stepNorm: stepNorm === "1", exitThreshold, tokenizer, ...recurrence } as const;
  if (formatVersion === 1 && (formatVersionOf(stack) !== 1 || meta.head_dim !== undefined)) {
    throw ModelFormatError.about(
      where,
      `metadata: format_version 1 cannot carry n_layers, norm_layout, step_norm, exit_threshold, the recurrent-depth keys or a tokenizer other than gpt2 (format_version 2 can)`,
    );
  }
  const dim = parseInt32(meta, "dim", where, ...SETTING_RANGES.dim);
  const nHeads = parseInt32(meta, "n_heads", where, ...SETTING_RANGES.nHeads);
  const nKvHeads = parseInt32(meta, "n_kv_heads", where, ...SETTING_RANGES.nKvHeads);
  const ffnDim = parseInt32(meta, "ffn_dim", where, ...SETTING_RANGES.ffnDim);
  const vocabSize = parseInt32(meta, "vocab_size", where, ...SETTING_RANGES.vocabSize);
  const defaultLoops = parseInt32(meta, "default_loops", where, ...SETTING_RANGES.loops);
  const maxSeqLen = parseInt32(meta, "max_seq_len", where, ...SETTING_RANGES.maxSeqLen);
  const ropeTheta = parsePositiveFloat(meta, "rope_theta", where, LS_MAX_ROPE_THETA);
  const normEps = parsePositiveFloat(meta, "norm_eps", where, LS_MAX_NORM_EPS);
  const quant = need(meta, "quant", where);
  if (quant !== "fp16" && quant !== "int4" && quant !== "int2") {
    throw ModelFormatError.about(where, `metadata: quant must be one of fp16, int4, int2, got "${quant}"`);
  }
  const groupSize = parseInt32(meta, "group_size", where, quant === "fp16" ? 0 : 1, LS_MAX_DIM);

  const bad = (msg: string): never => {
    throw ModelFormatError.about(where, `metadata: ${msg}`);
  };
  if (quant !== "fp16" && !GROUP_SIZES.includes(groupSize)) {
    bad(`group_size must be one of ${GROUP_SIZES.join(", ")} for quant ${quant}, got ${groupSize}`);
  }
  const statedHeadDim = meta.head_dim === undefined ? undefined : parseInt32(meta, "head_dim", where, ...SETTING_RANGES.headDim);
  const attention = attentionHeadDim(dim, nHeads, nKvHeads, statedHeadDim, METADATA_ATTENTION_NAMES);
  const headDim = typeof attention === "string" ? bad(attention) : attention;
  if (quant !== "fp16") {
    // Groups run along each matrix's inputs: dim (wq, wk, wv, w1, w3, output), the attention's width (wo), ffn_dim (w2).
    if (dim % groupSize !== 0) bad(`dim (${dim}) must be a multiple of group_size (${groupSize}) for quant ${quant}`);
    if (ffnDim % groupSize !== 0) {
      bad(`ffn_dim (${ffnDim}) must be a multiple of group_size (${groupSize}) for quant ${quant}`);
    }
    if ((nHeads * headDim) % groupSize !== 0) {
      bad(`n_heads x head_dim (${nHeads * headDim}) must be a multiple of group_size (${groupSize}) for quant ${quant}`);
    }
  }
  let quantMix: QuantMix = {};
  try {
    quantMix = parseQuantMix(meta.quant_mix ?? "", quant);
  } catch (e) {
    bad((e as Error).message);
  }
  return {
    arch: ARCH,
    formatVersion,
    ...stack,
    dim,
    nHeads,
    nKvHeads,
    headDim,
    ffnDim,
    vocabSize,
    defaultLoops,
    maxSeqLen,
    ropeTheta,
    normEps,
    quant,
    groupSize: quant === "fp16" ? 0 : groupSize, // fp16 has no groups, whatever the writer recorded
    quantMix,
  };
}

// ---- tensors ----

function shapeStr(s: number[]): string {
  return `[${s.join(", ")}]`;
}

/** The model tensor `name`: present, of `dtype` and `shape`, and aligned to its element size (the kernels read it in place). */
function checkTensor(file: SafetensorsFile, name: string, shape: number[], dtype: Dtype = "F16"): TensorView {
  const where = file.path;
  const t = file.tensors.get(name);
  if (t === undefined) throw ModelFormatError.about(where, `missing tensor "${name}" (${dtype} ${shapeStr(shape)})`);
  if (t.dtype !== dtype) {
    throw ModelFormatError.about(where, `tensor "${name}": dtype must be ${dtype}, got ${t.dtype}`);
  }
  if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
    throw ModelFormatError.about(where, `tensor "${name}": shape must be ${shapeStr(shape)}, got ${shapeStr(t.shape)}`);
  }
  const size = DTYPE_SIZES[dtype];
  if (t.offset % size !== 0) {
    throw ModelFormatError.about(where, `tensor "${name}": data at file offset ${t.offset} is not ${size}-byte aligned for ${dtype}`);
  }
  return t;
}

/** fp16 view of a tensor: zero-copy when 2-byte aligned, else a copy. */
export function asF16(t: TensorView): Uint16Array {
  const { data } = t;
  if (data.byteOffset % 2 === 0) return new Uint16Array(data.buffer, data.byteOffset, data.byteLength / 2);
  return new Uint16Array(data.slice().buffer);
}

/** A file judged as a loopserve model. */
export interface ValidatedModel {
  config: ModelConfig;
  /** The tensors the model consists of (a file may hold others, which are ignored), in file order. */
  tensors: Map<string, TensorView>;
}

/**
 * The output head's format: metadata `output_quant` (fp16, int8, int6,
 * int4; absent: int8 when output.qweight is present, else fp16) and, for a
 * quantized head, `output_group_size` (default: the block's group_size;
 * required in an fp16 model). Its tensors are checked by validateModel.
 */
function parseHead(file: SafetensorsFile, base: ModelShape): Pick<ModelConfig, "headQuant" | "headGroupSize"> {
  const where = file.path;
  const meta = file.metadata;
  const bad = (msg: string): never => {
    throw ModelFormatError.about(where, `metadata: ${msg}`);
  };
  const stated = meta.output_quant;
  if (stated !== undefined && !(HEAD_QUANTS as readonly string[]).includes(stated)) {
    bad(`output_quant must be one of ${HEAD_QUANTS.join(", ")}, got "${stated}"`);
  }
  const headQuant = (stated ?? (file.tensors.has("output.qweight") ? "int8" : "fp16")) as HeadQuant;
  if (headQuant === "fp16") return { headQuant, headGroupSize: 0 };
  if (meta.output_group_size === undefined && base.groupSize === 0) {
    bad(`output_group_size is required for a ${headQuant} output head in an fp16 model`);
  }
  const headGroupSize = meta.output_group_size === undefined ? base.groupSize : parseInt32(meta, "output_group_size", where, 1, LS_MAX_DIM);
  if (!GROUP_SIZES.includes(headGroupSize)) bad(`output_group_size must be one of ${GROUP_SIZES.join(", ")}, got ${headGroupSize}`);
  if (base.dim % headGroupSize !== 0) bad(`dim (${base.dim}) must be a multiple of output_group_size (${headGroupSize})`);
  if (headQuant === "int6" && base.dim % 64 !== 0) bad(`dim (${base.dim}) must be a multiple of 64 for an int6 output head`);
  return { headQuant, headGroupSize };
}

/**
 * Validates a parsed safetensors file as a loopserve model (the rules of
 * docs/model-format.md): the metadata, then every tensor of its weight
 * format. fp16: the fp16 matrices. int4 / int2: fp16 norms;
 * block.X.qweight (U8), block.X.scales (F16) and, for an int2 matrix,
 * block.X.zeros (F16) for each block matrix in its own format (quant, or
 * quant_mix's), with no block.X.weight beside them. Either
 * kind: the output head as parseHead names it: output.weight (F16) or
 * neither head tensor (tied) for an fp16 head; output.qweight +
 * output.scales for a quantized one; tok_embeddings.weight (F16), which
 * beside a quantized head may be absent (the head's rows then serve as
 * the embedding).
 */
export function validateModel(file: SafetensorsFile): ValidatedModel {
  const where = file.path;
  const base = parseModelMetadata(file.metadata, where);
  const head = parseHead(file, base);
  const used = new Set<string>();
  const check = (name: string, shape: number[], dtype: Dtype = "F16") => {
    checkTensor(file, name, shape, dtype);
    used.add(name);
  };
  if (head.headQuant === "fp16" && file.tensors.has("output.qweight")) {
    throw ModelFormatError.about(where, `tensor "output.qweight" present, but metadata output_quant is fp16`);
  }
  if (head.headQuant !== "fp16" && file.tensors.has("output.weight")) {
    throw ModelFormatError.about(
      where,
      `tensors "output.weight" and "output.qweight" both present: the output head is either fp16 or quantized (output_quant ${head.headQuant})`,
    );
  }
  const tiedOutput = head.headQuant === "fp16" && !file.tensors.has("output.weight");
  // A quantized head may stand in for the embedding too: one copy of a tied model's matrix.
  const embeddingFromHead = head.headQuant !== "fp16" && !file.tensors.has("tok_embeddings.weight");
  const exitGate = file.tensors.has("exit_gate.weight") || file.tensors.has("exit_gate.bias");
  if (exitGate && base.formatVersion === 1) {
    throw ModelFormatError.about(where, `tensor "exit_gate.weight": an exit gate needs format_version 2`);
  }
  const refused = base.exitThreshold === null ? null : exitThresholdRefusal(base.exitThreshold, exitGate);
  if (refused) throw ModelFormatError.about(where, `metadata: exit_threshold ${refused}`);
  if (!embeddingFromHead) check("tok_embeddings.weight", [base.vocabSize, base.dim]);
  // Layer tensors the metadata does not account for mean a mislabelled file: named, not ignored.
  const counts = { layers: base.nLayers, prelude: base.nPrelude, coda: base.nCoda } as const;
  const stray = [...file.tensors.keys()].find((n) => {
    const layer = /^(layers|prelude|coda)\.(\d+)\./.exec(n);
    if (layer !== null && Number(layer[2]) >= counts[layer[1] as keyof typeof counts]) return true;
    return base.nLayers === 1 ? layer?.[1] === "layers" : n.startsWith("block.");
  });
  if (stray !== undefined) {
    const expected = base.nLayers === 1 ? `block.*` : `layers.0.* .. layers.${base.nLayers - 1}.*`;
    const fixed = `, ${base.nPrelude} prelude and ${base.nCoda} coda layers`;
    throw ModelFormatError.about(where, `tensor "${stray}" does not belong in a ${base.nLayers}-layer model (n_layers ${base.nLayers}: ${expected}${fixed})`);
  }
  if (base.injection === "adapter") check("adapter.weight", [base.dim, 2 * base.dim]);
  const shapes = matrixShapes(base);
  for (const p of allLayerPrefixes(base)) {
    for (const [name, shape] of layerVectorShapes(base, p)) check(name, shape);
    for (const m of QUANT_MATRICES) {
      const name = `${p}${m}`;
      const [rows, cols] = shapes[m];
      if (base.quant === "fp16") {
        check(`${name}.weight`, [rows, cols]);
        continue;
      }
      if (file.tensors.has(`${name}.weight`)) {
        throw ModelFormatError.about(
          where,
          `tensor "${name}.weight" present in an ${base.quant} model: expected "${name}.qweight" and "${name}.scales" instead`,
        );
      }
      for (const [t, dtype, shape] of quantTensorShapes(name, matrixBits(base, m) as QuantMatrix["bits"], rows, cols, base.groupSize)) check(t, shape, dtype);
    }
  }
  check("norm.weight", [base.dim]);
  if (exitGate) {
    check("exit_gate.weight", [1, base.dim]);
    check("exit_gate.bias", [1]);
  }
  if (head.headQuant !== "fp16") {
    const shapes = quantTensorShapes("output", HEAD_BITS[head.headQuant], base.vocabSize, base.dim, head.headGroupSize);
    for (const [t, dtype, shape] of shapes) check(t, shape, dtype);
  } else if (!tiedOutput) {
    check("output.weight", [base.vocabSize, base.dim]);
  }
  return { config: { ...base, tiedOutput, ...head, embeddingFromHead, exitGate }, tensors: modelTensors(file, used) };
}

function modelTensors(file: SafetensorsFile, names: Set<string>): Map<string, TensorView> {
  return new Map([...file.tensors].filter(([name]) => names.has(name)));
}

/** The config of a valid loopserve model file (validateModel). */
export function parseModelConfig(file: SafetensorsFile): ModelConfig {
  return validateModel(file).config;
}

/** A stacked model (format version 2's layers, norms, gate or recurrent depth) refused by a reader of single-block weights. */
function refuseStack(path: string, config: ModelConfig, reader: string): void {
  if (isRecurrent(config)) throw ModelFormatError.about(path, `${reader} reads single-block models; this one has a recurrent-depth layout`);
  if (config.nLayers === 1 && config.normLayout === "pre" && !config.stepNorm && !config.exitGate) return;
  throw ModelFormatError.about(path, `${reader} reads single-block models; this one has ${config.nLayers} layer(s)${config.normLayout === "sandwich" ? ", sandwich norms" : ""}${config.stepNorm ? ", a norm per step" : ""}${config.exitGate ? ", an exit gate" : ""}`);
}

/** Reads, maps and validates an fp16 loopserve model file of one block. */
export function loadModelFile(path: string): LoadedModel {
  const file = readSafetensors(path);
  const config = parseModelConfig(file);
  refuseStack(path, config, "the TypeScript loader of fp16 weights (loadModelFile)");
  if (config.quant !== "fp16") {
    throw ModelFormatError.about(
      path,
      `quant "${config.quant}" is not supported by the TypeScript loader of fp16 weights (loadModelFile); loadQuantModelFile reads it`,
    );
  }
  if (config.headQuant !== "fp16") {
    throw ModelFormatError.about(path, `an ${config.headQuant} output head is not supported by the TypeScript loader of fp16 weights (loadModelFile)`);
  }
  const get = (name: string) => asF16(file.tensors.get(name)!);
  const tokEmbeddings = get("tok_embeddings.weight");
  const weights: ModelWeights = {
    tokEmbeddings,
    attnNorm: get("block.attn_norm.weight"),
    wq: get("block.wq.weight"),
    wk: get("block.wk.weight"),
    wv: get("block.wv.weight"),
    wo: get("block.wo.weight"),
    ffnNorm: get("block.ffn_norm.weight"),
    w1: get("block.w1.weight"),
    w2: get("block.w2.weight"),
    w3: get("block.w3.weight"),
    norm: get("norm.weight"),
    output: config.tiedOutput ? tokEmbeddings : get("output.weight"),
  };
  return { path, config, tensors: file.tensors, weights };
}

/** An int4 / int2 matrix's tensors as a QuantMatrix (views into the mapping when aligned). */
function quantMatrixOf(file: SafetensorsFile, base: string, bits: QuantMatrix["bits"], rows: number, cols: number, groupSize: number): QuantMatrix {
  const t = (name: string) => file.tensors.get(name)!;
  return {
    bits,
    rows,
    cols,
    groupSize,
    qweight: t(`${base}.qweight`).data,
    scales: asF16(t(`${base}.scales`)),
    zeros: bits === 2 ? asF16(t(`${base}.zeros`)) : undefined,
  };
}

/** The quantized output head of a validated model (config.headQuant int8 / int6 / int4). */
export function quantizedHead(file: SafetensorsFile, config: ModelConfig): QuantMatrix {
  if (config.headQuant === "fp16") throw new Error("quantizedHead: the model's head is fp16");
  return quantMatrixOf(file, "output", HEAD_BITS[config.headQuant], config.vocabSize, config.dim, config.headGroupSize);
}

/** Reads, maps and validates an int4 / int2 loopserve model file of one block. */
export function loadQuantModelFile(path: string): LoadedQuantModel {
  const file = readSafetensors(path);
  const config = parseModelConfig(file);
  refuseStack(path, config, "the TypeScript loader of quantized weights (loadQuantModelFile)");
  if (config.quant === "fp16") {
    throw ModelFormatError.about(path, `quant "fp16": use loadModelFile for unquantized models`);
  }
  const shapes = matrixShapes(config);
  const get = (name: string) => asF16(file.tensors.get(name)!);
  const block = {} as Record<QuantMatrixName, QuantMatrix>;
  for (const m of QUANT_MATRICES) {
    block[m] = quantMatrixOf(file, `block.${m}`, matrixBits(config, m) as QuantMatrix["bits"], shapes[m][0], shapes[m][1], config.groupSize);
  }
  const head = config.headQuant !== "fp16" ? quantizedHead(file, config) : undefined;
  const tokEmbeddings = config.embeddingFromHead ? head! : get("tok_embeddings.weight");
  const output = head ?? (config.tiedOutput ? tokEmbeddings : get("output.weight"));
  const weights: QuantModelWeights = {
    tokEmbeddings,
    attnNorm: get("block.attn_norm.weight"),
    ffnNorm: get("block.ffn_norm.weight"),
    norm: get("norm.weight"),
    block,
    output,
  };
  return { path, config, tensors: file.tensors, weights };
}
