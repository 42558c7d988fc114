import { describe, expect, test } from "bun:test";
import {
  bf16ArrayToF32,
  bf16BitsToNumber,
  F16_TO_F32,
  f16ArrayToF32,
  f16BitsToNumber,
  f32ArrayToF16,
  f32BitsToF16Bits,
  f32ToF16Bits,
  f64ArrayToF16,
  f64ToF16Bits,
  roundToF16,
} from "../../src/model/fp16.ts";

describe("fp16", () => {
  test("known encodings, including ties to even, subnormals and overflow", () => {
    const cases: [number, number][] = [
      [0, 0x0000],
      [-0, 0x8000],
      [1, 0x3c00],
      [-2, 0xc000],
      [0.5, 0x3800],
      [65504, 0x7bff], // largest finite
      [65519.99, 0x7bff],
      [65520, 0x7c00], // halfway to 2^16: ties to even = infinity
      [Infinity, 0x7c00],
      [-Infinity, 0xfc00],
      [2 ** -14, 0x0400], // smallest normal
      [2 ** -24, 0x0001], // smallest subnormal
      [2 ** -25, 0x0000], // halfway to the smallest subnormal: ties to even (0)
      [3 * 2 ** -25, 0x0002], // halfway between 1 and 2 subnormal steps: to even (2)
      [2 ** -25 + 2 ** -40, 0x0001], // just above halfway rounds up
      [1 + 2 ** -11, 0x3c00], // halfway between 1 and 1+2^-10: even mantissa
      [1 + 3 * 2 ** -11, 0x3c02], // halfway between odd and even: up to even
      [1 + 2 ** -11 + 2 ** -30, 0x3c01], // above halfway
      [(2 ** -14) * (1 - 2 ** -11), 0x0400], // rounds up across the subnormal/normal boundary
      [2047.5, 0x6800], // halfway between 2047 (0x67ff, odd) and 2048 (0x6800, even)
    ];
    for (const [x, bits] of cases) {
      expect({ x, bits: f64ToF16Bits(x) }).toEqual({ x, bits });
    }
    expect(f64ToF16Bits(NaN) & 0x7c00).toBe(0x7c00);
    expect(f64ToF16Bits(NaN) & 0x3ff).not.toBe(0);
  });

  test("decoding every bit pattern and encoding it again is the identity (NaNs stay NaN)", () => {
    for (let h = 0; h < 65536; h++) {
      const v = f16BitsToNumber(h);
      expect(F16_TO_F32[h]).toBe(Number.isNaN(v) ? NaN : v);
      if (Number.isNaN(v)) {
        expect(Number.isNaN(f16BitsToNumber(f64ToF16Bits(v)))).toBe(true);
      } else if (f64ToF16Bits(v) !== h) {
        throw new Error(`round trip of 0x${h.toString(16)} gave 0x${f64ToF16Bits(v).toString(16)}`);
      }
    }
  });

  test("bulk fp32 -> fp16 (bit tricks) agrees with the exact scalar rounding", () => {
    // Every exponent and sign, many mantissas, and the low bits that decide
    // rounding: exact, just below / at / just above halfway, odd and even.
    const lows = [0, 1, 0xfff, 0x1000, 0x1001, 0x1fff, 0x0800, 0x17ff];
    const bits = new Uint32Array(2 * 256 * 128 * lows.length);
    let n = 0;
    for (let sign = 0; sign < 2; sign++)
      for (let e = 0; e < 256; e++)
        for (let m = 0; m < 1024; m += 8)
          for (const lo of lows) bits[n++] = ((sign << 31) | (e << 23) | (m << 13) | lo | (m & 8 ? 0x2000 : 0)) >>> 0;
    const f32 = new Float32Array(bits.buffer);
    const fast = f32ArrayToF16(f32);
    for (let i = 0; i < f32.length; i++) {
      const x = f32[i];
      const want = f32ToF16Bits(x);
      if (Number.isNaN(x)) {
        expect(Number.isNaN(f16BitsToNumber(fast[i]))).toBe(true);
      } else if (fast[i] !== want) {
        throw new Error(`f32 bits 0x${bits[i].toString(16)} (${x}): fast 0x${fast[i].toString(16)}, exact 0x${want.toString(16)}`);
      }
      expect(f32BitsToF16Bits(bits[i])).toBe(fast[i]);
    }
  });

  // Bun ships Math.f16round (ES2025): an independent oracle where present.
  const f16round = (Math as unknown as { f16round?: (x: number) => number }).f16round;
  test.skipIf(f16round === undefined)("agrees with Math.f16round on random f64 and f32 inputs", () => {
    let state = 12345;
    const next = () => {
      state = (Math.imul(state, 1103515245) + 12345) >>> 0;
      return state;
    };
    const f32bits = new Uint32Array(1);
    const f32 = new Float32Array(f32bits.buffer);
    for (let i = 0; i < 1_000_000; i++) {
      // f64 with a random exponent in the fp16 range and beyond, random mantissa
      const x = (next() / 2 ** 32 + next() / 2 ** 64) * 2 ** ((next() % 60) - 30) * (next() & 1 ? -1 : 1);
      const want = f16round!(x);
      if (f16BitsToNumber(f64ToF16Bits(x)) !== want) throw new Error(`f64 ${x}: got ${roundToF16(x)}, want ${want}`);
      f32bits[0] = next();
      const y = f32[0];
      const wantY = f16round!(y);
      const got = f16BitsToNumber(f32BitsToF16Bits(f32bits[0]));
      if (!(got === wantY || (Number.isNaN(got) && Number.isNaN(wantY)))) {
        throw new Error(`f32 bits 0x${f32bits[0].toString(16)}: got ${got}, want ${wantY}`);
      }
    }
  });

  test("bulk helpers: f16 -> f32, f64 -> f16, roundToF16", () => {
    const h = new Uint16Array([0x3c00, 0xc000, 0x0001, 0x7bff]);
    expect([...f16ArrayToF32(h)]).toEqual([1, -2, 2 ** -24, 65504]);
    expect([...f64ArrayToF16([1, -2, 2 ** -24, 65504])]).toEqual([...h]);
    expect(roundToF16(0.1)).toBe(0.0999755859375);
    expect(roundToF16(1 / 3)).toBe(f16BitsToNumber(0x3555));
  });

  test("bf16 decodes as the top half of an fp32", () => {
    expect(bf16BitsToNumber(0x3f80)).toBe(1);
    expect(bf16BitsToNumber(0xc040)).toBe(-3);
    expect(bf16BitsToNumber(0x7f80)).toBe(Infinity);
    expect([...bf16ArrayToF32(new Uint16Array([0x3f80, 0x4000, 0xbf00]))]).toEqual([1, 2, -0.5]);
  });
});
