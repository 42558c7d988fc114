import { describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { f16ArrayToF32 } from "../../src/model/fp16.ts";
import { loadModelFile } from "../../src/model/format.ts";
import { ModelFormatError } from "../../src/model/safetensors.ts";
import { type SyntheticOptions, writeSyntheticModel } from "../../src/model/synthetic.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";
import { argmax, ReferenceModel } from "../reference/forward.ts";

const SMALL: SyntheticOptions = {
  dim: 32,
  nHeads: 4,
  nKvHeads: 2,
  ffnDim: 96,
  vocabSize: 1000,
  loops: 3,
  seed: 42,
  residualScale: 0.5,
};

let n = 0;
function write(opts: SyntheticOptions): Buffer {
  const path = join(testTempDir(), `syn-${n++}.safetensors`);
  writeSyntheticModel(path, opts);
  return readFileSync(path);
}

const sha256 = (b: Buffer) => createHash("sha256").update(b).digest("hex");

function stats(v: Float32Array): { mean: number; std: number } {
  let s = 0;
  let ss = 0;
  for (const x of v) {
    s += x;
    ss += x * x;
  }
  const mean = s / v.length;
  return { mean, std: Math.sqrt(ss / v.length - mean * mean) };
}

describe("synthetic models", () => {
  test("same seed and options give byte-identical files", () => {
    expect(write(SMALL).equals(write(SMALL))).toBe(true);
  });

  test("the bytes are pinned: same file on every machine and Bun version", () => {
    // If the generator changes on purpose, update these hashes (and say so in the commit).
    expect(sha256(write(SMALL))).toBe("a8a980167b98a71cd8929ad0e2abd7b0d5584af673833118fe7cca172781abb2");
    expect(sha256(write({ ...SMALL, tiedOutput: true }))).toBe(
      "97a0cb053fc6766df856cbaac653308347e7fa2ad215cb5b2ade75b112fbaaeb",
    );
  });

  test("a different seed gives different weights of the same shapes", () => {
    const a = write(SMALL);
    const b = write({ ...SMALL, seed: 43 });
    expect(a.equals(b)).toBe(false);
    expect(a.length).toBe(b.length);
  });

  test("each tensor has its own stream: changing the vocabulary leaves the block's weights alone", () => {
    const a = loadModelFile(tinyModelPath({ vocabSize: 500 }));
    const b = loadModelFile(tinyModelPath({ vocabSize: 700 }));
    for (const name of ["block.wq.weight", "block.w2.weight", "norm.weight"]) {
      expect(Buffer.from(a.tensors.get(name)!.data).equals(Buffer.from(b.tensors.get(name)!.data))).toBe(true);
    }
    // ...while different tensors of one file are not copies of each other.
    expect(Buffer.from(a.weights.w1).equals(Buffer.from(a.weights.w3))).toBe(false);
  });

  test("weights have the documented scales", () => {
    const m = loadModelFile(tinyModelPath({ vocabSize: 4000, residualScale: 0.25 }));
    const { dim, ffnDim } = m.config;
    const close = (got: number, want: number, rel = 0.05) => expect(Math.abs(got / want - 1)).toBeLessThan(rel);
    close(stats(f16ArrayToF32(m.weights.tokEmbeddings)).std, 1);
    close(stats(f16ArrayToF32(m.weights.output)).std, 3 / Math.sqrt(dim));
    close(stats(f16ArrayToF32(m.weights.wq)).std, 1 / Math.sqrt(dim));
    close(stats(f16ArrayToF32(m.weights.w1)).std, 1 / Math.sqrt(dim));
    close(stats(f16ArrayToF32(m.weights.wo)).std, 0.25 / Math.sqrt(dim), 0.1);
    close(stats(f16ArrayToF32(m.weights.w2)).std, 0.25 / Math.sqrt(ffnDim), 0.1);
    for (const norm of [m.weights.attnNorm, m.weights.ffnNorm, m.weights.norm]) {
      const s = stats(f16ArrayToF32(norm));
      expect(Math.abs(s.mean - 1)).toBeLessThan(0.03);
      expect(s.std).toBeLessThan(0.1);
    }
  });

  test("tied output: the final norm has random signs (no echo of the input token) and sets the logit scale", () => {
    const m = loadModelFile(tinyModelPath({ vocabSize: 4000, tiedOutput: true }));
    const norm = f16ArrayToF32(m.weights.norm);
    const neg = norm.filter((x) => x < 0).length;
    expect(neg).toBeGreaterThan(16);
    expect(neg).toBeLessThan(48);
    for (const x of norm) expect(Math.abs(Math.abs(x) / (3 / 8) - 1)).toBeLessThan(0.25);
  });

  test("greedy output is varied, tied or not", () => {
    for (const tiedOutput of [false, true]) {
      const ref = ReferenceModel.load(tinyModelPath({ tiedOutput }));
      for (const prompt of [[15496, 995], [50256], [1, 2, 3]]) {
        const out = ref.greedy(prompt, 16, 4);
        expect(new Set(out).size).toBeGreaterThanOrEqual(12);
      }
    }
  });

  test("a small residual scale makes shallow loops agree with deep ones", () => {
    const agreement = (residualScale: number) => {
      const ref = ReferenceModel.load(tinyModelPath({ residualScale }));
      const seq = [15496, 995, ...ref.greedy([15496, 995], 30, 4)];
      const deep = ref.forward(seq, 4).map(argmax);
      const shallow = ref.forward(seq, 2).map(argmax);
      return deep.filter((t, i) => t === shallow[i]).length / seq.length;
    };
    expect(agreement(0.03)).toBeGreaterThan(0.7);
    expect(agreement(1)).toBeLessThan(0.6);
  });

  test("options are checked with the loader's rules", () => {
    const bad: [Partial<SyntheticOptions>, RegExp][] = [
      [{ dim: 30 }, /dim \(30\) must be a multiple of nHeads \(4\)/],
      [{ dim: 8, nHeads: 8, nKvHeads: 8 }, /head_dim = dim \/ nHeads = 1 must be even/],
      [{ nKvHeads: 3 }, /nHeads \(4\) must be a multiple of nKvHeads \(3\)/],
      [{ loops: 0 }, /loops must be an integer in \[1, 64\]/],
      [{ loops: 65 }, /loops must be an integer in \[1, 64\]/],
      [{ nHeads: 8192, nKvHeads: 8192, dim: 8192 * 2 }, /nHeads must be an integer in \[1, 4096\]/], // the loader's bounds, not only its relations
      [{ vocabSize: 2 ** 30 }, /vocabSize must be an integer in \[1, \d+\]/],
      [{ headDim: 7 }, /headDim \(7\) must be even/],
      [{ seed: -1 }, /seed must be an integer/],
      [{ seed: 1.5 }, /seed must be an integer/],
      [{ vocabSize: 0 }, /vocabSize must be an integer/],
      [{ residualScale: -1 }, /residualScale must be a non-negative finite number/],
      [{ ropeTheta: 0 }, /ropeTheta must be a positive finite number/],
    ];
    for (const [over, re] of bad) {
      const path = join(testTempDir(), "never-written.safetensors");
      expect(() => writeSyntheticModel(path, { ...SMALL, ...over })).toThrow(ModelFormatError);
      expect(() => writeSyntheticModel(path, { ...SMALL, ...over })).toThrow(re);
    }
  });
});
