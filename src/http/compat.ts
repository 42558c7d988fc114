// Compat family: GET /v1/models, POST /v1/chat/completions, POST
// /v1/completions (docs/http.md, docs/openai-compat.md). A standard OpenAI
// client pointed at {base}/v1 works unchanged.
//
// The extended family (/api/v0, extended.ts) runs through the same handlers:
// it adds request knobs and response sections through an Extension, so the
// two families cannot drift apart.
//
// Choices this family makes:
// - `max_completion_tokens` (newer clients) is an alias of `max_tokens`;
//   both may be sent only with the same value.
// - `seed` unset: a fresh random sample seed per request.
// - Log-probabilities in OpenAI's shapes (docs/openai-compat.md): chat
//   `logprobs: true` + `top_logprobs`, text completions `logprobs` 0..5, also
//   for the echoed prompt (`echo`), where `max_tokens: 0` scores the prompt
//   without generating. Every choice carries `logprobs` (null when not asked).
// - `response_format` json_object and json_schema constrain the output
//   (src/http/response_format.ts, docs/structured-output.md); text
//   completions refuse a non-empty `suffix`. Tool-calling fields (`tools`,
//   `tool_choice`, `parallel_tool_calls`, `functions`, `function_call`) are
//   accepted and ignored (src/wire/requests.ts): the reply is the one without them.
//   `best_of` and `n` must be 1 (src/wire/requests.ts).
// - A message role outside system/user/assistant is a 400 (a value outside
//   an enum); a missing role or content is a 422.
// - Chat prompts are the model's own chat template rendered, or its chat
//   format (src/text/chat.ts); a template that fails is a 400 naming it. A
//   chat reply also ends at the template's end of turn. A model that reasons
//   (<think>…</think>) returns its reasoning in `reasoning_content`, apart
//   from the answer, unless the request sets `include_reasoning: false`
//   (src/text/reasoning.ts).
// - Streams: the role chunk is held until the scheduler starts the request,
//   so a request refused in the queue still gets a plain 503. With
//   `stream_options.include_usage` every chunk carries `usage: null` and a
//   last chunk with empty `choices` carries the usage, as OpenAI sends it.
import { Elysia } from "elysia";
import { SERVICE_NAME } from "../config.ts";
import { defaultExitThreshold, type DepthPlan } from "../engine/depth_plan.ts";
import type { GenerateRequest, OutputFormat, TokenLogprob } from "../engine/types.ts";
import { modelChat } from "../text/chat.ts";
import { opensReasoning, type ReplyPart, ReasoningSplitter, splitReasoning } from "../text/reasoning.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import { renderChat } from "./chat_template.ts";
import { badRequest, notFound, outOfRange, validatedBody } from "./errors.ts";
import {
  type AppDeps,
  type Completion,
  type DeltaSink,
  type GenerationEngine,
  type Scheduling,
  completedForStream,
  engineRequest,
  promptTokens,
  resolveDepth,
  runGeneration,
} from "./generation.ts";
import { chatLogprobs, CompletionLogprobWriter, joinChatLogprobs, joinCompletionLogprobs } from "./logprobs.ts";
import { requestFormat } from "./response_format.ts";
import type {
  ChatChunkChoice,
  ChatCompletion,
  ChatCompletionChunk,
  ChatLogprobs,
  CompletionLogprobs,
  ExtendedSections,
  FinishReason,
  ModelEntry,
  ModelList,
  TextChunkChoice,
  TextCompletion,
  TextCompletionChunk,
  Usage,
} from "../wire/responses.ts";
import { ChatCompletionBody, COMPAT_DEFAULTS as D, CompletionBody } from "../wire/requests.ts";
import { sseAfterAdmission, sseEvent } from "./sse.ts";

/** Unix seconds at the service start: the `created` of the model entry. */
const STARTED_AT = Math.floor(Date.now() / 1000);

// ---- models ----

