// The engine's speculative modes (src/engine/spec_plan.ts, speculative.ts, kernels/cpu/spec.c):
// greedy output is token-for-token the plain mode's at loops = verify_loops,
// across prompts, draft/verify depths, draft lengths, tree widths, sliding
// windows, stop ids and max_tokens that land mid-cycle; K_branches = 1 is the
// chain exactly; nothing of a speculative request is left behind.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Engine, type KvSnapshot } from "../../src/engine/engine.ts";
import { EngineRequestError } from "../../src/engine/errors.ts";
import { planSpeculative, type SpecSettings } from "../../src/engine/spec_plan.ts";
import type { GenerateRequest, GenerateResult, SamplingParams } from "../../src/engine/types.ts";
import type { SyntheticOptions } from "../../src/model/synthetic.ts";
import { BUILD_DIR, ensureLibrary } from "../helpers/kernels.ts";
import { tinyModelPath } from "../helpers/models.ts";

// Untied models (tied ones fall into 2-cycles at small residual scales),
// with a 4096-token vocabulary: the output head dominates a tiny model's
// step, and this file runs a few thousand of them.
const VOCAB = 4096;
const MODELS: Record<string, Partial<SyntheticOptions>> = {
  agreeing: { seed: 31, residualScale: 0.05, loops: 8, vocabSize: VOCAB }, // shallow loops mostly agree: long accepted runs
  random: { seed: 32, loops: 8, vocabSize: VOCAB }, // residualScale 1: drafts are mostly rejected
};

const engines = new Map<string, Engine>();
const engine = (name: string) => engines.get(name) as Engine;

beforeAll(() => {
  ensureLibrary();
  for (const [name, opts] of Object.entries(MODELS))
    engines.set(name, Engine.load({ modelPath: tinyModelPath(opts), threads: 2, simd: "auto", buildDir: BUILD_DIR, gpu: false }));
});

afterAll(() => {
  for (const e of engines.values()) e.close();
});

const PROMPTS = [
  [464, 3290, 318],
  [40, 1842, 257, 3797, 290, 616, 318, 257, 922, 1110, 13, 383, 3290, 318, 922, 11, 290],
  Array.from({ length: 40 }, (_, i) => (i * 7919 + 13) % VOCAB),
];

const GREEDY: SamplingParams = { temperature: 0, topK: 50, topP: 0.9, repetitionPenalty: 1, seed: 0 };

/** A request at `loops`; with spec, speculative at that verify depth (its plan made as the HTTP layer makes it). */
function request(prompt: number[], loops: number, maxTokens: number, window: number, stops: number[], spec: SpecSettings | null = null, sampling = GREEDY): GenerateRequest {
  const plain: GenerateRequest = { promptTokens: prompt, maxTokens, loops, sampling, stopTokenIds: stops, cacheWindow: window };
  return spec ? { ...plain, speculative: planSpeculative(spec, { temperature: sampling.temperature, kvCacheMode: "fp16" }) } : plain;
}

const run = (name: string, req: GenerateRequest) => engine(name).generate(req, () => {});

interface Case {
  model: string;
  prompt: number;
  D: number;
  V: number;
  k: number;
  K: number;
  window: number;
  maxTokens: number;
  penalty: number;
}

