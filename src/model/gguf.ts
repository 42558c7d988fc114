// GGUF export: a loopserve model unrolled into a plain Llama GGUF, so the
// same function runs in llama.cpp-based tools (and is compared against them
// by bench/peer.ts).
//
// Unrolled, a model run at `loops = L` is a Llama model with L identical
// layers (docs/kernels.md). GGUF has no way to share tensor data: llama.cpp's
// reader (ggml/src/gguf.cpp) requires each tensor's offset to be exactly
// where the previous one ended (padded to the alignment), so aliased offsets
// are rejected and the block's bytes are written once per layer.
//
// GGUF v3 layout, little-endian:
//   "GGUF" u32 version=3, u64 n_tensors, u64 n_kv
//   n_kv x { string key, u32 value_type, value }
//   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
//   zero padding to `general.alignment` (32), then the data section, each
//   tensor padded to the alignment.
// A string is u64 length + UTF-8 bytes; an array is u32 element type, u64
// count, elements. ne[0] is the innermost (contiguous) dimension, so a
// PyTorch [out, in] matrix has ne = [in, out].
//
// RoPE: loopserve rotates the pairs (i, i + head_dim/2) as Hugging Face's
// Llama does; llama.cpp's llama architecture rotates adjacent pairs
// (2i, 2i + 1). llama.cpp's converter (convert_hf_to_gguf.py, `permute`)
// reorders each head's rows of Wq and Wk so that new row 2i + j is old row
// j * head_dim/2 + i; q·k is unchanged because q and k move together.
//
// Tokenizer: GPT-2's byte-level BPE from the bundled tiktoken ranks. Token
// strings are the bytes mapped through GPT-2's bytes_to_unicode table (what
// vocab.json holds), merges are derived from the ranks (each multi-byte
// token is the merge of the two parts BPE reaches using only lower ranks),
// exactly the list merges.txt holds.

import gpt2 from "tiktoken/encoders/gpt2.json" with { type: "json" };
import type { ProgressCallback } from "../progress.ts";
import { F16_TO_F32 } from "./fp16.ts";
import { asF16, layerPrefix, MAX_LOOPS, type ModelConfig, parseModelConfig, parseModelMetadata } from "./format.ts";
import { ModelFormatError, readSafetensors, type TensorView, writeFileAtomically } from "./safetensors.ts";
import { BYTE_CHARS } from "../tokenizer/byte_chars.ts";

// ---- GGUF constants ----

export const GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
export const GGUF_VERSION = 3;
export const GGUF_ALIGNMENT = 32;

/** gguf.h: enum gguf_type */
export const GgufType = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

/** ggml.h: enum ggml_type (only what the exporter writes) */
export const GgmlType = { F32: 0, F16: 1 } as const;
export type GgmlTypeCode = (typeof GgmlType)[keyof typeof GgmlType];

/** llama.h: LLAMA_FTYPE_MOSTLY_F16 (general.file_type) */
const LLAMA_FTYPE_MOSTLY_F16 = 1;

/** llama.h: enum llama_token_type */
export const TokenType = { NORMAL: 1, UNKNOWN: 2, CONTROL: 3, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 } as const;

// ---- metadata values ----

export type GgufValue =
  | { type: "u32"; value: number }
  | { type: "i32"; value: number }
  | { type: "f32"; value: number }
  | { type: "bool"; value: boolean }
  | { type: "string"; value: string }
  | { type: "string[]"; value: readonly string[] }
  | { type: "i32[]"; value: ArrayLike<number> };

export const u32 = (value: number): GgufValue => ({ type: "u32", value });
export const f32 = (value: number): GgufValue => ({ type: "f32", value });
export const str = (value: string): GgufValue => ({ type: "string", value });

export interface GgufTensor {
  name: string;
  /** ggml order: ne[0] innermost. */
  ne: number[];
  type: GgmlTypeCode;
  /** The tensor's bytes; the same array may back several tensors. */
  data: Uint8Array;
}

