// The kernels under AddressSanitizer + UndefinedBehaviorSanitizer, driven by
// test/c/asan_driver/: every model descriptor that does not fit its file
// (the file's own format is the TypeScript validator's, test/model/) must be
// refused with exit code 2 and a message naming the problem, never a crash,
// an out-of-bounds read or a leak; the forward pass on every SIMD path must match the
// TypeScript reference with no sanitizer report; ls_sample must match its
// documented procedure.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type SyntheticOptions, writeSyntheticModel } from "../../src/model/synthetic.ts";
import { type ConfigField, copyDescriptor, descriptorOf, editDescriptor, type SpanEdit, spanOf, writeDescriptor } from "../helpers/model_descriptor.ts";
import { pathsWhere } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";
import { runSanitized, SANITIZED_BUILD_MS, type SanitizedRun, sanitizedDriver } from "../helpers/sanitized.ts";
import { ReferenceModel } from "../reference/forward.ts";

const TOL = 1e-3; // max|c - r| / max|r| against the float64 reference

// Sanitized code runs several times slower, and bun test's 5 s default (which
// bunfig.toml cannot raise) is too tight for sample-check on a busy machine.
setDefaultTimeout(120_000);

let driver = "";

/** Runs the sanitized driver; a sanitizer report fails the test (test/helpers/sanitized.ts). */
function run(...args: string[]): SanitizedRun {
  return runSanitized(driver, args);
}

// ---- model files ----

let n = 0;
function tmpPath(name: string): string {
  return join(testTempDir(), `asan-${n++}-${name}.safetensors`);
}

const SMALL: SyntheticOptions = { dim: 32, nHeads: 4, nKvHeads: 2, ffnDim: 64, vocabSize: 256, loops: 2, seed: 5 };

/** A model written with its descriptor beside it (test/c/model_desc.h). */
function modelPath(name: string, opts: SyntheticOptions): string {
  const path = tmpPath(name);
  writeSyntheticModel(path, opts);
  return writeDescriptor(path);
}

let valid: string; // SMALL, untied
let validTied: string;
let validBytes: Uint8Array;
let validDesc: Uint8Array;

/** A copy of the valid model (or of `bytes`) whose descriptor is `desc`. */
function variant(name: string, desc: Uint8Array, bytes: Uint8Array = validBytes): string {
  const path = tmpPath(name);
  writeFileSync(path, bytes);
  return writeDescriptor(path, desc);
}

beforeAll(async () => {
  driver = await sanitizedDriver("asan_driver");
  valid = modelPath("valid", SMALL);
  validTied = modelPath("valid-tied", { ...SMALL, tiedOutput: true });
  validBytes = new Uint8Array(readFileSync(valid));
  validDesc = descriptorOf(valid);
}, SANITIZED_BUILD_MS);

// ---- loading ----

function expectRefused(path: string, message: RegExp): void {
  const r = run("load", path);
  expect(r.stdout).toMatch(/^error: /);
  expect(r.stdout).toMatch(message);
  expect(r.code).toBe(2);
}

const span = (name: string) => spanOf(validDesc, name);

