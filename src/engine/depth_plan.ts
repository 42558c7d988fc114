// A request's depth, resolved once: how many steps (`loops`), the
// speculative plan (spec_plan.ts), the early exit (docs/early-exit.md: the
// learned gate's, or a zero-shot rule's) and the steps the cache keeps
// (cache_steps, docs/kv-cache.md), with the model's defaults for what the request
// leaves out and the rules that refuse a combination, in the words of the
// request's fields. The HTTP layer resolves every request through here and
// the engine runs the result as given. No FFI here: the HTTP layer imports it.
import { LS_MAX_LOOPS } from "../abi/abi.generated.ts";
import { EngineRequestError } from "./errors.ts";
import { checkRange, planSpeculative, type SpecContext } from "./spec_plan.ts";
import type { ExitPlan, ExitPolicy, ExitRule, GenerateRequest, GenerationMode, ModelFileInfo } from "./types.ts";

/** The policy of a request that names none. */
export const DEFAULT_EXIT_POLICY: ExitPolicy = "exact";

/** A request's depth fields as asked for; undefined: not given. */
export interface DepthSettings {
  mode: GenerationMode;
  /** Plain generation's depth (the speculative modes take verifyLoops). */
  loops?: number;
  /** The speculative modes' depth: what their output equals. */
  verifyLoops?: number;
  draftLoops?: number;
  draftAhead?: number;
  kBranches?: number;
  /** undefined: the model's default (plain generation only); null: no early exit. */
  exitThreshold?: number | null;
  exitPolicy?: ExitPolicy;
  /** undefined: the gate. */
  exitRule?: ExitRule;
  /** The request's cache window (0 or undefined: full attention): the exact exit policy needs none. */
  cacheWindow?: number;
  /** Steps of caches the core keeps (0 or undefined: every step its own). */
  cacheSteps?: number;
}

/** What a model contributes: its default depth, its exit gate and the file's default threshold. */
export type DepthModel = Pick<ModelFileInfo, "defaultLoops" | "exitGate" | "exitThreshold">;

export interface DepthContext extends SpecContext {
  /** null when no model is loaded: the rules that need none are still checked, and nothing is resolved. */
  model: DepthModel | null;
}

/** The GenerateRequest fields a depth plan sets. */
export type DepthPlan = Pick<GenerateRequest, "loops" | "speculative" | "exit" | "cacheSteps">;

/** A threshold the gate can only reach at the last step (1: every step) runs the fixed-depth path. */
const exits = (threshold: number) => threshold < 1;

/**
 * The early-exit threshold a request gets when it names none: the model's
 * default, or null (fixed depth) when it has none or its default is 1.
 */
export function defaultExitThreshold(model: DepthModel): number | null {
  const t = model.exitThreshold;
  return model.exitGate && t !== null && exits(t) ? t : null;
}

/**
 * The exit a request asks for, or none: absent takes the model's default in
 * plain generation; null and 1 are fixed depth. The exact policy computes
 * earlier tokens' skipped steps when a later token needs them, which reads
 * keys and values a cache window has dropped: the two are refused together.
 */
function planExit(settings: DepthSettings, model: DepthModel | null): ExitPlan | undefined {
  const plan = askedExit(settings, model);
  if (plan?.policy === "exact" && (settings.cacheWindow ?? 0) > 0)
    throw new EngineRequestError(
      "`cache_window` cannot be combined with the exact exit policy (the steps it computes late would read positions the window dropped): " +
        'ask for `exit_policy: "copy"` or `exit_threshold: null` with a window',
      "cache_window",
    );
  return plan;
}