const TYPE_SIZE: Record<GgmlTypeCode, number> = { [GgmlType.F32]: 4, [GgmlType.F16]: 2 };

// ---- header encoding ----

/** A growable little-endian byte buffer. */
class ByteWriter {
  private buf = new Uint8Array(1 << 16);
  private view = new DataView(this.buf.buffer);
  length = 0;
  private readonly enc = new TextEncoder();

  private reserve(n: number): void {
    if (this.length + n <= this.buf.length) return;
    let cap = this.buf.length * 2;
    while (cap < this.length + n) cap *= 2;
    const next = new Uint8Array(cap);
    next.set(this.buf.subarray(0, this.length));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  /** Appends `width` bytes that `write` puts at the given offset. */
  private put(width: number, write: (view: DataView, at: number) => void): void {
    this.reserve(width);
    write(this.view, this.length);
    this.length += width;
  }
  u8(v: number): void {
    this.put(1, (view, at) => view.setUint8(at, v));
  }
  u32(v: number): void {
    this.put(4, (view, at) => view.setUint32(at, v, true));
  }
  i32(v: number): void {
    this.put(4, (view, at) => view.setInt32(at, v, true));
  }
  f32(v: number): void {
    this.put(4, (view, at) => view.setFloat32(at, v, true));
  }
  u64(v: number): void {
    this.put(8, (view, at) => view.setBigUint64(at, BigInt(v), true));
  }
  bytes(b: Uint8Array): void {
    this.reserve(b.length);
    this.buf.set(b, this.length);
    this.length += b.length;
  }
  string(s: string): void {
    const b = this.enc.encode(s);
    this.u64(b.length);
    this.bytes(b);
  }
  padTo(alignment: number): void {
    while (this.length % alignment !== 0) this.u8(0);
  }
  result(): Uint8Array {
    return this.buf.subarray(0, this.length);
  }
}

function writeValue(w: ByteWriter, key: string, v: GgufValue): void {
  const check = (ok: boolean, what: string) => {
    if (!ok) throw new ModelFormatError(`GGUF metadata "${key}": ${what}`);
  };
  switch (v.type) {
    case "u32":
      check(Number.isInteger(v.value) && v.value >= 0 && v.value <= 0xffffffff, `u32 out of range: ${v.value}`);
      w.u32(GgufType.UINT32);
      w.u32(v.value);
      return;
    case "i32":
      check(Number.isInteger(v.value) && v.value >= -0x80000000 && v.value <= 0x7fffffff, `i32 out of range: ${v.value}`);
      w.u32(GgufType.INT32);
      w.i32(v.value);
      return;
    case "f32":
      check(Number.isFinite(v.value), `f32 must be finite, got ${v.value}`);
      w.u32(GgufType.FLOAT32);
      w.f32(v.value);
      return;
    case "bool":
      w.u32(GgufType.BOOL);
      w.u8(v.value ? 1 : 0);
      return;
    case "string":
      w.u32(GgufType.STRING);
      w.string(v.value);
      return;
    case "string[]":
      w.u32(GgufType.ARRAY);
      w.u32(GgufType.STRING);
      w.u64(v.value.length);
      for (const s of v.value) w.string(s);
      return;
    case "i32[]":
      w.u32(GgufType.ARRAY);
      w.u32(GgufType.INT32);
      w.u64(v.value.length);
      for (let i = 0; i < v.value.length; i++) w.i32(v.value[i]);
      return;
  }
}

const pad = (n: number, a: number) => Math.ceil(n / a) * a;

// ---- writer ----

/**
 * Writes a GGUF v3 file: metadata in the given order, then the tensor infos
 * and data in the given order, every tensor 32-byte aligned. Written to a
 * temporary file and renamed into place; onProgress is told the bytes
 * written. Returns the file size.
 */
export function writeGguf(path: string, metadata: [string, GgufValue][], tensors: GgufTensor[], onProgress?: ProgressCallback): number {
  const fail = (msg: string): never => {
    throw new ModelFormatError(`${path}: ${msg}`);
  };
  const w = new ByteWriter();
  w.u32(GGUF_MAGIC);
  w.u32(GGUF_VERSION);
  w.u64(tensors.length);
  w.u64(metadata.length);
  const keys = new Set<string>();
  for (const [key, value] of metadata) {
    if (keys.has(key)) fail(`duplicate metadata key "${key}"`);
    keys.add(key);
    w.string(key);
    writeValue(w, key, value);
  }
  const names = new Set<string>();
  let offset = 0;
  for (const t of tensors) {
    if (names.has(t.name)) fail(`duplicate tensor name "${t.name}"`);
    names.add(t.name);
    if (t.ne.length < 1 || t.ne.length > 4) fail(`tensor "${t.name}": ${t.ne.length} dimensions, GGUF allows 1..4`);
    const count = t.ne.reduce((a, b) => a * b, 1);
    const bytes = count * TYPE_SIZE[t.type];
    if (t.data.byteLength !== bytes) {
      fail(`tensor "${t.name}": ne [${t.ne.join(", ")}] type ${t.type} needs ${bytes} bytes, data has ${t.data.byteLength}`);
    }
    w.string(t.name);
    w.u32(t.ne.length);
    for (const d of t.ne) w.u64(d);
    w.u32(t.type);
    w.u64(offset);
    offset += pad(bytes, GGUF_ALIGNMENT);
  }
  w.padTo(GGUF_ALIGNMENT);
  const header = w.result();

  const size = header.length + offset;
  return writeFileAtomically(path, (writeAll) => {
    writeAll(header);
    let written = header.length;
    const zeros = new Uint8Array(GGUF_ALIGNMENT);
    for (const t of tensors) {
      writeAll(t.data);
      const gap = pad(t.data.byteLength, GGUF_ALIGNMENT) - t.data.byteLength;
      if (gap > 0) writeAll(zeros.subarray(0, gap));
      written += t.data.byteLength + gap;
      onProgress?.(written, size);
    }
    return size;
  });
}

// ---- GPT-2 vocabulary ----

export interface Gpt2Vocab {
  /** Token strings in id order (byte-to-unicode form); the last is <|endoftext|>. */
  tokens: string[];
  /** "left right" in rank order: the merge that creates token 256 + i. */
  merges: string[];
  endOfText: number;
}

/**
 * Token bytes in rank order from tiktoken's bundled table: lines of
 * "<ignored> <first rank> <base64 token> <base64 token> ...".
 */
function bundledRankBytes(): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (const line of gpt2.bpe_ranks.split("\n")) {
    if (line.trim() === "") continue;
    const [, first, ...tokens] = line.split(" ");
    const start = Number(first);
    if (!Number.isInteger(start) || start !== out.length) {
      throw new ModelFormatError(`bundled GPT-2 ranks: line starts at rank ${first}, expected ${out.length}`);
    }
    for (const t of tokens) out.push(new Uint8Array(Buffer.from(t, "base64")));
  }
  return out;
}

