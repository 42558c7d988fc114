// Exact early exit (LS_EXIT_EXACT, docs/early-exit.md): a token's logits
// come from its exit step, and the steps it skipped are computed when a
// later token first needs them, so every output equals computing every step
// for every token and taking each token's logits from its exit step (what
// the published Ouro code does). The oracle here is the kernels' own
// arithmetic at fixed depths: a session holding every earlier position at
// full depth, the token run to its exit step, then rolled back and run at
// full depth. Bit for bit, however the deferred units are computed: beside
// the next token in one batched step, in chunks of their own before it
// (more than a block keeps), by a plain forward pass, by a speculative
// cycle, or after a prefix copy.
import { beforeAll, describe, expect, test } from "bun:test";
import { type NativeModel, type NativeSession, SPEC_FLAGS } from "../../src/engine/binding.ts";
import { type ExitPlan, GREEDY } from "../../src/engine/types.ts";
import { ensureLibrary, expectBitIdentical, supportedPaths, tokensFor, withModel } from "../helpers/kernels.ts";
import { tinyModelPath } from "../helpers/models.ts";

const VOCAB = 384;
const OURO_LIKE = { vocabSize: VOCAB, loops: 4, seed: 17, nLayers: 3, sandwichNorm: true, stepNorm: true, exitGate: true };
const ONE_LAYER = { ...OURO_LIKE, nLayers: 1, seed: 29 };

beforeAll(ensureLibrary);

const exact = (threshold: number): ExitPlan => ({ threshold, policy: "exact" });

interface Decoded {
  fed: number[]; // every token fed, prompt first
  logits: Float32Array[]; // of each sampled token
  steps: number[]; // its exit step + 1
}

/** Greedy decoding of n tokens after the prompt under `exit`, one step a token; `session` is left holding them. */
function decodeExact(s: NativeSession, prompt: number[], loops: number, n: number, exit: (i: number) => ExitPlan | undefined): Decoded {
  const out: Decoded = { fed: [...prompt], logits: [], steps: [] };
  let feed = prompt;
  for (let i = 0; i < n; i++) {
    const logits = new Float32Array(VOCAB);
    const t = s.step(Int32Array.from(feed), loops, GREEDY, logits, exit(i));
    out.logits.push(logits);
    out.steps.push(s.lastSteps);
    out.fed.push(t);
    feed = [t];
  }
  return out;
}

/**
 * Every step for every token, each sampled token's logits taken at its
 * exit step: position q run to d.steps[i] steps on a session holding every
 * earlier position at full depth, then rolled back and run at full depth.
 */
function everyStepSelect(m: NativeModel, d: Decoded, promptLength: number, loops: number): Float32Array[] {
  const s = m.newSession(d.fed.length + 1, loops, 0);
  try {
    if (promptLength > 1) s.forward(Int32Array.from(d.fed.slice(0, promptLength - 1)), loops);
    return d.steps.map((steps, i) => {
      const q = promptLength - 1 + i;
      const logits = new Float32Array(VOCAB);
      s.step(Int32Array.of(d.fed[q]), steps, GREEDY, logits);
      s.rollback(q);
      s.forward(Int32Array.of(d.fed[q]), loops);
      return logits;
    });
  } finally {
    s.close();
  }
}

