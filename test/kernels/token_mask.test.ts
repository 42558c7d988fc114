// Token masks (structured output, loopserve.h): a masked row draws only
// tokens its mask allows, from the masked logits, on every path: a masked
// row in a batch equals the same row alone (greedy and sampled, rows of
// different depths, early exit, unmasked rows beside it, every SIMD path);
// a pipelined step whose masks are written after it began equals the plain
// step; speculative cycles under a path's mask give plain masked decoding's
// tokens (greedy, chain and tree) and only allowed tokens when sampling; a
// path no token may follow ends a cycle without a token of the verifier's
// own. The mask here is a stand-in for a grammar (helpers/batch.ts hashMask),
// about one token in three allowed, depending on every token before.
import { beforeAll, describe, expect, test } from "bun:test";
import { type BatchRow, maskWords, NativeError, type NativeModel, type NativeSession, type SpecCycleParams } from "../../src/engine/binding.ts";
import { GREEDY, type SamplingParams } from "../../src/engine/types.ts";
import { allows, expectMaskedLogits, expectSameAsSolo, hashMask, type MaskRule, plans, ruleMask } from "../helpers/batch.ts";
import { ensureLibrary, supportedPaths, withModel } from "../helpers/kernels.ts";
import { tinyModelPath } from "../helpers/models.ts";

const VOCAB = 512;
const SHAPE = { vocabSize: VOCAB, loops: 6, seed: 3 };
// Shallow loops mostly agree with deep ones: drafts are often accepted.
const AGREEING = { vocabSize: VOCAB, loops: 4, seed: 21, residualScale: 0.05 };
const EXIT_MODEL = { vocabSize: VOCAB, loops: 4, seed: 17, nLayers: 2, stepNorm: true, exitGate: true };
const RULE = hashMask(3);
const SAMPLED: SamplingParams = { temperature: 0.9, topK: 0, topP: 1, repetitionPenalty: 1, seed: 11 };

beforeAll(ensureLibrary);

describe("a masked row draws what its mask allows, and what it draws alone", () => {
  test("masked and unmasked rows of every depth, greedy and sampled, every SIMD path, 1 and 2 threads", () => {
    const path = tinyModelPath(SHAPE);
    for (const simd of supportedPaths(path))
      for (const threads of [1, 2])
        withModel(path, threads, simd, (m) => {
          const mixed = plans(VOCAB, 12, 7, [{ mode: "fp16" }]).map((p, i) => (i % 3 === 2 ? p : { ...p, mask: RULE }));
          expectSameAsSolo(m, mixed, `${simd} x${threads}`);
        });
  }, 120_000);

  test("rows that exit early (a model with an exit gate) under masks", () => {
    withModel(tinyModelPath(EXIT_MODEL), 2, "auto", (m) => {
      const exiting = plans(VOCAB, 8, 8, [{ mode: "fp16" }]).map((p, i) => ({
        ...p,
        window: 0,
        mask: RULE,
        exit: { policy: i % 2 ? "copy" : "exact", threshold: 0.4 } as const,
      }));
      const traces = expectSameAsSolo(m, exiting, "early exit");
      expect(new Set(traces.flatMap((t) => t.steps)).size, "some tokens exit before the last step").toBeGreaterThan(1);
    });
  }, 60_000);

  test("a mask changes the draw: the unmasked greedy token is refused when the mask forbids it", () => {
    withModel(tinyModelPath(SHAPE), 1, "auto", (m) => {
      const s = m.newSession(8, 2, 0);
      const logits = new Float32Array(VOCAB);
      try {
        const free = m.batchStep([{ session: s, tokens: Int32Array.of(5), loops: 2, sampling: GREEDY, logitsOut: logits }])[0];
        s.rollback(0);
        const mask = new Uint32Array(maskWords(VOCAB)).fill(0xffffffff);
        mask[free >>> 5] &= ~(1 << (free & 31));
        const masked = m.batchStep([{ session: s, tokens: Int32Array.of(5), loops: 2, sampling: GREEDY, mask: { fill: (o) => o.set(mask), successor: () => { throw new Error("unused"); } } }])[0];
        expect(masked).not.toBe(free);
        expect(allows(mask, masked)).toBe(true);
      } finally {
        s.close();
      }
    });
  });

  test("a mask that allows nothing fails the call and changes no session", () => {
    withModel(tinyModelPath(SHAPE), 1, "auto", (m) => {
      const s = m.newSession(8, 2, 0);
      try {
        const none = { fill: (o: Uint32Array) => o.fill(0), successor: () => none };
        expect(() => m.batchStep([{ session: s, tokens: Int32Array.of(5), loops: 2, sampling: GREEDY, mask: none }])).toThrow(NativeError);
      } finally {
        s.close();
      }
    });
  });
});