describe("model loading under ASan/UBSan: the descriptor against the file", () => {
  test("a valid model loads and reports its shape; tied output when the descriptor has no output tensor", () => {
    let r = run("load", valid);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^ok dim=32 n_heads=4 n_kv_heads=2 head_dim=8 ffn_dim=64 vocab=256 loops=2 /);
    expect(r.stdout).toMatch(/ tied=0 /);
    r = run("load", validTied);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/ tied=1 /);
    r = run("load", variant("untie", editDescriptor(validDesc, { tensors: { "output.weight": { offset: 0n, length: 0n, dtype: 0 } } })));
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/ tied=1 /);
  });

  test("files that cannot be opened or are not regular files", () => {
    expectRefused(copyDescriptor(valid, join(testTempDir(), "no-such-file.safetensors")), /cannot open model file .*No such file/);
    const dir = join(testTempDir(), `asan-dir-${n++}`);
    mkdirSync(dir);
    expectRefused(copyDescriptor(valid, dir), /not a regular file/);
  });

  test("truncated files: every tensor must lie inside the file", () => {
    const size = validBytes.length;
    const emb = span("tok_embeddings.weight");
    const cuts: [number, RegExp][] = [
      [0, /model file .* is empty/],
      [8, /tensor 'tok_embeddings\.weight': bytes \[\d+, \d+\) run past the end of the file \(8 bytes\)/],
      [Number(emb.offset) + 1001, new RegExp(`tensor 'tok_embeddings\\.weight': bytes \\[${emb.offset}, ${emb.offset + emb.length}\\) run past the end of the file \\(${Number(emb.offset) + 1001} bytes\\)`)],
      [size - 1, new RegExp(`tensor '[\\w.]+': bytes \\[\\d+, ${size}\\) run past the end of the file \\(${size - 1} bytes\\)`)],
    ];
    for (const [cut, message] of cuts) expectRefused(variant(`cut-${cut}`, validDesc, validBytes.subarray(0, cut)), message);
  });

  test("dimensions out of range or inconsistent", () => {
    const cases: [Partial<Record<ConfigField, number | number[]>>, RegExp][] = [
      [{ dim: 0 }, /model descriptor: dim 0 is outside 1\.\.65536/],
      [{ dim: 65537 }, /model descriptor: dim 65537 is outside 1\.\.65536/],
      [{ n_heads: -4 }, /n_heads -4 is outside 1\.\.4096/],
      [{ n_kv_heads: 4097 }, /n_kv_heads 4097 is outside 1\.\.4096/],
      [{ ffn_dim: 262145 }, /ffn_dim 262145 is outside 1\.\.262144/],
      [{ vocab_size: 1048577 }, /vocab_size 1048577 is outside 1\.\.1048576/],
      [{ default_loops: 65 }, /default_loops 65 is outside 1\.\.64/],
      [{ max_seq_len: 0 }, /max_seq_len 0 is outside 1\.\.1048576/],
      [{ rope_theta: Number.NaN }, /rope_theta nan or norm_eps [\d.e-]+ out of range/],
      [{ rope_theta: 1e13 }, /rope_theta 1e\+13 or norm_eps [\d.e-]+ out of range/],
      [{ norm_eps: 0 }, /rope_theta 10000 or norm_eps 0 out of range/],
      [{ norm_eps: 1 }, /norm_eps 1 out of range/],
      [{ quant: 3 }, /quant 3 is not one of LS_QUANT_FP16\/INT4\/INT2/],
      [{ group_size: 32 }, /group_size 32 does not suit quant fp16/],
      [{ quant: 1, group_size: 48 }, /group_size 48 does not suit quant int4/],
      [{ block_bits: [4, 0, 0, 0, 0, 0, 0] }, /block_bits 4 0 0 0 0 0 0 do not suit quant fp16/],
      [{ quant: 1, group_size: 32 }, /block_bits 0 0 0 0 0 0 0 do not suit quant int4/],
      [{ quant: 2, group_size: 32, block_bits: [2, 2, 4, 4, 2, 4, 3] }, /block_bits 2 2 4 4 2 4 3 do not suit quant int2/],
      [{ quant: 2, group_size: 32, block_bits: [2, 2, 4, 4, 4, 4, 2] }, /block_bits 2 2 4 4 4 4 2 do not suit quant int2: 4 or 2 each, w1 and w3 alike/],
      [{ head_bits: 5, head_group: 32 }, /head_bits 5 with head_group 32 \(dim 32\) is not a head format/],
      [{ head_bits: 0, head_group: 32 }, /head_bits 0 with head_group 32/],
      [{ head_bits: 8, head_group: 64 }, /head_bits 8 with head_group 64 \(dim 32\)/], // the group must divide dim
      [{ head_bits: 6, head_group: 32 }, /head_bits 6 with head_group 32 \(dim 32\)/], // int6 needs dim % 64 == 0
      [{ n_heads: 3 }, /inconsistent dimensions \(dim 32, n_heads 3,/],
      [{ n_heads: 32, head_dim: 0 }, /inconsistent dimensions/], // head_dim dim / n_heads = 1 is odd
      [{ head_dim: 7 }, /inconsistent dimensions/], // an odd head_dim of its own
      [{ n_kv_heads: 3 }, /inconsistent dimensions/],
      // Consistent, but not what the tensors hold.
      [{ vocab_size: 257 }, /tensor 'tok_embeddings\.weight': 16384 bytes, expected 16448/],
      [{ quant: 1, group_size: 32, block_bits: [4, 4, 4, 4, 4, 4, 4] }, /tensor 'block\.wq\.weight' does not belong in an int4 model whose matrix is int4/],
      [{ head_bits: 8, head_group: 32 }, /tensor 'output\.weight' does not belong in an fp16 model with a quantized output head/],
    ];
    for (const [config, message] of cases) expectRefused(variant("config", editDescriptor(validDesc, { config })), message);
  });

  test("tensor spans missing, foreign, of the wrong dtype or length, outside the file, misaligned or overlapping", () => {
    const size = BigInt(validBytes.length);
    const wq = span("block.wq.weight");
    const cases: [Record<string, SpanEdit>, RegExp][] = [
      [{ "block.wk.weight": { offset: 0n, length: 0n, dtype: 0 } }, /tensor 'block\.wk\.weight' missing from the model descriptor \(an fp16 model needs it\)/],
      // Only a quantized head may stand in for the embedding.
      [{ "tok_embeddings.weight": { offset: 0n, length: 0n, dtype: 0 } }, /tensor 'tok_embeddings\.weight' missing from the model descriptor \(an fp16 model needs it\)/],
      [{ "block.wq.zeros": { length: 8n } }, /tensor 'block\.wq\.zeros' is absent but has a byte range/],
      [{ "block.wq.qweight": { ...wq, dtype: 2 } }, /tensor 'block\.wq\.qweight' does not belong in an fp16 model/],
      [{ "output.scales": { offset: 0n, length: 0n, dtype: 1 } }, /tensor 'output\.scales' does not belong in an fp16 model/],
      [{ "norm.weight": { dtype: 2 } }, /tensor 'norm\.weight': dtype U8 \(2\), expected F16/],
      [{ "norm.weight": { dtype: 9 } }, /tensor 'norm\.weight': dtype unknown \(9\), expected F16/],
      [{ "norm.weight": { reserved: 1 } }, /tensor 'norm\.weight': reserved descriptor field is 1, expected 0/],
      [{ "block.ffn_norm.weight": { length: 62n } }, /tensor 'block\.ffn_norm\.weight': 62 bytes, expected 64/],
      [{ "output.weight": { offset: size } }, /tensor 'output\.weight': bytes \[\d+, \d+\) run past the end of the file/],
      [{ "output.weight": { offset: (1n << 64n) - 8n } }, /tensor 'output\.weight': bytes \[18446744073709551608, \d+\) run past the end of the file/],
      [{ "block.attn_norm.weight": { offset: span("block.attn_norm.weight").offset + 1n } }, /tensor 'block\.attn_norm\.weight': data at file offset \d+ is not 2-byte aligned for F16/],
      [{ "norm.weight": { offset: span("block.ffn_norm.weight").offset } }, /tensors '[\w.]+' \[\d+, \d+\) and '[\w.]+' \[\d+, \d+\) overlap/],
    ];
    for (const [tensors, message] of cases) expectRefused(variant("span", editDescriptor(validDesc, { tensors })), message);
  });

  test("a non-finite weight is refused, naming the tensor and where in it", () => {
    const bytes = validBytes.slice();
    const w2 = span("block.w2.weight");
    new DataView(bytes.buffer).setUint16(Number(w2.offset) + 2 * 70, 0x7e00, true);
    expectRefused(variant("nan", validDesc, bytes), /tensor 'block\.w2\.weight' holds a non-finite value \(NaN\) at element 70 \(row 1, column 6\)/);
  });

  test("thousands of randomly mutated descriptors and files are each loaded or refused, with no sanitizer report", () => {
    for (const [path, seed] of [
      [valid, "1"],
      [validTied, "2"],
    ]) {
      const r = run("fuzz", path, "3000", seed);
      expect(r.stdout).toMatch(/^ok \d+ loaded \d+ rejected/);
      expect(r.code).toBe(0);
    }
  });
});

