// Recurrent depth (docs/model-format.md): a Huginn-shaped model (a prelude and
// a coda around the looped core, the input injected every step through an
// adapter from a seeded first state, sandwich_sum norms, q/k biases,
// interleaved RoPE, an embedding scale, the mid norm) and a Nanbeige-shaped
// one (head_dim wider than dim / n_heads, a norm between steps). The kernels
// against the float64 reference at every depth; the zero-shot exit rules
// (KL, entropy) token by token, and exact in the sense (an exiting
// token's logits are its exit depth's, bit for bit); every CPU feature on
// both: batches of mixed depths, exits and cache modes bit-identical to each
// row alone, self-speculative decoding by depth equal to plain decoding,
// int4 / int2 weights, compressed caches, prefix copies; and the bounded
// cache (cache_steps): the reference's shared slots, the memory it saves,
// and the combinations it refuses.
import { beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { type KvCacheSettings, NativeError, type NativeModel, type NativeSession } from "../../src/engine/binding.ts";
import { type ExitPlan, GREEDY } from "../../src/engine/types.ts";
import { KV_CACHE_MODES, kvModeSpec } from "../../src/model/kvcache.ts";
import { quantizeModelFile, type WeightQuant } from "../../src/model/quantize.ts";
import type { SyntheticOptions } from "../../src/model/synthetic.ts";
import { expectSameAsSolo, plans } from "../helpers/batch.ts";
import { ensureLibrary, expectBitIdentical, feedInCalls, relErr, tokensFor, withModel, withSession } from "../helpers/kernels.ts";
import { expectPositionsAsReference, expectSameTrace, nativeGreedy, referenceGreedy, withModelAndReference } from "../helpers/against_reference.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";
import { ReferenceModel } from "../reference/forward.ts";

const VOCAB = 384;
const TOL = 1e-3; // max|c - r| / max|r| against the float64 reference
/** Huginn-0125's layout at a tiny size: 1 prelude, 2 core, 1 coda layers; 4 steps by default. */
const HUGINN_LIKE: Partial<SyntheticOptions> = {
  dim: 64, nHeads: 4, nKvHeads: 4, ffnDim: 128, vocabSize: VOCAB, loops: 4, seed: 3, nLayers: 2, nPrelude: 1, nCoda: 1,
  injection: "adapter", stateStd: 0.5, embedScale: 8, midNorm: true, ropeLayout: "interleaved", qkBias: true, normLayout: "sandwich_sum",
};
/** Nanbeige4.2's layout at a tiny size: GQA, head_dim 32 with dim 64 over 4 heads, a norm between steps, 2 steps. */
const NANBEIGE_LIKE: Partial<SyntheticOptions> = { dim: 64, nHeads: 4, nKvHeads: 2, headDim: 32, ffnDim: 128, vocabSize: VOCAB, loops: 2, seed: 4, nLayers: 3, stepNorm: true };
const FAMILIES = [["Huginn-like", HUGINN_LIKE], ["Nanbeige-like", NANBEIGE_LIKE]] as const;

beforeAll(ensureLibrary);

/** Greedy decoding of n tokens after the prompt, one step per token; `exit` on every token but the first (the published Huginn code never exits a prompt's last position). */
function decode(m: NativeModel, prompt: number[], loops: number, n: number, exit?: ExitPlan, kv?: KvCacheSettings) {
  return withSession(m, prompt.length + n, loops, 0, (s) => nativeGreedy(s, m.info.vocabSize, prompt, loops, n, (i) => (i > 0 ? exit : undefined)), kv);
}

/** The reference's greedy decoding, as decode. */
function referenceDecode(ref: ReferenceModel, prompt: number[], loops: number, n: number, exit?: ExitPlan, cacheSteps = 0) {
  const s = ref.session(loops, { cacheSteps });
  let logits: Float32Array<ArrayBufferLike> = new Float32Array();
  for (const t of prompt) logits = s.feed(t);
  return referenceGreedy(s, logits, n, exit);
}

/** Zero-shot rules and policies at thresholds where this random model's tokens exit at varied steps. */
const ZERO_SHOT: ExitPlan[] = (["exact", "copy"] as const).flatMap((policy): ExitPlan[] => [
  { rule: "kl", threshold: 1, policy },
  { rule: "kl", threshold: 3, policy },
  { rule: "entropy", threshold: 0.3, policy },
  { rule: "entropy", threshold: 0.05, policy },
]);

describe("recurrent-depth models against the float64 reference", () => {
  for (const [name, opts] of FAMILIES)
    test(`${name}: every position's logits at steps 1-4 and 8, prompts fed in calls of any size`, () => {
      withModelAndReference(opts, (m, ref) => {
        expect([m.info.nPrelude, m.info.nCoda, m.info.headDim]).toEqual([opts.nPrelude ?? 0, opts.nCoda ?? 0, opts.headDim ?? 16]);
        expectPositionsAsReference(m, ref, tokensFor(VOCAB, 40, 3), [1, 2, 3, 4, 8], TOL);
      });
    }, 120_000);

  test("greedy decoding with the zero-shot exit rules: tokens, exit steps and logits equal the reference's", () => {
    const prompt = tokensFor(VOCAB, 9, 4);
    withModelAndReference(HUGINN_LIKE, (m, ref) => {
      const seen = new Set<number>();
      for (const exit of [undefined, ...ZERO_SHOT]) {
        const got = decode(m, prompt, 6, 12, exit);
        expectSameTrace(got, referenceDecode(ref, prompt, 6, 12, exit), exit ? `${exit.rule} < ${exit.threshold}, ${exit.policy}` : "no exit", TOL);
        for (const s of got.steps) seen.add(s);
      }
      // the rules exit at several depths on this model: the test exercises real exits
      expect(seen.size).toBeGreaterThan(3);
    });
  }, 120_000);

  test("exact: a token's logits at its exit are its exit depth's, after the same history (every step, select)", () => {
    const path = tinyModelPath(HUGINN_LIKE);
    withModel(path, 1, "auto", (m) => {
      let checked = 0;
      for (const [exit, salt] of ZERO_SHOT.filter((e) => e.policy === "exact").flatMap((e) => [5, 6, 7].map((k) => [e, k] as const))) {
        const prompt = tokensFor(VOCAB, 9, salt);
        const run = decode(m, prompt, 6, 10, exit);
        // the first token that exits: every token before it ran every step, as a fixed-depth session runs them (an
        // earlier exit's coda reads its exit step, which a fixed depth cannot give: the reference test covers those)
        const i = run.steps.findIndex((steps) => steps < 6);
        if (i < 1) continue;
        {
          const steps = run.steps[i];
          // the history at full depth, then this token at its exit depth
          const fixed = withSession(m, prompt.length + i + 1, 6, 0, (s) => {
            s.forward(Int32Array.from([...prompt, ...run.tokens.slice(0, i - 1)]), 6);
            const logits = new Float32Array(VOCAB);
            s.step(Int32Array.of(run.tokens[i - 1]), steps, GREEDY, logits);
            return logits;
          });
          expectBitIdentical([run.logits[i]], [fixed], `${exit.rule} token ${i} exiting after ${steps} steps`);
          checked++;
        }
      }
      expect(checked).toBeGreaterThan(3);
    });
  }, 120_000);
});

describe("every CPU feature on both families", () => {
  test("batches of mixed depths, exits and cache modes: every row bit-identical to running alone", () => {
    for (const [name, opts] of FAMILIES)
      withModel(tinyModelPath(opts), 2, "auto", (m) => {
        const kv: KvCacheSettings[] = [{ mode: "fp16" }, { mode: "int8" }, { mode: "int4" }];
        const mixed = plans(VOCAB, 10, 7, kv).map((p, i) => ({ ...p, window: 0, exit: name === "Huginn-like" && i % 2 ? ZERO_SHOT[i % ZERO_SHOT.length] : undefined }));
        const traces = expectSameAsSolo(m, mixed, name);
        if (name === "Huginn-like") expect(traces.flatMap((t, i) => t.steps.filter((s) => s < mixed[i].loops)).length).toBeGreaterThan(0);
      });
  }, 120_000);

  test("self-speculative decoding by depth (chain and tree, shallower and deeper drafts) equals plain decoding", () => {
    for (const [name, opts] of FAMILIES)
      withModel(tinyModelPath({ ...opts, loops: 4 }), 2, "auto", (m) => {
        const prompt = tokensFor(VOCAB, 11, 6);
        const V = 4;
        const plain = decode(m, prompt, V, 14).tokens;
        for (const [D, K] of [[1, 1], [2, 3], [6, 1]] as const) {
          const got = withSession(m, prompt.length + 14 + 64, Math.max(D, V), 0, (s) => {
            const out = [s.step(Int32Array.from(prompt), V, GREEDY)];
            const buf = new Int32Array(17);
            const stats = { drafted: 0, accepted: 0 };
            while (out.length < 14) {
              const n = s.specCycle(out[out.length - 1], { draftLoops: D, verifyLoops: V, draftAhead: 4, kBranches: K, maxNew: 14 - out.length, sampling: GREEDY, flags: 0 }, buf, stats);
              out.push(...buf.subarray(0, n));
            }
            return out;
          });
          expect(got, `${name}: draft ${D}, verify ${V}, ${K} branches`).toEqual(plain);
        }
      });
  }, 120_000);

  const quantized = new Map<string, string>();
  /** A family's model quantized (group 32), written once per process. */
  function quantizedModel(opts: Partial<SyntheticOptions>, quant: WeightQuant): string {
    const src = tinyModelPath(opts);
    let path = quantized.get(`${src} ${quant}`);
    if (path === undefined) {
      path = join(testTempDir(), `recurrent-${quantized.size}.safetensors`);
      quantizeModelFile(src, path, { quant, head: "int8", groupSize: 32 });
      quantized.set(`${src} ${quant}`, path);
    }
    return path;
  }

  for (const quant of ["int4", "int2"] as const)
    test(`${quant} weights (int8 head): logits near the reference in the same format, every position at steps 1 and 3`, () => {
      for (const [name, opts] of FAMILIES) {
        const path = quantizedModel(opts, quant);
        const ref = ReferenceModel.load(path);
        const toks = tokensFor(VOCAB, 30, 2);
        withModel(path, 2, "auto", (m) => {
          expect(m.info.quant).toBe(quant);
          for (const loops of [1, 3]) {
            const got = withSession(m, toks.length, loops, 0, (s) => feedInCalls(s, toks, loops, [1, 7, 32], VOCAB));
            const errs = ref.forward(toks, loops).map((w, i) => relErr(got[i], w));
            // a position can be off by an int8 activation code (fp32 against float64 on a rounding boundary), which carries on
            expect(errs.toSorted((a, b) => a - b)[errs.length >> 1], `${name} ${quant}, steps ${loops}: the median position`).toBeLessThan(1e-4);
            expect(Math.max(...errs), `${name} ${quant}, steps ${loops}`).toBeLessThan(5e-2);
          }
        });
      }
    }, 120_000);

  test.each(KV_CACHE_MODES)("a %s cache: every position's logits near the reference's at steps 1 and 3", (mode) => {
    for (const [name, opts] of FAMILIES) {
      const path = tinyModelPath(opts);
      const ref = ReferenceModel.load(path);
      const toks = tokensFor(VOCAB, 30, 8);
      withModel(path, 2, "auto", (m) => {
        for (const loops of [1, 3]) {
          const got = withSession(m, toks.length, loops, 0, (s) => feedInCalls(s, toks, loops, [1, 7, 32], VOCAB), { mode });
          const want = ref.forward(toks, loops, { kvCacheMode: mode });
          const worst = { fp16: TOL, int8: 5e-3, int4: 2e-2 }[kvModeSpec(mode).format];
          want.forEach((w, i) => expect(relErr(got[i], w), `${name}, ${mode}, steps ${loops}, position ${i}`).toBeLessThan(worst));
        }
      });
    }
  }, 120_000);

  test("a copied prefix (every unit, the prelude's outputs, deferred exits) continues bit for bit as its source", () => {
    for (const [name, opts] of FAMILIES)
      withModel(tinyModelPath(opts), 1, "auto", (m) => {
        const prompt = tokensFor(VOCAB, 20, 9);
        const exit: ExitPlan | undefined = name === "Huginn-like" ? { rule: "entropy", threshold: 0.3, policy: "exact" } : undefined;
        const tail = (s: NativeSession) => {
          const out: Float32Array[] = [];
          let t = 7;
          for (let i = 0; i < 6; i++) {
            const logits = new Float32Array(VOCAB);
            t = s.step(Int32Array.of(t), 4, GREEDY, logits, exit);
            out.push(logits);
          }
          return out;
        };
        const src = m.newSession(64, 4, 0);
        const dst = m.newSession(64, 4, 0);
        try {
          src.forward(Int32Array.from(prompt), 4);
          for (let i = 0; i < 3; i++) src.step(Int32Array.of(11 + i), 4, GREEDY, null, exit); // deferred units to copy
          dst.copyPrefixFrom(src, src.pos);
          expectBitIdentical(tail(dst), tail(src), `${name}: the copy against its source`);
        } finally {
          src.close();
          dst.close();
        }
      });
  });
});

describe("the bounded cache (cache_steps: the core's units share steps' caches)", () => {
  test("a token at a time: logits equal the reference's shared slots, at every depth and sharing", () => {
    const path = tinyModelPath(HUGINN_LIKE);
    const ref = ReferenceModel.load(path);
    const prompt = tokensFor(VOCAB, 8, 11);
    withModel(path, 2, "auto", (m) => {
      for (const [loops, cacheSteps] of [[4, 1], [6, 2], [8, 4]] as const) {
        const got = withSession(m, 30, loops, 0, (s) => feedInCalls(s, [...prompt, ...tokensFor(VOCAB, 12, 1)], loops, [1], VOCAB), { mode: "fp16", cacheSteps });
        const rs = ref.session(loops, { cacheSteps });
        // (three times the usual tolerance: a shared slot holds a later step's rows, so each position's error feeds the next)
        [...prompt, ...tokensFor(VOCAB, 12, 1)].forEach((t, i) => expect(relErr(got[i], rs.feed(t)), `${loops} steps sharing ${cacheSteps}, position ${i}`).toBeLessThan(3 * TOL));
        // sharing changes the function: later positions read earlier positions' last steps
        const full = ref.forward([...prompt, ...tokensFor(VOCAB, 12, 1)], loops);
        expect(Math.max(...full.map((f, i) => relErr(got[i], f)))).toBeGreaterThan(1e-2);
      }
    });
  }, 120_000);

  test("the copy policy: an exit fills only the shared slots its steps did not reach (tokens, exit steps, logits as the reference's)", () => {
    const path = tinyModelPath(HUGINN_LIKE);
    const ref = ReferenceModel.load(path);
    const ran = new Set<number>();
    withModel(path, 1, "auto", (m) => {
      for (const exit of ZERO_SHOT.filter((e) => e.policy === "copy")) {
        // a one-token prompt: the reference feeds a token at a time, which a longer prompt in one call is not under sharing
        const got = decode(m, [7], 6, 16, exit, { mode: "fp16", cacheSteps: 3 });
        expectSameTrace(got, referenceDecode(ref, [7], 6, 16, exit, 3), JSON.stringify(exit), 3 * TOL);
        for (const s of got.steps) ran.add(s);
      }
    });
    // exits before the shared steps were all written (copies) and after (none)
    expect([...ran].some((s) => s < 3) && [...ran].some((s) => s >= 3 && s < 6)).toBe(true);
  });

  test("holds a quarter of the unbounded cache or less, counted and held; gated with the copy policy", () => {
    withModel(tinyModelPath(HUGINN_LIKE), 1, "auto", (m) => {
      const full = m.sessionCacheBytes(256, 32, 0);
      const shared = m.sessionCacheBytes(256, 32, 0, { mode: "fp16", cacheSteps: 4 });
      expect(shared / full).toBeLessThanOrEqual(0.25);
      withSession(m, 40, 32, 0, (s) => {
        s.forward(Int32Array.from(tokensFor(VOCAB, 30, 3)), 32);
        s.step(Int32Array.of(5), 32, GREEDY, null, { rule: "kl", threshold: 3, policy: "copy" });
        expect(s.cacheBytesHeld).toBeLessThanOrEqual(0.25 * full);
      }, { mode: "fp16", cacheSteps: 4 });
    });
  });

  test("the tokens of a call are never split by what shares a batch: batched equals alone", () => {
    withModel(tinyModelPath(HUGINN_LIKE), 2, "auto", (m) => {
      // each prompt in one call, as running alone feeds it: with shared steps a call's split is part of the function
      const ps = plans(VOCAB, 8, 3, [{ mode: "fp16", cacheSteps: 2 }, { mode: "fp16" }]).map((p) => ({ ...p, loops: 4, window: 0, chunk: p.prompt.length }));
      expectSameAsSolo(m, ps, "cache_steps beside unbounded sessions");
    });
  }, 120_000);

  test("refused: loops it cannot share, a window, the exact exit policy, a speculative cycle, a prefix copy", () => {
    withModel(tinyModelPath(HUGINN_LIKE), 1, "auto", (m) => {
      expect(() => m.newSession(16, 4, 0, { mode: "fp16", cacheSteps: 4 })).toThrow(/cache_steps must be 0 .* or in \[1, loops 4\)/);
      expect(() => m.newSession(16, 4, 8, { mode: "fp16", cacheSteps: 2 })).toThrow(/cannot be combined with a cache window/);
      withSession(m, 32, 4, 0, (s) => {
        const first = s.step(Int32Array.from(tokensFor(VOCAB, 5, 1)), 4, GREEDY);
        expect(() => s.step(Int32Array.of(first), 4, GREEDY, null, { rule: "kl", threshold: 1, policy: "exact" })).toThrow(NativeError);
        const spec = { draftLoops: 1, verifyLoops: 4, draftAhead: 2, kBranches: 1, maxNew: 3, sampling: GREEDY, flags: 0 };
        expect(() => s.specCycle(first, spec, new Int32Array(17), { drafted: 0, accepted: 0 })).toThrow(NativeError);
        const other = m.newSession(32, 4, 0, { mode: "fp16", cacheSteps: 2 });
        try {
          expect(() => other.copyPrefixFrom(s, 3)).toThrow(NativeError);
        } finally {
          other.close();
        }
      }, { mode: "fp16", cacheSteps: 2 });
    });
  });
});