describe("pipelined steps fill their masks while the forward pass runs", () => {
  test("a pipelined masked decode equals the plain one (pipelineBegin fills the masks after the step began)", () => {
    withModel(tinyModelPath(SHAPE), 2, "auto", (m) => {
      const decode = (pipelined: boolean) => {
        const sessions = [0, 1, 2].map(() => m.newSession(40, 4, 0));
        const generated: number[][] = [[], [], []];
        try {
          let feeds = [Int32Array.of(1, 2, 3), Int32Array.of(9), Int32Array.of(7, 7)];
          for (let step = 0; step < 10; step++) {
            const rows: BatchRow[] = sessions.map((session, i) => ({
              session,
              tokens: feeds[i],
              loops: 2 + i,
              sampling: i === 1 ? SAMPLED : GREEDY,
              mask: i === 2 ? undefined : ruleMask(RULE, VOCAB, generated[i]),
            }));
            let out: Int32Array;
            if (pipelined) {
              m.pipelineBegin(rows);
              out = m.pipelineEnd();
            } else out = m.batchStep(rows);
            out.forEach((t, i) => generated[i].push(t));
            feeds = [...out].map((t) => Int32Array.of(t));
          }
        } finally {
          for (const s of sessions) s.close();
        }
        return generated;
      };
      const plain = decode(false);
      expect(decode(true)).toEqual(plain);
      for (const i of [0, 1]) expect(plain[i].every((t, k) => allows(RULE(VOCAB, plain[i].slice(0, k)), t))).toBe(true);
    });
  });
});

/** Plain masked decoding: n tokens after the prompt, each a batch of one. */
function plainMasked(m: NativeModel, prompt: number[], V: number, n: number, sampling: SamplingParams, rule: MaskRule, logits?: Float32Array[]): number[] {
  const s = m.newSession(prompt.length + n + 1, V, 0);
  const out: number[] = [];
  try {
    let feed = Int32Array.from(prompt);
    while (out.length < n) {
      const row = new Float32Array(VOCAB);
      const t = m.batchStep([{ session: s, tokens: feed, loops: V, sampling, logitsOut: row, mask: ruleMask(rule, VOCAB, out) }])[0];
      out.push(t);
      logits?.push(row);
      feed = Int32Array.of(t);
    }
  } finally {
    s.close();
  }
  return out;
}

/** The path mask a cycle asks for, after the generated tokens: `ends` says where no token may follow. */
function pathRule(rule: MaskRule, generated: number[], ends: (all: number[]) => boolean = () => false) {
  return (path: Int32Array, mask: Uint32Array): boolean => {
    const all = [...generated, ...path];
    if (ends(all)) return false;
    mask.set(rule(VOCAB, all));
    return true;
  };
}