// ---- forward pass ----

const FWD: Record<string, SyntheticOptions> = {
  gqa: { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 96, vocabSize: 300, loops: 3, seed: 21 },
  stack: { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 96, vocabSize: 300, loops: 4, seed: 23, nLayers: 2, sandwichNorm: true, stepNorm: true, exitGate: true },
  "mha-tied": { dim: 40, nHeads: 4, nKvHeads: 4, ffnDim: 56, vocabSize: 67, loops: 2, seed: 22, tiedOutput: true },
  // recurrent depth: Huginn's prelude, coda, injection, biases and RoPE layout; Nanbeige's head_dim and step norm
  huginn: {
    dim: 64, nHeads: 4, nKvHeads: 4, ffnDim: 96, vocabSize: 300, loops: 3, seed: 24, nLayers: 2, nPrelude: 1, nCoda: 1, injection: "adapter",
    stateStd: 0.5, embedScale: 8, midNorm: true, ropeLayout: "interleaved", qkBias: true, normLayout: "sandwich_sum",
  },
  nanbeige: { dim: 64, nHeads: 4, nKvHeads: 2, headDim: 32, ffnDim: 96, vocabSize: 300, loops: 2, seed: 25, nLayers: 2, stepNorm: true },
};
const TOKENS = [1, 7, 42, 13, 0, 5, 5, 29, 66];