describe("exact early exit equals every step for every token, the exit step selected", () => {
  for (const [name, opts] of [["three layers", OURO_LIKE], ["one layer", ONE_LAYER]] as const)
    test(`${name}: tokens, exit steps and logits bit for bit at thresholds 0 to 0.9, on every SIMD path`, () => {
      const path = tinyModelPath(opts);
      const prompt = tokensFor(VOCAB, 11, 2);
      const depths = new Set<number>();
      for (const simd of supportedPaths(path))
        withModel(path, 2, simd, (m) => {
          for (const [loops, threshold] of [[4, 0], [4, 0.3], [4, 0.5], [6, 0.7], [8, 0.5], [3, 0.9]] as const) {
            const s = m.newSession(prompt.length + 24, loops, 0);
            try {
              const d = decodeExact(s, prompt, loops, 24, () => exact(threshold));
              expectBitIdentical(d.logits, everyStepSelect(m, d, prompt.length, loops), `${simd}, loops ${loops}, threshold ${threshold}`);
              for (const st of d.steps) depths.add(st);
            } finally {
              s.close();
            }
          }
        });
      expect(depths.size).toBeGreaterThan(2); // tokens exit at several depths: the deferred units are exercised
    }, 120_000);

  test("more deferred positions than a block keeps: dozens of one-step tokens, then one that goes deep", () => {
    withModel(tinyModelPath(OURO_LIKE), 2, "auto", (m) => {
      const prompt = tokensFor(VOCAB, 5, 4);
      for (const shallow of [3, 15, 40, 100]) {
        const s = m.newSession(prompt.length + shallow + 4, 4, 0);
        try {
          // threshold 0: every token stops after one step; then thresholds that reach the last step
          const d = decodeExact(s, prompt, 4, shallow + 3, (i) => exact(i < shallow ? 0 : 0.999));
          expect(d.steps.slice(0, shallow)).toEqual(new Array(shallow).fill(1));
          expect(d.steps.slice(shallow)).toContain(4);
          expectBitIdentical(d.logits, everyStepSelect(m, d, prompt.length, 4), `${shallow} shallow tokens`);
        } finally {
          s.close();
        }
      }
    });
  }, 120_000);

  test("a session holding deferred units serves every entry point as if every position ran every step", () => {
    withModel(tinyModelPath(OURO_LIKE), 2, "auto", (m) => {
      const prompt = tokensFor(VOCAB, 7, 9);
      const more = tokensFor(VOCAB, 6, 10);
      const full = m.newSession(40, 4, 0);
      const deferred = () => {
        const s = m.newSession(40, 4, 0);
        const d = decodeExact(s, prompt, 4, 6, () => exact(0)); // six tokens, each after one step
        return { s, fed: d.fed.slice(0, -1) }; // the last sampled token is not fed yet
      };
      try {
        // the reference: the same tokens at full depth
        const { s: probe, fed } = deferred();
        probe.close();
        full.forward(Int32Array.from(fed), 4);
        const want = new Float32Array(VOCAB);
        full.forward(Int32Array.from(more), 4, want, 1);

        // a plain forward pass (the deferred units computed first, in chunks)
        const a = deferred();
        const viaForward = new Float32Array(VOCAB);
        a.s.forward(Int32Array.from(more), 4, viaForward, 1);
        expectBitIdentical([viaForward], [want], "forward");

        // a batched step of a prompt chunk without an exit rule
        const b = deferred();
        const viaBatch = new Float32Array(VOCAB);
        m.batchStep([{ session: b.s, tokens: Int32Array.from(more), loops: 4, sampling: GREEDY, logitsOut: viaBatch }]);
        expectBitIdentical([viaBatch], [want], "batch");

        // a prefix copied with its deferred units
        const c = deferred();
        const copy = m.newSession(40, 4, 0);
        copy.copyPrefixFrom(c.s, c.fed.length);
        const viaCopy = new Float32Array(VOCAB);
        copy.forward(Int32Array.from(more), 4, viaCopy, 1);
        expectBitIdentical([viaCopy], [want], "prefix copy");

        // rolled back into the deferred positions, then fed again
        const r = deferred();
        r.s.rollback(prompt.length + 2);
        const viaRollback = new Float32Array(VOCAB);
        r.s.forward(Int32Array.from([...r.fed.slice(prompt.length + 2), ...more]), 4, viaRollback, 1);
        expectBitIdentical([viaRollback], [want], "rollback");

        for (const x of [a, b, c, r]) x.s.close();
        copy.close();
      } finally {
        full.close();
      }
    });
  }, 120_000);

  test("self-speculative decoding after exact exits equals plain decoding of the same history", () => {
    withModel(tinyModelPath({ ...OURO_LIKE, residualScale: 0.05 }), 2, "auto", (m) => {
      const prompt = tokensFor(VOCAB, 8, 12);
      const spec = m.newSession(80, 4, 0);
      const plain = m.newSession(80, 4, 0);
      try {
        const d = decodeExact(spec, prompt, 4, 5, () => exact(0.3));
        const pending = d.fed.at(-1) as number;
        plain.forward(Int32Array.from(d.fed.slice(0, -1)), 4);
        const want: number[] = [];
        let next = pending;
        for (let i = 0; i < 12; i++) {
          next = plain.step(Int32Array.of(next), 4, GREEDY);
          want.push(next);
        }
        const out = new Int32Array(4);
        const got: number[] = [];
        let p = pending;
        while (got.length < 12) {
          const n = spec.specCycle(p, { draftLoops: 2, verifyLoops: 4, draftAhead: 3, kBranches: 1, maxNew: 12 - got.length, flags: SPEC_FLAGS.exactDraftHead, sampling: GREEDY }, out, { drafted: 0, accepted: 0 });
          got.push(...out.subarray(0, n));
          p = out[n - 1];
        }
        expect(got).toEqual(want);
      } finally {
        spec.close();
        plain.close();
      }
    });
  }, 120_000);

  test("the exact policy with a cache window is refused; the copy policy takes one", () => {
    withModel(tinyModelPath(OURO_LIKE), 1, "auto", (m) => {
      const s = m.newSession(32, 4, 6);
      try {
        expect(() => s.step(Int32Array.of(1, 2, 3), 4, GREEDY, null, exact(0.5))).toThrow();
        expect(s.pos).toBe(0);
        s.step(Int32Array.of(1, 2, 3), 4, GREEDY, null, { threshold: 0.5, policy: "copy" });
        expect(s.pos).toBe(3);
      } finally {
        s.close();
      }
    });
  });
});
