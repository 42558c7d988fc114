// The quantized matmul kernels (kernels/cpu/*/quant_*.c) on their own, through
// test/c/quant_driver.c built with AddressSanitizer + UBSan: every format
// (int4, int2 block; int8, int6, int4 head) on odd shapes against the TypeScript reference
// (dequantize, quantize the activations as the kernels do, multiply in
// double precision), every SIMD path bit-identical to the portable one, and
// the driver's own batch-invariance checks (one token per call, uneven row
// ranges, add mode) on every case. Every format of a path must run the
// kernels its int4 probe ran (no silent fallback, e.g. a failed pack); the
// one fallback there is, a path giving way when its packed copy finds no
// memory, is tested on its own.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { QuantMatrix } from "../../src/model/format.ts";
import { quantizeInt2, quantizeInt4, quantizeInt6, quantizeInt8 } from "../../src/model/quantize.ts";
import { testTempDir } from "../helpers/models.ts";
import { SANITIZED_BUILD_MS, SANITIZER_ENV, sanitizedDriver } from "../helpers/sanitized.ts";
import { dequantize, quantizedMatvec } from "../reference/quant.ts";

// Kernel vs double-precision reference: the kernels add the per-group
// products in fp32, so they differ by fp32 rounding only.
const TOL = 1e-5; // max|c - r| / max|r|
const SIMD = { portable: 1, avx2: 2, avx512: 3 } as const;

setDefaultTimeout(120_000);

/** The driver, linked with the sanitized kernel objects the other sanitizer
 * tests share (test/helpers/sanitized.ts): compiling quant_avx512.c under
 * ASan alone takes minutes. */
let driver = "";

let paths: (keyof typeof SIMD)[] = [];
/** The kernels the driver reports for each path (set by the probe). */
const kernels: Partial<Record<keyof typeof SIMD, string>> = {};

beforeAll(async () => {
  driver = await sanitizedDriver("quant_driver");
  // Paths this CPU has (the driver answers 3 for the others).
  const q = quantizeInt4(new Float32Array(32).fill(0.5), 1, 32);
  for (const p of Object.keys(SIMD) as (keyof typeof SIMD)[]) {
    if (runCase(q, new Float32Array(32).fill(1), 1, p) !== null) paths.push(p);
  }
  expect(paths).toContain("portable");
}, SANITIZED_BUILD_MS);

// ---- cases ----

/** Deterministic weights with the awkward cases in them: an all-zero group, a
 * group dominated by its negative extreme, an outlier, a constant group. */
function weights(rows: number, cols: number, seed: number): Float32Array {
  let s = seed >>> 0;
  const rnd = () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32 - 0.5;
  };
  const w = Float32Array.from({ length: rows * cols }, () => rnd() * 0.25);
  w.fill(0, 0, Math.min(32, w.length)); // row 0, group 0: zeros
  if (rows > 1) w[cols + 3] = -2; // row 1: a negative extreme
  if (rows > 2) w[2 * cols + cols - 1] = 5; // row 2: an outlier in the last group
  if (rows > 3) w.fill(0.125, 3 * cols, 3 * cols + 32); // row 3, group 0: constant
  return w;
}

function activations(T: number, cols: number, seed: number): Float32Array {
  let s = (seed * 7919) >>> 0;
  const x = Float32Array.from({ length: T * cols }, () => {
    s = (Math.imul(s, 22695477) + 1) >>> 0;
    return (s / 2 ** 32 - 0.5) * 6;
  });
  if (T > 1) x.fill(0, cols, 2 * cols); // token 1: all zero (scale 0)
  return x;
}

let n = 0;
/** Runs the driver, with extra ASan options; its output and the kernels it ran, or null when the path is not on
 * this CPU. */
