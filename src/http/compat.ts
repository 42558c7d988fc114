// Compat family: GET /v1/models, POST /v1/chat/completions, POST
// /v1/completions (SPEC.md §2, §4, §6; DESIGN.md §6). A standard OpenAI
// client pointed at {base}/v1 works unchanged.
//
// The extended family (/api/v0, extended.ts) runs through the same handlers:
// it adds request knobs and response sections through an Extension, so the
// two families cannot drift apart.
//
// Decisions where SPEC.md leaves room:
// - `max_completion_tokens` (newer clients) is accepted and wins over
//   `max_tokens` when both are sent, as in vLLM.
// - `seed` unset: a fresh random sample seed per request.
// - `logprobs` (any value but null/false), `top_logprobs` (any but null/0) and
//   `response_format` (any but null or {"type": "text"}, which is what the
//   service produces anyway) are a 400 naming the field; text completions
//   also refuse a non-empty `suffix`. `echo` is supported; `best_of` and `n`
//   must be 1 (schemas.ts).
// - A message role outside system/user/assistant is a 400 (a value outside
//   an enum, DESIGN.md §6); a missing role or content is a 422.
// - Streams: the role chunk is held until the scheduler starts the request,
//   so a request refused in the queue still gets a plain 503. With
//   `stream_options.include_usage` every chunk carries `usage: null` and a
//   last chunk with empty `choices` carries the usage, as OpenAI sends it.
import { Elysia } from "elysia";
import { SERVICE_NAME } from "../config.ts";
import type { GenerateRequest } from "../engine/types.ts";
import { renderChat } from "./chat_template.ts";
import { badRequest, notFound, validatedBody } from "./errors.ts";
import {
  type AppDeps,
  type Completion,
  type GenerationEngine,
  type HttpFinishReason,
  type Scheduling,
  checkLength,
  completedForStream,
  promptTokens,
  requireEngine,
  runGeneration,
  stopTokenIds,
} from "./generation.ts";
import { ChatCompletionBody, COMPAT_DEFAULTS as D, CompletionBody } from "./schemas.ts";
import { sseAfterAdmission, sseEvent } from "./sse.ts";

/** Unix seconds at the service start: the `created` of the model entry. */
const STARTED_AT = Math.floor(Date.now() / 1000);

// ---- models ----

export interface ModelEntry {
  id: string;
  object: "model";
  created: number;
  owned_by: string;
}

/** The one served model (none when SERVICE_MODEL_PATH is unset). */
export function modelEntries(deps: AppDeps): ModelEntry[] {
  const id = deps.config.modelPath;
  return id === null ? [] : [{ id, object: "model", created: STARTED_AT, owned_by: SERVICE_NAME }];
}

/**
 * The entry named by the rest of a /models/... path, or a 404 in the error
 * shape. Ids are file paths, so clients send them percent-encoded (the
 * official client encodes "/" as %2F); the router leaves that to us.
 */
export function findModel(deps: AppDeps, encodedId: string): ModelEntry {
  let id = encodedId;
  try {
    id = decodeURIComponent(encodedId);
  } catch {
    // Not valid percent-encoding: compare it as it came.
  }
  const entry = modelEntries(deps).find((m) => m.id === id);
  if (!entry) throw notFound(`model ${JSON.stringify(id)} does not exist; GET /v1/models lists the served model`);
  return entry;
}

// ---- what the extended family adds ----

/** The extended family's effect on a compat request, its knobs already range-checked. */
export interface Extension {
  /** Replaces the penalty folded from presence/frequency_penalty; null/undefined keeps it. */
  repetitionPenalty?: number | null;
  cacheWindow: number;
  scheduling: Scheduling;
  /** Generation-mode fields (speculative knobs) laid over the compat request. */
  request?: Partial<GenerateRequest>;
  /** Sections added to the response body, or to the final chunk of a stream. */
  sections(done: Completion, request: GenerateRequest): Record<string, unknown>;
}

// ---- request → engine job (SPEC.md §4 order: range, then length, then engine loaded) ----

type SamplingBody = ChatCompletionBody | CompletionBody;

interface CompatJob {
  engine: GenerationEngine;
  request: GenerateRequest;
  stopStrings: string[];
  stream: boolean;
  includeUsage: boolean;
  model: string;
  /** Text that precedes the generated text in the response: the prompt, when `echo` is set. */
  echo: string;
  scheduling: Scheduling;
}

