import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { f16ArrayToF32, f64ArrayToF16, roundToF16 } from "../../src/model/fp16.ts";
import { SINGLE_BLOCK, configToMetadata, expectedTensorShapes, formatVersionOf, type ModelConfig, type ModelShape } from "../../src/model/format.ts";
import { readSafetensors, type TensorToWrite, writeSafetensors } from "../../src/model/safetensors.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";
import { applyRope, argmax, ReferenceModel } from "./forward.ts";

// ---- helpers ----

let n = 0;
const tmp = (name: string) => join(testTempDir(), `ref-${n++}-${name}.safetensors`);

type Dims = Pick<ModelConfig, "dim" | "nHeads" | "nKvHeads" | "ffnDim" | "vocabSize"> & { normEps?: number };
/** A stack's layout (default: a single block) and whether it has an exit gate. */
type Layout = Partial<Pick<ModelShape, "nLayers" | "normLayout" | "stepNorm">> & { exitGate?: boolean };

/**
 * Writes a model with hand-chosen weights (values must be exact in fp16),
 * named as in the file without ".weight" ("wv" in a single block,
 * "layers.1.wv" in a stack). Matrices default to zero, norms to one;
 * `output` absent = tied.
 */
function handModel(d: Dims, w: Record<string, number[]>, tied = false, layout: Layout = {}): ReferenceModel {
  const { exitGate = false, ...stack } = layout;
  const stackShape = { ...SINGLE_BLOCK, ...stack };
  const base = {
    arch: "looped-llama" as const,
    formatVersion: formatVersionOf(stackShape, exitGate),
    ...d,
    headDim: d.dim / d.nHeads,
    defaultLoops: 1,
    maxSeqLen: 64,
    ropeTheta: 10000,
    normEps: d.normEps ?? 1e-5,
    quant: "fp16" as const,
    groupSize: 0,
    ...stackShape,
    quantMix: {},
  };
  const tensors: TensorToWrite[] = [];
  for (const [name, shape] of expectedTensorShapes(base, exitGate)) {
    if (name === "output.weight" && tied) continue;
    const count = shape.reduce((a, b) => a * b, 1);
    const key = name.replace(/^block\./, "").replace(/\.weight$/, "");
    const vals = w[key] ?? new Array(count).fill(name.endsWith("norm.weight") ? 1 : 0);
    if (vals.length !== count) throw new Error(`${name}: ${vals.length} values for shape [${shape}]`);
    const bits = f64ArrayToF16(vals);
    if (!f16ArrayToF32(bits).every((x, i) => x === vals[i])) throw new Error(`${name}: values not exact in fp16`);
    tensors.push({ name, dtype: "F16", shape, data: new Uint8Array(bits.buffer) });
  }
  const path = tmp("hand");
  writeSafetensors(path, configToMetadata(base), tensors);
  return ReferenceModel.load(path);
}

/** Row-major identity of size k. */
const eye = (k: number, scale = 1) => Array.from({ length: k * k }, (_, i) => (i % (k + 1) === 0 ? scale : 0));

const rmsnormPlain = (x: number[], eps: number) => {
  const r = Math.sqrt(x.reduce((a, v) => a + v * v, 0) / x.length + eps);
  return x.map((v) => v / r);
};

function expectClose(got: ArrayLike<number>, want: ArrayLike<number>, tol = 1e-6) {
  expect(got.length).toBe(want.length);
  for (let i = 0; i < want.length; i++) {
    if (!(Math.abs(got[i] - want[i]) <= tol * Math.max(1, Math.abs(want[i])))) {
      throw new Error(`element ${i}: got ${got[i]}, want ${want[i]} (tol ${tol})`);
    }
  }
}

function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i] - b[i]));
  return d;
}

const PROMPT = [15496, 995, 6184, 120, 77, 26884, 66, 9101, 67, 2634, 32485, 50256, 464, 2068, 7586, 21831];

// ---- hand-computed models ----