let vocabCache: Gpt2Vocab | null = null;

/** The GPT-2 vocabulary and merges from the bundled tiktoken ranks (built once, ~100 ms). */
export function gpt2Vocab(): Gpt2Vocab {
  if (vocabCache) return vocabCache;
  const ranks = bundledRankBytes();
  const tokens = ranks.map((bytes) => Array.from(bytes, (b) => BYTE_CHARS[b]).join(""));
  const rankOf = new Map<string, number>();
  tokens.forEach((t, i) => rankOf.set(t, i));
  if (rankOf.size !== tokens.length) throw new ModelFormatError("bundled GPT-2 ranks hold a duplicate token");

  // A token of rank r is the merge of the two parts that BPE reaches from
  // its bytes when only merges of rank < r are allowed.
  const merges: string[] = [];
  for (let r = 0; r < tokens.length; r++) {
    const parts = Array.from(tokens[r]); // one unicode char per byte
    if (parts.length === 1) continue;
    for (;;) {
      let best = -1;
      let bestRank = r;
      for (let i = 0; i + 1 < parts.length; i++) {
        const pr = rankOf.get(parts[i] + parts[i + 1]);
        if (pr !== undefined && pr < bestRank) {
          bestRank = pr;
          best = i;
        }
      }
      if (best < 0) break;
      parts.splice(best, 2, parts[best] + parts[best + 1]);
    }
    if (parts.length !== 2) {
      throw new ModelFormatError(`bundled GPT-2 ranks: token ${r} does not split into one merge (${parts.length} parts)`);
    }
    merges.push(`${parts[0]} ${parts[1]}`);
  }
  const endOfText = gpt2.special_tokens["<|endoftext|>"];
  if (endOfText !== tokens.length) throw new ModelFormatError(`bundled GPT-2 ranks: <|endoftext|> is ${endOfText}, expected ${tokens.length}`);
  tokens.push("<|endoftext|>");
  vocabCache = { tokens, merges, endOfText };
  return vocabCache;
}