/** The SIMD paths the sanitized build runs on this CPU. */
function supportedPaths(path: string): string[] {
  return pathsWhere((simd) => {
    const r = run("load", path, simd);
    return r.code === 0 ? null : r.stdout;
  });
}

describe("forward pass under ASan/UBSan", () => {
  for (const [shape, opts] of Object.entries(FWD)) {
    test(`${shape}: logits on every SIMD path match the TypeScript reference within ${TOL}`, () => {
      const path = modelPath(`fwd-${shape}`, opts);
      const ref = ReferenceModel.load(path);
      const tokens = TOKENS.map((t) => t % opts.vocabSize);
      for (const loops of [1, opts.loops]) {
        const want = ref.forward(tokens, loops);
        for (const simd of supportedPaths(path)) {
          const r = run("logits", path, String(loops), simd, ...tokens.map(String));
          expect(r.code).toBe(0);
          const lines = r.stdout.trim().split("\n");
          expect(lines.length).toBe(tokens.length);
          lines.forEach((line, t) => {
            const got = line.split(" ").map(Number);
            expect(got.length).toBe(opts.vocabSize);
            let d = 0;
            let m = 0;
            for (let i = 0; i < got.length; i++) {
              d = Math.max(d, Math.abs(got[i] - want[t][i]));
              m = Math.max(m, Math.abs(want[t][i]));
            }
            if (!(d / m < TOL)) throw new Error(`${shape} ${simd} loops ${loops} token ${t}: rel err ${d / m}`);
          });
        }
      }
    });

    test(`${shape}: prefill and one-token steps give bit-identical logits on every SIMD path`, () => {
      const path = modelPath(`inv-${shape}`, opts);
      for (const simd of supportedPaths(path)) {
        const r = run("invariance", path, String(opts.loops), simd, ...TOKENS.map((t) => String(t % opts.vocabSize)));
        expect(r.stdout).toMatch(/^ok /);
        expect(r.code).toBe(0);
      }
    });
  }

  test.each(["gqa", "stack", "huginn"])("batched steps of mixed sessions (depths, windows, cache modes, prompt chunks, sampling; exit policies and rules) equal each session alone, every SIMD path: %s", (name) => {
    const path = modelPath(`batch-${name}`, FWD[name]);
    const prompt = Array.from({ length: 90 }, (_, i) => String((i * 13 + 5) % FWD[name].vocabSize)); // longer than one block
    for (const simd of supportedPaths(path)) {
      const r = run("batch", path, simd, ...prompt);
      expect(r.stdout).toMatch(/^ok /);
      expect(r.code).toBe(0);
    }
  });

  test("out-of-range tokens are refused, not read", () => {
    const r = run("logits", valid, "1", "portable", "1", "256");
    expect(r.code).toBe(2);
    expect(r.stdout).toMatch(/^error: /);
  });
});

