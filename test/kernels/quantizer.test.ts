// The kernel library's weight quantizer (kernels/cpu/quantize.c, ls_quantize
// through NativeQuantizer) against the reference quantizer
// (src/model/quantize.ts): every format, group and input type, on every SIMD
// path this CPU has and several thread counts, byte for byte, on weights with
// the awkward groups in them; its refusals; and whole model files made either
// way.
import { beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { NativeQuantizer } from "../../src/engine/binding.ts";
import type { SimdChoice } from "../../src/engine/types.ts";
import { f32ArrayToF16 } from "../../src/model/fp16.ts";
import type { QuantMatrix } from "../../src/model/format.ts";
import { type MatrixFormat, type QuantRows, quantizeModelFile, referenceQuantizer, type SourceDtype } from "../../src/model/quantize.ts";
import { ModelFormatError } from "../../src/model/safetensors.ts";
import { ensureLibrary, LIB, pathsWhere } from "../helpers/kernels.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";

let paths: SimdChoice[] = [];

beforeAll(() => {
  ensureLibrary();
  paths = pathsWhere((simd) => {
    try {
      NativeQuantizer.open(LIB, 1, simd).close();
      return null;
    } catch (e) {
      return (e as Error).message;
    }
  });
});

/** Deterministic weights, each row of its own kind of awkward group (see below), the rest random with outliers. */
function weights(rows: number, cols: number, seed: number): Float32Array {
  let s = seed >>> 0;
  const u = () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32 - 0.5;
  };
  const w = Float32Array.from({ length: rows * cols }, () => u() * 0.1 * (u() > 0.4 ? 1 : 12));
  const row = (r: number, f: (i: number) => number) => {
    if (r < rows) for (let i = 0; i < cols; i++) w[r * cols + i] = f(i);
  };
  // Quotients exactly halfway between codes: at a scale of 3/8, whose
  // reciprocal is inexact, and of 1/8 (int4, k = 2 of the scale search).
  row(0, (i) => ((i % 15) - 7) * 0.1875 + (i % 15 === 14 ? 0.0 : 0.09375));
  row(1, (i) => ((i % 16) - 8 + 0.5) * 0.125);
  row(2, () => 0); // all zero
  row(3, (i) => (i % 3 === 0 ? -0 : 0.25)); // constant, with negative zeros
  row(4, (i) => ((i % 32) - 16) * 2 ** -26); // scales in fp16's subnormals
  row(5, (i) => (i % 4) * 0.5 - 1); // exactly int2's four levels
  row(6, (i) => (i % 32 === 5 ? -3 : u() * 0.01)); // one negative extreme per group
  row(7, (i) => (i % 32 === 9 ? 6e4 : u())); // large, still within fp16
  return w;
}

function outputs(f: MatrixFormat, rows: number): QuantRows {
  const ng = (rows * f.cols) / f.groupSize;
  return { qweight: new Uint8Array((rows * f.cols * f.bits) / 8), scales: new Uint16Array(ng), zeros: f.bits === 2 ? new Uint16Array(ng) : undefined };
}

function sourceBytes(w: Float32Array, dtype: SourceDtype): Uint8Array {
  if (dtype === "F32") return new Uint8Array(w.buffer, w.byteOffset, w.byteLength);
  if (dtype === "F16") return new Uint8Array(f32ArrayToF16(w).buffer);
  const bits = new Uint32Array(w.buffer, w.byteOffset, w.length);
  return new Uint8Array(Uint16Array.from(bits, (b) => b >>> 16).buffer); // the top halves: bf16 values
}

function quantizeWith(q: typeof referenceQuantizer, f: MatrixFormat, dtype: SourceDtype, src: Uint8Array, rows: number): QuantRows {
  const out = outputs(f, rows);
  q.quantizeRows(f, dtype, src, rows, out, "m");
  return out;
}

function expectSameRows(got: QuantRows, want: QuantRows, what: string): void {
  const same = (a: Uint8Array | Uint16Array, b: Uint8Array | Uint16Array) => a.length === b.length && a.every((v, i) => v === b[i]);
  expect({ what, qweight: same(got.qweight, want.qweight), scales: same(got.scales, want.scales), zeros: same(got.zeros ?? new Uint16Array(0), want.zeros ?? new Uint16Array(0)) }).toEqual({
    what,
    qweight: true,
    scales: true,
    zeros: true,
  });
}

const FORMATS: [QuantMatrix["bits"], number[]][] = [
  [4, [32, 64, 128, 256]],
  [2, [32, 64, 256]],
  [6, [32, 64]],
  [8, [32, 128]],
];

