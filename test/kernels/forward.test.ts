// The C forward pass (libloopserve.so through the FFI binding) against the
// TypeScript reference, on every SIMD path this CPU has, plus the properties
// the generation modes rely on: batch invariance (bit-identical logits
// whatever the batch split or thread count), sliding window, rollback.
import { beforeAll, describe, expect, test } from "bun:test";
import { LS_ERR_ARG, LS_ERR_FULL, LS_ERR_STATE } from "../../src/abi/abi.generated.ts";
import { NativeError } from "../../src/engine/binding.ts";
import { GREEDY, type SimdChoice } from "../../src/engine/types.ts";
import type { SyntheticOptions } from "../../src/model/synthetic.ts";
import { expectBitIdentical, feedInCalls, relErr, supportedPaths, tokensFor, withModel, withSession } from "../helpers/kernels.ts";
import { tinyModelPath } from "../helpers/models.ts";
import { argmax, ReferenceModel } from "../reference/forward.ts";

const TOL = 1e-3; // max|c - r| / max|r| against the float64 reference
const SIMD_TOL = 1e-4; // SIMD paths against the portable path

// Tiny shapes chosen so no width is a multiple of a vector width (tails on
// every path), with GQA, MQA and plain multi-head attention, tied and not.
const SHAPES: Record<string, SyntheticOptions> = {
  gqa: { dim: 48, nHeads: 6, nKvHeads: 2, ffnDim: 72, vocabSize: 97, loops: 3, seed: 11 },
  "mha-tied": { dim: 40, nHeads: 4, nKvHeads: 4, ffnDim: 56, vocabSize: 67, loops: 3, seed: 12, tiedOutput: true },
  mqa: { dim: 64, nHeads: 4, nKvHeads: 1, ffnDim: 136, vocabSize: 130, loops: 8, seed: 13 },
  // five query heads to a kv head: a decode token's heads go four through
  // the multi-query kernels, then one alone
  "mqa-5": { dim: 80, nHeads: 5, nKvHeads: 1, ffnDim: 72, vocabSize: 89, loops: 3, seed: 17 },
};

// Head widths the attention kernels tile differently (mqa's 16 is one
// AVX-512 vector): 32 (two), 56 (three and a half), 64 (four).
const HEAD_WIDTHS: Record<string, SyntheticOptions> = {
  "heads of 32": { dim: 128, nHeads: 4, nKvHeads: 2, ffnDim: 192, vocabSize: 89, loops: 3, seed: 14 },
  "heads of 56": { dim: 112, nHeads: 2, nKvHeads: 1, ffnDim: 160, vocabSize: 89, loops: 3, seed: 15 },
  "heads of 64": { dim: 128, nHeads: 2, nKvHeads: 2, ffnDim: 160, vocabSize: 89, loops: 3, seed: 16 },
};

let paths: SimdChoice[] = [];

beforeAll(() => {
  paths = supportedPaths(tinyModelPath(SHAPES.gqa));
});

