// Self-speculative decoding, engine side (docs/speculative.md): which requests run
// speculatively and with what settings, and the per-request statistics. The
// cycle itself — draft at draftLoops, one batched verify at loops, accept,
// roll back — is one C call (ls_spec_cycle, kernels/spec.c) per step.
//
// How a speculative request runs (engine.ts): the prompt is prefilled at the
// verify depth and the first token sampled exactly as plain generation does
// (so the prefix pool serves both alike); every later step is one cycle that
// returns 1..draftAhead+1 tokens. Tokens reach the sink one by one, and stop
// ids / max_tokens cut a cycle's tokens where plain decoding would have
// stopped; cycles never draft past max_tokens.
import { LS_MAX_LOOPS, LS_SPEC_MAX_AHEAD, LS_SPEC_MAX_BRANCHES, LS_SPEC_MAX_NODES } from "../abi/abi.generated.ts";
import { SPEC_FLAGS, type SpecCycleParams, type SpecCycleStats } from "./binding.ts";
import { EngineRequestError } from "./errors.ts";
import type { GenerateRequest, SpeculativeMode, SpeculativeStats } from "./types.ts";

export const SPEC_LIMITS = {
  loops: LS_MAX_LOOPS, // draft and verify depth
  draftAhead: LS_SPEC_MAX_AHEAD,
  kBranches: LS_SPEC_MAX_BRANCHES,
  nodes: LS_SPEC_MAX_NODES, // kBranches * draftAhead
} as const;

export const SPEC_DEFAULTS = { draftLoops: 2, draftAhead: 4, kBranches: 1 } as const;

/**
 * Positions a cycle may write past the request's last token: the tree's root
 * plus up to 64 nodes each take their own cache row until the walk is done.
 * Sessions of speculative requests are sized prompt + maxTokens + this.
 */
export const SPEC_SESSION_SLACK = 1 + SPEC_LIMITS.nodes;

/** Which head proposes draft tokens (see kernels/spec.c: "Draft head"). */
export type DraftHead = "shortlist" | "exact";

/** A speculative request's resolved settings. */
export interface SpecPlan {
  mode: SpeculativeMode;
  draftLoops: number;
  verifyLoops: number;
  draftAhead: number;
  kBranches: number;
}

const isIntIn = (v: number, lo: number, hi: number) => Number.isInteger(v) && v >= lo && v <= hi;

/**
 * The plan of a speculative request, null for plain generation. Throws
 * EngineRequestError (a 400 upstream) for settings the kernels refuse, with
 * the constraint named.
 */
export function planSpeculative(req: GenerateRequest): SpecPlan | null {
  const mode = req.mode ?? "generate";
  if (mode === "generate") return null;
  const verifyLoops = req.verifyLoops ?? req.loops;
  if (verifyLoops !== req.loops)
    throw new EngineRequestError(`verifyLoops (${verifyLoops}) must equal loops (${req.loops}) in the speculative modes`);
  const draftLoops = req.draftLoops ?? Math.min(SPEC_DEFAULTS.draftLoops, verifyLoops);
  const draftAhead = req.draftAhead ?? SPEC_DEFAULTS.draftAhead;
  const kBranches = mode === "tree_speculative" ? (req.kBranches ?? SPEC_DEFAULTS.kBranches) : 1;
  // A draft deeper than the verifier is allowed (kernels/spec.c): only slower.
  if (!isIntIn(draftLoops, 1, SPEC_LIMITS.loops))
    throw new EngineRequestError(`draft_loops must be between 1 and ${SPEC_LIMITS.loops}, got ${draftLoops}`);
  if (!isIntIn(draftAhead, 1, SPEC_LIMITS.draftAhead))
    throw new EngineRequestError(`draft_ahead must be between 1 and ${SPEC_LIMITS.draftAhead}, got ${draftAhead}`);
  if (!isIntIn(kBranches, 1, SPEC_LIMITS.kBranches))
    throw new EngineRequestError(`K_branches must be between 1 and ${SPEC_LIMITS.kBranches}, got ${kBranches}`);
  if (kBranches * draftAhead > SPEC_LIMITS.nodes)
    throw new EngineRequestError(
      `K_branches * draft_ahead must be at most ${SPEC_LIMITS.nodes} (tree nodes verified in one call), got ${kBranches} * ${draftAhead} = ${kBranches * draftAhead}`,
    );
  if (mode === "tree_speculative" && req.sampling.temperature !== 0)
    throw new EngineRequestError(
      `tree_speculative is greedy only: temperature must be 0, got ${req.sampling.temperature} (use mode speculative to sample)`,
    );
  return { mode, draftLoops, verifyLoops, draftAhead, kBranches };
}

/** How the engine drafts (Engine options; the defaults suit every request). */
export interface DraftOptions {
  /** Head that proposes draft tokens (default "shortlist": a 2-bit copy of the output head scores every token, the model's own head its best few; "exact": the model's head everywhere). */
  draftHead?: DraftHead;
  /**
   * Tree: top-K candidates the draft gives less probability than this are
   * not verified (default 0: every candidate is verified).
   * On a CPU a verified row costs nearly a plain step while a leaf adds at
   * most one token, so e.g. 0.1 keeps the tree from costing more than the
   * chain; the output is exact either way.
   */
  treeLeafMinProb?: number;
}

/** ls_spec_cycle's settings for one cycle that may return at most maxNew tokens. */
export function cycleParams(plan: SpecPlan, req: GenerateRequest, maxNew: number, draft: DraftOptions = {}): SpecCycleParams {
  const s = req.sampling;
  return {
    draftLoops: plan.draftLoops,
    verifyLoops: plan.verifyLoops,
    draftAhead: plan.draftAhead,
    kBranches: plan.kBranches,
    maxNew,
    temperature: s.temperature,
    topK: s.topK,
    topP: s.topP,
    repetitionPenalty: s.repetitionPenalty,
    seed: s.seed,
    flags: draft.draftHead === "exact" ? SPEC_FLAGS.exactDraftHead : 0,
    leafMinProb: draft.treeLeafMinProb ?? 0,
  };
}

/** Sums what the cycles of one request did. */
export class SpecCounter {
  private drafted = 0;
  private accepted = 0;
  private produced = 0;
  private cycles = 0;

  add(stats: SpecCycleStats, tokens: number): void {
    this.drafted += stats.drafted;
    this.accepted += stats.accepted;
    this.produced += tokens;
    this.cycles++;
  }

  stats(): SpeculativeStats {
    return {
      draftTokens: this.drafted,
      acceptedTokens: this.accepted,
      cycles: this.cycles,
      acceptedPerCycle: this.cycles > 0 ? this.produced / this.cycles : 0,
    };
  }
}