// 80 combinations: every (draft, verify) pair below on both models, with the
// draft length, tree width, window and prompt cycling independently, so the
// set covers D = V, D > V (a draft deeper than its verifier), draft_ahead 1
// and 16, K_branches 1..8, windows that wrap the ring (prompt + output >
// window + 64) and full attention.
const DEPTHS: [number, number][] = [
  [1, 4],
  [2, 4],
  [4, 4],
  [1, 8],
  [3, 6],
  [2, 2],
  [1, 1],
  [5, 8],
  [6, 3],
  [8, 2],
];
const AHEAD = [1, 4, 16, 3, 7, 2, 8, 5];
const BRANCHES = [1, 2, 3, 4, 5, 6, 7, 8];
const WINDOWS = [0, 0, 5, 33, 0, 1, 12, 0];
const CASES: Case[] = [];
for (const model of Object.keys(MODELS))
  for (let i = 0; i < DEPTHS.length; i++)
    for (let j = 0; j < 4; j++) {
      const n = i * 4 + j + (model === "random" ? 3 : 0);
      const K = BRANCHES[n % BRANCHES.length];
      const k = Math.min(AHEAD[(n * 3 + 1) % AHEAD.length], Math.floor(64 / K));
      CASES.push({
        model,
        prompt: n % PROMPTS.length,
        D: DEPTHS[i][0],
        V: DEPTHS[i][1],
        k,
        K,
        window: WINDOWS[(n * 5 + 2) % WINDOWS.length],
        maxTokens: n % 5 === 0 ? 90 : 30,
        penalty: n % 3 === 2 ? 1.3 : 1, // the penalty reads each path's own history
      });
    }

const label = (c: Case) => `${c.model} p${c.prompt} D${c.D} V${c.V} k${c.k} K${c.K} W${c.window} n${c.maxTokens} rp${c.penalty}`;
const greedy = (c: Case): SamplingParams => ({ ...GREEDY, repetitionPenalty: c.penalty });

function specOf(c: Case): SpecSettings {
  return { mode: c.K === 1 && c.k % 2 === 0 ? "speculative" : "tree_speculative", draftLoops: c.D, draftAhead: c.k, kBranches: c.K };
}

describe("greedy speculative output equals plain decoding at verify_loops", () => {
  test(`${CASES.length} combinations of model, prompt, draft/verify loops, draft_ahead, K_branches and cache_window`, async () => {
    expect(CASES.length).toBeGreaterThanOrEqual(50);
    const covered = { dEqV: false, ahead1: false, ahead16: false, wrap: false, branches: new Set<number>() };
    let treeAccepted = 0;
    let chainAccepted = 0;
    const perCycle: number[] = [];
    for (const c of CASES) {
      const prompt = PROMPTS[c.prompt];
      const plain = await run(c.model, request(prompt, c.V, c.maxTokens, c.window, [], null, greedy(c)));
      const spec = await run(c.model, request(prompt, c.V, c.maxTokens, c.window, [], specOf(c), greedy(c)));
      expect(spec.tokens, label(c)).toEqual(plain.tokens);
      expect(spec.finishReason, label(c)).toBe(plain.finishReason);
      expect(spec.speculative?.cycles, label(c)).toBeGreaterThan(0);
      if (c.model === "agreeing") perCycle.push(spec.speculative?.acceptedPerCycle ?? 0);
      if (c.K > 1 && c.model === "random") {
        // The same draft as a chain: leaves can only add accepted tokens.
        const chain = await run(c.model, request(prompt, c.V, c.maxTokens, c.window, [], { mode: "speculative", draftLoops: c.D, draftAhead: c.k }, greedy(c)));
        treeAccepted += spec.speculative?.acceptedTokens ?? 0;
        chainAccepted += chain.speculative?.acceptedTokens ?? 0;
      }
      covered.dEqV ||= c.D === c.V;
      covered.ahead1 ||= c.k === 1;
      covered.ahead16 ||= c.k === 16;
      covered.wrap ||= c.window > 0 && prompt.length + c.maxTokens > c.window + 64;
      covered.branches.add(c.K);
    }
    expect(covered.dEqV && covered.ahead1 && covered.ahead16 && covered.wrap).toBe(true);
    expect([...covered.branches].sort()).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    // The sweep exercises long accepted runs, and accepted tree leaves (whose
    // cache rows are moved into place).
    expect(perCycle.reduce((a, b) => a + b, 0) / perCycle.length).toBeGreaterThan(2);
    expect(treeAccepted).toBeGreaterThan(chainAccepted);
  });

  test("stop ids and max_tokens that fall mid-cycle end generation where plain decoding does", async () => {
    let checked = 0;
    for (const c of CASES.filter((_, i) => i % 4 === 0)) {
      const prompt = PROMPTS[c.prompt];
      const free = await run(c.model, request(prompt, c.V, 40, c.window, [], null, greedy(c)));
      // A stop id: the first occurrence of a token 5..15 tokens in.
      const at = free.tokens.findIndex((t, i) => i >= 5 && i <= 15 && free.tokens.indexOf(t) === i);
      if (at >= 0) {
        const stop = [free.tokens[at]];
        const plain = await run(c.model, request(prompt, c.V, 40, c.window, stop, null, greedy(c)));
        const spec = await run(c.model, request(prompt, c.V, 40, c.window, stop, specOf(c), greedy(c)));
        expect(plain.tokens).toEqual(free.tokens.slice(0, at));
        expect(plain.finishReason).toBe("stop");
        expect(spec.tokens, label(c)).toEqual(plain.tokens);
        expect(spec.finishReason, label(c)).toBe("stop");
        checked++;
      }
      for (const maxTokens of [1, 2, 7, 13]) {
        const spec = await run(c.model, request(prompt, c.V, maxTokens, c.window, [], specOf(c), greedy(c)));
        expect(spec.tokens, `${label(c)} max_tokens ${maxTokens}`).toEqual(free.tokens.slice(0, maxTokens));
        expect(spec.finishReason).toBe("length");
      }
    }
    expect(checked).toBeGreaterThanOrEqual(8);
  });

  test("a sink that says stop ends generation after exactly that token; a cancelled request stops", async () => {
    const got: number[] = [];
    const res = await engine("agreeing").generate(request(PROMPTS[1], 8, 40, 0, [], { mode: "speculative", draftLoops: 2, draftAhead: 8 }), (t) => {
      got.push(t);
      return got.length < 6;
    });
    expect(res.tokens).toHaveLength(6);
    expect(got).toEqual(res.tokens);
    expect(res.finishReason).toBe("stop");

    const abort = new AbortController();
    const cancelled = await engine("agreeing").generate(
      request(PROMPTS[1], 8, 200, 0, [], { mode: "tree_speculative", draftLoops: 2, draftAhead: 4, kBranches: 3 }),
      () => abort.abort(),
      abort.signal,
    );
    expect(cancelled.finishReason).toBe("cancelled");
    expect(cancelled.tokens.length).toBeLessThan(20);
  });
});