function askedExit(settings: DepthSettings, model: DepthModel | null): ExitPlan | undefined {
  const policy = settings.exitPolicy ?? DEFAULT_EXIT_POLICY;
  const rule = settings.exitRule ?? "gate";
  const asked = settings.exitThreshold;
  if (asked === undefined) {
    if (rule !== "gate") throw new EngineRequestError(`\`exit_rule\` "${rule}" needs an \`exit_threshold\` (the value below which a token exits)`, "exit_threshold");
    const threshold = model && settings.mode === "generate" ? defaultExitThreshold(model) : null;
    return threshold === null ? undefined : { threshold, policy };
  }
  if (asked === null) return undefined;
  if (rule === "gate") {
    if (!(asked >= 0 && asked <= 1)) throw new EngineRequestError(`\`exit_threshold\` must be in [0, 1], got ${asked}`, "exit_threshold");
    if (!exits(asked)) return undefined;
    if (model && !model.exitGate)
      throw new EngineRequestError(
        '`exit_threshold` needs a model with an exit gate; this model has none (the zero-shot rules need none: `exit_rule` "kl" or "entropy")',
        "exit_threshold",
      );
  } else {
    // a zero-shot rule's value (a KL divergence, an entropy difference, in nats) is below the threshold to exit; 0 never is
    if (!(asked >= 0 && Number.isFinite(asked))) throw new EngineRequestError(`\`exit_threshold\` must be a number >= 0, got ${asked}`, "exit_threshold");
    if (asked === 0) return undefined;
  }
  if (settings.mode !== "generate")
    throw new EngineRequestError(`\`exit_threshold\` cannot be combined with mode ${settings.mode}: speculative decoding runs fixed depths`, "exit_threshold");
  return rule === "gate" ? { threshold: asked, policy } : { threshold: asked, policy, rule };
}

/**
 * cache_steps S: the core's units share S steps of caches (the published
 * Huginn code's compress-s). It keeps fewer steps than it runs, needs full
 * attention, and cannot be combined with what rewrites or reads a shared
 * slot out of turn: the exact exit policy's late steps, a speculative cycle.
 */
function planCacheSteps(settings: DepthSettings, loops: number | undefined, exit: ExitPlan | undefined): number {
  const steps = settings.cacheSteps ?? 0;
  if (steps === 0) return 0;
  if (!Number.isInteger(steps) || steps < 0) throw new EngineRequestError(`\`cache_steps\` must be an integer >= 0, got ${steps}`, "cache_steps");
  if (loops !== undefined && steps >= loops)
    throw new EngineRequestError(`\`cache_steps\` (${steps}) must be less than the steps run (${loops}); 0 keeps every step`, "cache_steps");
  if ((settings.cacheWindow ?? 0) > 0) throw new EngineRequestError("`cache_steps` cannot be combined with `cache_window`", "cache_steps");
  if (settings.mode !== "generate")
    throw new EngineRequestError(`\`cache_steps\` cannot be combined with mode ${settings.mode} (a verify pass reads drafted rows a shared slot no longer holds)`, "cache_steps");
  if (exit?.policy === "exact")
    throw new EngineRequestError(
      '`cache_steps` cannot be combined with the exact exit policy (its late steps would rewrite slots later positions read): ask for `exit_policy: "copy"` or `exit_threshold: null`',
      "cache_steps",
    );
  return steps;
}

/**
 * Resolves a request's depth once, defaults and checks together. Throws
 * EngineRequestError naming the field for what cannot be run. Without a
 * model (context.model null) it checks what it can and returns null: such
 * a request is refused before it could run.
 */
export function planDepth(settings: DepthSettings, context: DepthContext & { model: DepthModel }): DepthPlan;
export function planDepth(settings: DepthSettings, context: DepthContext): DepthPlan | null;
export function planDepth(settings: DepthSettings, context: DepthContext): DepthPlan | null {
  const { mode } = settings;
  const speculative = mode === "generate" ? undefined : planSpeculative({ ...settings, mode }, context);
  const exit = planExit(settings, context.model);
  const asked = speculative ? settings.verifyLoops : settings.loops;
  if (asked !== undefined) checkRange(speculative ? "verify_loops" : "loops", asked, LS_MAX_LOOPS);
  const cacheSteps = planCacheSteps(settings, asked ?? context.model?.defaultLoops, exit);
  if (!context.model) return null;
  const loops = asked ?? context.model.defaultLoops;
  return { loops, ...(speculative ? { speculative } : {}), ...(exit ? { exit } : {}), ...(cacheSteps ? { cacheSteps } : {}) };
}
