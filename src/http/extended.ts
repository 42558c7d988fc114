// Extended family: GET /api/v0/models, POST /api/v0/chat/completions, POST
// /api/v0/completions (docs/http.md#responses).
// The compat handlers do the work; this family adds its request knobs (mode,
// speculative knobs, cache_window, repetition_penalty, priority, slo_ms)
// and the `stats`, `model_info` and `runtime` sections, which a stream
// carries on its final chunk (the one with finish_reason).
import { Elysia } from "elysia";
import { type Config, SERVICE_NAME } from "../config.ts";
import { defaultExitThreshold } from "../engine/depth_plan.ts";
import type { ModelInfo } from "../engine/types.ts";
import { chatCompletion, type Extension, findModel, modelEntries, textCompletion } from "./compat.ts";
import { validatedBody } from "./errors.ts";
import { type AppDeps, checkCacheWindow, resolveDepth } from "./generation.ts";
import { nativeStats } from "./native.ts";
import type { ExtendedModelEntry, ExtendedModelList, ModelInfoSection, RuntimeSection } from "../wire/responses.ts";
import { speculativeStats } from "./speculative.ts";
import {
  COMPAT_DEFAULTS,
  EXTENDED_DEFAULTS as E,
  ExtendedChatCompletionBody,
  ExtendedCompletionBody,
  type ExtendedKnobs,
} from "../wire/requests.ts";

// ---- response sections ----

function modelInfoSection(info: ModelInfo, config: Config): ModelInfoSection {
  return {
    arch: info.arch,
    family: info.family,
    dim: info.dim,
    n_heads: info.nHeads,
    ffn_dim: info.ffnDim,
    vocab_size: info.vocabSize,
    default_loops: info.defaultLoops,
    n_layers: info.nLayers,
    exit_gate: info.exitGate,
    exit_threshold: defaultExitThreshold(info),
    quant: info.quant,
    kv_cache_mode: config.kvCacheMode,
  };
}

/** model_info of the loaded model; null without one (only the models list can be asked then). */
function loadedModelInfo(deps: AppDeps): ModelInfoSection | null {
  return deps.engine ? modelInfoSection(deps.engine.info, deps.config) : null;
}

function runtimeSection(config: Config): RuntimeSection {
  return { name: SERVICE_NAME, version: config.version, commit: config.commit };
}

// ---- modes ----

/**
 * Range-checks the extended knobs (400s, before the length check) and turns
 * them into an Extension: the depth, speculative knobs included, is
 * resolved as on the native routes.
 */
function extension(deps: AppDeps, knobs: ExtendedKnobs & { temperature?: number | null; loops?: number | null }): Extension {
  const mode = knobs.mode ?? E.mode;
  const depth = resolveDepth(deps, mode, knobs, knobs.temperature ?? COMPAT_DEFAULTS.temperature);
  const cacheWindow = knobs.cache_window ?? E.cache_window;
  checkCacheWindow(deps, cacheWindow);
  return {
    repetitionPenalty: knobs.repetition_penalty,
    cacheWindow,
    scheduling: { priority: knobs.priority, sloMs: knobs.slo_ms },
    depth,
    grammar: knobs.grammar,
    sections: (done, request) => ({
      // loops_used: verify_loops for the speculative modes, loops for plain generate.
      stats: mode === "generate" ? nativeStats(done, mode, request.loops) : speculativeStats(done, mode, request.loops),
      model_info: loadedModelInfo(deps),
      runtime: runtimeSection(deps.config),
    }),
  };
}

function models(deps: AppDeps): ExtendedModelList {
  // Without a loaded model the entry is still listed (it is configuration); model_info is null.
  return {
    object: "list",
    data: modelEntries(deps).map((m) => ({ ...m, model_info: loadedModelInfo(deps) })),
    runtime: runtimeSection(deps.config),
  };
}

export function extendedRoutes(deps: AppDeps) {
  return new Elysia({ prefix: "/api/v0" })
    .get("/models", () => models(deps))
    .get("/models/*", ({ params }): ExtendedModelEntry => ({ ...findModel(deps, params["*"]), model_info: loadedModelInfo(deps) }))
    .post(
      "/chat/completions",
      ({ body, request }) => chatCompletion(deps, body, request, extension(deps, body)),
      validatedBody(ExtendedChatCompletionBody),
    )
    .post(
      "/completions",
      ({ body, request }) => textCompletion(deps, body, request, extension(deps, body)),
      validatedBody(ExtendedCompletionBody),
    );
}