describe("tree leaves", () => {
  test("the repetition penalty of an accepted leaf's next token reads the leaf's own path", async () => {
    // A tied model's next token is mostly its input token again, and a
    // penalty below 1 rewards repeats: a leaf whose history showed the spine
    // token instead of itself would continue differently.
    const e = Engine.load({
      modelPath: tinyModelPath({ seed: 33, loops: 8, vocabSize: VOCAB, tiedOutput: true }),
      threads: 2,
      simd: "auto",
      buildDir: BUILD_DIR,
      gpu: false,
    });
    try {
      let leaves = 0;
      for (let pr = 0; pr < 6; pr++)
        for (const [V, penalty] of [
          [3, 0.7],
          [6, 0.5],
        ]) {
          const prompt = Array.from({ length: 5 + pr * 3 }, (_, i) => (i * 131 + pr * 977) % VOCAB);
          const sampling = { ...GREEDY, topK: 0, topP: 1, repetitionPenalty: penalty };
          const plain = await e.generate(request(prompt, V, 64, 0, [], null, sampling), () => {});
          const treeSpec: SpecSettings = { mode: "tree_speculative", draftLoops: 1, draftAhead: 4, kBranches: 16 };
          const tree = await e.generate(request(prompt, V, 64, 0, [], treeSpec, sampling), () => {});
          const chain = await e.generate(request(prompt, V, 64, 0, [], { mode: "speculative", draftLoops: 1, draftAhead: 4 }, sampling), () => {});
          expect(tree.tokens, `prompt ${pr} V ${V}`).toEqual(plain.tokens);
          leaves += (tree.speculative?.acceptedTokens ?? 0) - (chain.speculative?.acceptedTokens ?? 0);
        }
      expect(leaves).toBeGreaterThan(50);
    } finally {
      e.close();
    }
  });
});

