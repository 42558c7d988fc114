// `loopserve model import-hf DIR OUT`: a Hugging Face checkpoint directory
// (src/model/hf_checkpoint.ts reads and checks it) written as one loopserve
// fp16 model file, format_version 2 (docs/model-format.md, docs/import-hf.md).
//
// Streaming: a 1.4B checkpoint is ~2.8 GB of bf16, so no tensor is ever held
// whole. The output header is computed first (names, shapes, offsets), then
// each tensor is read from its shard in CHUNK_ELEMENTS pieces with pread,
// converted to fp16 into a reused buffer and appended; memory stays at a few
// chunk buffers whatever the model's size. Output order is loopserve's
// (embedding, layers, norm, head, gate), independent of how the checkpoint
// was sharded, so the same weights give the same file however they were split.
//
// Conversion: round to nearest, ties to even. A value fp16 cannot hold (one
// that rounds to infinity: |x| >= 65520) is an error naming the tensor and
// the element, as is a NaN or infinity in the checkpoint: the server refuses
// non-finite weights, so such a file would be written only to be refused.
// Values below fp16's normal range become subnormals or zero, as rounding says.

import { closeSync, openSync, readSync } from "node:fs";
import type { ProgressCallback } from "../progress.ts";
import { bf16BitsToNumber, f16BitsToNumber, f32BitsToF16Bits } from "./fp16.ts";
import { type HfCheckpoint, type HfDtype, type HfTensor, readHfCheckpoint, tokenId } from "./hf_checkpoint.ts";
import { HF_FAMILIES } from "./hf_families.ts";
import { DTYPE_SIZES, ModelFormatError, writeSafetensorsStream } from "./safetensors.ts";

export interface ImportOptions {
  /** Bytes of fp16 written so far out of the total. */
  onProgress?: ProgressCallback;
}

export interface ImportResult {
  checkpoint: HfCheckpoint;
  metadata: Record<string, string>;
  bytes: number; // the output file's size
  tensors: number;
  parameters: number;
}

/** Elements converted per read: 2-4 MB buffers, large enough that syscalls cost nothing. */
export const CHUNK_ELEMENTS = 1 << 20;

// ---- conversion ----

/** fp16 bits of every bf16 bit pattern: bf16 is fp32's top half, so one table covers it exactly. */
let bf16Table: Uint16Array | null = null;
function bf16ToF16Table(): Uint16Array {
  if (bf16Table === null) {
    bf16Table = new Uint16Array(65536);
    for (let b = 0; b < 65536; b++) bf16Table[b] = f32BitsToF16Bits(b << 16);
  }
  return bf16Table;
}

/** fp16 bits with the all-ones exponent: infinity or NaN. */
const F16_EXP_MASK = 0x7c00;

/** The value of element i of a source chunk, for error messages. */
function sourceValue(dtype: HfDtype, src: Uint8Array, i: number): number {
  const dv = new DataView(src.buffer, src.byteOffset, src.byteLength);
  if (dtype === "F32") return dv.getFloat32(i * 4, true);
  if (dtype === "F16") return f16BitsToNumber(dv.getUint16(i * 2, true));
  return bf16BitsToNumber(dv.getUint16(i * 2, true));
}

/**
 * Converts `count` elements of `dtype` in `src` (little-endian, 4-byte
 * aligned) to fp16 bits in `out`. Returns -1, or the index of the first
 * element fp16 cannot hold (non-finite, or |x| >= 65520) — exactly the
 * elements whose fp16 result has the all-ones exponent.
 */