describe("C logits match the TypeScript reference", () => {
  for (const [name, shape] of Object.entries({ ...SHAPES, ...HEAD_WIDTHS })) {
    test(`${name}: prefill and decode steps at loops 1, 3, 8 on every SIMD path`, () => {
      const path = tinyModelPath(shape);
      const ref = ReferenceModel.load(path);
      const vocab = shape.vocabSize;
      const prompt = tokensFor(vocab, 12);
      const decoded = tokensFor(vocab, 5, 3);
      const all = [...prompt, ...decoded];
      for (const loops of [1, 3, 8]) {
        const want = ref.forward(all, loops);
        for (const simd of paths) {
          withModel(path, 2, simd, (m) => {
            expect(m.info.simd).toBe(simd);
            expect(m.info.tiedOutput).toBe(shape.tiedOutput === true);
            withSession(m, 64, loops, 0, (s) => {
              const pre = new Float32Array(prompt.length * vocab);
              s.forward(Int32Array.from(prompt), loops, pre, prompt.length);
              for (let t = 0; t < prompt.length; t++) {
                const err = relErr(pre.subarray(t * vocab, (t + 1) * vocab), want[t]);
                if (!(err < TOL)) throw new Error(`${simd} loops ${loops} prefill token ${t}: rel err ${err}`);
              }
              for (let j = 0; j < decoded.length; j++) {
                const step = new Float32Array(vocab);
                s.forward(Int32Array.of(decoded[j]), loops, step, 1);
                const err = relErr(step, want[prompt.length + j]);
                if (!(err < TOL)) throw new Error(`${simd} loops ${loops} decode step ${j}: rel err ${err}`);
              }
              expect(s.pos).toBe(all.length);
            });
          });
        }
      }
    });
  }

  test("every SIMD path agrees with the portable path within 1e-4", () => {
    const shape = SHAPES.mqa;
    const path = tinyModelPath(shape);
    const toks = tokensFor(shape.vocabSize, 20);
    const run = (simd: SimdChoice) =>
      withModel(path, 2, simd, (m) =>
        withSession(m, 32, 8, 0, (s) => feedInCalls(s, toks, 8, [20], shape.vocabSize)),
      );
    const base = run("portable");
    for (const simd of paths) {
      const got = run(simd);
      for (let t = 0; t < toks.length; t++) expect(relErr(got[t], base[t])).toBeLessThan(SIMD_TOL);
    }
  });

  test("a sampled greedy continuation equals the reference's", () => {
    const shape = SHAPES.gqa;
    const path = tinyModelPath(shape);
    const ref = ReferenceModel.load(path);
    const prompt = tokensFor(shape.vocabSize, 6);
    const want = ref.greedy(prompt, 10, 3);
    for (const simd of paths) {
      withModel(path, 2, simd, (m) =>
        withSession(m, 32, 3, 0, (s) => {
          const got: number[] = [];
          const logits = new Float32Array(shape.vocabSize);
          let next = s.step(Int32Array.from(prompt), 3, GREEDY, logits);
          expect(next).toBe(argmax(logits));
          while (got.length < 10) {
            got.push(next);
            if (got.length < 10) next = s.step(Int32Array.of(next), 3, GREEDY, null);
          }
          expect(got).toEqual(want);
        }),
      );
    }
  });
});