describe("reference forward pass: hand-computed cases", () => {
  // dim 4, one head of 4, a 5-token vocabulary.
  const D4 = { dim: 4, nHeads: 1, nKvHeads: 1, ffnDim: 4, vocabSize: 5 };
  const E = [1, 2, 3, 4, /**/ -1, 0.5, 0, 2, /**/ 4, -2, 1, 0.25, /**/ 0, 0, 1, 0, /**/ 3, 3, -1, -1];
  const row = (t: number) => E.slice(t * 4, t * 4 + 4);

  test("no residual updates: logits = rmsnorm(E[t], norm) · Wout^T, with eps inside the root and Wout [vocab, dim]", () => {
    // Wo = W2 = 0, so h stays E[t]. eps = 0.5 makes the rms of (1,2,3,4) sqrt(7.5 + 0.5) = sqrt(8).
    const out = [1, 0, 0, 0, /**/ 0, 1, 0, 0, /**/ 0, 0, 1, 0, /**/ 0, 0, 0, 1, /**/ 1, 1, 1, 1];
    const m = handModel({ ...D4, normEps: 0.5 }, { tok_embeddings: E, norm: [1, 0.5, 2, 1], output: out });
    const [logits] = m.forward([0], 3);
    // x = (1, 2, 3, 4) / sqrt(8) * (1, 0.5, 2, 1) = (1, 1, 6, 4) / sqrt(8)
    expectClose(logits, [1, 1, 6, 4, 12].map((v) => v / Math.sqrt(8)), 3e-7);
  });

  test("tied output uses tok_embeddings as Wout", () => {
    const m = handModel({ ...D4, normEps: 0.5 }, { tok_embeddings: E }, true);
    const [logits] = m.forward([0], 1);
    const x = [1, 2, 3, 4].map((v) => v / Math.sqrt(8));
    const want = [0, 1, 2, 3, 4].map((t) => row(t).reduce((a, e, i) => a + e * x[i], 0));
    expectClose(logits, want, 3e-7);
  });

  // Wq = Wk = 0: every score is 0, so attention is the plain mean of the
  // cached values; Wv = Wo = I, Wout = I, vocab = dim: logits = rmsnorm(h).
  const uniform = { ...D4, vocabSize: 4 };
  const uniformWeights = { tok_embeddings: E.slice(0, 16), wv: eye(4), wo: eye(4), output: eye(4) };
  const eps = 1e-5;
  /** h after `loops` loops at every position, computed the long way. */
  function uniformAttention(tokens: number[], loops: number, window = 0): number[][] {
    let h = tokens.map(row);
    for (let l = 0; l < loops; l++) {
      const v = h.map((x) => rmsnormPlain(x, eps).map(roundToF16)); // the fp16 cache
      h = h.map((x, p) => {
        const first = window > 0 ? Math.max(0, p - window + 1) : 0;
        const seen = v.slice(first, p + 1);
        return x.map((xi, i) => xi + seen.reduce((a, vj) => a + vj[i], 0) / seen.length);
      });
    }
    return h;
  }

  test("attention is causal, averages the fp16-rounded cache, and each loop reads its own cache", () => {
    const m = handModel(uniform, uniformWeights);
    const tokens = [0, 1, 2, 3, 1];
    for (const loops of [1, 2, 3]) {
      const got = m.forward(tokens, loops);
      const want = uniformAttention(tokens, loops).map((h) => rmsnormPlain(h, eps));
      got.forEach((g, p) => expectClose(g, want[p], 3e-7));
    }
    // Without the fp16 rounding of V the answer is measurably different.
    const unrounded = (() => {
      const h = tokens.map(row);
      const v = h.map((x) => rmsnormPlain(x, eps));
      return rmsnormPlain(h[4].map((x, i) => x + v.reduce((a, vj) => a + vj[i], 0) / 5), eps);
    })();
    expect(maxAbsDiff(m.forward(tokens, 1)[4], Float32Array.from(unrounded))).toBeGreaterThan(1e-6);
  });

  test("cacheWindow W: position p attends to [p-W+1, p] only", () => {
    const m = handModel(uniform, uniformWeights);
    const tokens = [0, 1, 2, 3, 1, 0];
    for (const window of [1, 2, 3]) {
      const got = m.forward(tokens, 2, { cacheWindow: window });
      const want = uniformAttention(tokens, 2, window).map((h) => rmsnormPlain(h, eps));
      got.forEach((g, p) => expectClose(g, want[p], 3e-7));
    }
  });

  test("SwiGLU: h += (silu(x·W1^T) * (x·W3^T)) · W2^T, with W1 the gate and W3 the up projection", () => {
    const m = handModel(D4, {
      tok_embeddings: E,
      w1: eye(4, 2),
      w3: eye(4),
      w2: eye(4, 0.5),
      ffn_norm: [1, 2, 1, 0.5],
      output: [...eye(4), 1, 1, 1, 1],
    });
    const silu = (z: number) => z / (1 + Math.exp(-z));
    for (const t of [0, 1, 2]) {
      const e = row(t);
      const x = rmsnormPlain(e, eps).map((v, i) => v * [1, 2, 1, 0.5][i]);
      const h = e.map((ei, i) => ei + 0.5 * silu(2 * x[i]) * x[i]);
      const y = rmsnormPlain(h, eps);
      expectClose(m.forward([t], 1)[0], [...y, y.reduce((a, b) => a + b, 0)], 3e-7);
    }
  });

  test("RoPE rotates the pairs (i, i + head_dim/2) by pos * theta^(-2i/head_dim), per head", () => {
    // head_dim 4, theta 100: pair (0, 2) turns by pos rad, pair (1, 3) by pos * 0.1 rad.
    const v = Float64Array.from([1, 2, 3, 4, 1, 2, 3, 4]);
    applyRope(v, 2, 4, 1, 100);
    const [c1, s1, c2, s2] = [Math.cos(1), Math.sin(1), Math.cos(0.1), Math.sin(0.1)];
    const head = [1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 1 * s1 + 3 * c1, 2 * s2 + 4 * c2];
    expectClose(v, [...head, ...head], 1e-15);
    const still = Float64Array.from([1, 2, 3, 4]);
    applyRope(still, 1, 4, 0, 100);
    expect([...still]).toEqual([1, 2, 3, 4]);
  });

  test("attention scores use q·k / sqrt(head_dim) with RoPE on both", () => {
    // One head of 2 (one RoPE pair, angle = pos): Wq = Wk = I, Wv = Wo = I.
    // At position 1 the weights over positions 0 and 1 are softmax(q1·k0, q1·k1) / sqrt(2).
    const d = { dim: 2, nHeads: 1, nKvHeads: 1, ffnDim: 2, vocabSize: 2 };
    const emb = [1, 0, 0.5, 1];
    const m = handModel(d, { tok_embeddings: emb, wq: eye(2), wk: eye(2), wv: eye(2), wo: eye(2), output: eye(2) });
    const rot = (x: number[], a: number) => [x[0] * Math.cos(a) - x[1] * Math.sin(a), x[0] * Math.sin(a) + x[1] * Math.cos(a)];
    const x0 = rmsnormPlain([1, 0], eps);
    const x1 = rmsnormPlain([0.5, 1], eps);
    const q1 = rot(x1, 1);
    const k0 = rot(x0, 0).map(roundToF16);
    const k1 = rot(x1, 1).map(roundToF16);
    const v0 = x0.map(roundToF16);
    const v1 = x1.map(roundToF16);
    const s0 = (q1[0] * k0[0] + q1[1] * k0[1]) / Math.sqrt(2);
    const s1 = (q1[0] * k1[0] + q1[1] * k1[1]) / Math.sqrt(2);
    const p0 = Math.exp(s0) / (Math.exp(s0) + Math.exp(s1));
    const h1 = [0.5 + p0 * v0[0] + (1 - p0) * v1[0], 1 + p0 * v0[1] + (1 - p0) * v1[1]];
    expectClose(m.forward([0, 1], 1)[1], rmsnormPlain(h1, eps), 3e-7);
  });
});