export function convertToF16(dtype: HfDtype, src: Uint8Array, count: number, out: Uint16Array): number {
  if (dtype === "BF16") {
    const table = bf16ToF16Table();
    const s = new Uint16Array(src.buffer, src.byteOffset, count);
    for (let i = 0; i < count; i++) {
      const h = table[s[i]];
      if ((h & F16_EXP_MASK) === F16_EXP_MASK) return i;
      out[i] = h;
    }
  } else if (dtype === "F32") {
    const s = new Uint32Array(src.buffer, src.byteOffset, count);
    for (let i = 0; i < count; i++) {
      const h = f32BitsToF16Bits(s[i]);
      if ((h & F16_EXP_MASK) === F16_EXP_MASK) return i;
      out[i] = h;
    }
  } else {
    const s = new Uint16Array(src.buffer, src.byteOffset, count);
    for (let i = 0; i < count; i++) {
      const h = s[i];
      if ((h & F16_EXP_MASK) === F16_EXP_MASK) return i;
      out[i] = h;
    }
  }
  return -1;
}

/** "[r, c]" of flat index i in `shape`. */
function indexIn(shape: number[], i: number): string {
  const idx: number[] = [];
  for (let d = shape.length - 1; d >= 0; d--) {
    idx.unshift(i % shape[d]);
    i = Math.floor(i / shape[d]);
  }
  return `[${idx.join(", ")}]`;
}

// ---- metadata ----

function num(x: number): string {
  return String(x);
}

/**
 * bos id, when the tokenizer prepends one: tokenizer_config.json's
 * add_bos_token true, or tokenizer.json's post-processor putting one token
 * before every text (Llama's TemplateProcessing; add_bos_token false turns
 * it off, as transformers rebuilds that template from it).
 */
function bosTokenId(ck: HfCheckpoint): number | null {
  const tok = ck.tokenizer;
  if (!tok || tok.config.add_bos_token === false) return null;
  const prefix = tok.prefixIds;
  if (prefix.length > 1) {
    throw ModelFormatError.about(ck.dir, `tokenizer.json's post_processor puts ${prefix.length} tokens (ids ${prefix.join(", ")}) before every text: loopserve prepends one, the beginning-of-sequence token`);
  }
  if (prefix.length === 1) {
    if (prefix[0] >= ck.model.vocabSize) throw ModelFormatError.about(ck.dir, `tokenizer.json's post_processor puts token id ${prefix[0]} first, outside the vocabulary [0, ${ck.model.vocabSize})`);
    return prefix[0];
  }
  if (tok.config.add_bos_token !== true) return null;
  const text = tok.specialTokens.bos_token;
  let id: unknown = ck.config.bos_token_id;
  if (typeof text === "string") {
    id = tokenId(tok, text);
    if (id === null) throw ModelFormatError.about(ck.dir, `tokenizer_config.json bos_token ${JSON.stringify(text)} is not a token of tokenizer.json`);
  }
  if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id >= ck.model.vocabSize) {
    throw ModelFormatError.about(ck.dir, `add_bos_token is true but no bos token id in [0, ${ck.model.vocabSize}) is given (bos_token / bos_token_id)`);
  }
  return id;
}

/** The output file's metadata (docs/model-format.md: format version 2). */
export function importMetadata(ck: HfCheckpoint): Record<string, string> {
  const m = ck.model;
  const meta: Record<string, string> = {
    format: "loopserve",
    format_version: "2",
    arch: "looped-llama",
    dim: num(m.dim),
    n_heads: num(m.nHeads),
    n_kv_heads: num(m.nKvHeads),
    ffn_dim: num(m.ffnDim),
    vocab_size: num(m.vocabSize),
    default_loops: num(m.defaultLoops),
    max_seq_len: num(m.maxSeqLen),
    rope_theta: num(m.ropeTheta),
    norm_eps: num(m.normEps),
    quant: "fp16",
    group_size: "0",
    n_layers: num(m.nLayers),
    norm_layout: m.sandwich ? "sandwich" : "pre",
    step_norm: m.stepNorm ? "1" : "0",
  };
  if (m.exitThreshold !== null) meta.exit_threshold = num(m.exitThreshold);
  Object.assign(meta, ck.layout);
  meta.generator = "loopserve import-hf";
  meta.source_arch = ck.arch;
  const tok = ck.tokenizer;
  if (tok === null) {
    meta.tokenizer = "gpt2";
    return meta;
  }
  meta.tokenizer = "bpe";
  meta.chat_format = tok.chatTemplate?.includes("<|im_start|>") ? "chatml" : "plain";
  if (tok.chatTemplate !== null) meta.chat_template = tok.chatTemplate;
  if (Object.keys(tok.specialTokens).length > 0) meta.special_tokens = JSON.stringify(tok.specialTokens);
  if (ck.eosIds.length === 0)
    throw ModelFormatError.about(ck.dir, "no end-of-sequence token: neither config.json nor generation_config.json has an eos_token_id, and tokenizer_config.json no eos_token");
  meta.eos_token_ids = ck.eosIds.join(",");
  const bos = bosTokenId(ck);
  if (bos !== null) meta.bos_token_id = num(bos);
  meta.tokenizer_json = tok.json; // last: by far the longest value
  return meta;
}