/** Speculative masked decoding: the first token plain (masked), then cycles until n tokens. */
function speculateMasked(m: NativeModel, prompt: number[], n: number, p: (maxNew: number) => SpecCycleParams, rule: MaskRule, logits?: Float32Array[], ends?: (all: number[]) => boolean) {
  const s: NativeSession = m.newSession(prompt.length + n + 80, Math.max(p(1).verifyLoops, p(1).draftLoops), 0);
  const out: number[] = [];
  const cycles: number[] = [];
  try {
    const first = new Float32Array(VOCAB);
    out.push(m.batchStep([{ session: s, tokens: Int32Array.from(prompt), loops: p(1).verifyLoops, sampling: p(1).sampling, logitsOut: first, mask: ruleMask(rule, VOCAB, []) }])[0]);
    logits?.push(first);
    const buf = new Int32Array(17);
    const rows = new Float32Array(17 * VOCAB);
    const stats = { drafted: 0, accepted: 0 };
    while (out.length < n && !ends?.(out)) {
      const got = s.specCycle(out[out.length - 1], p(n - out.length), buf, stats, rows, pathRule(rule, out, ends));
      cycles.push(got);
      for (let i = 0; i < got; i++) logits?.push(rows.slice(i * VOCAB, (i + 1) * VOCAB));
      out.push(...buf.subarray(0, got));
    }
  } finally {
    s.close();
  }
  return { tokens: out, cycles };
}

const spec = (D: number, V: number, k: number, K: number, sampling: SamplingParams) => (maxNew: number): SpecCycleParams => ({
  draftLoops: D,
  verifyLoops: V,
  draftAhead: k,
  kBranches: K,
  maxNew,
  sampling,
});

describe("speculative cycles under masks", () => {
  const PROMPT = [464, 300, 318, 257, 22, 110, 11, 290];

  test("greedy chain and tree cycles give plain masked decoding's tokens and its masked logits, bit for bit", () => {
    withModel(tinyModelPath(AGREEING), 2, "auto", (m) => {
      const plainLogits: Float32Array[] = [];
      const reference = plainMasked(m, PROMPT, 4, 40, GREEDY, RULE, plainLogits);
      for (const [D, k, K] of [[1, 4, 1], [2, 6, 1], [1, 3, 3], [2, 4, 4], [6, 4, 1]]) {
        const logits: Float32Array[] = [];
        const got = speculateMasked(m, PROMPT, 40, spec(D, 4, k, K, GREEDY), RULE, logits);
        expect(got.tokens.slice(0, 40), `D=${D} k=${k} K=${K}`).toEqual(reference);
        for (let i = 0; i < 40; i++) expect(Buffer.from(logits[i].buffer).equals(Buffer.from(plainLogits[i].buffer)), `D=${D} k=${k} K=${K} token ${i} logits`).toBe(true);
        expect(got.cycles.some((c) => c > 1), "some drafts are accepted").toBe(true);
      }
    });
  }, 60_000);

  test("sampled chain cycles draw only allowed tokens, from masked logits", () => {
    withModel(tinyModelPath(AGREEING), 2, "auto", (m) => {
      for (const seed of [1, 2, 3]) {
        const logits: Float32Array[] = [];
        const got = speculateMasked(m, PROMPT, 30, spec(1, 4, 4, 1, { ...SAMPLED, seed }), RULE, logits);
        got.tokens.slice(0, 30).forEach((t, i) => {
          const mask = RULE(VOCAB, got.tokens.slice(0, i));
          expect(allows(mask, t), `seed ${seed} token ${i}`).toBe(true);
          expectMaskedLogits(logits[i], mask, `seed ${seed} token ${i}`);
        });
      }
    });
  }, 60_000);

  test("a path no token may follow ends the cycle there, without a token of the verifier's own", () => {
    withModel(tinyModelPath(AGREEING), 2, "auto", (m) => {
      const reference = plainMasked(m, PROMPT, 4, 12, GREEDY, RULE);
      for (const K of [1, 3]) {
        // nothing may follow the 7th token: decoding stops there, every token before it plain decoding's
        const got = speculateMasked(m, PROMPT, 12, spec(1, 4, 6, K, GREEDY), RULE, undefined, (all) => all.length >= 7);
        expect(got.tokens, `K=${K}`).toEqual(reference.slice(0, 7));
      }
    });
  }, 60_000);
});