// ---- stacks: layers, sandwich and step norms, the exit gate ----

describe("reference forward pass: stacks", () => {
  // dim 4, one head; Wq = Wk = 0 and Wv = Wo = I: a lone token's attention output is its own cached value row.
  const D4 = { dim: 4, nHeads: 1, nKvHeads: 1, ffnDim: 4, vocabSize: 4 };
  const E = [1, 2, 3, 4, /**/ -1, 0.5, 0, 2, /**/ 4, -2, 1, 0.25, /**/ 0, 0, 1, 0];
  const eps = 1e-5;
  const normed = (x: number[], w: number[]) => rmsnormPlain(x, eps).map((v, i) => v * w[i]);

  test("sandwich norms norm each sublayer's output before the residual add, each layer with its own weights; the step norm norms h after every step, and the head norms no further", () => {
    const outNorms = [[1, 2, 1, 1], [1, 1, 0.5, 1]];
    const stepNorm = [1, 1, 1, 2];
    const w: Record<string, number[]> = { tok_embeddings: E, norm: stepNorm, output: eye(4) };
    for (const i of [0, 1]) Object.assign(w, { [`layers.${i}.wv`]: eye(4), [`layers.${i}.wo`]: eye(4), [`layers.${i}.attn_out_norm`]: outNorms[i] });
    const m = handModel(D4, w, false, { nLayers: 2, normLayout: "sandwich", stepNorm: true });
    for (const loops of [1, 2])
      for (const t of [0, 2]) {
        let h = E.slice(t * 4, t * 4 + 4);
        for (let step = 0; step < loops; step++) {
          for (const i of [0, 1]) {
            const a = normed(rmsnormPlain(h, eps).map(roundToF16), outNorms[i]); // the fp16 value row, sandwich-normed
            h = h.map((x, j) => x + a[j]); // the feed-forward adds rmsnorm(0) = 0 (W2 = 0)
          }
          h = normed(h, stepNorm);
        }
        expectClose(m.forward([t], loops)[0], h, 3e-7);
      }
  });

  test("the exit gate: the token's logits are the first step's whose cumulative exit probability reaches the threshold; exact runs every step, copy gives the deeper units of each layer the exit step's keys and values", () => {
    // gate weight 0, bias 0: lambda = 1/2 after every step, so the exit probability by step s is 0.5, 0.75, 0.875, ...
    const w = { tok_embeddings: E, "layers.0.wk": eye(4), "layers.0.wv": eye(4), "layers.1.wv": eye(4), output: eye(4) };
    const m = handModel(D4, w, false, { nLayers: 2, stepNorm: true, exitGate: true });
    for (const [threshold, steps] of [[0.5, 1], [0.7, 2], [0.75, 2], [0.9, 4], [1, 4], [0, 1]]) {
      const exact = m.session(4);
      exact.feed(1);
      const fromExact = exact.feed(3, { threshold, policy: "exact" });
      expect(exact.lastSteps, `threshold ${threshold}`).toBe(steps);
      expect(fromExact).toEqual(m.forward([1, 3], steps)[1]);
      // every unit of the exiting token computed: the same rows as a run at full depth
      const full = m.session(4);
      full.feed(1);
      full.feed(3);
      expect(exact.keys).toEqual(full.keys);
      expect(exact.values).toEqual(full.values);

      const copy = m.session(4);
      copy.feed(1);
      expect(copy.feed(3, { threshold, policy: "copy" })).toEqual(fromExact);
      // unit u = step * 2 + layer; the units past the exit step copy the exit step's rows of the same layer
      for (let u = 2 * steps; u < 8; u++) {
        expect(copy.keys[u][1]).toBe(copy.keys[2 * (steps - 1) + (u % 2)][1]);
        expect(copy.values[u][1]).toBe(copy.values[2 * (steps - 1) + (u % 2)][1]);
      }
      expect(copy.keys.map((unit) => unit.length)).toEqual(new Array(8).fill(2));
    }
    for (const bad of [-0.1, 1.5, Number.NaN]) expect(() => m.session(2).feed(0, { threshold: bad, policy: "exact" })).toThrow(RangeError);
  });

  test("rollback truncates every cache unit of a stack; feeding on equals a fresh session, exits included", () => {
    const ref = ReferenceModel.load(tinyModelPath({ vocabSize: 384, loops: 4, seed: 17, nLayers: 3, sandwichNorm: true, stepNorm: true, exitGate: true }));
    const toks = PROMPT.map((t) => t % 384);
    const s = ref.session(3);
    const exit = { threshold: 0.5, policy: "copy" } as const;
    const steps = toks.slice(0, 8).map((t) => (s.feed(t, exit), s.lastSteps));
    expect(new Set(steps).size).toBeGreaterThan(1); // real exits
    s.rollback(4);
    expect(s.keys.map((unit) => unit.length)).toEqual(new Array(9).fill(4));
    const tail = toks.slice(10).map((t) => s.feed(t, exit));
    const fresh = ref.session(3);
    const want = [...toks.slice(0, 4), ...toks.slice(10)].map((t) => fresh.feed(t, exit));
    tail.forEach((l, i) => expect(l).toEqual(want[4 + i]));
  });
});

