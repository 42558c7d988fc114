// Weight quantization (int4, int2 block matrices; int8, int6, int4 output
// head) and the reference arithmetic of the quantized kernels (kernels/quant.h).
//
// Formats (packing written down in kernels/loopserve.h, types in format.ts):
//   int4  symmetric groups along the inputs, code c in [-8, 7], value = s * c
//   int2  groups with scale and offset, code c in 0..3, value = s * c + z
//   int8  (output head) symmetric, code c in [-127, 127], value = s * c
//   int6  (output head) symmetric, code c in [-32, 31], value = s * c
// with s (and z) fp16, one per group of `groupSize` inputs (default 32).
//
// Everything here is deterministic: plain IEEE double arithmetic (+ - * /,
// comparisons), no Math.log/exp, fixed iteration counts, so the same input
// gives byte-identical output on every machine. These functions are the
// reference quantizer: `model quantize` runs the kernel library's
// (ls_quantize, kernels/cpu/quantize.c), which gives their bytes many times
// faster; quantizeModelFile streams a file through either (RowQuantizer).

import { closeSync, openSync, readSync, statSync } from "node:fs";
import type { ProgressCallback } from "../progress.ts";
import { bf16ArrayToF32, F16_TO_F32, f16ArrayToF32, f32ArrayToF16, f64ToF16Bits } from "./fp16.ts";
import {
  allLayerPrefixes,
  BLOCK_BITS,
  type BlockQuant,
  configToMetadata,
  formatQuantMix,
  GROUP_SIZES,
  HEAD_BITS,
  HEAD_QUANTS,
  type HeadQuant,
  matrixQuant,
  matrixShapes,
  type ModelConfig,
  type ModelShape,
  parseModelMetadata,
  parseQuantMix,
  QUANT_MATRICES,
  type QuantMatrix,
  type QuantMix,
  quantTensorShapes,
} from "./format.ts";
import { ModelFormatError, readSafetensors, type TensorSpec, type TensorView, writeSafetensorsStream } from "./safetensors.ts";

export type WeightQuant = BlockQuant;
export type { HeadQuant, QuantMix };
export const DEFAULT_GROUP_SIZE = 32;
/**
 * The head `model quantize` writes unless told otherwise: int6, the smallest
 * whose quality cost on the trained model is small (README quality table:
 * int4 weights' KL to fp16 2.8e-3 with int8, 3.2e-3 with int6, 8.2e-3 with
 * int4), and the same bits as llama.cpp's Q6_K head; int8 where dim is not
 * a multiple of 64 (the int6 layout's block).
 */
export function defaultHead(dim: number): HeadQuant {
  return dim % 64 === 0 ? "int6" : "int8";
}

/**
 * The block matrices `model quantize` keeps in the other format unless told
 * otherwise. int2 keeps wv, wo and w2 at int4, as llama.cpp's Q2_K keeps
 * them at 3 bits: on the trained model this brings int2's KL to fp16 below
 * Q2_K's (docs/model-format.md), for 0.75 more bits per block weight.
 */
export const DEFAULT_MIX: Record<WeightQuant, QuantMix> = { int4: {}, int2: { wv: "int4", wo: "int4", w2: "int4" } };

// ---- fp16 rounding with a direction ----

const F16_MAX = 65504;

/** Bits of the smallest fp16 >= x (x finite, |x| <= 65504). */
export function f16BitsUp(x: number): number {
  let b = f64ToF16Bits(x);
  if (F16_TO_F32[b] < x) b = b & 0x8000 ? (b === 0x8000 ? 0x0001 : b - 1) : b + 1;
  return b;
}

/** Bits of the largest fp16 <= x (x finite, |x| <= 65504). */
export function f16BitsDown(x: number): number {
  let b = f64ToF16Bits(x);
  if (F16_TO_F32[b] > x) b = b & 0x8000 ? b + 1 : b === 0 ? 0x8001 : b - 1;
  return b;
}

