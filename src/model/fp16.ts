// IEEE 754 binary16 (fp16) and bfloat16 conversions.
//
// The kernels store weights and the K/V cache in fp16, so the TypeScript
// side (artifact writer, reference forward pass) must round exactly as the C
// code does: round to nearest, ties to even, overflow to infinity, NaN kept
// NaN (quiet). Everything here is exact; nothing goes through Math.log2.

// ---- scalar: number -> fp16 bits ----

const TWO_POW_24 = 16777216; // 2^24: one fp16 subnormal step is 2^-24

/** Rounds v to the nearest integer, ties to even. v must be >= 0. */
function roundHalfEven(v: number): number {
  const f = Math.floor(v);
  const d = v - f; // exact: v < 2^12 wherever this is called
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/**
 * Rounds any JS number (an f64) to the nearest fp16 and returns its 16 bits.
 * One rounding step: exact for f64 inputs, hence also for f32 inputs.
 */
export function f64ToF16Bits(x: number): number {
  if (Number.isNaN(x)) return 0x7e00;
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const a = Math.abs(x);
  // 65520 is halfway between 65504 (largest finite) and 65536 (2^16):
  // ties go to the even mantissa, which is the overflow to infinity.
  if (a >= 65520) return sign | 0x7c00;
  if (a < 6.103515625e-5) {
    // Subnormal (or zero): a multiple of 2^-24. Scaling by 2^24 is exact, and
    // a rounded result of 1024 is the smallest normal, whose bits are 0x400.
    return sign | roundHalfEven(a * TWO_POW_24);
  }
  // Normal: find e with 2^e <= a < 2^(e+1) without trusting Math.log2.
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e -= 1;
  else if (2 ** (e + 1) <= a) e += 1;
  let m = roundHalfEven((a / 2 ** e) * 1024); // in [1024, 2048]; powers of two scale exactly
  if (m === 2048) {
    m = 1024;
    e += 1;
  }
  if (e > 15) return sign | 0x7c00;
  return sign | ((e + 15) << 10) | (m - 1024);
}

/** Rounds an fp32 value (a number already representable as f32) to fp16 bits. */
export function f32ToF16Bits(x: number): number {
  return f64ToF16Bits(Math.fround(x));
}

// ---- scalar: fp16 / bf16 bits -> number ----

/** Decodes 16 fp16 bits to a number (exact). */
export function f16BitsToNumber(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 31) return m === 0 ? sign * Infinity : NaN;
  return sign * (1024 + m) * 2 ** (e - 25);
}

/** Every fp16 bit pattern decoded once: bulk decoding is one table lookup. */
export const F16_TO_F32: Float32Array = (() => {
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) t[h] = f16BitsToNumber(h);
  return t;
})();

/** Rounds x to the nearest fp16 value and returns it as a number. */
export function roundToF16(x: number): number {
  return F16_TO_F32[f64ToF16Bits(x)];
}

const bf16Scratch = new Float32Array(1);
const bf16ScratchBits = new Uint32Array(bf16Scratch.buffer);

/** Decodes 16 bfloat16 bits (the top half of an fp32) to a number. */
export function bf16BitsToNumber(b: number): number {
  bf16ScratchBits[0] = (b & 0xffff) << 16;
  return bf16Scratch[0];
}

// ---- bulk ----

/** Decodes fp16 bits into a new (or the given) Float32Array; exact. */
export function f16ArrayToF32(src: Uint16Array, out: Float32Array = new Float32Array(src.length)): Float32Array {
  if (out.length < src.length) throw new RangeError(`output holds ${out.length} values, need ${src.length}`);
  for (let i = 0; i < src.length; i++) out[i] = F16_TO_F32[src[i]];
  return out;
}

/** Decodes bfloat16 bits into a new (or the given) Float32Array; exact. */
export function bf16ArrayToF32(src: Uint16Array, out: Float32Array = new Float32Array(src.length)): Float32Array {
  if (out.length < src.length) throw new RangeError(`output holds ${out.length} values, need ${src.length}`);
  const bits = new Uint32Array(out.buffer, out.byteOffset, src.length);
  for (let i = 0; i < src.length; i++) bits[i] = src[i] << 16;
  return out;
}

/**
 * Rounds fp32 values to fp16 bits (nearest, ties to even) into a new (or the
 * given) Uint16Array. Works on the fp32 bit patterns, so it is fast enough
 * for whole embedding matrices; it agrees with f32ToF16Bits on every input.
 */
export function f32ArrayToF16(src: Float32Array, out: Uint16Array = new Uint16Array(src.length)): Uint16Array {
  if (out.length < src.length) throw new RangeError(`output holds ${out.length} values, need ${src.length}`);
  const bits = new Uint32Array(src.buffer, src.byteOffset, src.length);
  for (let i = 0; i < src.length; i++) out[i] = f32BitsToF16Bits(bits[i]);
  return out;
}

/** Rounds numbers (f64) to fp16 bits, one exact rounding each. */
export function f64ArrayToF16(src: ArrayLike<number>, out: Uint16Array = new Uint16Array(src.length)): Uint16Array {
  if (out.length < src.length) throw new RangeError(`output holds ${out.length} values, need ${src.length}`);
  for (let i = 0; i < src.length; i++) out[i] = f64ToF16Bits(src[i]);
  return out;
}

const denormScratch = new Float32Array(1);
const denormScratchBits = new Uint32Array(denormScratch.buffer);
// 0.5f: adding it to a value below 2^-14 leaves the fp16 subnormal code,
// already rounded to nearest-even by the fp32 addition, in the low bits.
const DENORM_MAGIC_BITS = (127 - 15 + 23 - 10 + 1) << 23;
const DENORM_MAGIC = 0.5;

/**
 * fp32 bits -> fp16 bits, round to nearest even (F. Giesen's
 * float_to_half_fast3_rtne, written for 32-bit integer arithmetic).
 */
export function f32BitsToF16Bits(f: number): number {
  const sign = (f >>> 16) & 0x8000;
  let a = f & 0x7fffffff;
  if (a >= 0x47800000) {
    // >= 2^16 (infinity after rounding), Inf or NaN
    return sign | (a > 0x7f800000 ? 0x7e00 : 0x7c00);
  }
  if (a < 0x38800000) {
    // below 2^-14: fp16 subnormal or zero. The f64 sum of two f32 values in
    // this range is exact, so fround rounds exactly once, as fp32 addition does.
    denormScratchBits[0] = a;
    denormScratch[0] = Math.fround(denormScratch[0] + DENORM_MAGIC);
    return sign | ((denormScratchBits[0] - DENORM_MAGIC_BITS) & 0xffff);
  }
  const mantOdd = (a >>> 13) & 1;
  // Rebias the exponent, add 0xfff + the odd bit (ties to even); a carry out
  // of the mantissa bumps the exponent, up to infinity (0x7c00) for 65520+.
  a = a - ((127 - 15) << 23) + 0xfff + mantOdd; // stays positive: a >= 2^-14 here
  return sign | (a >>> 13);
}
