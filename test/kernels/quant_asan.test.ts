// Quantized models under AddressSanitizer + UBSan, through the same driver
// as asan.test.ts (test/c/asan_driver.c, every kernel source, the loader
// reading the file into an exactly-sized heap buffer): corrupt quantized
// files are refused with exit 2 and a message, never an out-of-bounds read;
// the quantized forward pass (partial windows, row and token tails, the
// int8 head) runs clean on every SIMD path, matches the reference and is
// batch-invariant; header fuzzing of a quantized file stays clean.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import { type SyntheticOptions, writeSyntheticModel } from "../../src/model/synthetic.ts";
import { pathsWhere } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";
import { runSanitized, type SanitizedRun, sanitizedDriver } from "../helpers/sanitized.ts";
import { ReferenceModel } from "../reference/forward.ts";

const TOL = 2e-3; // as quant_forward.test.ts

setDefaultTimeout(120_000);

let driver = "";

/** Runs the sanitized driver; a sanitizer report fails the test (test/helpers/sanitized.ts). */
function run(...args: string[]): SanitizedRun {
  return runSanitized(driver, args);
}

let n = 0;
const tmpPath = (name: string) => join(testTempDir(), `qasan-${n++}-${name}.safetensors`);

// dim 96 (3 groups: one partial window), ffn 160 (5), vocab 61 (odd rows everywhere).
const SHAPE: SyntheticOptions = { dim: 96, nHeads: 6, nKvHeads: 2, ffnDim: 160, vocabSize: 61, loops: 2, seed: 31 };
const TOKENS = [1, 60, 7, 33, 2, 2, 59, 10, 0, 44, 5];

const files: Record<string, string> = {};

beforeAll(async () => {
  driver = await sanitizedDriver("asan_driver");
  const src = tmpPath("fp16");
  writeSyntheticModel(src, SHAPE);
  for (const quant of ["int4", "int2"] as const) {
    files[quant] = tmpPath(quant);
    quantizeModelFile(src, files[quant], { quant });
  }
  files["int4-fp16head"] = tmpPath("int4-fp16head");
  quantizeModelFile(src, files["int4-fp16head"], { quant: "int4", head: "fp16" });
}, 240_000);

/** The SIMD paths the sanitized build runs on this CPU. */
function supportedPaths(path: string): string[] {
  return pathsWhere((simd) => {
    const r = run("load", path, simd);
    return r.code === 0 ? null : r.stdout;
  });
}

describe("quantized forward under ASan/UBSan", () => {
  for (const name of ["int4", "int2", "int4-fp16head"]) {
    test(`${name}: clean on every SIMD path, within ${TOL} of the reference, bit-identical across call splits`, () => {
      const path = files[name];
      const want = ReferenceModel.load(path).forward(TOKENS, SHAPE.loops);
      for (const simd of supportedPaths(path)) {
        const r = run("logits", path, String(SHAPE.loops), simd, ...TOKENS.map(String));
        expect(r.code).toBe(0);
        const lines = r.stdout.trim().split("\n");
        expect(lines.length).toBe(TOKENS.length);
        lines.forEach((line, t) => {
          const got = line.split(" ").map(Number);
          let d = 0;
          let m = 0;
          for (let i = 0; i < got.length; i++) {
            d = Math.max(d, Math.abs(got[i] - want[t][i]));
            m = Math.max(m, Math.abs(want[t][i]));
          }
          if (!(d / m < TOL)) throw new Error(`${name} ${simd} token ${t}: rel err ${d / m}`);
        });
        const inv = run("invariance", path, String(SHAPE.loops), simd, ...TOKENS.map(String));
        expect(inv.stdout).toMatch(/^ok /);
        expect(inv.code).toBe(0);
      }
    });
  }
});

describe("corrupt quantized files under ASan/UBSan", () => {
  function parse(path: string) {
    const bytes = new Uint8Array(readFileSync(path));
    const len = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    return { header: JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + len))), data: bytes.subarray(8 + len) };
  }
  function write(header: unknown, data: Uint8Array): string {
    let text = JSON.stringify(header);
    while (text.length % 8 !== 0) text += " ";
    const head = new TextEncoder().encode(text);
    const buf = new Uint8Array(8 + head.length + data.length);
    new DataView(buf.buffer).setBigUint64(0, BigInt(head.length), true);
    buf.set(head, 8);
    buf.set(data, 8 + head.length);
    const p = tmpPath("corrupt");
    writeFileSync(p, buf);
    return p;
  }

  test("truncated data, a short scales tensor, shifted offsets: exit 2 with the tensor named", () => {
    const { header, data } = parse(files.int2);
    const edits: [(h: any) => void, Uint8Array, RegExp][] = [
      [() => {}, data.subarray(0, data.length - 1), /tensor '[^']+': data_offsets .* past end of data/],
      [(h) => (h["output.scales"].shape = [61, 2]), data, /tensor 'output.scales': shape \[61, 2\] expected \[61, 3\]/],
      [(h) => (h["block.wv.qweight"].data_offsets[1] -= 1), data, /tensor 'block.wv.qweight': data_offsets .* hold \d+ bytes, expected \d+ \(U8 \[32, 24\]\)/],
      [(h) => (h["block.w1.scales"].dtype = "F32"), data, /tensor 'block.w1.scales': dtype 'F32' expected F16/],
    ];
    for (const [edit, bytes, msg] of edits) {
      const h = structuredClone(header);
      edit(h);
      const r = run("load", write(h, bytes));
      expect(r.stdout).toMatch(/^error: /);
      expect(r.stdout).toMatch(msg);
      expect(r.code).toBe(2);
    }
  });

  test("header fuzzing of an int4 file: every copy loads or is refused, nothing reported", () => {
    const r = run("fuzz", files.int4, "300", "7");
    expect(r.code).toBe(0);
  });
});