/** The one served model (none when SERVICE_MODEL_PATH is unset). */
export function modelEntries(deps: AppDeps): ModelEntry[] {
  const id = deps.config.modelPath;
  if (id === null) return [];
  const info = deps.engine?.info;
  return [
    {
      id,
      object: "model",
      created: STARTED_AT,
      owned_by: SERVICE_NAME,
      max_model_len: deps.config.maxSeqLen,
      default_loops: info?.defaultLoops ?? null,
      exit_threshold: info ? defaultExitThreshold(info) : null,
    },
  ];
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
  /** The request's depth, its knobs included (resolveDepth); null without a model. */
  depth: DepthPlan | null;
  /** An EBNF grammar the output follows (docs/structured-output.md), beside or instead of `response_format`. */
  grammar?: string | null;
  /** Sections added to the response body, or to the final chunk of a stream. */
  sections(done: Completion, request: GenerateRequest): ExtendedSections;
}

// ---- request → engine job (validation order: range, then length, then engine loaded) ----

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
  /** A reasoning model's chat reply: sorted into reasoning and answer; null: all answer. */
  reasoning: ReasoningReply | null;
}

interface ReasoningReply {
  /** The prompt opened the reasoning: the reply starts inside it. */
  startsInside: boolean;
  /** Return the reasoning (`include_reasoning`), or leave it out. */
  include: boolean;
}

/** What a chat or text completion asks beyond its sampling fields. */
interface JobShape {
  maxTokens: number;
  echo: string;
  /** Top alternatives per token; undefined: no log-probabilities. */
  logprobs?: number;
  /** Score the prompt too (text completions with `echo`). */
  promptLogprobs: boolean;
  /** Ids that end the reply beside the model's end-of-sequence ids (a chat turn's end). */
  stopTokenIds?: readonly number[];
  reasoning?: ReasoningReply | null;
}

const unsupported = (field: string, message: string) => badRequest(`\`${field}\` ${message}`, field, "unsupported_parameter");

/**
 * max_tokens or its newer alias max_completion_tokens; both only when they
 * agree. 0 only for a text completion that scores its prompt (`echo`).
 */
function requestedMaxTokens(body: SamplingBody, scoring: boolean): number {
  for (const field of ["max_tokens", "max_completion_tokens"] as const)
    if (body[field] === 0 && !scoring) throw outOfRange(field, "must be at least 1 (0, to only score the prompt, needs `echo: true`), got 0");
  const { max_tokens: a, max_completion_tokens: b } = body;
  if (a != null && b != null && a !== b)
    throw badRequest(
      `\`max_tokens\` (${a}) and \`max_completion_tokens\` (${b}) disagree: they are the same setting, send one of them`,
      "max_completion_tokens",
    );
  return b ?? a ?? D.max_tokens;
}

/** Both penalties collapse into one repetition penalty (docs/http.md#requests). */
function foldPenalties(presence: number, frequency: number): number {
  return 1 + Math.max(0, presence + frequency) / 2;
}

function randomSeed(): number {
  return crypto.getRandomValues(new Uint32Array(1))[0];
}

function resolve(deps: AppDeps, body: SamplingBody, prompt: number[], shape: JobShape, ext: Extension | undefined, format: OutputFormat | undefined): CompatJob {
  const temperature = body.temperature ?? D.temperature;
  // /v1 names only `loops`: the mode is plain generation and the exit the model's default.
  const depth = ext ? ext.depth : resolveDepth(deps, "generate", { loops: body.loops }, temperature);
  const penalty = foldPenalties(body.presence_penalty ?? D.presence_penalty, body.frequency_penalty ?? D.frequency_penalty);
  const { engine, request } = engineRequest(deps, depth, {
    promptTokens: prompt,
    maxTokens: shape.maxTokens,
    sampling: {
      temperature,
      topK: D.top_k,
      topP: body.top_p ?? D.top_p,
      repetitionPenalty: ext?.repetitionPenalty ?? penalty,
      seed: body.seed ?? randomSeed(),
    },
    stopTokenIds: [...(shape.stopTokenIds ?? [])],
    cacheWindow: ext?.cacheWindow ?? 0,
    ...(shape.logprobs === undefined ? {} : { logprobs: shape.logprobs, promptLogprobs: shape.promptLogprobs }),
    ...(format ? { format } : {}),
  });
  const stream = body.stream ?? D.stream;
  return {
    engine,
    request,
    stopStrings: body.stop == null ? [] : Array.isArray(body.stop) ? body.stop : [body.stop],
    stream,
    includeUsage: stream && (body.stream_options?.include_usage ?? false),
    model: body.model,
    echo: shape.echo,
    scheduling: ext?.scheduling ?? {},
    reasoning: shape.reasoning ?? null,
  };
}