const unsupported = (field: string, message: string) => badRequest(`\`${field}\` ${message}`, field, "unsupported_parameter");

/** Fields a client may send that the service cannot honour: refused, never silently ignored. */
function refuseUnsupported(body: SamplingBody): void {
  if (body.logprobs != null && body.logprobs !== false)
    throw unsupported("logprobs", "is not supported: this server does not return log probabilities");
  if (body.top_logprobs != null && body.top_logprobs !== 0)
    throw unsupported("top_logprobs", "is not supported: this server does not return log probabilities");
  const format = body.response_format;
  const plainText = typeof format === "object" && format !== null && (format as { type?: unknown }).type === "text";
  if (format != null && !plainText)
    throw unsupported("response_format", 'is not supported: only plain text output ({"type": "text"}) is available');
}

/** SPEC.md §4: both penalties collapse into one repetition penalty. */
export function foldPenalties(presence: number, frequency: number): number {
  return 1 + Math.max(0, presence + frequency) / 2;
}

function randomSeed(): number {
  return crypto.getRandomValues(new Uint32Array(1))[0];
}

function resolve(deps: AppDeps, body: SamplingBody, prompt: number[], echo: string, ext: Extension | undefined): CompatJob {
  const maxTokens = body.max_completion_tokens ?? body.max_tokens ?? D.max_tokens;
  checkLength(deps, prompt.length, maxTokens);
  const engine = requireEngine(deps);
  const stopStrings = body.stop == null ? [] : Array.isArray(body.stop) ? body.stop : [body.stop];
  const penalty = foldPenalties(body.presence_penalty ?? D.presence_penalty, body.frequency_penalty ?? D.frequency_penalty);
  const stream = body.stream ?? D.stream;
  return {
    engine,
    request: {
      promptTokens: prompt,
      maxTokens,
      loops: body.loops ?? engine.info.defaultLoops,
      sampling: {
        temperature: body.temperature ?? D.temperature,
        topK: D.top_k,
        topP: body.top_p ?? D.top_p,
        repetitionPenalty: ext?.repetitionPenalty ?? penalty,
        seed: body.seed ?? randomSeed(),
      },
      stopTokenIds: stopTokenIds(deps),
      cacheWindow: ext?.cacheWindow ?? 0,
      ...ext?.request,
    },
    stopStrings,
    stream,
    includeUsage: stream && (body.stream_options?.include_usage ?? false),
    model: body.model,
    echo,
    scheduling: ext?.scheduling ?? {},
  };
}

async function chatJob(deps: AppDeps, body: ChatCompletionBody, ext?: Extension): Promise<CompatJob> {
  refuseUnsupported(body);
  return resolve(deps, body, await promptTokens(deps, renderChat(body.messages), "messages"), "", ext);
}

const isTexts = (p: string[] | number[]): p is string[] => typeof p[0] === "string";

/** SPEC.md §4: of several prompts, only the first is used; an id array is one prompt. */
function firstPrompt(p: CompletionBody["prompt"]): { prompt: string | number[]; param: string } {
  if (typeof p === "string") return { prompt: p, param: "prompt" };
  return isTexts(p) ? { prompt: p[0], param: "prompt[0]" } : { prompt: p, param: "prompt" };
}

async function completionJob(deps: AppDeps, body: CompletionBody, ext?: Extension): Promise<CompatJob> {
  refuseUnsupported(body);
  if (body.suffix != null && body.suffix !== "")
    throw unsupported("suffix", "is not supported: this server only continues the prompt, it does not fill in text");
  const { prompt, param } = firstPrompt(body.prompt);
  const ids = await promptTokens(deps, prompt, param);
  const echo = body.echo ? (typeof prompt === "string" ? prompt : deps.tokenizer.decode(ids)) : "";
  return resolve(deps, body, ids, echo, ext);
}

// ---- response framing: the one place chat and text completions differ ----

interface Framing {
  idPrefix: string;
  object: string;
  chunkObject: string;
  /** The choice of a whole (non-streamed) response. */
  choice(text: string, finishReason: HttpFinishReason): object;
  /** The stream's first choice, before any text (chat: the role), or null. */
  opening: object | null;
  /** A stream choice carrying text. */
  delta(text: string): object;
  /** The stream's closing choice. */
  end(finishReason: HttpFinishReason): object;
}