// ---- fp16 ----

describe("fp16 conversions under ASan/UBSan", () => {
  test("every half round-trips and every rounding boundary goes to nearest even, subnormals and overflow included", () => {
    const r = run("f16-check");
    expect(r.stdout).toMatch(/^ok \d+ conversions/);
    expect(r.code).toBe(0);
  });
});

describe("RoPE under ASan/UBSan", () => {
  test("every SIMD path rotates bit-identically to the portable path, head dims 2 to 258", () => {
    const r = run("rope-check");
    expect(r.stdout).toMatch(/^ok \d+ rows match the portable path on \d SIMD paths/);
    expect(r.code).toBe(0);
  });
});

// ---- sampling ----

describe("ls_sample under ASan/UBSan", () => {
  test("every top-k / top-p / temperature / penalty path picks the token of the documented procedure", () => {
    const r = run("sample-check");
    expect(r.stdout).toMatch(/^ok \d+ configurations match/);
    expect(r.code).toBe(0);
  });

  test("greedy picks the lowest id on ties and invalid parameters are refused", () => {
    let r = run("sample", "0", "0", "1", "1", "0", "0", "1,3,2,3");
    expect(r.stdout.trim()).toBe("1");
    // Vocabularies longer than the vectorized passes' blocks of 16: NaN and
    // -inf skipped, the first of equal maxima across blocks (-0 equals 0), a
    // maximum in the tail past the last whole block, +inf, nothing valid.
    const greedy = (at: Record<number, string>, fill = "-1") =>
      run("sample", "0", "0", "1", "1", "0", "0", Array.from({ length: 40 }, (_, i) => at[i] ?? fill).join(","));
    for (const [at, want] of [
      [{ 0: "nan", 17: "5", 33: "5", 34: "nan" }, "17"],
      [{ 39: "0.5", 38: "0.25" }, "39"],
      [{ 20: "inf", 30: "inf", 31: "nan" }, "20"],
      [{ 18: "-0", 5: "nan", 19: "0", 2: "0" }, "2"],
      [{ 19: "-0", 27: "0" }, "19"],
    ] as const) {
      r = greedy(at);
      expect(r.stdout.trim()).toBe(want);
    }
    r = greedy({ 1: "nan", 9: "nan", 30: "nan" }, "-inf");
    expect(r.stdout).toMatch(/^error: ls_sample returned -1/);
    for (const bad of [
      ["nan", "0", "1", "1"],
      ["-1", "0", "1", "1"],
      ["1", "-1", "1", "1"],
      ["1", "0", "1.5", "1"],
      ["1", "0", "nan", "1"],
      ["1", "0", "1", "0"],
      ["1", "0", "1", "nan"],
    ]) {
      r = run("sample", ...bad, "0", "0", "1,2,3");
      expect(r.stdout).toMatch(/^error: ls_sample returned -1/);
      expect(r.code).toBe(2);
    }
  });

  test("same seed and counter give the same token; history ids outside the vocabulary are ignored", () => {
    const logits = Array.from({ length: 50 }, (_, i) => String(Math.sin(i) * 2)).join(",");
    const a = run("sample", "0.8", "10", "0.9", "1.2", "77", "5", logits, "-4,3,3,999,2147483647");
    const b = run("sample", "0.8", "10", "0.9", "1.2", "77", "5", logits, "-4,3,3,999,2147483647");
    expect(a.code).toBe(0);
    expect(a.stdout).toBe(b.stdout);
  });
});
