// A request's depth resolved once (src/engine/depth_plan.ts): the model's
// defaults for what the request leaves out, exit_threshold as the published
// Ouro code means it at every value, the zero-shot exit rules, cache_steps,
// and the refusals, each naming its field.
import { describe, expect, test } from "bun:test";
import { defaultExitThreshold, type DepthModel, type DepthSettings, planDepth } from "../../src/engine/depth_plan.ts";
import { EngineRequestError } from "../../src/engine/errors.ts";

const GATED: DepthModel = { defaultLoops: 4, exitGate: true, exitThreshold: 0.6 };
const PLAIN: DepthModel = { defaultLoops: 8, exitGate: false, exitThreshold: null };
const context = <M extends DepthModel | null>(model: M) => ({ model, temperature: 0, kvCacheMode: "fp16" as const });

describe("planDepth", () => {
  test("the depth: loops, or verify_loops in the speculative modes, else the model's default_loops", () => {
    expect(planDepth({ mode: "generate" }, context(PLAIN))).toEqual({ loops: 8 });
    expect(planDepth({ mode: "generate", loops: 3 }, context(PLAIN))).toEqual({ loops: 3 });
    const spec = planDepth({ mode: "speculative", loops: 3 }, context(GATED));
    expect(spec).toEqual({ loops: 4, speculative: { mode: "speculative", draftLoops: 2, draftAhead: 4, kBranches: 1 } });
    expect(planDepth({ mode: "tree_speculative", verifyLoops: 6, kBranches: 2 }, context(GATED)).loops).toBe(6);
  });

  test("exit_threshold: absent takes the model's default in plain generation; null and 1 are fixed depth; 0 exits after the first step", () => {
    const exit = (settings: Partial<DepthSettings>, model = GATED) => planDepth({ mode: "generate", ...settings }, context(model)).exit;
    expect(exit({})).toEqual({ threshold: 0.6, policy: "exact" });
    expect(exit({ exitPolicy: "copy" })).toEqual({ threshold: 0.6, policy: "copy" });
    expect(exit({ exitThreshold: null })).toBeUndefined();
    expect(exit({ exitThreshold: 1 })).toBeUndefined();
    expect(exit({ exitThreshold: 0 })).toEqual({ threshold: 0, policy: "exact" });
    expect(exit({ exitThreshold: 0.3, exitPolicy: "copy" })).toEqual({ threshold: 0.3, policy: "copy" });
    // A gateless model, or one whose default is 1 (every step): fixed depth unless asked, and 1 or null may always be asked.
    expect(exit({}, PLAIN)).toBeUndefined();
    expect(exit({}, { ...GATED, exitThreshold: 1 })).toBeUndefined();
    expect(exit({ exitThreshold: 1 }, PLAIN)).toBeUndefined();
    expect(exit({ exitThreshold: null }, PLAIN)).toBeUndefined();
    // The speculative modes run fixed depths: the model's default does not apply.
    expect(planDepth({ mode: "speculative" }, context(GATED)).exit).toBeUndefined();
  });

  test("exit_rule kl / entropy: any model, a threshold >= 0 that is the value below which a token exits (0: never)", () => {
    const exit = (settings: Partial<DepthSettings>, model = PLAIN) => planDepth({ mode: "generate", ...settings }, context(model)).exit;
    expect(exit({ exitRule: "kl", exitThreshold: 5e-4 })).toEqual({ threshold: 5e-4, policy: "exact", rule: "kl" });
    expect(exit({ exitRule: "entropy", exitThreshold: 3, exitPolicy: "copy" })).toEqual({ threshold: 3, policy: "copy", rule: "entropy" });
    expect(exit({ exitRule: "kl", exitThreshold: 0 })).toBeUndefined();
    expect(exit({ exitRule: "kl", exitThreshold: null })).toBeUndefined();
    expect(exit({ exitRule: "kl", exitThreshold: 0.5 }, GATED)).toEqual({ threshold: 0.5, policy: "exact", rule: "kl" });
    // "gate" is the default rule
    expect(exit({ exitRule: "gate", exitThreshold: 0.5 }, GATED)).toEqual({ threshold: 0.5, policy: "exact" });
  });

  test("cache_steps: kept in the plan below the steps run; 0 is every step its own", () => {
    const plan = (settings: Partial<DepthSettings>, model = PLAIN) => planDepth({ mode: "generate", ...settings }, context(model));
    expect(plan({ cacheSteps: 4 })).toEqual({ loops: 8, cacheSteps: 4 });
    expect(plan({ cacheSteps: 0, loops: 3 })).toEqual({ loops: 3 });
    expect(plan({ cacheSteps: 2, exitRule: "kl", exitThreshold: 1e-3, exitPolicy: "copy" })).toEqual({ loops: 8, cacheSteps: 2, exit: { threshold: 1e-3, policy: "copy", rule: "kl" } });
    // a gated model's default exit is exact: with shared steps a request says copy or no exit
    expect(plan({ cacheSteps: 2, exitThreshold: null }, GATED)).toEqual({ loops: 4, cacheSteps: 2 });
  });

  test("what a request gets when it names none is what the models list shows", () => {
    expect(defaultExitThreshold(GATED)).toBe(0.6);
    expect(defaultExitThreshold({ ...GATED, exitThreshold: 1 })).toBeNull();
    expect(defaultExitThreshold(PLAIN)).toBeNull();
  });

  const refusals: [string, DepthSettings, DepthModel | null, string, RegExp][] = [
    ["exit_threshold 1.5", { mode: "generate", exitThreshold: 1.5 }, GATED, "exit_threshold", /must be in \[0, 1\], got 1.5/],
    ["exit_threshold 0 without a gate", { mode: "generate", exitThreshold: 0 }, PLAIN, "exit_threshold", /needs a model with an exit gate.*"kl" or "entropy"/],
    ["a zero-shot rule without a threshold", { mode: "generate", exitRule: "kl" }, PLAIN, "exit_threshold", /needs an `exit_threshold`/],
    ["a zero-shot rule's negative threshold", { mode: "generate", exitRule: "entropy", exitThreshold: -1 }, PLAIN, "exit_threshold", /must be a number >= 0/],
    ["a zero-shot rule in a speculative mode", { mode: "speculative", exitRule: "kl", exitThreshold: 0.1 }, PLAIN, "exit_threshold", /cannot be combined with mode speculative/],
    ["cache_steps as many as the steps", { mode: "generate", loops: 4, cacheSteps: 4 }, PLAIN, "cache_steps", /must be less than the steps run \(4\)/],
    ["cache_steps beyond the default depth", { mode: "generate", cacheSteps: 8 }, PLAIN, "cache_steps", /must be less than the steps run \(8\)/],
    ["cache_steps with a window", { mode: "generate", cacheSteps: 2, cacheWindow: 16 }, PLAIN, "cache_steps", /cannot be combined with `cache_window`/],
    ["cache_steps in a speculative mode", { mode: "speculative", cacheSteps: 2 }, PLAIN, "cache_steps", /cannot be combined with mode speculative/],
    ["cache_steps with the exact policy", { mode: "generate", cacheSteps: 2, exitRule: "kl", exitThreshold: 0.1 }, PLAIN, "cache_steps", /exact exit policy/],
    ["cache_steps with a gated model's default exit", { mode: "generate", cacheSteps: 2 }, GATED, "cache_steps", /exact exit policy/],
    ["exit_threshold in a speculative mode", { mode: "speculative", exitThreshold: 0.5 }, GATED, "exit_threshold", /cannot be combined with mode speculative/],
    ["the same without a model loaded", { mode: "tree_speculative", exitThreshold: 0.5 }, null, "exit_threshold", /cannot be combined/],
    ["loops 65", { mode: "generate", loops: 65 }, GATED, "loops", /`loops` must be between 1 and 64, got 65/],
    ["verify_loops 0", { mode: "speculative", verifyLoops: 0 }, GATED, "verify_loops", /between 1 and 64, got 0/],
    ["a tree of 65 nodes", { mode: "tree_speculative", kBranches: 5, draftAhead: 13 }, null, "K_branches", /at most 64/],
  ];
  for (const [name, settings, model, param, message] of refusals)
    test(`refuses ${name}, naming the field`, () => {
      let error: unknown = null;
      try {
        planDepth(settings, context(model));
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(EngineRequestError);
      expect((error as EngineRequestError).param).toBe(param);
      expect((error as EngineRequestError).message).toMatch(message);
    });

  test("without a model it checks what needs none and resolves nothing", () => {
    expect(planDepth({ mode: "generate", exitThreshold: 0.5 }, context(null))).toBeNull();
    expect(planDepth({ mode: "speculative" }, context(null))).toBeNull();
  });
});
