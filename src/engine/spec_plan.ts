// A speculative request's settings, resolved once (docs/speculative.md):
// defaults, ranges and the combinations the kernels refuse, in the words of
// the request's fields. planDepth (depth_plan.ts) plans every request's
// depth through here; the engine then runs the plan as given. No FFI here:
// the HTTP layer imports it.
import { LS_MAX_LOOPS, LS_SPEC_MAX_AHEAD, LS_SPEC_MAX_BRANCHES, LS_SPEC_MAX_NODES } from "../abi/abi.generated.ts";
import type { KvCacheMode } from "../model/kvcache.ts";
import { EngineRequestError } from "./errors.ts";
import type { SpeculativeMode, SpecPlan } from "./types.ts";

export const SPEC_LIMITS = {
  // The draft's range in the service's contract (docs/speculative.md); the
  // kernels would take any depth up to LS_MAX_LOOPS.
  draftLoops: 32,
  verifyLoops: LS_MAX_LOOPS,
  draftAhead: LS_SPEC_MAX_AHEAD,
  kBranches: LS_SPEC_MAX_BRANCHES,
  nodes: LS_SPEC_MAX_NODES, // kBranches * draftAhead
} as const;

/** The draft's defaults; the verify depth's is the model's default_loops (planDepth). */
export const SPEC_DEFAULTS = { draftLoops: 2, draftAhead: 4, kBranches: 1 } as const;

/** A speculative request's settings as asked for: unset ones take SPEC_DEFAULTS. */
export interface SpecSettings {
  mode: SpeculativeMode;
  draftLoops?: number;
  draftAhead?: number;
  /** tree_speculative only; the chain is one branch. */
  kBranches?: number;
}

/** What a plan depends on beyond its own settings. */
export interface SpecContext {
  /** The request's sampling temperature: the tree is greedy only. */
  temperature: number;
  /** The key/value cache the engine runs: the tree moves fp16 rows only (kernels/cpu/spec.c). */
  kvCacheMode: KvCacheMode;
}

/** An integer knob in [1, max], or a refusal naming its field. */
export function checkRange(param: string, value: number, max: number): number {
  if (!(Number.isInteger(value) && value >= 1 && value <= max)) throw new EngineRequestError(`\`${param}\` must be between 1 and ${max}, got ${value}`, param);
  return value;
}

/**
 * Resolves a speculative request's settings once, defaults and checks
 * together: the plan the engine runs unchanged (GenerateRequest.speculative).
 * Throws EngineRequestError for settings the kernels refuse, naming the field. A
 * draft deeper than the verify depth is allowed: slower, still exact.
 */
export function planSpeculative(settings: SpecSettings, context: SpecContext): SpecPlan {
  const { mode } = settings;
  const draftLoops = checkRange("draft_loops", settings.draftLoops ?? SPEC_DEFAULTS.draftLoops, SPEC_LIMITS.draftLoops);
  const draftAhead = checkRange("draft_ahead", settings.draftAhead ?? SPEC_DEFAULTS.draftAhead, SPEC_LIMITS.draftAhead);
  if (mode === "speculative") return { mode, draftLoops, draftAhead, kBranches: 1 };
  const kBranches = checkRange("K_branches", settings.kBranches ?? SPEC_DEFAULTS.kBranches, SPEC_LIMITS.kBranches);
  if (kBranches * draftAhead > SPEC_LIMITS.nodes)
    throw new EngineRequestError(
      `\`K_branches\` * \`draft_ahead\` must be at most ${SPEC_LIMITS.nodes} (tree nodes verified in one call), got ${kBranches} * ${draftAhead} = ${kBranches * draftAhead}`,
      "K_branches",
    );
  if (context.temperature !== 0)
    throw new EngineRequestError(
      `tree_speculative is greedy only: \`temperature\` must be 0.0, got ${context.temperature} (mode speculative samples)`,
      "temperature",
      "unsupported_parameter",
    );
  if (context.kvCacheMode !== "fp16")
    throw new EngineRequestError(
      `tree_speculative needs the fp16 key/value cache, but this server runs kv_cache_mode ${context.kvCacheMode} (use mode speculative)`,
      "mode",
      "unsupported_cache_mode",
    );
  return { mode, draftLoops, draftAhead, kBranches };
}