/** Round half to even of a finite double. */
export function rne(v: number): number {
  const f = Math.floor(v);
  const d = v - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** The format's rules for rows of `cols` inputs: a group size it has, dividing cols; int6 rows a multiple of 64. */
function checkFormat(what: string, bits: QuantMatrix["bits"], cols: number, groupSize: number): void {
  if (!GROUP_SIZES.includes(groupSize)) {
    throw new ModelFormatError(`${what}: group size must be one of ${GROUP_SIZES.join(", ")}, got ${groupSize}`);
  }
  if (cols % groupSize !== 0) {
    throw new ModelFormatError(
      `${what}: in_features ${cols} is not a multiple of the group size ${groupSize} (groups run along the inputs)`,
    );
  }
  if (bits === 6 && cols % 64 !== 0) throw new ModelFormatError(`${what}: in_features ${cols} is not a multiple of 64 (the int6 layout)`);
}

function checkShape(what: string, bits: QuantMatrix["bits"], w: ArrayLike<number>, rows: number, cols: number, groupSize: number): void {
  checkFormat(what, bits, cols, groupSize);
  if (w.length !== rows * cols) throw new ModelFormatError(`${what}: ${w.length} values, expected ${rows} x ${cols}`);
}

function scaleBits(what: string, s: number): number {
  if (!(s <= F16_MAX)) {
    throw new ModelFormatError(`${what}: a group's scale ${s} does not fit in fp16 (weights too large or not finite)`);
  }
  return f16BitsUp(s);
}

// ---- int4 ----

/** Candidate scales per group: max|w| / (L + 1 - SCALE_STEP * k), k < SCALE_CANDIDATES, each sign. */
const SCALE_STEP = 0.25;
const SCALE_CANDIDATES = 21;

/** The code of weight v at scale s: rne(v / s) clamped to [-L - 1, L] (0 when s is 0). */
function symmetricCode(v: number, s: number, L: number): number {
  return s !== 0 ? Math.min(L, Math.max(-L - 1, rne(v / s))) : 0;
}

/** Squared error of a group's weights against their codes at scale s. */
function symmetricError(w: ArrayLike<number>, base: number, n: number, s: number, L: number): number {
  let e = 0;
  for (let i = 0; i < n; i++) {
    const v = w[base + i];
    e += (v - symmetricCode(v, s, L) * s) ** 2;
  }
  return e;
}

/**
 * Symmetric codes c = clamp(rne(w / s), -L - 1, L) per group (int4: L = 7,
 * int6: L = 31). The scale is searched: |s| = max|w| / (L + 1 - k / 4) for
 * k = 0..20 (fp16, rounded away from zero), either sign, the one with the
 * least squared error winning (ties: the earlier candidate, k = 0 with the
 * group's largest weight at -L - 1 first, as llama.cpp's Q4_0 places it).
 * Smaller scales clip a group's extremes to -L - 1 or L; the search takes
 * that trade only where the rest of the group gains more. On the trained
 * model (int4 block, int6 head) the KL divergence to fp16 went from
 * 3.17e-3 with a scale fitting the whole range to 2.51e-3 keeping the
 * largest weight and 2.32e-3 searched. put(idx, c) stores the code of
 * weight idx.
 */
function quantizeSymmetric(w: ArrayLike<number>, rows: number, cols: number, groupSize: number, what: string, L: number, scales: Uint16Array, put: (idx: number, c: number) => void): void {
  const ng = cols / groupSize;
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < ng; g++) {
      const base = r * cols + g * groupSize;
      let maxPos = 0;
      let maxNeg = 0;
      for (let i = 0; i < groupSize; i++) {
        const v = w[base + i];
        if (v > maxPos) maxPos = v;
        else if (-v > maxNeg) maxNeg = -v;
      }
      const amax = Math.max(maxPos, maxNeg);
      // The larger side's sign first: on a tie of errors it keeps the largest weight.
      const signs = maxNeg >= maxPos ? [0, 0x8000] : [0x8000, 0];
      let sb = 0;
      let best = Infinity;
      for (let k = 0; k < SCALE_CANDIDATES && amax > 0; k++) {
        for (const sign of signs) {
          const cand = scaleBits(what, amax / (L + 1 - SCALE_STEP * k)) | sign;
          const e = symmetricError(w, base, groupSize, F16_TO_F32[cand], L);
          if (e < best) {
            best = e;
            sb = cand;
          }
        }
      }
      scales[r * ng + g] = sb;
      const s = F16_TO_F32[sb];
      for (let i = 0; i < groupSize; i++) put(base + i, symmetricCode(w[base + i], s, L));
    }
  }
}

