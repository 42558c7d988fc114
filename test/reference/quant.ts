// The quantized kernels' arithmetic in plain TypeScript, for the reference
// forward pass and the kernel tests: weights dequantized exactly, and each
// activation row quantized to int8 as the kernels quantize it.
import { F16_TO_F32 } from "../../src/model/fp16.ts";
import type { QuantMatrix } from "../../src/model/format.ts";
import { rne } from "../../src/model/quantize.ts";

// ---- reading codes back ----

/** The code of input i of row r: signed for int4 / int6 / int8, 0..3 for int2. */
export function codeAt(q: QuantMatrix, r: number, i: number): number {
  const idx = r * q.cols + i;
  if (q.bits === 8) return (q.qweight[idx] << 24) >> 24;
  if (q.bits === 4) return ((q.qweight[idx >> 1] >> ((idx & 1) * 4)) & 0xf) - 8;
  if (q.bits === 2) return (q.qweight[idx >> 2] >> ((idx & 3) * 2)) & 3;
  // int6: the row's nibbles, then its high bits in 16-byte blocks per 64 inputs.
  const row = (r * q.cols * 3) / 4;
  const j = (i & 63) >> 1;
  const lo = (q.qweight[row + (i >> 1)] >> ((i & 1) * 4)) & 0xf;
  const hi = (q.qweight[row + q.cols / 2 + 16 * (i >> 6) + (j & 15)] >> (4 * (j >> 4) + 2 * (i & 1))) & 3;
  return (lo | (hi << 4)) - 32;
}

/** Dequantized weights, row-major; exact (fp16 scale times a small integer, plus an fp16 offset, fit a double). */
export function dequantize(q: QuantMatrix): Float64Array {
  const out = new Float64Array(q.rows * q.cols);
  const ng = q.cols / q.groupSize;
  for (let r = 0; r < q.rows; r++) {
    for (let i = 0; i < q.cols; i++) {
      const g = r * ng + Math.floor(i / q.groupSize);
      const s = F16_TO_F32[q.scales[g]];
      const v = s * codeAt(q, r, i);
      out[r * q.cols + i] = q.zeros ? v + F16_TO_F32[q.zeros[g]] : v;
    }
  }
  return out;
}

// ---- activations, as the kernels quantize them ----

export interface QuantizedRow {
  q: Int8Array; // codes in [-127, 127]
  d: number; // fp32 scale: x ~= d * q
}

/**
 * One activation row quantized exactly as kernels/cpu/portable/quant_portable.c does it
 * in fp32: amax = max|x|, d = amax / 127, q = rne(x * (127 / amax)). The
 * inputs are rounded to fp32 first (the kernels hold activations in fp32),
 * and each fp32 operation is emulated with Math.fround.
 */
export function quantizeActivations(x: ArrayLike<number>): QuantizedRow {
  const n = x.length;
  const xf = new Float32Array(n);
  let amax = 0;
  for (let i = 0; i < n; i++) {
    xf[i] = x[i];
    amax = Math.max(amax, Math.abs(xf[i]));
  }
  const id = amax > 0 ? Math.fround(127 / amax) : 0;
  const q = new Int8Array(n);
  for (let i = 0; i < n; i++) q[i] = Math.min(127, Math.max(-127, rne(Math.fround(xf[i] * id))));
  return { q, d: Math.fround(amax / 127) };
}

/**
 * y = W x the way the quantized kernels compute it, in double precision:
 * x quantized per row (quantizeActivations), multiplied by the dequantized
 * weights `deq` (rows, cols), scaled back by d. Differs from the kernels
 * only by their fp32 rounding.
 */
export function quantizedMatvec(deq: Float32Array | Float64Array, rows: number, cols: number, x: ArrayLike<number>): Float64Array {
  const { q, d } = quantizeActivations(x);
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    const base = r * cols;
    for (let c = 0; c < cols; c++) s += deq[base + c] * q[c];
    y[r] = s * d;
  }
  return y;
}