function runDriver(
  q: QuantMatrix,
  x: Float32Array,
  T: number,
  simd: keyof typeof SIMD,
  head: boolean,
  asanOptions = "",
): { y: Float32Array; ran: string } | null {
  const hdr = new Int32Array([0x3151534c, q.bits, q.groupSize, q.rows, q.cols, T, SIMD[simd], head ? 1 : 0]);
  const parts: Uint8Array[] = [
    new Uint8Array(hdr.buffer),
    q.qweight,
    new Uint8Array(q.scales.buffer, q.scales.byteOffset, q.scales.byteLength),
  ];
  if (q.zeros) parts.push(new Uint8Array(q.zeros.buffer, q.zeros.byteOffset, q.zeros.byteLength));
  parts.push(new Uint8Array(x.buffer, x.byteOffset, x.byteLength));
  const casePath = join(testTempDir(), `quant-case-${n}.bin`);
  const outPath = join(testTempDir(), `quant-out-${n++}.bin`);
  writeFileSync(casePath, Buffer.concat(parts));
  const r = Bun.spawnSync([driver, casePath, outPath], {
    env: { ...SANITIZER_ENV, ASAN_OPTIONS: `${SANITIZER_ENV.ASAN_OPTIONS}${asanOptions}` },
    stdout: "pipe",
    stderr: "pipe",
  });
  const out = r.stdout.toString();
  // ASan's note that it refused an allocation over max_allocation_size_mb
  // (the driver then gets NULL): what a test with that option asks for.
  const stderr = r.stderr.toString().replace(/^==\d+==WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]+ bytes\n/gm, "");
  if (r.exitCode === 3) return null;
  if (r.exitCode !== 0 || /Sanitizer|runtime error/.test(stderr)) {
    throw new Error(`driver exit ${r.exitCode} (${simd}, bits ${q.bits}, ${q.rows}x${q.cols}, T ${T}):\n${out}${r.stderr}`);
  }
  const bytes = readFileSync(outPath);
  const ran = out.trim().split(" ")[1]; // "ok <kernels>"
  return { y: new Float32Array(bytes.buffer, bytes.byteOffset, T * q.rows), ran };
}

/** runDriver for the kernel cases: every case of a path must run the kernels its probe ran. */
function runCase(q: QuantMatrix, x: Float32Array, T: number, simd: keyof typeof SIMD, head = false): Float32Array | null {
  const r = runDriver(q, x, T, simd, head);
  if (!r) return null;
  kernels[simd] ??= r.ran;
  if (r.ran !== kernels[simd]) {
    throw new Error(`${simd}, bits ${q.bits}: ran ${r.ran} kernels, the probe ran ${kernels[simd]}`);
  }
  return r.y;
}

function sameBits(a: Float32Array, b: Float32Array): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

/** Each format: its quantizer, and whether it is an output head's (the head scheme of quant_avx512.c). */
const FORMATS = {
  int4: [quantizeInt4, false],
  int2: [quantizeInt2, false],
  "int8 head": [quantizeInt8, true],
  "int6 head": [quantizeInt6, true],
  "int4 head": [quantizeInt4, true],
} as const;

// [rows, cols, group]: odd row counts (tails of every row tile, and of the
// AVX-512 row pairs), inputs that are not a multiple of a SIMD window (96,
// 160), more than 8 groups (the fp32 lane order wraps), and every group
// size. The AVX-512 layout cuts a row into windows of 8 groups, then 4, 2,
// 1: 96/32 is 2 + 1, 352/32 is 8 + 2 + 1, 1216/64 is 16 + 2 + 1, 1440/32
// is 40 + 4 + 1, 2176/128 is 16 + 1, 4864/256 is 16 + 2 + 1. One-token
// int4 runs whole 8-group windows in tiles of 8 row pairs: 37 x 768 (3
// windows, 2 tiles and 3 pairs), 34 x 512 at group 64, 17 x 2048 at 256.
// Tokens 1 to 9 cover every remainder of the token tiles.
const SHAPES: [number, number, number][] = [
  [7, 96, 32],
  [33, 160, 32],
  [5, 352, 32],
  [9, 320, 64],
  [6, 384, 128],
  [3, 768, 256],
  [1, 32, 32],
  [13, 768, 32],
  [19, 1440, 32],
  [10, 1216, 64],
  [5, 2176, 128],
  [6, 4864, 256],
  [37, 768, 32],
  [34, 512, 64],
  [17, 2048, 256],
];

