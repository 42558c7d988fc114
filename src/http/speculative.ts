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
import { LS_SPEC_MAX_NODES as MAX_TREE_NODES } from "../abi/abi.generated.ts";
import type { GenerateRequest, SpeculativeMode } from "../engine/types.ts";
import { badRequest, validatedBody } from "./errors.ts";
import { type AppDeps, type Completion, runGeneration } from "./generation.ts";
import { nativeBody, nativeJob, nativeStats } from "./native.ts";
import type { SpeculativeResponse, SpeculativeStats } from "../wire/responses.ts";
import { NATIVE_DEFAULTS as D, EXTENDED_DEFAULTS as E, GenerateBody, SpeculativeFields, type SpeculativeKnobs } from "./schemas.ts";

// ---- request bodies: /generate's fields plus the knobs ----

const { draft_loops, verify_loops, draft_ahead, K_branches } = SpeculativeFields;

export const SpeculativeBody = T.Object({ ...GenerateBody.properties, draft_loops, verify_loops, draft_ahead });
export type SpeculativeBody = Static<typeof SpeculativeBody>;

export const TreeSpeculativeBody = T.Object({ ...SpeculativeBody.properties, K_branches });
export type TreeSpeculativeBody = Static<typeof TreeSpeculativeBody>;

// ---- knobs → engine request fields (shared with the extended family) ----

/** The GenerateRequest fields a speculative request sets (loops is the verify depth). */
export type SpeculativeRequestFields = Required<Pick<GenerateRequest, "mode" | "loops" | "draftLoops" | "verifyLoops" | "draftAhead" | "kBranches">>;

/**
 * Range checks that go beyond each field's own bounds (400 naming the
 * constraint), before the length check (docs/http.md#validation-order): for the tree,
 * K_branches * draft_ahead <= LS_SPEC_MAX_NODES, greedy sampling and the fp16 key/value
 * cache. draft_loops and verify_loops are independent: a draft deeper than
 * the verifier is slower but exact (kernels/spec.c).
 */
export function speculativeFields(config: Config, mode: SpeculativeMode, knobs: SpeculativeKnobs, temperature: number): SpeculativeRequestFields {
  const verifyLoops = knobs.verify_loops ?? E.verify_loops;
  const draftLoops = knobs.draft_loops ?? E.draft_loops;
  const draftAhead = knobs.draft_ahead ?? E.draft_ahead;
  const kBranches = mode === "tree_speculative" ? (knobs.K_branches ?? E.K_branches) : 1;
  if (mode === "tree_speculative") {
    if (kBranches * draftAhead > MAX_TREE_NODES)
      throw badRequest(
        `\`K_branches\` * \`draft_ahead\` must be at most ${MAX_TREE_NODES} (tree nodes verified in one call), got ${kBranches} * ${draftAhead} = ${kBranches * draftAhead}`,
        "K_branches",
      );
    if (temperature !== 0)
      throw badRequest(
        `tree_speculative is greedy only: \`temperature\` must be 0.0, got ${temperature} (mode speculative samples)`,
        "temperature",
        "unsupported_parameter",
      );
    if (config.kvCacheMode !== "fp16")
      throw badRequest(
        `tree_speculative needs the fp16 key/value cache, but this server runs kv_cache_mode ${config.kvCacheMode} ` +
          "(unset SERVICE_KV_INT8 / SERVICE_KV_INT4 / SERVICE_KV_H_MODE, or use mode speculative)",
        "mode",
        "unsupported_cache_mode",
      );
  }
  return { mode, loops: verifyLoops, draftLoops, verifyLoops, draftAhead, kBranches };
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
  const { engine, request: plain, stopStrings, scheduling } = await nativeJob(deps, body);
  const request: GenerateRequest = { ...plain, ...spec };
  const done = await runGeneration(engine, deps.tokenizer, request, stopStrings, httpRequest.signal, undefined, scheduling);
  return Response.json(nativeBody(deps, request, done, speculativeStats(done, mode, spec.verifyLoops)) satisfies SpeculativeResponse);
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