describe("batch invariance", () => {
  for (const [name, shape] of Object.entries({ gqa: SHAPES.gqa, mqa: SHAPES.mqa, "mqa-5": SHAPES["mqa-5"], ...HEAD_WIDTHS }))
    test(`${name}: a token's logits are bit-identical for batches of 1, 7 and 64, decode, and 1 or 2 threads`, () => {
      const path = tinyModelPath(shape);
      const vocab = shape.vocabSize;
      const toks = tokensFor(vocab, 80);
      for (const simd of paths) {
        let base: Float32Array[] | null = null;
        for (const threads of [1, 2]) {
          withModel(path, threads, simd, (m) => {
            for (const sizes of [[80], [64, 16], [7], [1], [3, 64, 1, 12], [13, 2]]) {
              const got = withSession(m, 96, 3, 0, (s) => feedInCalls(s, toks, 3, sizes, vocab));
              if (base === null) base = got;
              else expectBitIdentical(got, base, `${simd} threads ${threads} calls ${sizes.join("+")}`);
            }
          });
        }
      }
    });

  test("decode attention reading 32K cached values or more a step, split over the pool, gives the one-thread bits", () => {
    // 4 heads of 32 read 128 values a position: decode steps from position
    // 256 on split over the pool, earlier ones run on the calling thread.
    const shape = HEAD_WIDTHS["heads of 32"];
    const path = tinyModelPath(shape);
    const toks = tokensFor(shape.vocabSize, 262);
    const sizes = [250, ...Array<number>(12).fill(1)];
    for (const simd of paths) {
      let base: Float32Array[] | null = null;
      for (const threads of [1, 2, 3]) {
        withModel(path, threads, simd, (m) => {
          const got = withSession(m, 300, 3, 0, (s) => feedInCalls(s, toks, 3, sizes, shape.vocabSize));
          if (base === null) base = got;
          else expectBitIdentical(got, base, `${simd} threads ${threads}`);
        });
      }
    }
  });

  test("logits do not depend on how many logit rows are requested", () => {
    const shape = SHAPES["mha-tied"];
    const path = tinyModelPath(shape);
    const vocab = shape.vocabSize;
    const toks = Int32Array.from(tokensFor(vocab, 9));
    for (const simd of paths) {
      withModel(path, 2, simd, (m) => {
        const all = withSession(m, 16, 3, 0, (s) => {
          const b = new Float32Array(9 * vocab);
          s.forward(toks, 3, b, 9);
          return b;
        });
        const last = withSession(m, 16, 3, 0, (s) => {
          const b = new Float32Array(vocab);
          s.forward(toks, 3, b, 1);
          return b;
        });
        expectBitIdentical([last], [all.slice(8 * vocab)], simd);
      });
    }
  });

  test("a prompt fed with fewer logit rows (its last loop skips the rest) leaves the same caches: decode after it is bit-identical", () => {
    const shape = SHAPES.gqa;
    const path = tinyModelPath(shape);
    const vocab = shape.vocabSize;
    // 150 tokens: three chunks, so a chunk may skip all, some or none of its rows.
    const toks = Int32Array.from(tokensFor(vocab, 150));
    const decoded = tokensFor(vocab, 4, 5);
    for (const simd of paths) {
      withModel(path, 2, simd, (m) => {
        for (const window of [0, 5]) {
          const run = (nLogits: number) =>
            withSession(m, 160, 3, window, (s) => {
              const b = new Float32Array(150 * vocab);
              if (nLogits > 0) s.forward(toks, 3, b, nLogits);
              else s.forward(toks, 3);
              const prompt = b.slice(0, nLogits * vocab); // the last nLogits positions' rows
              return [prompt, ...feedInCalls(s, decoded, 3, [1], vocab)];
            });
          const all = run(150);
          for (const n of [0, 1, 70]) {
            const got = run(n);
            const want = [n > 0 ? all[0].slice((150 - n) * vocab) : new Float32Array(0), ...all.slice(1)];
            expectBitIdentical(got, want, `${simd} window ${window}, ${n} logit rows`);
          }
        }
      });
    }
  });
});

describe("sliding window", () => {
  test("cache_window W matches the reference restricted to the last W positions, ring wrap included", () => {
    const shape = SHAPES.gqa;
    const path = tinyModelPath(shape);
    const ref = ReferenceModel.load(path);
    const vocab = shape.vocabSize;
    const W = 5;
    // 150 positions > W + 64: the ring of W + 64 rows wraps twice.
    const toks = tokensFor(vocab, 150);
    const want = ref.forward(toks, 3, { cacheWindow: W });
    const full = ref.forward(toks, 3);
    expect(relErr(want[149], full[149])).toBeGreaterThan(TOL); // the window matters
    for (const simd of paths) {
      withModel(path, 2, simd, (m) => {
        const batched = withSession(m, 200, 3, W, (s) => feedInCalls(s, toks, 3, [150], vocab));
        for (let t = 0; t < toks.length; t++) {
          const err = relErr(batched[t], want[t]);
          if (!(err < TOL)) throw new Error(`${simd} token ${t}: rel err ${err}`);
        }
        const stepped = withSession(m, 200, 3, W, (s) => feedInCalls(s, toks, 3, [1], vocab));
        expectBitIdentical(stepped, batched, `${simd} windowed decode vs prefill`);
        const mixed = withSession(m, 200, 3, W, (s) => feedInCalls(s, toks, 3, [70, 3, 64, 1], vocab));
        expectBitIdentical(mixed, batched, `${simd} windowed mixed calls`);
      });
    }
  });
});