describe("the library's quantizer gives the reference quantizer's bytes", () => {
  test("every format and group, F32, F16 and BF16 rows, on every SIMD path, on awkward and random groups", () => {
    for (const simd of paths) {
      const q = NativeQuantizer.open(LIB, 2, simd);
      expect(q.simd).toBe(simd);
      for (const [bits, groups] of FORMATS)
        for (const groupSize of groups)
          for (const [rows, cols] of [
            [9, 256],
            [13, 512],
          ])
            for (const dtype of ["F32", "F16", "BF16"] as const) {
              const f: MatrixFormat = { bits, groupSize, cols };
              const w = weights(rows, cols, rows * 131 + bits);
              if (bits === 8) w.fill(0.5, 3 * cols, 4 * cols); // int8 refuses a NaN group, and row 3 has none
              const src = sourceBytes(w, dtype);
              expectSameRows(quantizeWith(q, f, dtype, src, rows), quantizeWith(referenceQuantizer, f, dtype, src, rows), `${simd} int${bits} g${groupSize} ${rows}x${cols} ${dtype}`);
            }
      q.close();
    }
  });

  test("a NaN weight zeroes its group in int4, int6 and int2, as in the reference", () => {
    const cols = 128;
    const w = weights(4, cols, 7);
    w[cols + 3] = NaN;
    for (const simd of paths) {
      const q = NativeQuantizer.open(LIB, 1, simd);
      for (const bits of [4, 6, 2] as const) {
        const f: MatrixFormat = { bits, groupSize: 32, cols };
        const got = quantizeWith(q, f, "F32", new Uint8Array(w.buffer), 4);
        expectSameRows(got, quantizeWith(referenceQuantizer, f, "F32", new Uint8Array(w.buffer), 4), `${simd} int${bits}`);
        expect(got.scales[cols / 32]).toBe(0);
      }
      q.close();
    }
  });

  test("neither the thread count nor the rows of a call change a byte", () => {
    const [rows, cols] = [300, 768]; // several tasks of rows, the last one short
    const w = weights(rows, cols, 3);
    const src = new Uint8Array(w.buffer);
    for (const bits of [4, 2] as const) {
      const f: MatrixFormat = { bits, groupSize: 64, cols };
      const want = quantizeWith(referenceQuantizer, f, "F32", src, rows);
      for (const threads of [1, 3]) {
        const q = NativeQuantizer.open(LIB, threads, "auto");
        expectSameRows(quantizeWith(q, f, "F32", src, rows), want, `${threads} threads int${bits}`);
        // Rows [0, 7) and [7, rows) in two calls.
        const a = quantizeWith(q, f, "F32", src.subarray(0, 7 * cols * 4), 7);
        const b = quantizeWith(q, f, "F32", src.subarray(7 * cols * 4), rows - 7);
        expectSameRows(
          {
            qweight: Uint8Array.from([...a.qweight, ...b.qweight]),
            scales: Uint16Array.from([...a.scales, ...b.scales]),
            zeros: a.zeros && b.zeros ? Uint16Array.from([...a.zeros, ...b.zeros]) : undefined,
          },
          want,
          `${threads} threads, two calls, int${bits}`,
        );
        q.close();
      }
    }
  });
});

describe("what the library's quantizer refuses", () => {
  const refusal = (f: MatrixFormat, w: Float32Array, rows: number): string => {
    const q = NativeQuantizer.open(LIB, 2, "auto");
    try {
      quantizeWith(q, f, "F32", sourceBytes(w, "F32"), rows);
      return "";
    } catch (e) {
      expect(e).toBeInstanceOf(ModelFormatError);
      return (e as Error).message;
    } finally {
      q.close();
    }
  };

  test("weights no fp16 scale or offset holds, naming the first such row and group", () => {
    const w = weights(6, 64, 1);
    w[4 * 64 + 40] = 1e9;
    w[5 * 64 + 1] = Infinity;
    expect(refusal({ bits: 4, groupSize: 32, cols: 64 }, w, 6)).toMatch(/^m: row 4, group 1: a group's scale 125000000 does not fit in fp16/);
    expect(refusal({ bits: 6, groupSize: 32, cols: 64 }, w, 6)).toMatch(/^m: row 4, group 1: a group's scale .* does not fit in fp16/);
    expect(refusal({ bits: 2, groupSize: 32, cols: 64 }, w, 6)).toMatch(/^m: row 4, group 1: weights \[.*, 1e\+09\] do not fit in fp16 offsets/);
    expect(refusal({ bits: 2, groupSize: 32, cols: 64 }, w.subarray(5 * 64), 1)).toMatch(/^m: row 0, group 0: weights \[.*, inf\] do not fit/);
    const nan = weights(2, 64, 1);
    nan[64 + 33] = NaN; // int8 alone refuses a NaN (its scale would be one)
    expect(refusal({ bits: 8, groupSize: 32, cols: 64 }, nan, 2)).toMatch(/^m: row 1, group 1: a group's scale nan does not fit in fp16/);
  });

  test("parameters out of range, with the reason", () => {
    const w = new Float32Array(256);
    expect(refusal({ bits: 3 as 4, groupSize: 32, cols: 64 }, w, 4)).toMatch(/bits must be 2, 4, 6 or 8, got 3/);
    expect(refusal({ bits: 4, groupSize: 48, cols: 96 }, w, 2)).toMatch(/group must be a power of two in \[32, 256\], got 48/);
    expect(refusal({ bits: 4, groupSize: 64, cols: 96 }, w, 2)).toMatch(/cols 96 must be in 1\.\.262144 and a multiple of the group 64/);
    expect(refusal({ bits: 6, groupSize: 32, cols: 96 }, w, 2)).toMatch(/and of 64 \(int6\)/);
  });
});

describe("model files", () => {
  test("quantizeModelFile writes the same bytes with the library's quantizer as with the reference: int4, int2, an int4 head, a tied stack", () => {
    const dir = testTempDir();
    const plain = tinyModelPath({ vocabSize: 1000 });
    const stack = tinyModelPath({ vocabSize: 1000, tiedOutput: true, nLayers: 2, sandwichNorm: true });
    const q = NativeQuantizer.open(LIB, 2, "auto");
    const cases: [string, Parameters<typeof quantizeModelFile>[2]][] = [
      [plain, { quant: "int4" }],
      [plain, { quant: "int2", head: "int8", groupSize: 64 }],
      [plain, { quant: "fp16", head: "int4" }],
      [stack, { quant: "int4", head: "int6" }],
    ];
    cases.forEach(([src, opts], i) => {
      const a = join(dir, `quantizer-ref-${i}.safetensors`);
      const b = join(dir, `quantizer-lib-${i}.safetensors`);
      quantizeModelFile(src, a, opts);
      quantizeModelFile(src, b, { ...opts, quantizer: q });
      expect(readFileSync(b).equals(readFileSync(a))).toBe(true);
    });
    q.close();
  });
});