describe("pruned trees", () => {
  test("leaves below the draft-probability threshold are not verified; output stays exact", async () => {
    const pruned = Engine.load({ modelPath: tinyModelPath(MODELS.agreeing), threads: 2, simd: "auto", buildDir: BUILD_DIR, gpu: false, draft: { treeLeafMinProb: 0.02 } });
    try {
      let fewer = 0;
      for (const c of CASES.filter((x) => x.K > 2).slice(0, 12)) {
        const prompt = PROMPTS[c.prompt];
        const req = request(prompt, c.V, c.maxTokens, c.window, [], specOf(c), greedy(c));
        const plain = await run(c.model, request(prompt, c.V, c.maxTokens, c.window, [], null, greedy(c)));
        const full = await run(c.model, req);
        const cut = await pruned.generate(req, () => {});
        expect(cut.tokens, label(c)).toEqual(plain.tokens);
        if ((cut.speculative?.draftTokens ?? 0) < (full.speculative?.draftTokens ?? 0)) fewer++;
      }
      expect(fewer).toBeGreaterThan(6);
    } finally {
      pruned.close();
    }
  });
});

describe("K_branches = 1 is the chain", () => {
  test("tree_speculative with K_branches 1 gives speculative's tokens and accepted counts", async () => {
    for (const c of CASES.filter((_, i) => i % 3 === 0)) {
      const prompt = PROMPTS[c.prompt];
      const chain = await run(c.model, request(prompt, c.V, c.maxTokens, c.window, [], { mode: "speculative", draftLoops: c.D, draftAhead: c.k }, greedy(c)));
      const tree = await run(
        c.model,
        request(prompt, c.V, c.maxTokens, c.window, [], { mode: "tree_speculative", draftLoops: c.D, draftAhead: c.k, kBranches: 1 }, greedy(c)),
      );
      expect(tree.tokens, label(c)).toEqual(chain.tokens);
      expect(tree.speculative, label(c)).toEqual(chain.speculative as NonNullable<GenerateResult["speculative"]>);
    }
  });
});

describe("speculative requests leave no trace", () => {
  const sampled: SamplingParams = { temperature: 0.8, topK: 40, topP: 0.95, repetitionPenalty: 1.1, seed: 11 };

  test("after speculative requests a plain request gives what it gives on a fresh engine", async () => {
    const probe = request(PROMPTS[1], 8, 40, 0, []);
    const probeSampled = request(PROMPTS[2], 6, 40, 7, [], null, sampled);
    const e = engine("random");
    await e.generate(request(PROMPTS[1], 8, 60, 0, [], { mode: "tree_speculative", draftLoops: 1, draftAhead: 8, kBranches: 8 }), () => {});
    await e.generate(request(PROMPTS[1], 8, 60, 0, [], { mode: "speculative", draftLoops: 3, draftAhead: 16 }, sampled), () => {});
    const after = [await run("random", probe), await run("random", probeSampled)];
    const fresh = Engine.load({ modelPath: tinyModelPath(MODELS.random), threads: 2, simd: "auto", buildDir: BUILD_DIR, gpu: false });
    try {
      const clean = [await fresh.generate(probe, () => {}), await fresh.generate(probeSampled, () => {})];
      expect(after.map((r) => r.tokens)).toEqual(clean.map((r) => r.tokens));
    } finally {
      fresh.close();
    }
  });

  test("a prompt snapshot captured by a speculative request serves a plain request exactly", async () => {
    const e = engine("agreeing");
    const prompt = PROMPTS[2];
    let snap: KvSnapshot | null = null;
    await e.generate(request(prompt, 8, 30, 0, [], { mode: "tree_speculative", draftLoops: 2, draftAhead: 4, kBranches: 4 }), () => {}, undefined, {
      capture: (s) => {
        snap = s;
      },
    });
    expect(snap).not.toBeNull();
    const snapshot = snap as unknown as KvSnapshot;
    try {
      const longer = [...prompt, 318, 257];
      const reused = await e.generate(request(longer, 8, 30, 0, []), () => {}, undefined, { prefix: { snapshot, length: prompt.length } });
      const scratch = await run("agreeing", request(longer, 8, 30, 0, []));
      expect(reused.tokens).toEqual(scratch.tokens);
      const reusedSpec = await e.generate(request(longer, 8, 30, 0, [], { mode: "speculative", draftLoops: 2, draftAhead: 4 }), () => {}, undefined, {
        prefix: { snapshot, length: prompt.length },
      });
      expect(reusedSpec.tokens).toEqual(scratch.tokens);
    } finally {
      snapshot.release();
    }
  });
});