/** int4 per group (quantizeSymmetric with L = 7): the nibble c + 8, input 2j in the low nibble of byte j. */
export function quantizeInt4(w: ArrayLike<number>, rows: number, cols: number, groupSize = DEFAULT_GROUP_SIZE, what = "int4"): QuantMatrix {
  checkShape(what, 4, w, rows, cols, groupSize);
  const qweight = new Uint8Array((rows * cols) / 2);
  const scales = new Uint16Array((rows * cols) / groupSize);
  quantizeSymmetric(w, rows, cols, groupSize, what, 7, scales, (idx, c) => {
    qweight[idx >> 1] |= (c + 8) << ((idx & 1) * 4);
  });
  return { bits: 4, rows, cols, groupSize, qweight, scales };
}

// ---- int6 (output head) ----

/**
 * int6 per group (quantizeSymmetric with L = 31), u = c + 32: a row is
 * cols / 2 bytes of int4-style nibbles (u's low four bits), then cols / 4
 * bytes of u's high two bits, those of input 64b + 2j + e (j < 32) at bits
 * 4 (j >> 4) + 2e of byte 16b + (j & 15). cols must be a multiple of 64.
 */
export function quantizeInt6(w: ArrayLike<number>, rows: number, cols: number, groupSize = DEFAULT_GROUP_SIZE, what = "int6"): QuantMatrix {
  checkShape(what, 6, w, rows, cols, groupSize);
  const rowBytes = (cols * 3) / 4;
  const qweight = new Uint8Array(rows * rowBytes);
  const scales = new Uint16Array((rows * cols) / groupSize);
  quantizeSymmetric(w, rows, cols, groupSize, what, 31, scales, (idx, c) => {
    const r = Math.floor(idx / cols);
    const i = idx - r * cols;
    const row = r * rowBytes;
    const u = c + 32;
    const j = (i & 63) >> 1;
    qweight[row + (i >> 1)] |= (u & 15) << ((i & 1) * 4);
    qweight[row + cols / 2 + 16 * (i >> 6) + (j & 15)] |= (u >> 4) << (4 * (j >> 4) + 2 * (i & 1));
  });
  return { bits: 6, rows, cols, groupSize, qweight, scales };
}

// ---- int2 ----

/** Candidate ranges per int2 group: the offset lifted from the min by OFFSET_STEP * m of the range (m < OFFSET_CANDIDATES), the span above it shrunk by SPAN_STEP * k (k < SPAN_CANDIDATES). */
const OFFSET_STEP = 0.04;
const OFFSET_CANDIDATES = 6;
const SPAN_STEP = 0.03;
const SPAN_CANDIDATES = 11;

/** The int2 code of weight v at scale s and offset z: rne((v - z) / s) clamped to 0..3 (0 when s is 0). */
function offsetCode(v: number, s: number, z: number): number {
  return s > 0 ? Math.min(3, Math.max(0, rne((v - z) / s))) : 0;
}

/** A group's squared error against its codes at (s, z), each weight's term weighted by |v|. */
function offsetError(w: ArrayLike<number>, base: number, n: number, s: number, z: number): number {
  let e = 0;
  for (let i = 0; i < n; i++) {
    const v = w[base + i];
    e += Math.abs(v) * (v - (offsetCode(v, s, z) * s + z)) ** 2;
  }
  return e;
}

