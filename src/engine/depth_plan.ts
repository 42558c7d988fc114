// A request's depth, resolved once: how many steps (`loops`), the
// speculative plan (spec_plan.ts) and the learned early exit
// (docs/early-exit.md), with the model's defaults for what the request
// leaves out and the rules that refuse a combination, in the words of the
// request's fields. The HTTP layer resolves every request through here and
// the engine runs the result as given. No FFI here: the HTTP layer imports it.
import { LS_MAX_LOOPS } from "../abi/abi.generated.ts";
import { EngineRequestError } from "./errors.ts";
import { checkRange, planSpeculative, type SpecContext } from "./spec_plan.ts";
import type { ExitPlan, ExitPolicy, GenerateRequest, GenerationMode, ModelFileInfo } from "./types.ts";

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
  /** The request's cache window (0 or undefined: full attention): the exact exit policy needs none. */
  cacheWindow?: number;
}

/** What a model contributes: its default depth, its exit gate and the file's default threshold. */
export type DepthModel = Pick<ModelFileInfo, "defaultLoops" | "exitGate" | "exitThreshold">;

export interface DepthContext extends SpecContext {
  /** null when no model is loaded: the rules that need none are still checked, and nothing is resolved. */
  model: DepthModel | null;
}

/** The GenerateRequest fields a depth plan sets. */
export type DepthPlan = Pick<GenerateRequest, "loops" | "speculative" | "exit">;

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
  const asked = settings.exitThreshold;
  if (asked === undefined) {
    const threshold = model && settings.mode === "generate" ? defaultExitThreshold(model) : null;
    return threshold === null ? undefined : { threshold, policy };
  }
  if (asked === null) return undefined;
  if (!(asked >= 0 && asked <= 1)) throw new EngineRequestError(`\`exit_threshold\` must be in [0, 1], got ${asked}`, "exit_threshold");
  if (!exits(asked)) return undefined;
  if (model && !model.exitGate) throw new EngineRequestError("`exit_threshold` needs a model with an exit gate; this model has none", "exit_threshold");
  if (settings.mode !== "generate")
    throw new EngineRequestError(`\`exit_threshold\` cannot be combined with mode ${settings.mode}: speculative decoding runs fixed depths`, "exit_threshold");
  return { threshold: asked, policy };
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
  if (!context.model) return null;
  const loops = asked ?? context.model.defaultLoops;
  return { loops, ...(speculative ? { speculative } : {}), ...(exit ? { exit } : {}) };
}