async function chatJob(deps: AppDeps, body: ChatCompletionBody, ext?: Extension): Promise<CompatJob> {
  if (body.top_logprobs != null && body.logprobs !== true)
    throw badRequest("`top_logprobs` needs `logprobs: true`", "top_logprobs");
  const maxTokens = requestedMaxTokens(body, false);
  const logprobs = body.logprobs === true ? (body.top_logprobs ?? 0) : undefined;
  const chat = modelChat(deps.tokenizer);
  const text = renderChat(body.messages, chat);
  const prompt = await promptTokens(deps, text, "messages", maxTokens, chat.addsBos);
  const reasoning = chat.reasons ? { startsInside: opensReasoning(text), include: body.include_reasoning ?? true } : null;
  const format = await requestFormat(deps, body.response_format, ext?.grammar);
  return resolve(deps, body, prompt, { maxTokens, echo: "", logprobs, promptLogprobs: false, stopTokenIds: chat.turnEndIds, reasoning }, ext, format);
}

/** Of several prompts, only the first is used; an id array is one prompt. */
function firstPrompt(p: CompletionBody["prompt"]): { prompt: string | number[]; param: string } {
  if (typeof p === "string") return { prompt: p, param: "prompt" };
  const first = p[0];
  return typeof first === "number" ? { prompt: p as number[], param: "prompt" } : { prompt: first, param: "prompt[0]" };
}

async function completionJob(deps: AppDeps, body: CompletionBody, ext?: Extension): Promise<CompatJob> {
  if (body.suffix != null && body.suffix !== "")
    throw unsupported("suffix", "is not supported: this server only continues the prompt, it does not fill in text");
  const echoed = body.echo ?? false;
  const maxTokens = requestedMaxTokens(body, echoed);
  const { prompt, param } = firstPrompt(body.prompt);
  const ids = await promptTokens(deps, prompt, param, maxTokens);
  // A text prompt echoes as sent, unless the model's beginning id was put before it: then as its ids read.
  const asSent = typeof prompt === "string" && deps.tokenizer.conventions.bosId === null;
  const echo = echoed ? (asSent ? prompt : deps.tokenizer.decode(ids)) : "";
  const logprobs = body.logprobs ?? undefined;
  const format = await requestFormat(deps, body.response_format, ext?.grammar);
  return resolve(deps, body, ids, { maxTokens, echo, logprobs, promptLogprobs: echoed && logprobs !== undefined }, ext, format);
}

// ---- response framing: the one place chat and text completions differ ----

/** One response's log-probability sections, in its framing's shape (src/http/logprobs.ts). */
interface LogprobWriter<S> {
  /** The echoed prompt's tokens (text completions only). */
  prompt?(ids: readonly number[], entries: readonly (TokenLogprob | null)[]): S;
  generated(ids: readonly number[], entries: readonly TokenLogprob[]): S;
  /** Sections of consecutive tokens as one. */
  join(parts: readonly S[]): S;
}

/** What a response and each of its chunks begin with. */
type Head = Pick<ChatCompletion, "id" | "created" | "model">;

/** A whole reply: its answer, and a reasoning model's reasoning (null: it had none; absent: not returned). */
interface Reply {
  content: string;
  reasoning?: string | null;
}

interface Framing<S, Whole, Chunk, ChunkChoice> {
  idPrefix: string;
  /** The whole (non-streamed) response, before any extended sections. */
  whole(head: Head, reply: Reply, finishReason: FinishReason, logprobs: S | null, usage: Usage): Whole;
  /** A stream chunk with these choices; `usage` only with stream_options.include_usage. */
  chunk(head: Head, choices: ChunkChoice[], usage?: Usage | null): Chunk;
  /** The stream's first choice, before any text (chat: the role), or null. */
  opening: ChunkChoice | null;
  /** A stream choice carrying text (and the log-probabilities of the tokens it completes). */
  delta(part: ReplyPart, logprobs: S | null): ChunkChoice;
  /** The stream's closing choice. */
  end(finishReason: FinishReason, logprobs: S | null): ChunkChoice;
  /** A writer for one response; echo is the text before the generated text. */
  logprobs(tokenizer: Tokenizer, echo: string): LogprobWriter<S>;
}

