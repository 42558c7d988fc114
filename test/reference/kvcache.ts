// The key/value cache row encodings and the Walsh–Hadamard rotation exactly
// as kernels/cpu/kvcache.c computes them (the modes: src/model/kvcache.ts), so
// the reference forward pass stores what the kernels store and tests can
// compare the C encoder with this one bit for bit.
//
// fp32 arithmetic is emulated with Math.fround after every operation; a sum,
// difference, product or quotient of two fp32 values computed in float64 and
// then rounded to fp32 is the correctly rounded fp32 result (53 >= 2 * 24 + 2),
// so this is exact, not approximate.
import { LS_KV_INT4_GROUP } from "../../src/abi/abi.generated.ts";
import { f16BitsToNumber, f32ToF16Bits, roundToF16 } from "../../src/model/fp16.ts";
import { type KvCacheMode, type KvFormat, type KvModeSpec, kvModeSpec } from "../../src/model/kvcache.ts";

/** int4: values per scale/offset pair along head_dim. */
export const KV_GROUP = LS_KV_INT4_GROUP;

// ---- sizes ----

/** Code bytes of one row (one loop, position, kv head: head_dim values of K or V). */
export function kvCodeBytes(format: KvFormat, headDim: number): number {
  return format === "int8" ? headDim : format === "int4" ? headDim / 2 : 0;
}

/** fp16 parameters of one row: int8 one scale; int4 a scale and an offset per group. */
export function kvParamCount(format: KvFormat, headDim: number): number {
  return format === "int8" ? 1 : format === "int4" ? 2 * Math.ceil(headDim / KV_GROUP) : 0;
}

/** Bytes one row takes in the cache (allocation padding aside). */
export function kvRowBytes(format: KvFormat, headDim: number): number {
  return format === "fp16" ? 2 * headDim : kvCodeBytes(format, headDim) + 2 * kvParamCount(format, headDim);
}

/** Cache bytes one token (position) takes: K and V rows of every kv head in every loop. */
export function kvBytesPerToken(mode: KvCacheMode, shape: { loops: number; nKvHeads: number; headDim: number }): number {
  return shape.loops * shape.nKvHeads * 2 * kvRowBytes(kvModeSpec(mode).format, shape.headDim);
}

// ---- rows (kernels/cpu/kvcache.c) ----

const f = Math.fround;

function scaleBits(x: number): number {
  let b = f32ToF16Bits(x);
  if (b >= 0x7c00) b = 0x7bff;
  if (b === 0 && x > 0) b = 1;
  return b;
}

/** roundf (half away from zero) of y clamped to [lo, hi]; NaN gives lo. */
function codeOf(y: number, lo: number, hi: number): number {
  if (!(y >= lo)) y = lo;
  if (y > hi) y = hi;
  const r = Math.floor(Math.abs(y) + 0.5); // exact: |y| <= 127 has at most 24 significant bits
  return y < 0 ? -r : r;
}

export interface EncodedRow {
  codes: Uint8Array; // kvCodeBytes
  params: Uint16Array; // kvParamCount fp16 bit patterns
}