// ---- import ----

/** Reads exactly buf.length bytes at `position` of fd. */
function preadFully(fd: number, buf: Uint8Array, position: number, file: string): void {
  let done = 0;
  while (done < buf.length) {
    const n = readSync(fd, buf, done, buf.length - done, position + done);
    if (n === 0) throw ModelFormatError.about(file, `unexpected end of file at byte ${position + done}`);
    done += n;
  }
}

/** Imports the checkpoint in `dir` into the loopserve model file `out` (replaced atomically). */
export function importHfCheckpoint(dir: string, out: string, opts: ImportOptions = {}): ImportResult {
  const ck = readHfCheckpoint(dir, HF_FAMILIES);
  const metadata = importMetadata(ck);
  const specs = ck.tensors.map((t) => ({ name: t.target, dtype: "F16" as const, shape: t.shape }));
  const counts = ck.tensors.map((t) => t.shape.reduce((a, b) => a * b, 1));
  const totalBytes = counts.reduce((a, b) => a + 2 * b, 0);

  // One buffer per source element size, reused for every chunk; Uint32-backed so F32 views align.
  const srcBuf = new Uint8Array(new ArrayBuffer(CHUNK_ELEMENTS * 4));
  const outBuf = new Uint16Array(CHUNK_ELEMENTS);
  const fds = new Map<string, number>();
  const fdOf = (file: string) => {
    let fd = fds.get(file);
    if (fd === undefined) {
      fd = openSync(file, "r");
      fds.set(file, fd);
    }
    return fd;
  };

  let written = 0;
  let bytes: number;
  try {
    bytes = writeSafetensorsStream(out, metadata, specs, (_spec, i, write) => {
      const t: HfTensor = ck.tensors[i];
      const size = DTYPE_SIZES[t.dtype];
      const fd = fdOf(t.file);
      for (let done = 0; done < counts[i]; done += CHUNK_ELEMENTS) {
        const n = Math.min(CHUNK_ELEMENTS, counts[i] - done);
        const src = srcBuf.subarray(0, n * size);
        preadFully(fd, src, t.offset + done * size, t.file);
        const bad = convertToF16(t.dtype, src, n, outBuf);
        if (bad >= 0) {
          const k = done + bad;
          const v = sourceValue(t.dtype, src, bad);
          const why = Number.isFinite(v) ? "beyond fp16's range (largest finite 65504)" : "not finite";
          throw ModelFormatError.about(t.file, `tensor "${t.name}" element ${k} ${indexIn(t.shape, k)} is ${v} (${t.dtype}), ${why}`);
        }
        write(new Uint8Array(outBuf.buffer, 0, n * 2));
        written += n * 2;
        opts.onProgress?.(written, totalBytes);
      }
    });
  } finally {
    for (const fd of fds.values()) closeSync(fd);
  }
  return { checkpoint: ck, metadata, bytes, tensors: specs.length, parameters: counts.reduce((a, b) => a + b, 0) };
}