/** The fields every response and chunk starts with, in OpenAI's order. */
const opening = <O extends string>(head: Head, object: O) => ({ id: head.id, object, created: head.created, model: head.model });

/** A framing's chunk builder for chunks of type `object`. */
const chunkOf =
  <O extends string>(object: O) =>
  <C>(head: Head, choices: C[], usage?: Usage | null) => ({
    ...opening(head, object),
    choices,
    ...(usage === undefined ? {} : { usage }),
  });

const CHAT: Framing<ChatLogprobs, ChatCompletion, ChatCompletionChunk, ChatChunkChoice> = {
  idPrefix: "chatcmpl-",
  whole: (head, reply, finishReason, logprobs, usage) => ({
    ...opening(head, "chat.completion"),
    choices: [
      {
        index: 0,
        message: { role: "assistant", content: reply.content, ...(reply.reasoning === undefined ? {} : { reasoning_content: reply.reasoning }) },
        logprobs,
        finish_reason: finishReason,
      },
    ],
    usage,
  }),
  chunk: chunkOf("chat.completion.chunk"),
  opening: { index: 0, delta: { role: "assistant" }, logprobs: null, finish_reason: null },
  delta: (part, logprobs) => ({
    index: 0,
    delta: { ...(part.reasoning === "" ? {} : { reasoning_content: part.reasoning }), ...(part.content === "" ? {} : { content: part.content }) },
    logprobs,
    finish_reason: null,
  }),
  end: (finishReason, logprobs) => ({ index: 0, delta: {}, logprobs, finish_reason: finishReason }),
  logprobs: (tokenizer) => ({ generated: (_, entries) => chatLogprobs(tokenizer, entries), join: joinChatLogprobs }),
};

const TEXT: Framing<CompletionLogprobs, TextCompletion, TextCompletionChunk, TextChunkChoice> = {
  idPrefix: "cmpl-",
  whole: (head, reply, finishReason, logprobs, usage) => ({
    ...opening(head, "text_completion"),
    choices: [{ text: reply.content, index: 0, logprobs, finish_reason: finishReason }],
    usage,
  }),
  chunk: chunkOf("text_completion"),
  opening: null,
  delta: (part, logprobs) => ({ text: part.content, index: 0, logprobs, finish_reason: null }),
  end: (finishReason, logprobs) => ({ text: "", index: 0, logprobs, finish_reason: finishReason }),
  logprobs: (tokenizer, echo) => {
    const writer = new CompletionLogprobWriter(tokenizer, echo);
    return {
      prompt: (ids, entries) => writer.promptSection(ids, entries),
      generated: (ids, entries) => writer.generatedSection(ids, entries),
      join: joinCompletionLogprobs,
    };
  },
};

function responseId(prefix: string): string {
  return prefix + crypto.randomUUID().replaceAll("-", "");
}