/**
 * int2 per group, value = s * c + z with c in 0..3. The range is searched,
 * as llama.cpp's Q2_K searches its own: the offset z = min + (m / 25) *
 * (max - min) for m = 0..5 (fp16, rounded down) and the scale s = (max - z)
 * * (1 - 0.03 k) / 3 for k = 0..10 (fp16, rounded up), the pair with the
 * least squared error weighted by |w| winning (ties: the earlier pair,
 * m = k = 0 spanning the whole group first). The weighting keeps the large
 * weights, which the KL divergence feels most, close; clipping small ones
 * costs little. An unweighted least-squares fit clipped the extremes and
 * raised the KL divergence to fp16 on the trained model (4.82e-2 to
 * 5.97e-2); this search lowered it, weights alone, from 4.92e-2 spanning
 * each group to 4.08e-2.
 */
export function quantizeInt2(w: ArrayLike<number>, rows: number, cols: number, groupSize = DEFAULT_GROUP_SIZE, what = "int2"): QuantMatrix {
  checkShape(what, 2, w, rows, cols, groupSize);
  const ng = cols / groupSize;
  const qweight = new Uint8Array((rows * cols) / 4);
  const scales = new Uint16Array(rows * ng);
  const zeros = new Uint16Array(rows * ng);
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < ng; g++) {
      const base = r * cols + g * groupSize;
      let mn = Infinity;
      let mx = -Infinity;
      for (let i = 0; i < groupSize; i++) {
        const v = w[base + i];
        if (v < mn) mn = v;
        if (v > mx) mx = v;
      }
      if (!(Math.abs(mn) <= F16_MAX && Math.abs(mx) <= F16_MAX)) {
        throw new ModelFormatError(`${what}: weights [${mn}, ${mx}] do not fit in fp16 offsets`);
      }
      let sb = 0;
      let zb = 0;
      let best = Infinity;
      for (let m = 0; m < OFFSET_CANDIDATES; m++) {
        const zc = f16BitsDown(mn + OFFSET_STEP * m * (mx - mn));
        for (let k = 0; k < SPAN_CANDIDATES; k++) {
          const sc = scaleBits(what, ((mx - F16_TO_F32[zc]) * (1 - SPAN_STEP * k)) / 3);
          const e = offsetError(w, base, groupSize, F16_TO_F32[sc], F16_TO_F32[zc]);
          if (e < best) {
            best = e;
            sb = sc;
            zb = zc;
          }
        }
      }
      scales[r * ng + g] = sb;
      zeros[r * ng + g] = zb;
      const s = F16_TO_F32[sb];
      const z = F16_TO_F32[zb];
      for (let i = 0; i < groupSize; i++) {
        const idx = base + i;
        qweight[idx >> 2] |= offsetCode(w[idx], s, z) << ((idx & 3) * 2);
      }
    }
  }
  return { bits: 2, rows, cols, groupSize, qweight, scales, zeros };
}

// ---- int8 (output head) ----

/** Symmetric int8 per group: s = max|w| / 127 rounded up to fp16, c = rne(w / s). */
export function quantizeInt8(w: ArrayLike<number>, rows: number, cols: number, groupSize = DEFAULT_GROUP_SIZE, what = "int8"): QuantMatrix {
  checkShape(what, 8, w, rows, cols, groupSize);
  const ng = cols / groupSize;
  const qweight = new Uint8Array(rows * cols);
  const codes = new Int8Array(qweight.buffer);
  const scales = new Uint16Array(rows * ng);
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < ng; g++) {
      const base = r * cols + g * groupSize;
      let amax = 0;
      for (let i = 0; i < groupSize; i++) amax = Math.max(amax, Math.abs(w[base + i]));
      const sb = scaleBits(what, amax / 127);
      scales[r * ng + g] = sb;
      const s = F16_TO_F32[sb];
      for (let i = 0; i < groupSize; i++) {
        codes[base + i] = s > 0 ? Math.min(127, Math.max(-127, rne(w[base + i] / s))) : 0;
      }
    }
  }
  return { bits: 8, rows, cols, groupSize, qweight, scales };
}

