// Native speculative family: POST /generate/speculative and
// /generate/tree_speculative (docs/http.md, docs/speculative.md). Every /generate
// field plus the speculative knobs; `stream` is accepted and ignored (one
// JSON body); `loops` is accepted and ignored (the verify depth is
// verify_loops, the model's default_loops unless given, reported as
// loops_used). The knobs are resolved with the rest of the depth
// (resolveDepth), as on the extended family; the response stats are
// exported for it.
import { type Static, Type as T } from "@sinclair/typebox";
import { Elysia } from "elysia";
import type { SpeculativeMode } from "../engine/types.ts";
import { validatedBody } from "./errors.ts";
import { type AppDeps, type Completion, runGeneration } from "./generation.ts";
import { nativeBody, nativeJob, nativeStats } from "./native.ts";
import type { SpeculativeResponse, SpeculativeStats } from "../wire/responses.ts";
import { GenerateBody, SpeculativeFields } from "../wire/requests.ts";

// ---- request bodies: /generate's fields plus the knobs ----

const { draft_loops, verify_loops, draft_ahead, K_branches } = SpeculativeFields;

export const SpeculativeBody = T.Object({ ...GenerateBody.properties, draft_loops, verify_loops, draft_ahead });
export type SpeculativeBody = Static<typeof SpeculativeBody>;

export const TreeSpeculativeBody = T.Object({ ...SpeculativeBody.properties, K_branches });
export type TreeSpeculativeBody = Static<typeof TreeSpeculativeBody>;

// ---- response stats (shared with the extended family) ----

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
  const { engine, request, stopStrings, scheduling } = await nativeJob(deps, body, mode);
  const done = await runGeneration(engine, deps.tokenizer, request, stopStrings, httpRequest.signal, undefined, scheduling);
  return Response.json(nativeBody(deps, request, done, speculativeStats(done, mode, request.loops)) satisfies SpeculativeResponse);
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