// ---- RoPE row permutation ----

/**
 * Reorders the rows of a [nHeads * headDim, cols] matrix, head by head, from
 * Hugging Face's rotate-half RoPE layout to llama.cpp's adjacent pairs:
 * new row 2i + j = old row j * headDim/2 + i (convert_hf_to_gguf.py).
 */
export function permuteRopeRows(w: Uint16Array, nHeads: number, headDim: number, cols: number): Uint16Array {
  return reorderRows(w, nHeads, headDim, cols, false);
}

/** The inverse of permuteRopeRows. */
export function unpermuteRopeRows(w: Uint16Array, nHeads: number, headDim: number, cols: number): Uint16Array {
  return reorderRows(w, nHeads, headDim, cols, true);
}

function reorderRows(w: Uint16Array, nHeads: number, headDim: number, cols: number, inverse: boolean): Uint16Array {
  if (headDim % 2 !== 0) throw new ModelFormatError(`RoPE permutation: head_dim ${headDim} must be even`);
  if (w.length !== nHeads * headDim * cols) {
    throw new ModelFormatError(`RoPE permutation: ${w.length} values, expected ${nHeads} x ${headDim} x ${cols}`);
  }
  const half = headDim / 2;
  const out = new Uint16Array(w.length);
  for (let h = 0; h < nHeads; h++) {
    for (let i = 0; i < half; i++) {
      for (let j = 0; j < 2; j++) {
        const hf = h * headDim + j * half + i; // rotate-half row
        const ll = h * headDim + 2 * i + j; // adjacent-pairs row
        const [dst, src] = inverse ? [hf, ll] : [ll, hf];
        out.set(w.subarray(src * cols, (src + 1) * cols), dst * cols);
      }
    }
  }
  return out;
}

// ---- export ----

export interface GgufExportOptions {
  /** Layers to unroll (default: the model's default_loops), 1..MAX_LOOPS. */
  loops?: number;
  /** general.name (default: "loopserve looped-llama"). */
  name?: string;
  /** Told the bytes of the GGUF file written so far. */
  onProgress?: ProgressCallback;
}

export interface GgufExportResult {
  path: string;
  bytes: number;
  loops: number;
  tensors: number;
  config: ModelConfig;
}