// ---- model files ----

/** Each format's reference quantizer, by its bits. */
const QUANTIZER_OF_BITS: Record<QuantMatrix["bits"], typeof quantizeInt8> = { 2: quantizeInt2, 4: quantizeInt4, 6: quantizeInt6, 8: quantizeInt8 };

/** The element types a model is quantized from. */
export type SourceDtype = "F32" | "F16" | "BF16";
const SOURCE_DTYPES: readonly string[] = ["F32", "F16", "BF16"];

/** One quantized matrix's format: its bits (QuantMatrix), group and inputs per row. */
export interface MatrixFormat {
  bits: QuantMatrix["bits"];
  groupSize: number;
  cols: number;
}

/** Some rows of a quantized matrix, laid out as the file holds them. */
export type QuantRows = Pick<QuantMatrix, "qweight" | "scales" | "zeros">;

/**
 * What quantizes a file's matrices, some rows at a time: the reference
 * (referenceQuantizer), or the kernel library's (src/engine/binding.ts,
 * NativeQuantizer), which gives the same bytes many times faster.
 * quantizeRows writes `rows` rows of src (raw little-endian values of
 * dtype) into out, sized for exactly those rows; a failure throws
 * ModelFormatError `${what}: the reason`.
 */
export interface RowQuantizer {
  quantizeRows(format: MatrixFormat, dtype: SourceDtype, src: Uint8Array, rows: number, out: QuantRows, what: string): void;
}

/** Raw values of dtype as fp32 (exact). */
function sourceToF32(src: Uint8Array, dtype: SourceDtype, n: number): Float32Array {
  const bytes = src.byteOffset % 4 === 0 ? src : src.slice();
  if (dtype === "F32") return new Float32Array(bytes.buffer, bytes.byteOffset, n);
  const u16 = new Uint16Array(bytes.buffer, bytes.byteOffset, n);
  return dtype === "F16" ? f16ArrayToF32(u16) : bf16ArrayToF32(u16);
}

/** The reference quantizer: the functions above, on an fp32 copy of the rows. */
export const referenceQuantizer: RowQuantizer = {
  quantizeRows(f, dtype, src, rows, out, what) {
    const q = QUANTIZER_OF_BITS[f.bits](sourceToF32(src, dtype, rows * f.cols), rows, f.cols, f.groupSize, what);
    out.qweight.set(q.qweight);
    out.scales.set(q.scales);
    if (q.zeros) out.zeros?.set(q.zeros);
  },
};

export interface QuantizeOptions {
  /** The block's format; fp16 keeps the block and quantizes the head only. */
  quant: WeightQuant | "fp16";
  groupSize?: number; // the block's group, default 32
  /** The output head: int8, int6, int4 or fp16 (default: defaultHead). A tied model stays tied (fp16) with fp16; with a quantized head, the head is its embedding too. */
  head?: HeadQuant;
  /** The head's group, default groupSize. */
  headGroupSize?: number;
  /** Block matrices in the other block format than quant (default DEFAULT_MIX[quant]). */
  mix?: QuantMix;
  /** Told the weights quantized so far, out of all the file's quantized weights. */
  onProgress?: ProgressCallback;
  /** Default referenceQuantizer; `model quantize` passes the kernel library's. */
  quantizer?: RowQuantizer;
}

export interface QuantizeResult {
  path: string;
  bytes: number;
  inputBytes: number;
  config: ModelConfig;
  head: HeadQuant | "tied";
}

/**
 * Source bytes a matrix is read in at a time: the rows of one quantizer call
 * (the progress moves per call) and the most of the input held at once.
 */
const CHUNK_BYTES = 8 << 20;