describe("quantized matmul kernels", () => {
  for (const [fmt, [quantize, head]] of Object.entries(FORMATS)) {
    test(`${fmt}: portable kernel equals dequantize-then-multiply on odd shapes; every path bit-identical`, () => {
      let seed = 1;
      // int6 rows are whole 64-input blocks.
      for (const [rows, cols, group] of SHAPES.filter(([, cols]) => quantize !== quantizeInt6 || cols % 64 === 0)) {
        for (const T of [1, 2, 3, 4, 5, 6, 7, 8, 9, 13]) {
          const q = quantize(weights(rows, cols, seed), rows, cols, group);
          const x = activations(T, cols, seed++);
          const deq = dequantize(q);
          const base = runCase(q, x, T, "portable", head)!;
          let d = 0;
          let m = 0;
          for (let t = 0; t < T; t++) {
            const want = quantizedMatvec(deq, rows, cols, x.subarray(t * cols, (t + 1) * cols));
            for (let o = 0; o < rows; o++) {
              d = Math.max(d, Math.abs(base[t * rows + o] - want[o]));
              m = Math.max(m, Math.abs(want[o]));
            }
          }
          if (!(d <= TOL * m)) throw new Error(`${fmt} ${rows}x${cols} g${group} T${T}: rel err ${d / m}`);
          for (const p of paths) {
            if (!sameBits(runCase(q, x, T, p, head)!, base))
              throw new Error(`${fmt} ${rows}x${cols} g${group} T${T}: ${p} differs from portable`);
          }
        }
      }
    });
  }

  test("a token whose activations are all zero gets exactly zero", () => {
    const q = quantizeInt2(weights(4, 64, 3), 4, 64, 32);
    for (const p of paths) {
      const y = runCase(q, activations(2, 64, 9), 2, p)!;
      expect(Array.from(y.subarray(4, 8))).toEqual([0, 0, 0, 0]);
    }
  });

  // A 2000 x 1024 int4 matrix: its codes are 1,024,000 bytes, the AVX2
  // copy 1,152,000 (codes and metadata) and the AVX-512 copies 3,456,000
  // (wide and narrow together). ASan refuses allocations over the limit
  // (returning NULL, as malloc does when memory runs out), so with 1 MiB
  // the driver still reads the matrix but no path can pack it, and with
  // 2 MiB the AVX2 copy fits and AVX-512's does not.
  test("without memory for its packed copy a path gives way (AVX-512 to AVX2, AVX2 to portable) with the same bits", () => {
    const rows = 2000;
    const cols = 1024;
    const q = quantizeInt4(weights(rows, cols, 5), rows, cols, 32);
    const x = activations(3, cols, 5);
    const base = runCase(q, x, 3, "portable")!;
    const limited = (p: keyof typeof SIMD, mib: number) =>
      runDriver(q, x, 3, p, false, `:allocator_may_return_null=1:max_allocation_size_mb=${mib}`)!;
    for (const p of paths) {
      const none = limited(p, 1);
      expect(none.ran).toBe("portable");
      expect(sameBits(none.y, base)).toBe(true);
      const some = limited(p, 2);
      expect(some.ran).toBe(p === "portable" ? "portable" : "avx2");
      expect(sameBits(some.y, base)).toBe(true);
    }
    // Without the limit each path runs its own kernels again (runCase checks them against its probe's).
    for (const p of paths) expect(sameBits(runCase(q, x, 3, p)!, base)).toBe(true);
  });
});
