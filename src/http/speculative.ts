// Native speculative family: POST /generate/speculative and
// /generate/tree_speculative (docs/http.md, docs/speculative.md). Every /generate
// field plus the speculative knobs; `stream` is accepted and ignored (one
// JSON body); `loops` is accepted and ignored (the verify depth is
// verify_loops, reported as loops_used).
//
// The knob checks and the response stats are exported for the extended
// family (/api/v0, `mode` = speculative / tree_speculative), so both
// families refuse the same combinations with the same messages.
import { type Static, Type as T } from "@sinclair/typebox";
import { Elysia } from "elysia";
import type { Config } from "../config.ts";
import { planSpeculative, SPEC_DEFAULTS } from "../engine/spec_plan.ts";
import type { GenerateRequest, SpeculativeMode } from "../engine/types.ts";
import { validatedBody } from "./errors.ts";
import { type AppDeps, type Completion, runGeneration } from "./generation.ts";
import { nativeBody, nativeJob, nativeStats } from "./native.ts";
import type { SpeculativeResponse, SpeculativeStats } from "../wire/responses.ts";
import { NATIVE_DEFAULTS as D, GenerateBody, SpeculativeFields, type SpeculativeKnobs } from "../wire/requests.ts";

// ---- request bodies: /generate's fields plus the knobs ----

const { draft_loops, verify_loops, draft_ahead, K_branches } = SpeculativeFields;

export const SpeculativeBody = T.Object({ ...GenerateBody.properties, draft_loops, verify_loops, draft_ahead });
export type SpeculativeBody = Static<typeof SpeculativeBody>;

export const TreeSpeculativeBody = T.Object({ ...SpeculativeBody.properties, K_branches });
export type TreeSpeculativeBody = Static<typeof TreeSpeculativeBody>;

// ---- knobs → engine request fields (shared with the extended family) ----

/** The GenerateRequest fields a speculative request sets: the verify depth as `loops`, and the plan. */
export type SpeculativeRequestFields = Required<Pick<GenerateRequest, "loops" | "speculative">>;

/**
 * The knobs resolved into the engine's plan (defaults, ranges and the
 * combinations it refuses: a 400 naming the field, before the length check,
 * docs/http.md#validation-order). The verify depth is the request's depth.
 */
export function speculativeFields(config: Config, mode: SpeculativeMode, knobs: SpeculativeKnobs, temperature: number): SpeculativeRequestFields {
  const settings = { mode, draftLoops: knobs.draft_loops ?? undefined, draftAhead: knobs.draft_ahead ?? undefined, kBranches: knobs.K_branches ?? undefined };
  return {
    loops: knobs.verify_loops ?? SPEC_DEFAULTS.verifyLoops,
    speculative: planSpeculative(settings, { temperature, kvCacheMode: config.kvCacheMode }),
  };
}

/** Response stats of a speculative request: /generate's plus the acceptance figures. */
export function speculativeStats(c: Completion, mode: SpeculativeMode, verifyLoops: number): SpeculativeStats {
  const spec = c.result.speculative;
  return {
    ...nativeStats(c, mode, verifyLoops),
    accepted_per_cycle: spec?.acceptedPerCycle ?? 0,
    draft_tokens: spec?.draftTokens ?? 0,
    accepted_tokens: spec?.acceptedTokens ?? 0,
  };
}

// ---- the two endpoints ----

async function generate(deps: AppDeps, body: TreeSpeculativeBody, httpRequest: Request, mode: SpeculativeMode): Promise<Response> {
  // Validation order (docs/http.md#validation-order): (schema, done) → range (the knobs first) → length → engine loaded → admission.
  const spec = speculativeFields(deps.config, mode, body, body.temperature ?? D.temperature);
  const { engine, request: plain, stopStrings, scheduling } = await nativeJob(deps, body, mode);
  const request: GenerateRequest = { ...plain, ...spec };
  const done = await runGeneration(engine, deps.tokenizer, request, stopStrings, httpRequest.signal, undefined, scheduling);
  return Response.json(nativeBody(deps, request, done, speculativeStats(done, mode, spec.loops)) satisfies SpeculativeResponse);
}

export function speculativeRoutes(deps: AppDeps) {
  return new Elysia()
    .post("/generate/speculative", ({ body, request }) => generate(deps, body, request, "speculative"), validatedBody(SpeculativeBody))
    .post(
      "/generate/tree_speculative",
      ({ body, request }) => generate(deps, body, request, "tree_speculative"),
      validatedBody(TreeSpeculativeBody),
    );
}