/** A buffer reused for one thing at a time, grown to the largest asked for. */
class Scratch {
  private buf = new ArrayBuffer(0);

  /** `bytes` bytes (at the start of the buffer), valid until the next take. */
  take(bytes: number): Uint8Array {
    if (this.buf.byteLength < bytes) this.buf = new ArrayBuffer(bytes);
    return new Uint8Array(this.buf, 0, bytes);
  }
}

/** The input file, read a range at a time into one reused buffer (never mapped: memory holds one chunk of it); opened by the first read. */
class SourceReader {
  private fd = -1;
  private readonly buf = new Scratch();

  constructor(private readonly path: string) {}

  /** `bytes` bytes from `offset` of the file, in a buffer valid until the next read. */
  read(offset: number, bytes: number): Uint8Array {
    if (this.fd < 0) this.fd = openSync(this.path, "r");
    const out = this.buf.take(bytes);
    for (let done = 0; done < bytes; ) {
      const n = readSync(this.fd, out, done, bytes - done, offset + done);
      if (n <= 0) throw new ModelFormatError(`${this.path}: short read at byte ${offset + done}`);
      done += n;
    }
    return out;
  }

  close(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
  }
}

function bytesOf(data: Uint8Array | Uint16Array): Uint8Array {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

/**
 * Quantizes an unquantized loopserve model (F16, BF16 or F32 tensors) and
 * writes it to `outPath`: the block's seven matrices int4 or int2 (or kept
 * fp16), the output head int8, int6, int4 (or fp16), the norms fp16, and
 * the embedding fp16 or, in a tied model with a quantized head, that head
 * itself: the output is always smaller than the input. Same input and
 * options give a byte-identical file, whichever quantizer makes it.
 *
 * One tensor at a time, each read from the file CHUNK_BYTES at a time:
 * memory holds a chunk of the input and one quantized matrix.
 */
export function quantizeModelFile(inPath: string, outPath: string, opts: QuantizeOptions): QuantizeResult {
  const blockGroup = opts.groupSize ?? DEFAULT_GROUP_SIZE;
  const headGroupSize = opts.headGroupSize ?? blockGroup;
  if (opts.quant !== "int4" && opts.quant !== "int2" && opts.quant !== "fp16") {
    throw new ModelFormatError(`quant must be int4, int2 or fp16, got ${String(opts.quant)}`);
  }
  const quantizer = opts.quantizer ?? referenceQuantizer;
  const file = readSafetensors(inPath);
  const where = inPath;
  const base = parseModelMetadata(file.metadata, where);
  const head = opts.head ?? defaultHead(base.dim);
  if (!HEAD_QUANTS.includes(head)) throw new ModelFormatError(`head must be one of ${HEAD_QUANTS.join(", ")}, got ${String(head)}`);
  if (opts.quant === "fp16" && head === "fp16") throw new ModelFormatError("quant fp16 with an fp16 head: nothing to quantize");
  if (base.quant !== "fp16" || (file.metadata.output_quant ?? "fp16") !== "fp16" || file.tensors.has("output.qweight")) {
    throw new ModelFormatError(`${where}: already quantized (quant ${base.quant}); quantize the fp16/bf16/fp32 original`);
  }
  const groupSize = opts.quant === "fp16" ? 0 : blockGroup;
  const mix = opts.mix ?? (opts.quant === "fp16" ? {} : DEFAULT_MIX[opts.quant]);
  // format.ts's rules (a mix needs int4 or int2, w1 and w3 alike); entries naming quant itself dropped.
  let quantMix: QuantMix;
  try {
    quantMix = parseQuantMix(formatQuantMix(mix), opts.quant);
  } catch (e) {
    throw new ModelFormatError((e as Error).message);
  }
  const config: ModelShape = { ...base, quant: opts.quant, groupSize, quantMix };
  // The metadata rules (group size, dim and ffn_dim multiples of it) with this file's name.
  parseModelMetadata({ ...file.metadata, ...configToMetadata(config) }, where);
  const headMeta: Record<string, string> =
    head === "fp16" ? { output_quant: "fp16" } : { output_quant: head, output_group_size: String(headGroupSize) };

  /** The tensor `name`, of this shape and a dtype it can be quantized from. */
  const check = (name: string, shape: number[]): TensorView & { dtype: SourceDtype } => {
    const t = file.tensors.get(name);
    if (t === undefined) throw new ModelFormatError(`${where}: missing tensor "${name}" (${shape.join(" x ")})`);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new ModelFormatError(`${where}: tensor "${name}": shape must be [${shape.join(", ")}], got [${t.shape.join(", ")}]`);
    }
    if (!SOURCE_DTYPES.includes(t.dtype)) {
      throw new ModelFormatError(`${where}: tensor "${name}": dtype must be F16, BF16 or F32 to quantize, got ${t.dtype}`);
    }
    return t as TensorView & { dtype: SourceDtype };
  };

  // The output is written as it is made (writeSafetensorsStream): each part
  // (a tensor kept fp16, or a quantized matrix's two or three tensors) is
  // checked now and computed when the writer reaches its first tensor.
  interface Part {
    specs: TensorSpec[];
    /** Writes the part's k-th tensor. */
    fill(k: number, write: (buf: Uint8Array) => void): void;
  }
  const parts: Part[] = [];
  const source = new SourceReader(inPath);
  // One matrix's outputs at a time, in buffers every matrix reuses (a new
  // buffer per matrix would leave the garbage collector a file's worth to find).
  const outputs = { qweight: new Scratch(), scales: new Scratch(), zeros: new Scratch() };
  // Tensors that stay fp16: F16 input is copied bit for bit, BF16 / F32 rounded to nearest.
  const f16 = (name: string, shape: number[]): void => {
    const t = check(name, shape);
    const size = t.dtype === "F32" ? 4 : 2;
    const n = shape.reduce((a, b) => a * b, 1);
    parts.push({
      specs: [{ name, dtype: "F16", shape }],
      fill: (_, write) => {
        const per = Math.floor(CHUNK_BYTES / size);
        for (let i = 0; i < n; i += per) {
          const m = Math.min(per, n - i);
          const bytes = source.read(t.offset + i * size, m * size);
          write(t.dtype === "F16" ? bytes : bytesOf(f32ArrayToF16(sourceToF32(bytes, t.dtype, m))));
        }
      },
    });
  };
  const { dim, vocabSize } = config;
  const shapes = matrixShapes(config);
  // Progress counts weights: every layer's matrices, then the head (most of the work).
  const perLayer = opts.quant !== "fp16" ? QUANT_MATRICES.reduce((n, m) => n + shapes[m][0] * shapes[m][1], 0) : 0;
  const layerPrefixes = allLayerPrefixes(config);
  const total = perLayer * layerPrefixes.length + (head !== "fp16" ? vocabSize * dim : 0);
  let before = 0;
  const quantized = (base: string, bits: QuantMatrix["bits"], rows: number, cols: number, group: number, src: string, what: string): void => {
    const t = check(src, [rows, cols]);
    checkFormat(what, bits, cols, group);
    const format: MatrixFormat = { bits, groupSize: group, cols };
    const rowBytes = cols * (t.dtype === "F32" ? 4 : 2);
    let made: Uint8Array[] = [];
    parts.push({
      specs: quantTensorShapes(base, bits, rows, cols, group).map(([name, dtype, shape]) => ({ name, dtype, shape })),
      fill: (k, write) => {
        if (k === 0) {
          const ng = cols / group;
          const out: QuantRows = {
            qweight: outputs.qweight.take((rows * cols * bits) / 8),
            scales: new Uint16Array(outputs.scales.take(rows * ng * 2).buffer, 0, rows * ng),
            zeros: bits === 2 ? new Uint16Array(outputs.zeros.take(rows * ng * 2).buffer, 0, rows * ng) : undefined,
          };
          const per = Math.max(1, Math.floor(CHUNK_BYTES / rowBytes));
          for (let r = 0; r < rows; r += per) {
            const n = Math.min(per, rows - r);
            const part: QuantRows = {
              qweight: out.qweight.subarray((r * cols * bits) / 8, ((r + n) * cols * bits) / 8),
              scales: out.scales.subarray(r * ng, (r + n) * ng),
              zeros: out.zeros?.subarray(r * ng, (r + n) * ng),
            };
            quantizer.quantizeRows(format, t.dtype, source.read(t.offset + r * rowBytes, n * rowBytes), n, part, what);
            opts.onProgress?.(before + (r + n) * cols, total);
          }
          before += rows * cols;
          made = [out.qweight, out.scales, ...(out.zeros ? [out.zeros] : [])].map(bytesOf);
        }
        write(made[k]);
      },
    });
  };

  const tied = !file.tensors.has("output.weight");
  // A tied model with a quantized head keeps one copy of its matrix: the
  // head's rows serve as the embedding too, so the file holds no fp16 copy.
  const embeddingFromHead = tied && head !== "fp16";
  if (!embeddingFromHead) f16("tok_embeddings.weight", [vocabSize, dim]);
  const sandwich = config.normLayout !== "pre";
  for (const p of layerPrefixes) {
    f16(`${p}attn_norm.weight`, [dim]);
    if (config.qkBias) {
      f16(`${p}wq.bias`, [config.nHeads * config.headDim]);
      f16(`${p}wk.bias`, [config.nKvHeads * config.headDim]);
    }
    for (const m of QUANT_MATRICES) {
      const [rows, cols] = shapes[m];
      const name = `${p}${m}`;
      if (m === "w1") {
        if (sandwich) f16(`${p}attn_out_norm.weight`, [dim]);
        f16(`${p}ffn_norm.weight`, [dim]);
      }
      const format = matrixQuant(config, m);
      if (format === "fp16") f16(`${name}.weight`, [rows, cols]);
      else quantized(name, BLOCK_BITS[format], rows, cols, groupSize, `${name}.weight`, `${where}: ${name}`);
    }
    if (sandwich) f16(`${p}ffn_out_norm.weight`, [dim]);
  }
  // The input injection's adapter stays fp16 in every weight format (kernels/loopserve.h).
  if (config.injection === "adapter") f16("adapter.weight", [dim, 2 * dim]);
  f16("norm.weight", [dim]);
  const exitGate = file.tensors.has("exit_gate.weight");
  if (exitGate) {
    f16("exit_gate.weight", [1, dim]);
    f16("exit_gate.bias", [1]);
  }

  let headKind: HeadQuant | "tied";
  if (head !== "fp16") {
    // A tied model's head is the embedding: its quantized copy becomes output.qweight.
    const src = tied ? "tok_embeddings.weight" : "output.weight";
    quantized("output", HEAD_BITS[head], vocabSize, dim, headGroupSize, src, `${where}: ${src} (${head} head)`);
    headKind = head;
  } else if (tied) {
    headKind = "tied";
  } else {
    f16("output.weight", [vocabSize, dim]);
    headKind = "fp16";
  }

  const metadata: Record<string, string> = { ...file.metadata, ...configToMetadata(config), ...headMeta };
  const specs = parts.flatMap((part) => part.specs);
  const partOf = parts.flatMap((part) => part.specs.map((_, k) => ({ part, k })));
  let bytes: number;
  try {
    bytes = writeSafetensorsStream(outPath, metadata, specs, (_, i, write) => partOf[i].part.fill(partOf[i].k, write));
  } finally {
    source.close();
  }
  return {
    path: outPath,
    bytes,
    inputBytes: statSync(inPath).size,
    config: { ...config, tiedOutput: headKind === "tied", headQuant: head, headGroupSize: head === "fp16" ? 0 : headGroupSize, embeddingFromHead, exitGate },
    head: headKind,
  };
}
