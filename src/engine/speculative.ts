// Self-speculative decoding, engine side (docs/speculative.md): a plan's
// cycle settings and the per-request statistics (spec_plan.ts makes the plan). The
// cycle itself — draft at draftLoops, one batched verify at loops, accept,
// roll back — is one C call (ls_spec_cycle, kernels/cpu/spec.c) per step.
//
// How a speculative request runs (engine.ts): the prompt is prefilled at the
// verify depth and the first token sampled exactly as plain generation does
// (so the prefix pool serves both alike); every later step is one cycle that
// returns 1..draftAhead+1 tokens. Tokens reach the sink one by one, and stop
// ids / max_tokens cut a cycle's tokens where plain decoding would have
// stopped; cycles never draft past max_tokens.
import { SPEC_FLAGS, type SpecCycleParams, type SpecCycleStats } from "./binding.ts";
import { SPEC_LIMITS } from "./spec_plan.ts";
import type { SamplingParams, SpeculativeStats, SpecPlan } from "./types.ts";

/**
 * Positions a cycle may write past the request's last token: the tree's root
 * plus up to 64 nodes each take their own cache row until the walk is done.
 * Sessions of speculative requests are sized prompt + maxTokens + this.
 */
export const SPEC_SESSION_SLACK = 1 + SPEC_LIMITS.nodes;

/** Which head proposes draft tokens (see kernels/cpu/spec.c: "Draft head"). */
export type DraftHead = "shortlist" | "exact";

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

/** ls_spec_cycle's settings for one cycle at depth `loops` that may return at most maxNew tokens. */
export function cycleParams(plan: SpecPlan, loops: number, sampling: SamplingParams, maxNew: number, draft: DraftOptions = {}): SpecCycleParams {
  return {
    draftLoops: plan.draftLoops,
    verifyLoops: loops,
    draftAhead: plan.draftAhead,
    kBranches: plan.kBranches,
    maxNew,
    sampling,
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