const bytesOf = (a: Uint16Array | Float32Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

/** fp16 norm weights as F32: llama.cpp keeps 1-D tensors in F32 (its converter does). */
function normAsF32(w: Uint16Array): Uint8Array {
  const out = new Float32Array(w.length);
  for (let i = 0; i < w.length; i++) out[i] = F16_TO_F32[w[i]];
  return bytesOf(out);
}

/** The GGUF metadata of a model unrolled into `layers` layers (tokenizer included). */
export function ggufMetadata(c: ModelConfig, layers: number, name: string): [string, GgufValue][] {
  const vocab = gpt2Vocab();
  if (c.vocabSize < 256) {
    throw new ModelFormatError(`vocab_size ${c.vocabSize}: a GPT-2 byte-level vocabulary needs at least 256 ids`);
  }
  // Ids past GPT-2's 50257 have no text (tokenizer.ts): padding tokens.
  // A smaller model keeps the first vocab_size tokens and their merges.
  const tokens: string[] = [];
  const types = new Int32Array(c.vocabSize);
  for (let id = 0; id < c.vocabSize; id++) {
    if (id < vocab.tokens.length) {
      tokens.push(vocab.tokens[id]);
      types[id] = id === vocab.endOfText ? TokenType.CONTROL : TokenType.NORMAL;
    } else {
      tokens.push(`<|pad_${id}|>`);
      types[id] = TokenType.UNUSED;
    }
  }
  const nMerges = Math.max(0, Math.min(vocab.merges.length, c.vocabSize - 256));
  const meta: [string, GgufValue][] = [
    ["general.architecture", str("llama")],
    ["general.name", str(name)],
    ["general.file_type", u32(LLAMA_FTYPE_MOSTLY_F16)],
    ["general.alignment", u32(GGUF_ALIGNMENT)],
    ["llama.block_count", u32(layers)],
    ["llama.context_length", u32(c.maxSeqLen)],
    ["llama.embedding_length", u32(c.dim)],
    ["llama.feed_forward_length", u32(c.ffnDim)],
    ["llama.attention.head_count", u32(c.nHeads)],
    ["llama.attention.head_count_kv", u32(c.nKvHeads)],
    ["llama.rope.freq_base", f32(c.ropeTheta)],
    ["llama.attention.layer_norm_rms_epsilon", f32(c.normEps)],
    ["llama.rope.dimension_count", u32(c.headDim)],
    ["llama.vocab_size", u32(c.vocabSize)],
    ["tokenizer.ggml.model", str("gpt2")],
    // llama.cpp's name for GPT-2's pre-tokenizer regex is "gpt-2"; it
    // rejects "gpt2" as an unknown pre-tokenizer.
    ["tokenizer.ggml.pre", str("gpt-2")],
    ["tokenizer.ggml.tokens", { type: "string[]", value: tokens }],
    ["tokenizer.ggml.token_type", { type: "i32[]", value: types }],
    ["tokenizer.ggml.merges", { type: "string[]", value: vocab.merges.slice(0, nMerges) }],
  ];
  if (vocab.endOfText < c.vocabSize) {
    meta.push(["tokenizer.ggml.bos_token_id", u32(vocab.endOfText)]);
    meta.push(["tokenizer.ggml.eos_token_id", u32(vocab.endOfText)]);
  }
  // GPT-2 never prepends a BOS token; loopserve encodes prompts without one.
  meta.push(["tokenizer.ggml.add_bos_token", { type: "bool", value: false }]);
  meta.push(["tokenizer.ggml.add_eos_token", { type: "bool", value: false }]);
  return meta;
}

/**
 * Writes the fp16 model at `inPath` as a Llama GGUF: its n_layers layers
 * unrolled `loops` times (GGUF layer l * n_layers + i is layer i). A stack
 * exports only as far as llama.cpp's Llama graph runs it: pre-norm layers,
 * no norm per step, no exit gate. Throws ModelFormatError for a bad,
 * quantized or such input.
 */
export function exportGguf(inPath: string, outPath: string, opts: GgufExportOptions = {}): GgufExportResult {
  const file = readSafetensors(inPath);
  const header = parseModelMetadata(file.metadata, inPath);
  if (header.quant !== "fp16") {
    throw new ModelFormatError(
      `${inPath}: export-gguf needs an fp16 model, this one is ${header.quant} ` +
        `(export the fp16 model, then quantize the GGUF with llama-quantize)`,
    );
  }
  if (header.tokenizer !== "gpt2") {
    throw new ModelFormatError(`${inPath}: export-gguf writes GPT-2's vocabulary; this model carries its own tokenizer (${header.tokenizer})`);
  }
  const c = parseModelConfig(file);
  if (c.headQuant !== "fp16") throw new ModelFormatError(`${inPath}: export-gguf needs an fp16 head, this one is ${c.headQuant}`);
  const unsupported = [c.normLayout === "sandwich" && "sandwich norms", c.stepNorm && "norm after every step", c.exitGate && "exit gate"].filter(Boolean);
  if (unsupported.length > 0) {
    throw new ModelFormatError(`${inPath}: export-gguf writes llama.cpp's Llama graph, which has no place for this model's ${unsupported.join(", ")}`);
  }
  const loops = opts.loops ?? c.defaultLoops;
  if (!Number.isInteger(loops) || loops < 1 || loops > MAX_LOOPS) {
    throw new ModelFormatError(`loops must be an integer in [1, ${MAX_LOOPS}], got ${loops}`);
  }
  const get = (name: string) => asF16(file.tensors.get(name) as TensorView);
  const { dim, ffnDim, headDim, nHeads, nKvHeads, vocabSize } = c;
  const q = nHeads * headDim;
  const kv = nKvHeads * headDim;
  const F16 = GgmlType.F16;

  // Each layer's tensors, converted once and referenced by every loop's copy.
  const layers = Array.from({ length: c.nLayers }, (_, i): [string, number[], GgmlTypeCode, Uint8Array][] => {
    const p = layerPrefix(c, i);
    return [
      ["attn_norm.weight", [dim], GgmlType.F32, normAsF32(get(`${p}attn_norm.weight`))],
      ["attn_q.weight", [dim, q], F16, bytesOf(permuteRopeRows(get(`${p}wq.weight`), nHeads, headDim, dim))],
      ["attn_k.weight", [dim, kv], F16, bytesOf(permuteRopeRows(get(`${p}wk.weight`), nKvHeads, headDim, dim))],
      ["attn_v.weight", [dim, kv], F16, bytesOf(get(`${p}wv.weight`))],
      ["attn_output.weight", [q, dim], F16, bytesOf(get(`${p}wo.weight`))],
      ["ffn_norm.weight", [dim], GgmlType.F32, normAsF32(get(`${p}ffn_norm.weight`))],
      ["ffn_gate.weight", [dim, ffnDim], F16, bytesOf(get(`${p}w1.weight`))],
      ["ffn_down.weight", [ffnDim, dim], F16, bytesOf(get(`${p}w2.weight`))],
      ["ffn_up.weight", [dim, ffnDim], F16, bytesOf(get(`${p}w3.weight`))],
    ];
  });
  const tokEmbeddings = get("tok_embeddings.weight");
  const tensors: GgufTensor[] = [{ name: "token_embd.weight", ne: [dim, vocabSize], type: F16, data: bytesOf(tokEmbeddings) }];
  for (let l = 0; l < loops; l++) {
    layers.forEach((layer, i) => {
      for (const [name, ne, type, data] of layer) tensors.push({ name: `blk.${l * c.nLayers + i}.${name}`, ne, type, data });
    });
  }
  tensors.push({ name: "output_norm.weight", ne: [dim], type: GgmlType.F32, data: normAsF32(get("norm.weight")) });
  // Tied output: llama.cpp falls back to token_embd.weight when output.weight is absent.
  if (!c.tiedOutput) tensors.push({ name: "output.weight", ne: [dim, vocabSize], type: F16, data: bytesOf(get("output.weight")) });

  const name = opts.name ?? `loopserve looped-llama unrolled x${loops}`;
  const bytes = writeGguf(outPath, ggufMetadata(c, loops * c.nLayers, name), tensors, opts.onProgress);
  return { path: outPath, bytes, loops, tensors: tensors.length, config: c };
}