describe("sampled speculative decoding", () => {
  test("is deterministic per seed, and seeds differ", async () => {
    const s = (seed: number): SamplingParams => ({ temperature: 1, topK: 0, topP: 1, repetitionPenalty: 1, seed });
    const spec: SpecSettings = { mode: "speculative", draftLoops: 2, draftAhead: 4 };
    const a = await run("agreeing", request(PROMPTS[0], 8, 30, 0, [], spec, s(1)));
    const b = await run("agreeing", request(PROMPTS[0], 8, 30, 0, [], spec, s(1)));
    const c = await run("agreeing", request(PROMPTS[0], 8, 30, 0, [], spec, s(2)));
    expect(a.tokens).toEqual(b.tokens);
    expect(a.tokens).not.toEqual(c.tokens);
    expect(a.tokens).toHaveLength(30);
  });
});

describe("a speculative plan is resolved once", () => {
  const fp16 = (temperature = 0) => ({ temperature, kvCacheMode: "fp16" as const });

  test("unset settings take the defaults; the chain has one branch whatever K_branches says", () => {
    expect(planSpeculative({ mode: "speculative", kBranches: 5 }, fp16(0.7))).toEqual({ mode: "speculative", draftLoops: 2, draftAhead: 4, kBranches: 1 });
    expect(planSpeculative({ mode: "tree_speculative" }, fp16())).toEqual({ mode: "tree_speculative", draftLoops: 2, draftAhead: 4, kBranches: 1 });
    expect(planSpeculative({ mode: "tree_speculative", draftLoops: 32, draftAhead: 4, kBranches: 16 }, fp16()).kBranches).toBe(16);
  });

  const cases: [string, SpecSettings, { temperature: number; kvCacheMode: "fp16" | "int8" }, string, RegExp][] = [
    ["draft_loops 33", { mode: "speculative", draftLoops: 33 }, fp16(), "draft_loops", /`draft_loops` must be between 1 and 32, got 33/],
    ["draft_loops 0", { mode: "speculative", draftLoops: 0 }, fp16(), "draft_loops", /between 1 and 32, got 0/],
    ["draft_ahead 17", { mode: "speculative", draftAhead: 17 }, fp16(), "draft_ahead", /`draft_ahead` must be between 1 and 16/],
    ["K_branches 17", { mode: "tree_speculative", kBranches: 17, draftAhead: 1 }, fp16(), "K_branches", /`K_branches` must be between 1 and 16/],
    ["K_branches * draft_ahead 65", { mode: "tree_speculative", draftAhead: 13, kBranches: 5 }, fp16(), "K_branches", /at most 64.*5 \* 13 = 65/],
    ["sampled tree", { mode: "tree_speculative", kBranches: 2 }, fp16(0.5), "temperature", /greedy only/],
    ["tree on an int8 cache", { mode: "tree_speculative", kBranches: 2 }, { temperature: 0, kvCacheMode: "int8" }, "mode", /fp16 key\/value cache.*int8/],
  ];
  for (const [name, spec, context, param, message] of cases)
    test(`refuses ${name}, naming the field`, () => {
      let error: unknown = null;
      try {
        planSpeculative(spec, context);
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(EngineRequestError);
      expect((error as EngineRequestError).param).toBe(param);
      expect((error as EngineRequestError).message).toMatch(message);
    });
});