// ---- properties of a synthetic model (GQA: 4 query heads over 2 kv heads) ----

describe("reference forward pass: properties", () => {
  const ref = ReferenceModel.load(tinyModelPath());

  test("causal: a prefix's logits do not change when tokens are appended", () => {
    const full = ref.forward(PROMPT, 3);
    const prefix = ref.forward(PROMPT.slice(0, 7), 3);
    prefix.forEach((l, i) => expect(l).toEqual(full[i]));
  });

  test("a cache window at least as long as the sequence is full attention", () => {
    const full = ref.forward(PROMPT, 3);
    for (const w of [PROMPT.length, PROMPT.length + 5]) {
      ref.forward(PROMPT, 3, { cacheWindow: w }).forEach((l, i) => expect(l).toEqual(full[i]));
    }
  });

  test("cacheWindow 1: each token sees only itself, so its logits do not depend on position or context", () => {
    const windowed = ref.forward(PROMPT, 4, { cacheWindow: 1 });
    PROMPT.forEach((t, i) => expect(windowed[i]).toEqual(ref.forward([t], 4)[0]));
  });

  test("windowed attention is translation invariant (RoPE is relative): only the last loops*(W-1) tokens matter", () => {
    const W = 3;
    const loops = 3;
    const p = PROMPT.length - 1;
    const need = loops * (W - 1); // receptive field grows by W-1 per loop
    const full = ref.forward(PROMPT, loops, { cacheWindow: W })[p];
    const shifted = ref.forward(PROMPT.slice(p - need), loops, { cacheWindow: W }).at(-1)!;
    const short = ref.forward(PROMPT.slice(p - need + 1), loops, { cacheWindow: W }).at(-1)!;
    // Not bit-equal: RoPE angles and the fp16 rounding of K differ with the absolute position.
    expect(maxAbsDiff(full, shifted)).toBeLessThan(0.01);
    expect(maxAbsDiff(full, short)).toBeGreaterThan(0.05); // the control: one token too few
  });

  test("GQA: query head h reads kv head floor(h / (n_heads / n_kv_heads))", () => {
    // Expand the 2 kv heads to 4 by copying kv head g to slots 2g and 2g+1:
    // as plain multi-head attention the model must compute the same logits.
    const src = readSafetensors(tinyModelPath({ vocabSize: 1000 }));
    const small = ReferenceModel.load(tinyModelPath({ vocabSize: 1000 }));
    const hd = 16;
    const expand = (name: string, headOf: (slot: number) => number): Uint8Array => {
      const w = src.tensors.get(name)!.data; // (2 * hd, 64) fp16
      const rowBytes = 64 * 2;
      const out = new Uint8Array(4 * hd * rowBytes);
      for (let slot = 0; slot < 4; slot++) {
        const g = headOf(slot);
        out.set(w.subarray(g * hd * rowBytes, (g + 1) * hd * rowBytes), slot * hd * rowBytes);
      }
      return out;
    };
    const build = (headOf: (slot: number) => number) => {
      const tensors: TensorToWrite[] = [...src.tensors].map(([name, t]) =>
        name === "block.wk.weight" || name === "block.wv.weight"
          ? { name, dtype: t.dtype, shape: [64, 64], data: expand(name, headOf) }
          : { name, ...t },
      );
      const path = tmp("mha");
      writeSafetensors(path, { ...src.metadata, n_kv_heads: "4" }, tensors);
      return ReferenceModel.load(path);
    };
    const tokens = PROMPT.map((t) => t % 1000);
    const want = small.forward(tokens, 2);
    build((slot) => Math.floor(slot / 2))
      .forward(tokens, 2)
      .forEach((l, i) => expect(l).toEqual(want[i]));
    // The control: the interleaved mapping (h % n_kv_heads) is a different model.
    const wrong = build((slot) => slot % 2).forward(tokens, 2);
    expect(maxAbsDiff(wrong.at(-1)!, want.at(-1)!)).toBeGreaterThan(0.01);
  });

  test("the K/V cache holds fp16 values, one cache per loop", () => {
    const s = ref.session(3);
    for (const t of PROMPT.slice(0, 5)) s.feed(t);
    expect(s.position).toBe(5);
    expect(s.keys.length).toBe(3);
    for (const cache of [...s.keys, ...s.values]) {
      expect(cache.length).toBe(5);
      for (const rowv of cache) {
        expect(rowv.length).toBe(2 * 16);
        for (const x of rowv) expect(roundToF16(x)).toBe(x);
      }
    }
    // Different loops see different hidden states, so their caches differ.
    expect([...s.keys[0][4]]).not.toEqual([...s.keys[1][4]]);
  });

  test("incremental session, rollback and forward agree exactly", () => {
    const s = ref.session(2);
    PROMPT.slice(0, 6).forEach((t) => s.feed(t));
    s.rollback(3);
    const tail = [PROMPT[10], PROMPT[11], PROMPT[12]].map((t) => s.feed(t));
    const fresh = ref.forward([...PROMPT.slice(0, 3), PROMPT[10], PROMPT[11], PROMPT[12]], 2);
    tail.forEach((l, i) => expect(l).toEqual(fresh[3 + i]));
  });

  test("more loops change the output; greedy is the argmax of forward", () => {
    const a = ref.forward(PROMPT.slice(0, 4), 2).at(-1)!;
    const b = ref.forward(PROMPT.slice(0, 4), 4).at(-1)!;
    expect(maxAbsDiff(a, b)).toBeGreaterThan(0.1);
    const out = ref.greedy(PROMPT.slice(0, 3), 5, 4);
    const logits = ref.forward([...PROMPT.slice(0, 3), ...out.slice(0, 4)], 4);
    expect(logits.slice(2).map(argmax)).toEqual(out);
  });

  test("bad arguments are RangeErrors", () => {
    expect(() => ref.forward([50257], 1)).toThrow(RangeError);
    expect(() => ref.forward([-1], 1)).toThrow(RangeError);
    expect(() => ref.forward([1.5], 1)).toThrow(RangeError);
    expect(() => ref.forward([1], 0)).toThrow(RangeError);
    expect(() => ref.forward([1], 65)).toThrow(RangeError);
    expect(() => ref.forward([1], 1, { cacheWindow: -1 })).toThrow(RangeError);
    expect(() => ref.session(1).feed(1, { threshold: 0.5, policy: "exact" })).toThrow(RangeError); // an exit rule needs a gate
  });
});
