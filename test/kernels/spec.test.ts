// ls_spec_cycle (kernels/cpu/spec.c) through the binding: a session continues
// exactly as plain decoding after speculative cycles, bad settings are
// refused without touching the session, every SIMD path and thread count
// gives the same tokens, and speculative sampling draws from plain
// sampling's distribution (chi-square against the exact distribution, with
// a deliberately broken sampler showing the test can fail).
import { beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { NativeError, NativeModel, type NativeSession, type SpecCycleParams } from "../../src/engine/binding.ts";
import type { SamplingParams, SimdChoice } from "../../src/engine/types.ts";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import type { SyntheticOptions } from "../../src/model/synthetic.ts";
import { LS_SIMD_AVX2, LS_SIMD_AVX512, LS_SIMD_PORTABLE } from "../../src/abi/abi.generated.ts";
import { LS_SPEC_TEST_ACCEPT_ALL } from "../helpers/abi_testing.generated.ts";
import { ensureLibrary, LIB, supportedPaths } from "../helpers/kernels.ts";
import { writeDescriptor } from "../helpers/model_descriptor.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";
import { runSanitized, SANITIZED_BUILD_MS, sanitizedDriver } from "../helpers/sanitized.ts";

// Shallow loops mostly agree with deep ones: most drafts are accepted.
const AGREEING: Partial<SyntheticOptions> = { seed: 21, residualScale: 0.05 };
// A tiny vocabulary so sampled distributions can be compared cell by cell.
const SMALL_VOCAB: Partial<SyntheticOptions> = { dim: 32, nHeads: 4, nKvHeads: 2, ffnDim: 64, vocabSize: 12, loops: 4, seed: 5, residualScale: 0.5 };

beforeAll(ensureLibrary);

function withModel<T>(opts: Partial<SyntheticOptions>, fn: (m: NativeModel) => T, threads = 2, simd: SimdChoice = "auto"): T {
  const m = NativeModel.load(LIB, tinyModelPath(opts), threads, simd);
  try {
    return fn(m);
  } finally {
    m.close();
  }
}

const PROMPT = [464, 3290, 318, 257, 922, 1110, 11, 290, 3290];

interface Sampling {
  temperature: number;
  topK: number;
  topP: number;
  penalty: number;
}
const GREEDY: Sampling = { temperature: 0, topK: 0, topP: 1, penalty: 1 };

/** The binding's sampling parameters for s drawn with seed. */
function samplingOf(s: Sampling, seed: number): SamplingParams {
  return { temperature: s.temperature, topK: s.topK, topP: s.topP, repetitionPenalty: s.penalty, seed };
}

function params(D: number, V: number, k: number, K: number, maxNew: number, s: Sampling, seed: number, flags = 0): SpecCycleParams {
  return { draftLoops: D, verifyLoops: V, draftAhead: k, kBranches: K, maxNew, sampling: samplingOf(s, seed), flags };
}

function plainStep(session: NativeSession, tokens: number[], V: number, s: Sampling, seed: number): number {
  return session.step(Int32Array.from(tokens), V, samplingOf(s, seed));
}

/** Plain decoding: n tokens after the prompt. */
function plain(m: NativeModel, prompt: number[], V: number, n: number, s: Sampling, seed: number, window = 0): number[] {
  const session = m.newSession(prompt.length + n + 1, V, window);
  try {
    const out = [plainStep(session, prompt, V, s, seed)];
    while (out.length < n) out.push(plainStep(session, [out[out.length - 1]], V, s, seed));
    return out;
  } finally {
    session.close();
  }
}

/** Speculative decoding on `session` (the prompt already in it, `first` pending) until n tokens. */
function speculate(session: NativeSession, first: number, n: number, p: (maxNew: number) => SpecCycleParams): number[] {
  const out = [first];
  const buf = new Int32Array(17);
  const stats = { drafted: 0, accepted: 0 };
  while (out.length < n) {
    const got = session.specCycle(out[out.length - 1], p(n - out.length), buf, stats);
    out.push(...buf.subarray(0, got));
  }
  return out;
}

describe("speculative cycles leave the session as plain decoding would", () => {
  test("plain steps after speculative cycles continue exactly as plain decoding from the start", () => {
    withModel(AGREEING, (m) => {
      for (const [D, V, k, K, window] of [
        [1, 4, 4, 1, 0],
        [2, 4, 16, 1, 0],
        [1, 3, 8, 6, 0],
        [2, 4, 4, 4, 3],
        // drafts deeper than their verifier: the session holds D loops
        [6, 4, 4, 1, 0],
        [8, 1, 5, 1, 0],
        [5, 2, 6, 4, 3],
      ]) {
        const reference = plain(m, PROMPT, V, 60, GREEDY, 0, window);
        const session = m.newSession(PROMPT.length + 60 + 65, Math.max(D, V), window);
        try {
          const first = plainStep(session, PROMPT, V, GREEDY, 0);
          const head = speculate(session, first, 30, (maxNew) => params(D, V, k, K, maxNew, GREEDY, 0));
          expect(session.pos).toBe(PROMPT.length + 29); // the 30th token is pending, not fed
          const tail = [...head];
          while (tail.length < 60) tail.push(plainStep(session, [tail[tail.length - 1]], V, GREEDY, 0));
          expect(tail).toEqual(reference);
        } finally {
          session.close();
        }
      }
    });
  });

  test("a draft deeper than the verifier keeps loops [V, D) as a D-loop prefill would, wherever the session stands", () => {
    // Speculative cycles at D > V after plain steps at V (which leave loops
    // [V, D) behind: the cycle fills them in), then plain steps again (more
    // than a window's ring holds), then cycles again: every token is plain
    // decoding's at V, and the session's D-loop logits for the next position
    // are bit for bit those of a fresh D-loop prefill of the same tokens (so
    // the draft saw the real D-loop model).
    withModel(AGREEING, (m) => {
      for (const [D, V, K, window] of [
        [7, 3, 1, 0],
        [6, 2, 3, 0],
        [5, 3, 1, 4],
      ]) {
        const reference = plain(m, PROMPT, V, 160, GREEDY, 0, window);
        const session = m.newSession(PROMPT.length + 160 + 65, D, window);
        const fresh = m.newSession(PROMPT.length + 160 + 65, D, window);
        try {
          const out = [plainStep(session, PROMPT, V, GREEDY, 0)];
          const cycles = (until: number) => {
            const pending = out.pop() as number;
            out.push(...speculate(session, pending, until - out.length, (n) => params(D, V, 4, K, n, GREEDY, 0)));
          };
          const steps = (until: number) => {
            while (out.length < until) out.push(plainStep(session, [out[out.length - 1]], V, GREEDY, 0));
          };
          steps(10);
          cycles(30);
          steps(45);
          cycles(60);
          steps(140); // past the ring of window 4 (4 + 64 rows)
          cycles(160);
          expect(out.slice(0, 160)).toEqual(reference);

          const vocab = m.info.vocabSize;
          const resumed = new Float32Array(vocab);
          session.forward(Int32Array.of(out[out.length - 1]), D, resumed, 1);
          const prefilled = new Float32Array(vocab);
          fresh.forward(Int32Array.from([...PROMPT, ...out]), D, prefilled, 1);
          expect(resumed).toEqual(prefilled);
        } finally {
          session.close();
          fresh.close();
        }
      }
    });
  });

  test("every SIMD path and thread count gives the same speculative tokens (greedy and sampled)", () => {
    const runs: number[][] = [];
    const sampled: Sampling = { temperature: 0.9, topK: 40, topP: 0.95, penalty: 1.1 };
    for (const simd of supportedPaths(tinyModelPath(AGREEING))) {
      for (const threads of [1, 2]) {
        const m = NativeModel.load(LIB, tinyModelPath(AGREEING), threads, simd);
        try {
          const row: number[] = [];
          for (const s of [GREEDY, sampled]) {
            const session = m.newSession(PROMPT.length + 40 + 65, 4, 0);
            const first = plainStep(session, PROMPT, 4, s, 9);
            row.push(...speculate(session, first, 40, (maxNew) => params(2, 4, 6, 1, maxNew, s, 9)));
            session.close();
          }
          runs.push(row);
        } finally {
          m.close();
        }
      }
    }
    expect(runs.length).toBeGreaterThanOrEqual(2);
    for (const r of runs) expect(r).toEqual(runs[0]);
  });
});

describe("ls_spec_cycle_logits hands back the verifier's logits", () => {
  /** Speculates n tokens after PROMPT, keeping each cycle's logits rows; returns the tokens, their rows and the cycles' stats. */
  function speculateWithLogits(m: NativeModel, n: number, p: (maxNew: number) => SpecCycleParams, s: Sampling, V: number) {
    const vocab = m.info.vocabSize;
    const session = m.newSession(PROMPT.length + n + 65, V, 0);
    try {
      const first = new Float32Array(vocab);
      const out = [session.step(Int32Array.from(PROMPT), V, samplingOf(s, 3), first)];
      const rows = [first];
      const buf = new Int32Array(17);
      const logits = new Float32Array(17 * vocab);
      const stats = { drafted: 0, accepted: 0, cycles: 0 };
      const cycle = { drafted: 0, accepted: 0 };
      while (out.length < n) {
        const got = session.specCycle(out[out.length - 1], p(n - out.length), buf, cycle, logits);
        stats.accepted += cycle.accepted;
        stats.cycles++;
        for (let i = 0; i < got; i++) {
          out.push(buf[i]);
          rows.push(logits.slice(i * vocab, (i + 1) * vocab));
        }
      }
      return { out, rows, stats };
    } finally {
      session.close();
    }
  }

  /** Plain decoding's logits before each of `tokens`: one forward of the prompt and all but the last token. */
  function plainRows(m: NativeModel, tokens: number[], V: number) {
    const vocab = m.info.vocabSize;
    const fed = [...PROMPT, ...tokens.slice(0, -1)];
    const session = m.newSession(fed.length, V, 0);
    try {
      const all = new Float32Array(fed.length * vocab);
      session.forward(Int32Array.from(fed), V, all, fed.length);
      return tokens.map((_, i) => all.slice((PROMPT.length - 1 + i) * vocab, (PROMPT.length + i) * vocab));
    } finally {
      session.close();
    }
  }

  const sampled: Sampling = { temperature: 0.9, topK: 40, topP: 0.95, penalty: 1.1 };
  test.each([
    ["greedy chain", 2, 4, 6, 1, GREEDY],
    ["sampled chain", 2, 4, 6, 1, sampled],
    ["greedy tree", 1, 4, 4, 6, GREEDY],
  ] as const)("%s: every row is bit-identical to plain decoding's logits at verify_loops", (_, D, V, k, K, s) => {
    withModel({ ...AGREEING, residualScale: 0.3 }, (m) => {
      const { out, rows } = speculateWithLogits(m, 48, (maxNew) => params(D, V, k, K, maxNew, s, 3), s, V);
      const expected = plainRows(m, out, V);
      expect(rows).toHaveLength(out.length);
      for (let i = 0; i < out.length; i++) expect(rows[i]).toEqual(expected[i]);
    });
  });

  test("a tree whose accepted path ends in a leaf hands back that leaf's row", () => {
    withModel({ ...AGREEING, residualScale: 0.3 }, (m) => {
      const chain = speculateWithLogits(m, 48, (maxNew) => params(1, 4, 4, 1, maxNew, GREEDY, 3), GREEDY, 4);
      const tree = speculateWithLogits(m, 48, (maxNew) => params(1, 4, 4, 6, maxNew, GREEDY, 3), GREEDY, 4);
      expect(tree.out).toEqual(chain.out);
      // The spine is the chain's draft, so a tree accepting more per cycle took leaves.
      expect(tree.stats.accepted / tree.stats.cycles).toBeGreaterThan(chain.stats.accepted / chain.stats.cycles);
      const expected = plainRows(m, tree.out, 4);
      for (let i = 0; i < tree.out.length; i++) expect(tree.rows[i]).toEqual(expected[i]);
    });
  });

  test("a buffer shorter than draft_ahead + 1 rows is refused before the call", () => {
    withModel(AGREEING, (m) => {
      const session = m.newSession(PROMPT.length + 8, 4, 0);
      try {
        const first = plainStep(session, PROMPT, 4, GREEDY, 0);
        const small = new Float32Array(4 * m.info.vocabSize);
        expect(() => session.specCycle(first, params(2, 4, 4, 1, 8, GREEDY, 0), new Int32Array(17), { drafted: 0, accepted: 0 }, small)).toThrow(
          /logits buffer too small/,
        );
        expect(session.pos).toBe(PROMPT.length);
      } finally {
        session.close();
      }
    });
  });
});

describe("the draft head", () => {
  // Drafts score every token with a 2-bit copy of the output head and the
  // best few again with the model's own head: fp16 here, the stored int8
  // head of a quantized model below. Proposals change speed, never tokens.
  test("a quantized model (int4 block, int8 head) drafts too: greedy cycles equal plain decoding on every SIMD path", () => {
    const path = join(testTempDir(), "spec-int4-int8head.safetensors");
    quantizeModelFile(tinyModelPath({ ...AGREEING, vocabSize: 4096 }), path, { quant: "int4", head: "int8", groupSize: 32 });
    for (const simd of supportedPaths(path)) {
      const m = NativeModel.load(LIB, path, 2, simd);
      try {
        const reference = plain(m, PROMPT, 4, 40, GREEDY, 0);
        const session = m.newSession(PROMPT.length + 40 + 65, 4, 0);
        const first = plainStep(session, PROMPT, 4, GREEDY, 0);
        let accepted = 0;
        const out = [first];
        const buf = new Int32Array(17);
        const stats = { drafted: 0, accepted: 0 };
        while (out.length < 40) {
          const got = session.specCycle(out[out.length - 1], params(1, 4, 4, 1, 40 - out.length, GREEDY, 0), buf, stats);
          accepted += got - 1;
          out.push(...buf.subarray(0, got));
        }
        session.close();
        expect(out).toEqual(reference);
        expect(accepted).toBeGreaterThan(0); // the draft head proposes tokens the verifier keeps
      } finally {
        m.close();
      }
    }
  });
});

describe("ls_spec_cycle refuses what it cannot do, without touching the session", () => {
  test("bad settings, a sampled tree, a session at the wrong depth and no room are errors", () => {
    withModel(AGREEING, (m) => {
      const session = m.newSession(PROMPT.length + 8, 4, 0);
      try {
        const first = plainStep(session, PROMPT, 4, GREEDY, 0);
        const pos = session.pos;
        const buf = new Int32Array(17);
        const stats = { drafted: 0, accepted: 0 };
        const sampled: Sampling = { temperature: 0.7, topK: 0, topP: 1, penalty: 1 };
        const bad: [SpecCycleParams, number, string][] = [
          [params(5, 4, 4, 1, 4, GREEDY, 0), first, "draft deeper than the session"],
          [params(1, 5, 4, 1, 4, GREEDY, 0), first, "verify deeper than the session"],
          [params(1, 4, 17, 1, 4, GREEDY, 0), first, "draft_ahead 17"],
          [params(1, 4, 0, 1, 4, GREEDY, 0), first, "draft_ahead 0"],
          [params(1, 4, 8, 9, 4, GREEDY, 0), first, "K * k = 72"],
          [params(1, 4, 4, 2, 4, sampled, 0), first, "a tree with temperature > 0"],
          [params(1, 4, 4, 1, 0, GREEDY, 0), first, "max_new 0"],
          [params(1, 4, 4, 1, 4, GREEDY, 0), 50257, "pending token outside the vocabulary"],
          [params(1, 4, 4, 1, 4, GREEDY, 0, 64), first, "unknown flag"],
          [{ ...params(1, 4, 4, 2, 4, GREEDY, 0), leafMinProb: 1.5 }, first, "leaf_min_prob above 1"],
        ];
        for (const [p, pending, why] of bad) {
          expect(() => session.specCycle(pending, p, buf, stats), why).toThrow(NativeError);
          expect(session.pos, why).toBe(pos);
        }
        // No room: a 4-deep tree of 4 branches needs 17 rows, the session has 8 left.
        expect(() => session.specCycle(first, params(1, 4, 4, 4, 8, GREEDY, 0), buf, stats)).toThrow(/session is full/);
        expect(session.pos).toBe(pos);
        // Still usable, and exact, afterwards.
        const got = session.specCycle(first, params(1, 4, 4, 1, 5, GREEDY, 0), buf, stats);
        expect([...buf.subarray(0, got)]).toEqual(plain(m, PROMPT, 4, 1 + got, GREEDY, 0).slice(1));
      } finally {
        session.close();
      }
    });
  });

  test("a session whose loops are not all at its position is refused", () => {
    withModel(AGREEING, (m) => {
      const session = m.newSession(64, 4, 0);
      try {
        session.forward(Int32Array.from(PROMPT), 2); // only loops 0..1 hold the prompt
        expect(() => session.specCycle(5, params(1, 4, 4, 1, 4, GREEDY, 0), new Int32Array(17), { drafted: 0, accepted: 0 })).toThrow(
          /invalid session state/,
        );
      } finally {
        session.close();
      }
    });
  });
});

// ---- speculative sampling preserves the distribution ----

/** ls_sample's distribution (sample.c's procedure) in float64. */
function distribution(logits: Float32Array, history: number[], s: Sampling): number[] {
  const v = Array.from(logits, (x) => (Number.isNaN(x) ? Number.NEGATIVE_INFINITY : x));
  if (s.penalty !== 1)
    for (const h of new Set(history)) {
      const l = logits[h];
      v[h] = l > 0 ? l / s.penalty : l * s.penalty;
    }
  const vmax = Math.max(...v);
  const w = v.map((x) => Math.exp((x - vmax) / s.temperature));
  const rank = v.map((_, i) => i).sort((a, b) => v[b] - v[a] || a - b);
  const k = s.topK === 0 || s.topK >= v.length ? v.length : s.topK;
  const kept = rank.slice(0, k);
  let m = kept.length;
  if (s.topP < 1) {
    const total = kept.reduce((a, i) => a + w[i], 0);
    let run = 0;
    for (m = 0; m < kept.length; ) {
      run += w[kept[m++]];
      if (run >= s.topP * total) break;
    }
  }
  const p = new Array<number>(v.length).fill(0);
  const z = kept.slice(0, m).reduce((a, i) => a + w[i], 0);
  for (const i of kept.slice(0, m)) p[i] = w[i] / z;
  return p;
}

/** Exact next-token distribution after `context` at V loops. */
function nextDist(m: NativeModel, context: number[], V: number, s: Sampling): number[] {
  const session = m.newSession(context.length, V, 0);
  try {
    const logits = new Float32Array(m.info.vocabSize);
    session.forward(Int32Array.from(context), V, logits, 1);
    return distribution(logits, context, s);
  } finally {
    session.close();
  }
}

/** Pearson chi-square of counts against expected probabilities, cells with expectation < 5 pooled. */
function chiSquare(counts: number[], probs: number[], n: number): { stat: number; df: number } {
  let stat = 0;
  let cells = 0;
  let poolObs = 0;
  let poolExp = 0;
  for (let i = 0; i < counts.length; i++) {
    const e = probs[i] * n;
    if (e < 5) {
      poolObs += counts[i];
      poolExp += e;
      continue;
    }
    stat += (counts[i] - e) ** 2 / e;
    cells++;
  }
  if (poolExp > 0) {
    stat += (poolObs - poolExp) ** 2 / Math.max(poolExp, 1e-9);
    cells++;
  }
  return { stat, df: cells - 1 };
}

/** Upper critical value of chi-square(df) at significance 0.001 (Wilson-Hilferty). */
function critical(df: number): number {
  const z = 3.09;
  const a = 2 / (9 * df);
  return df * (1 - a + z * Math.sqrt(a)) ** 3;
}

const DRAW_SEEDS = 4000;
const V_LOOPS = 3;

/** Tokens 1..3 after the prompt for every seed, drawn plainly or speculatively. */
function draws(m: NativeModel, prompt: number[], s: Sampling, how: "plain" | "speculative", flags = 0): number[][] {
  const out: number[][] = [];
  for (let seed = 0; seed < DRAW_SEEDS; seed++) {
    const session = m.newSession(prompt.length + 4 + 65, V_LOOPS, 0);
    const first = plainStep(session, prompt, V_LOOPS, s, seed);
    let toks: number[];
    if (how === "plain") {
      toks = [first];
      while (toks.length < 3) toks.push(plainStep(session, [toks[toks.length - 1]], V_LOOPS, s, seed));
    } else {
      toks = speculate(session, first, 3, (maxNew) => params(1, V_LOOPS, 3, 1, maxNew, s, seed, flags)).slice(0, 3);
    }
    session.close();
    out.push(toks);
  }
  return out;
}

interface Fit {
  pairs: { stat: number; df: number };
  third: { stat: number; df: number };
}

/** Chi-square of the (t1, t2) joint and the t3 marginal against the exact distribution. */
function fit(m: NativeModel, prompt: number[], s: Sampling, samples: number[][]): Fit {
  const V = m.info.vocabSize;
  const p1 = nextDist(m, prompt, V_LOOPS, s);
  const pair = new Array<number>(V * V).fill(0);
  const third = new Array<number>(V).fill(0);
  for (let a = 0; a < V; a++) {
    if (p1[a] === 0) continue;
    const p2 = nextDist(m, [...prompt, a], V_LOOPS, s);
    for (let b = 0; b < V; b++) {
      pair[a * V + b] = p1[a] * p2[b];
      if (pair[a * V + b] === 0) continue;
      const p3 = nextDist(m, [...prompt, a, b], V_LOOPS, s);
      for (let c = 0; c < V; c++) third[c] += pair[a * V + b] * p3[c];
    }
  }
  const pairCounts = new Array<number>(V * V).fill(0);
  const thirdCounts = new Array<number>(V).fill(0);
  for (const [a, b, c] of samples) {
    pairCounts[a * V + b]++;
    thirdCounts[c]++;
  }
  return { pairs: chiSquare(pairCounts, pair, samples.length), third: chiSquare(thirdCounts, third, samples.length) };
}

const passes = (f: Fit) => f.pairs.stat < critical(f.pairs.df) && f.third.stat < critical(f.third.df);

describe("speculative sampling preserves the output distribution", () => {
  const PROMPT_SMALL = [1, 5, 3, 7];
  const CONFIGS: [string, Sampling][] = [
    ["temperature 1", { temperature: 1, topK: 0, topP: 1, penalty: 1 }],
    ["temperature 0.8, top_k 6, top_p 0.85, repetition_penalty 1.3", { temperature: 0.8, topK: 6, topP: 0.85, penalty: 1.3 }],
  ];

  for (const [name, s] of CONFIGS) {
    test(`${name}: tokens 1-3 follow plain sampling's distribution; accepting every draft would not`, () => {
      withModel(SMALL_VOCAB, (m) => {
        // The harness itself: plain sampling fits the exact distribution.
        const plainFit = fit(m, PROMPT_SMALL, s, draws(m, PROMPT_SMALL, s, "plain"));
        expect(passes(plainFit)).toBe(true);
        const specFit = fit(m, PROMPT_SMALL, s, draws(m, PROMPT_SMALL, s, "speculative"));
        expect(specFit.pairs.stat).toBeLessThan(critical(specFit.pairs.df));
        expect(specFit.third.stat).toBeLessThan(critical(specFit.third.df));
        // Power: the same test on a sampler that skips the acceptance rule fails.
        const broken = fit(m, PROMPT_SMALL, s, draws(m, PROMPT_SMALL, s, "speculative", LS_SPEC_TEST_ACCEPT_ALL));
        expect(passes(broken)).toBe(false);
      });
    });
  }

  test("the draft and verify distributions differ on this model (the acceptance rule has work to do)", () => {
    withModel(SMALL_VOCAB, (m) => {
      const s = CONFIGS[0][1];
      const p = nextDist(m, PROMPT_SMALL, V_LOOPS, s);
      const q = nextDist(m, PROMPT_SMALL, 1, s);
      const tv = p.reduce((a, x, i) => a + Math.abs(x - q[i]), 0) / 2;
      expect(tv).toBeGreaterThan(0.1);
    });
  });
});

// ---- under AddressSanitizer + UndefinedBehaviorSanitizer ----
//
// test/c/spec_asan_driver.c runs speculative cycles of every shape against
// plain stepping, on every SIMD path, plus an error path, with every kernel
// built under the sanitizers, for an fp16 model and a quantized one (~30 s
// on two cores).

describe("speculative cycles under ASan/UBSan", () => {
  let driver = "";
  beforeAll(async () => {
    driver = await sanitizedDriver("spec_asan_driver");
  }, SANITIZED_BUILD_MS);

  test(
    "no sanitizer report, and greedy cycles equal plain stepping, on every SIMD path",
    async () => {
      const fp16 = tinyModelPath({ ...AGREEING, vocabSize: 4096 });
      const quantized = join(testTempDir(), "spec-asan-int4.safetensors"); // drafts from the stored int8 head
      quantizeModelFile(fp16, quantized, { quant: "int4", head: "int8", groupSize: 32 });
      for (const model of [fp16, quantized]) {
        writeDescriptor(model);
        for (const simd of [LS_SIMD_PORTABLE, LS_SIMD_AVX2, LS_SIMD_AVX512].map(String)) {
          const r = runSanitized(driver, [model, simd]);
          const out = `${r.stdout}${r.stderr}`;
          if (/requested but the CPU lacks/.test(out)) continue;
          expect(r.code, out).toBe(0);
        }
      }
    },
    120_000,
  );
});