const CHAT: Framing = {
  idPrefix: "chatcmpl-",
  object: "chat.completion",
  chunkObject: "chat.completion.chunk",
  choice: (text, finishReason) => ({ index: 0, message: { role: "assistant", content: text }, finish_reason: finishReason }),
  opening: { index: 0, delta: { role: "assistant" }, finish_reason: null },
  delta: (text) => ({ index: 0, delta: { content: text }, finish_reason: null }),
  end: (finishReason) => ({ index: 0, delta: {}, finish_reason: finishReason }),
};

const TEXT: Framing = {
  idPrefix: "cmpl-",
  object: "text_completion",
  chunkObject: "text_completion",
  choice: (text, finishReason) => ({ text, index: 0, finish_reason: finishReason }),
  opening: null,
  delta: (text) => ({ text, index: 0, finish_reason: null }),
  end: (finishReason) => ({ text: "", index: 0, finish_reason: finishReason }),
};

function responseId(prefix: string): string {
  return prefix + crypto.randomUUID().replaceAll("-", "");
}

function usage(job: CompatJob, done: Completion) {
  const prompt = job.request.promptTokens.length;
  const completion = done.tokens.length;
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

async function respond(deps: AppDeps, job: CompatJob, framing: Framing, http: Request, ext?: Extension): Promise<Response> {
  const head = { id: responseId(framing.idPrefix), created: Math.floor(Date.now() / 1000), model: job.model };
  const { engine, request, stopStrings, scheduling } = job;

  if (!job.stream) {
    const done = await runGeneration(engine, deps.tokenizer, request, stopStrings, http.signal, undefined, scheduling);
    return Response.json({
      id: head.id,
      object: framing.object,
      created: head.created,
      model: head.model,
      choices: [framing.choice(job.echo + done.text, done.finishReason)],
      usage: usage(job, done),
      ...ext?.sections(done, request),
    });
  }

  const chunkHead = { id: head.id, object: framing.chunkObject, created: head.created, model: head.model };
  const usageNull = job.includeUsage ? { usage: null } : {};
  const chunk = (choice: object, extra: Record<string, unknown> = {}) =>
    sseEvent({ ...chunkHead, choices: [choice], ...usageNull, ...extra });

  return sseAfterAdmission(http, (send, signal) => {
    // Held by sseAfterAdmission until the request leaves the queue.
    if (framing.opening) send(chunk(framing.opening));
    const text = (t: string) => {
      if (t !== "") send(chunk(framing.delta(t))); // SPEC.md §6: no empty deltas
    };
    text(job.echo);
    const run = runGeneration(engine, deps.tokenizer, request, stopStrings, signal, (_, t) => text(t), scheduling);
    const done = run.then(completedForStream).then((c) => {
      text(c.tail);
      send(chunk(framing.end(c.finishReason), ext?.sections(c, request)));
      if (job.includeUsage) send(sseEvent({ ...chunkHead, choices: [], usage: usage(job, c) }));
    });
    // sseResponse reports a failure as an error event; this only keeps a
    // failure before the stream opened from counting as unhandled.
    done.catch(() => undefined);
    return { started: run.started, done };
  });
}

// ---- handlers shared with the extended family ----

export async function chatCompletion(deps: AppDeps, body: ChatCompletionBody, http: Request, ext?: Extension): Promise<Response> {
  return respond(deps, await chatJob(deps, body, ext), CHAT, http, ext);
}

export async function textCompletion(deps: AppDeps, body: CompletionBody, http: Request, ext?: Extension): Promise<Response> {
  return respond(deps, await completionJob(deps, body, ext), TEXT, http, ext);
}

export function compatRoutes(deps: AppDeps) {
  return new Elysia({ prefix: "/v1" })
    .get("/models", () => ({ object: "list", data: modelEntries(deps) }))
    .get("/models/*", ({ params }) => findModel(deps, params["*"]))
    .post("/chat/completions", ({ body, request }) => chatCompletion(deps, body, request), validatedBody(ChatCompletionBody))
    .post("/completions", ({ body, request }) => textCompletion(deps, body, request), validatedBody(CompletionBody));
}
