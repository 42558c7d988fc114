// Quantized models under AddressSanitizer + UBSan, through the same driver
// as asan.test.ts (test/c/asan_driver/, every kernel source, the loader
// reading the file into an exactly-sized heap buffer): descriptors that do
// not fit a quantized file are refused with exit 2 and a message, never an
// out-of-bounds read; the quantized forward pass (partial windows, row and
// token tails, the int8 head) runs clean on every SIMD path, matches the
// reference and is batch-invariant; fuzzing a quantized model's descriptor
// and bytes stays clean.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import { type SyntheticOptions, writeSyntheticModel } from "../../src/model/synthetic.ts";
import { descriptorOf, editDescriptor, type SpanEdit, spanOf, writeDescriptor } from "../helpers/model_descriptor.ts";
import { pathsWhere } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";
import { runSanitized, SANITIZED_BUILD_MS, type SanitizedRun, sanitizedDriver } from "../helpers/sanitized.ts";
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
    quantizeModelFile(src, files[quant], { quant }); // int2: wv, wo and w2 at int4 (the default mix)
    writeDescriptor(files[quant]);
  }
  files["int2-pure"] = tmpPath("int2-pure");
  quantizeModelFile(src, files["int2-pure"], { quant: "int2", mix: {} });
  writeDescriptor(files["int2-pure"]);
  files["int4-fp16head"] = tmpPath("int4-fp16head");
  quantizeModelFile(src, files["int4-fp16head"], { quant: "int4", head: "fp16" });
  writeDescriptor(files["int4-fp16head"]);
  // A tied model: its int8 head is the embedding too (no tok_embeddings.weight).
  const tied = tmpPath("fp16-tied");
  writeSyntheticModel(tied, { ...SHAPE, tiedOutput: true });
  files["int4-tied"] = tmpPath("int4-tied");
  quantizeModelFile(tied, files["int4-tied"], { quant: "int4" });
  writeDescriptor(files["int4-tied"]);
}, SANITIZED_BUILD_MS);

/** The SIMD paths the sanitized build runs on this CPU. */
function supportedPaths(path: string): string[] {
  return pathsWhere((simd) => {
    const r = run("load", path, simd);
    return r.code === 0 ? null : r.stdout;
  });
}

describe("quantized forward under ASan/UBSan", () => {
  for (const name of ["int4", "int2", "int2-pure", "int4-fp16head", "int4-tied"]) {
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

describe("quantized descriptors that do not fit the file, under ASan/UBSan", () => {
  test("truncated data, spans of the wrong length or dtype, a missing zeros tensor: exit 2 with the tensor named", () => {
    const desc = descriptorOf(files.int2);
    const bytes = new Uint8Array(readFileSync(files.int2));
    const cases: [Uint8Array, Record<string, SpanEdit>, RegExp][] = [
      [bytes.subarray(0, bytes.length - 1), {}, /tensor '[^']+': bytes \[\d+, \d+\) run past the end of the file/],
      [bytes, { "output.scales": { length: spanOf(desc, "output.scales").length - 2n } }, /tensor 'output\.scales': \d+ bytes, expected \d+/],
      [bytes, { "block.wv.qweight": { length: 767n } }, /tensor 'block\.wv\.qweight': 767 bytes, expected 1536/], // int4: 32 x 96 / 2
      [bytes, { "block.wq.qweight": { length: 767n } }, /tensor 'block\.wq\.qweight': 767 bytes, expected 2304/], // int2: 96 x 96 / 4
      [bytes, { "block.w1.scales": { dtype: 2 } }, /tensor 'block\.w1\.scales': dtype U8 \(2\), expected F16/],
      [bytes, { "output.qweight": { dtype: 2 } }, /tensor 'output\.qweight': dtype U8 \(2\), expected I8/],
      [bytes, { "block.wk.zeros": { offset: 0n, length: 0n, dtype: 0 } }, /tensor 'block\.wk\.zeros' missing from the model descriptor \(an int2 model needs it\)/],
    ];
    // block_bits that do not match the tensors: wv said to be int2 (its bytes are
    // int4's, and it has no zeros), or wv int4 with wk's zeros given as its own.
    const mixed = (bits: number[], tensors: Record<string, SpanEdit> = {}) => editDescriptor(desc, { config: { block_bits: bits }, tensors });
    const configCases: [Uint8Array, RegExp][] = [
      [mixed([2, 2, 2, 4, 2, 4, 2]), /tensor 'block\.wv\.qweight': 1536 bytes, expected 768/],
      [mixed([2, 2, 4, 4, 2, 4, 2], { "block.wv.zeros": spanOf(desc, "block.wk.zeros") }), /tensor 'block\.wv\.zeros' does not belong in an int2 model whose matrix is int4/],
    ];
    for (const [edited, message] of configCases) {
      const path = tmpPath("corrupt-bits");
      writeFileSync(path, bytes);
      writeDescriptor(path, edited);
      const r = run("load", path);
      expect(r.stdout).toMatch(message);
      expect(r.code).toBe(2);
    }
    for (const [data, tensors, message] of cases) {
      const path = tmpPath("corrupt");
      writeFileSync(path, data);
      writeDescriptor(path, editDescriptor(desc, { tensors }));
      const r = run("load", path);
      expect(r.stdout).toMatch(/^error: /);
      expect(r.stdout).toMatch(message);
      expect(r.code).toBe(2);
    }
  });

  test("descriptor and file fuzzing of an int4 model: every copy loads or is refused, nothing reported", () => {
    const r = run("fuzz", files.int4, "300", "7");
    expect(r.stdout).toMatch(/^ok \d+ loaded \d+ rejected/);
    expect(r.code).toBe(0);
  });
});