function usage(job: CompatJob, done: Completion): Usage {
  const prompt = job.request.promptTokens.length;
  const completion = done.tokens.length;
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

/** A whole reply's text, sorted when the model reasons. */
function wholeReply(job: CompatJob, text: string): Reply {
  if (!job.reasoning) return { content: text };
  const split = splitReasoning(text, job.reasoning.startsInside);
  if (!job.reasoning.include) return { content: split.content };
  return { content: split.content, reasoning: split.hadReasoning ? split.reasoning : null };
}

/** A stream's text sorted as it comes (reasoning withheld when not asked for); all answer for other replies. */
function streamSorter(job: CompatJob): { push(text: string): ReplyPart; finish(): ReplyPart } {
  const r = job.reasoning;
  if (!r) return { push: (content) => ({ reasoning: "", content }), finish: () => ({ reasoning: "", content: "" }) };
  const splitter = new ReasoningSplitter(r.startsInside);
  const kept = (p: ReplyPart) => (r.include ? p : { reasoning: "", content: p.content });
  return { push: (text) => kept(splitter.push(text)), finish: () => kept(splitter.finish()) };
}

/** The whole response's log-probabilities: the scored prompt's (echo), then the generated tokens'. */
function wholeLogprobs<S>(writer: LogprobWriter<S>, request: GenerateRequest, done: Completion): S {
  const parts: S[] = [];
  const scored = done.result.promptLogprobs;
  if (scored && writer.prompt) parts.push(writer.prompt(request.promptTokens, scored));
  parts.push(writer.generated(done.tokens, done.logprobs));
  return writer.join(parts);
}

async function respond<S, Whole extends ChatCompletion | TextCompletion, Chunk extends ChatCompletionChunk | TextCompletionChunk, ChunkChoice>(
  deps: AppDeps,
  job: CompatJob,
  framing: Framing<S, Whole, Chunk, ChunkChoice>,
  http: Request,
  ext?: Extension,
): Promise<Response> {
  const head: Head = { id: responseId(framing.idPrefix), created: Math.floor(Date.now() / 1000), model: job.model };
  const { engine, request, stopStrings, scheduling } = job;
  const writer = request.logprobs === undefined ? null : framing.logprobs(deps.tokenizer, job.echo);

  if (!job.stream) {
    const done = await runGeneration(engine, deps.tokenizer, request, stopStrings, http.signal, undefined, scheduling);
    const logprobs = writer && wholeLogprobs(writer, request, done);
    return Response.json({
      ...framing.whole(head, wholeReply(job, job.echo + done.text), done.finishReason, logprobs, usage(job, done)),
      ...ext?.sections(done, request),
    });
  }

  const usageNull = job.includeUsage ? null : undefined;
  const chunk = (choice: ChunkChoice, sections?: ExtendedSections) => sseEvent({ ...framing.chunk(head, [choice], usageNull), ...sections });

  return sseAfterAdmission(http, (send, signal) => {
    // Held by sseAfterAdmission until the request leaves the queue.
    if (framing.opening) send(chunk(framing.opening));
    // Log-probabilities ride on the chunk that carries their tokens' text; a
    // token whose text is still held back waits for the next chunk.
    const pending: S[] = [];
    const takePending = () => (writer && pending.length > 0 ? writer.join(pending.splice(0)) : null);
    const sorter = streamSorter(job);
    const sendPart = (part: ReplyPart) => {
      if (part.content !== "" || part.reasoning !== "") send(chunk(framing.delta(part, takePending()))); // no empty deltas
    };
    const text = (t: string) => sendPart(sorter.push(t));
    const onToken: DeltaSink = (id, t, logprob) => {
      if (writer && logprob) pending.push(writer.generated([id], [logprob]));
      text(t);
    };
    // The echoed prompt comes first: once scored, with its log-probabilities.
    const promptSection = request.promptLogprobs ? writer?.prompt : undefined;
    const onPromptLogprobs = promptSection
      ? (entries: (TokenLogprob | null)[]) => {
          pending.push(promptSection(request.promptTokens, entries));
          text(job.echo);
        }
      : undefined;
    if (!onPromptLogprobs) text(job.echo);
    const run = runGeneration(engine, deps.tokenizer, request, stopStrings, signal, onToken, scheduling, onPromptLogprobs);
    const done = run.then(completedForStream).then((c) => {
      text(c.tail);
      sendPart(sorter.finish());
      send(chunk(framing.end(c.finishReason, takePending()), ext?.sections(c, request)));
      if (job.includeUsage) send(sseEvent(framing.chunk(head, [], usage(job, c))));
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
    .get("/models", (): ModelList => ({ object: "list", data: modelEntries(deps) }))
    .get("/models/*", ({ params }) => findModel(deps, params["*"]))
    .post("/chat/completions", ({ body, request }) => chatCompletion(deps, body, request), validatedBody(ChatCompletionBody))
    .post("/completions", ({ body, request }) => textCompletion(deps, body, request), validatedBody(CompletionBody));
}