describe("rollback", () => {
  test("rollback then re-forward gives identical logits, and new tokens match the reference", () => {
    const shape = SHAPES.mqa;
    const path = tinyModelPath(shape);
    const ref = ReferenceModel.load(path);
    const vocab = shape.vocabSize;
    const prompt = tokensFor(vocab, 20);
    const a = tokensFor(vocab, 5, 1);
    const b = tokensFor(vocab, 4, 2);
    for (const simd of paths) {
      withModel(path, 2, simd, (m) =>
        withSession(m, 64, 4, 0, (s) => {
          feedInCalls(s, prompt, 4, [20], vocab);
          const first = feedInCalls(s, a, 4, [5], vocab);
          expect(s.pos).toBe(25);
          s.rollback(20);
          expect(s.pos).toBe(20);
          const again = feedInCalls(s, a, 4, [1], vocab);
          expectBitIdentical(again, first, `${simd} after rollback`);
          s.rollback(22);
          const other = feedInCalls(s, b, 4, [4], vocab);
          const want = ref.forward([...prompt, ...a.slice(0, 2), ...b], 4);
          for (let j = 0; j < b.length; j++) expect(relErr(other[j], want[22 + j])).toBeLessThan(TOL);
        }),
      );
    }
  });

  test("a windowed session refuses a rollback past what its ring still holds", () => {
    const shape = SHAPES.gqa;
    const path = tinyModelPath(shape);
    withModel(path, 1, "portable", (m) =>
      withSession(m, 400, 2, 4, (s) => {
        feedInCalls(s, tokensFor(shape.vocabSize, 300), 2, [64], shape.vocabSize);
        expect(() => s.rollback(100)).toThrow(NativeError);
        expect(s.pos).toBe(300);
        s.rollback(260); // within one chunk of the newest position: kept
        expect(s.pos).toBe(260);
      }),
    );
  });
});

describe("argument checks", () => {
  test("bad tokens, loops, sizes and states are refused without changing the session", () => {
    const shape = SHAPES.gqa;
    const path = tinyModelPath(shape);
    withModel(path, 1, "portable", (m) =>
      withSession(m, 8, 3, 0, (s) => {
        const code = (fn: () => void): number => {
          try {
            fn();
          } catch (e) {
            return (e as NativeError).code;
          }
          return 0;
        };
        expect(code(() => s.forward(Int32Array.of(shape.vocabSize), 3))).toBe(LS_ERR_ARG);
        expect(code(() => s.forward(Int32Array.of(-1), 3))).toBe(LS_ERR_ARG);
        expect(code(() => s.forward(Int32Array.of(1), 0))).toBe(LS_ERR_ARG);
        expect(code(() => s.forward(Int32Array.of(1), 4))).toBe(LS_ERR_ARG);
        expect(code(() => s.forward(new Int32Array(0), 3))).toBe(LS_ERR_ARG);
        expect(code(() => s.forward(Int32Array.of(1, 2), 3, new Float32Array(3 * shape.vocabSize), 3))).toBe(LS_ERR_ARG);
        expect(code(() => s.forward(new Int32Array(9), 3))).toBe(LS_ERR_FULL);
        expect(s.pos).toBe(0);
        s.forward(Int32Array.of(1, 2, 3), 2); // loop 2 now lacks these positions
        expect(code(() => s.forward(Int32Array.of(4), 3))).toBe(LS_ERR_STATE);
        s.forward(Int32Array.of(4), 2); // fewer loops is fine
        expect(code(() => s.rollback(5))).toBe(LS_ERR_ARG);
        s.rollback(0); // truncates every loop: all three loops usable again
        s.forward(Int32Array.of(1, 2, 3, 4, 5, 6, 7, 8), 3);
        expect(code(() => s.forward(Int32Array.of(1), 3))).toBe(LS_ERR_FULL);
        expect(code(() => s.step(Int32Array.of(1), 3, { ...GREEDY, temperature: -1 }))).toBe(LS_ERR_ARG);
      }),
    );
  });

  test("a session rejects impossible sizes with a message", () => {
    const path = tinyModelPath(SHAPES.gqa);
    withModel(path, 1, "portable", (m) => {
      expect(() => m.newSession(0, 3, 0)).toThrow(/max_seq/);
      expect(() => m.newSession(8, 0, 0)).toThrow(/loops/);
      expect(() => m.newSession(8, 3, -1)).toThrow(/cache_window/);
    });
  });
});