/** Encodes hd fp32 values (ls_kv_encode_row). */
export function encodeKvRow(format: "int8" | "int4", x: ArrayLike<number>, hd: number): EncodedRow {
  const codes = new Uint8Array(kvCodeBytes(format, hd));
  const params = new Uint16Array(kvParamCount(format, hd));
  const v = Float32Array.from({ length: hd }, (_, i) => x[i]);
  if (format === "int8") {
    let amax = 0;
    for (let i = 0; i < hd; i++) if (Math.abs(v[i]) > amax) amax = Math.abs(v[i]);
    const sb = scaleBits(f(amax / 127));
    const s = f16BitsToNumber(sb);
    for (let i = 0; i < hd; i++) codes[i] = (s > 0 ? codeOf(f(v[i] / s), -127, 127) : 0) & 0xff;
    params[0] = sb;
    return { codes, params };
  }
  for (let g0 = 0, g = 0; g0 < hd; g0 += KV_GROUP, g++) {
    const g1 = Math.min(g0 + KV_GROUP, hd);
    let mn = Infinity;
    let mx = -Infinity;
    for (let i = g0; i < g1; i++) {
      if (v[i] < mn) mn = v[i];
      if (v[i] > mx) mx = v[i];
    }
    if (!(mn <= mx)) mn = mx = 0;
    let zb = f32ToF16Bits(mn);
    if ((zb & 0x7fff) >= 0x7c00) zb = (zb & 0x8000) | 0x7bff;
    const z = f16BitsToNumber(zb);
    let d = f(mx - z);
    if (!(d > 0)) d = 0;
    const sb = scaleBits(f(d / 15));
    const s = f16BitsToNumber(sb);
    // byte g0/2 + i: value g0 + i in the low nibble, g0 + half + i in the high one
    const half = (g1 - g0) / 2;
    for (let i = g0; i < g1; i++) {
      const c = s > 0 ? codeOf(f(f(v[i] - z) / s), 0, 15) : 0;
      const k = i - g0;
      codes[g0 / 2 + (k < half ? k : k - half)] |= k < half ? c : c << 4;
    }
    params[2 * g] = sb;
    params[2 * g + 1] = zb;
  }
  return { codes, params };
}

/** The fp32 values a row decodes to (ls_kv_decode_row). */
export function decodeKvRow(format: "int8" | "int4", row: EncodedRow, hd: number): Float32Array {
  const out = new Float32Array(hd);
  if (format === "int8") {
    const s = f16BitsToNumber(row.params[0]);
    for (let i = 0; i < hd; i++) out[i] = ((row.codes[i] << 24) >> 24) * s;
    return out;
  }
  for (let g0 = 0, g = 0; g0 < hd; g0 += KV_GROUP, g++) {
    const half = (Math.min(g0 + KV_GROUP, hd) - g0) / 2;
    const s = f16BitsToNumber(row.params[2 * g]);
    const z = f16BitsToNumber(row.params[2 * g + 1]);
    for (let i = 0; i < half; i++) {
      const b = row.codes[g0 / 2 + i];
      out[g0 + i] = (b & 15) * s + z; // c * s is exact; the Float32Array store rounds the sum once
      out[g0 + half + i] = (b >> 4) * s + z;
    }
  }
  return out;
}

/** In place, fp32: x = H x / sqrt(n), n a power of two (ls_kv_wht). */
export function whtF32(x: Float32Array): Float32Array {
  const n = x.length;
  for (let len = 1; len < n; len <<= 1)
    for (let i = 0; i < n; i += 2 * len)
      for (let j = i; j < i + len; j++) {
        const a = x[j];
        const b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
  const scale = f(1 / Math.sqrt(n));
  for (let i = 0; i < n; i++) x[i] *= scale;
  return x;
}

/** In place, float64: the same orthonormal rotation, for the reference's q and outputs. */
export function whtF64(x: Float64Array, off: number, n: number): void {
  for (let len = 1; len < n; len <<= 1)
    for (let i = 0; i < n; i += 2 * len)
      for (let j = i; j < i + len; j++) {
        const a = x[off + j];
        const b = x[off + j + len];
        x[off + j] = a + b;
        x[off + j + len] = a - b;
      }
  const scale = 1 / Math.sqrt(n);
  for (let i = 0; i < n; i++) x[off + i] *= scale;
}

/**
 * The values attention reads back for one cached head row x (hd values of K
 * or V, RoPE applied), as the kernels compute them: x in fp32, rounded to
 * fp16 first with fp16Qkv, rotated in the H modes, then stored in fp16, or
 * encoded and decoded (the kernels dequantize in registers, in fp32).
 */
export function storedKvRow(spec: KvModeSpec, x: ArrayLike<number>, hd: number): Float64Array {
  const v = Float32Array.from({ length: hd }, (_, i) => x[i]);
  if (spec.hadamard) {
    if (spec.fp16Qkv) for (let i = 0; i < hd; i++) v[i] = roundToF16(v[i]);
    whtF32(v);
  }
  if (spec.format === "fp16") return Float64Array.from(v, roundToF16);
  return Float64Array.from(decodeKvRow(spec.format, encodeKvRow(spec.format, v, hd), hd));
}
