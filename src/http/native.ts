// Native family: POST /generate (docs/http.md, native stream framing included).
// Handlers stay thin: resolve the body into an engine request (schema →
// range, the depth resolved once → length → engine loaded), run it, frame
// the result.
import { Elysia } from "elysia";
import type { GenerateRequest, GenerationMode } from "../engine/types.ts";
import {
  type AppDeps,
  type Completion,
  type GenerationEngine,
  type Scheduling,
  checkCacheWindow,
  completedForStream,
  type DepthFields,
  engineRequest,
  promptTokens,
  resolveDepth,
  runGeneration,
} from "./generation.ts";
import { nativeLogprobs } from "./logprobs.ts";
import { requestFormat } from "./response_format.ts";
import type { GenerateResponse, GenerateStreamEvent, NativeStats } from "../wire/responses.ts";
import { GenerateBody, NATIVE_DEFAULTS as D } from "../wire/requests.ts";
import { sseAfterAdmission, sseEvent } from "./sse.ts";

interface NativeJob {
  engine: GenerationEngine;
  request: GenerateRequest;
  stopStrings: string[];
  stream: boolean;
  scheduling: Scheduling;
}

/** A /generate body, or a speculative route's (its knobs beside), resolved into an engine job. */
export async function nativeJob(deps: AppDeps, body: GenerateBody & DepthFields, mode: GenerationMode = "generate"): Promise<NativeJob> {
  const maxTokens = body.max_tokens ?? D.max_tokens;
  const temperature = body.temperature ?? D.temperature;
  const cacheWindow = body.cache_window ?? D.cache_window;
  const stops = body.stop == null ? [] : Array.isArray(body.stop) ? body.stop : [body.stop];
  const stopStrings = stops.filter((s): s is string => typeof s === "string");
  const stopIds = stops.filter((s): s is number => typeof s === "number");

  const depth = resolveDepth(deps, mode, body, temperature);
  checkCacheWindow(deps, cacheWindow);
  const prompt = await promptTokens(deps, body.prompt, "prompt", maxTokens);
  const format = await requestFormat(deps, body.response_format, body.grammar);
  const { engine, request } = engineRequest(deps, depth, {
    promptTokens: prompt,
    maxTokens,
    sampling: {
      temperature,
      topK: body.top_k ?? D.top_k,
      topP: body.top_p ?? D.top_p,
      repetitionPenalty: body.repetition_penalty ?? D.repetition_penalty,
      seed: body.sample_seed ?? D.sample_seed,
    },
    stopTokenIds: stopIds,
    cacheWindow,
    ...(body.logprobs == null ? {} : { logprobs: body.logprobs }),
    ...(format ? { format } : {}),
  });
  return {
    engine,
    request,
    stopStrings,
    stream: body.stream ?? D.stream,
    scheduling: { priority: body.priority, sloMs: body.slo_ms },
  };
}

/** A native family's whole response: the generation, its `logprobs` when asked (docs/openai-compat.md), and `stats`. */
export function nativeBody<S>(deps: AppDeps, request: GenerateRequest, c: Completion, stats: S) {
  return {
    tokens: c.tokens,
    text: c.text,
    finish_reason: c.finishReason,
    ...(request.logprobs === undefined ? {} : { logprobs: nativeLogprobs(deps.tokenizer, c.logprobs) }),
    stats,
  };
}

export function nativeStats(c: Completion, mode: GenerationMode, loopsUsed: number): NativeStats {
  const wallMs = c.result.wallMs;
  return {
    wall_ms: wallMs,
    tokens_per_second: wallMs > 0 ? c.tokens.length / (wallMs / 1000) : 0,
    prompt_tokens: c.result.promptTokens,
    completion_tokens: c.tokens.length,
    mode,
    loops_used: loopsUsed,
    ...(c.result.exitSteps?.length ? { mean_steps: c.result.exitSteps.reduce((a, b) => a + b, 0) / c.result.exitSteps.length } : {}),
  };
}

async function generate(deps: AppDeps, body: GenerateBody, httpRequest: Request): Promise<Response> {
  const { engine, request, stopStrings, stream, scheduling } = await nativeJob(deps, body);

  if (stream) {
    return sseAfterAdmission(httpRequest, (send, signal) => {
      const run = runGeneration(
        engine,
        deps.tokenizer,
        request,
        stopStrings,
        signal,
        // With logprobs, each token's event carries its one entry: the events' arrays add up to the body's.
        (id, text, logprob) =>
          send(
            sseEvent({
              token_id: id,
              text,
              ...(logprob ? { logprobs: nativeLogprobs(deps.tokenizer, [logprob]) } : {}),
            } satisfies GenerateStreamEvent),
          ),
        scheduling,
      );
      const done = run.then(completedForStream).then((c) => send(sseEvent({ token_id: -1, text: c.tail } satisfies GenerateStreamEvent)));
      return { started: run.started, done };
    });
  }

  const done = await runGeneration(engine, deps.tokenizer, request, stopStrings, httpRequest.signal, undefined, scheduling);
  return Response.json(nativeBody(deps, request, done, nativeStats(done, "generate", request.loops)) satisfies GenerateResponse);
}

export function nativeRoutes(deps: AppDeps) {
  return new Elysia().post("/generate", ({ body, request }) => generate(deps, body, request), {
    body: GenerateBody,
  });
}
