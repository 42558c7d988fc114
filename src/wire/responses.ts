// Response bodies as TypeBox schemas, family by family (the requests are
// beside them, in requests.ts). They sit below both the HTTP handlers and the web
// playground, which reads the same bodies: the handlers build their bodies as these static types, and
// the tests import the same types and check the bodies a server sends
// against the schemas. Objects are closed (additionalProperties: false), so
// a check also proves that nothing else is sent.
import { type Static, type TProperties, type TSchema, Type as T } from "@sinclair/typebox";
import { GENERATION_MODES, type ModelInfo } from "../engine/types.ts";
import { KV_CACHE_MODES } from "../model/kvcache.ts";
import { MODEL_FAMILIES } from "../model/family.ts";

const closed = <P extends TProperties>(properties: P) => T.Object(properties, { additionalProperties: false });
const Nullable = <S extends TSchema>(schema: S) => T.Union([schema, T.Null()]);

/** The generation modes a request may ask for and a response reports. */
export const GenerationModeSchema = T.Union(GENERATION_MODES.map((mode) => T.Literal(mode)));

// ---- every family: the error body (src/http/errors.ts) ----

export const ErrorType = T.Union([
  T.Literal("invalid_request_error"),
  T.Literal("not_found_error"),
  T.Literal("service_unavailable_error"),
  T.Literal("server_error"),
]);
export type ErrorType = Static<typeof ErrorType>;

/** OpenAI's error shape, on every route (and as a stream's error event). */
export const ErrorBody = closed({
  error: closed({ message: T.String(), type: ErrorType, param: Nullable(T.String()), code: Nullable(T.String()) }),
});
export type ErrorBody = Static<typeof ErrorBody>;

// ---- native family: POST /generate ----

/** How a generation ended: "error" is an engine failure, with the tokens before it. */
export const FinishReason = T.Union([T.Literal("stop"), T.Literal("length"), T.Literal("error")]);
export type FinishReason = Static<typeof FinishReason>;

const NativeTopLogprob = closed({ token_id: T.Integer(), token: T.String(), logprob: T.Number() });

/** One generated token's log-probability and its most likely alternatives (logprobs.ts). */
export const NativeLogprob = closed({ ...NativeTopLogprob.properties, top_logprobs: T.Array(NativeTopLogprob) });
export type NativeLogprob = Static<typeof NativeLogprob>;

export const NativeStats = closed({
  wall_ms: T.Number(),
  tokens_per_second: T.Number(),
  prompt_tokens: T.Integer(),
  completion_tokens: T.Integer(),
  mode: GenerationModeSchema,
  /** The depth the output comes from: loops, or verify_loops in the speculative modes. */
  loops_used: T.Integer(),
  /** Under early exit (exit_threshold): the mean steps the generated tokens ran. */
  mean_steps: T.Optional(T.Number()),
});
export type NativeStats = Static<typeof NativeStats>;

const generationFields = {
  tokens: T.Array(T.Integer()),
  text: T.String(),
  finish_reason: FinishReason,
  /** Only when the request asked for them. */
  logprobs: T.Optional(T.Array(NativeLogprob)),
};

export const GenerateResponse = closed({ ...generationFields, stats: NativeStats });
export type GenerateResponse = Static<typeof GenerateResponse>;

/** A /generate stream event: one per token, then token_id -1 with the text still held back. */
export const GenerateStreamEvent = closed({
  token_id: T.Integer(),
  text: T.String(),
  /** The token's one entry, when the request asked for log-probabilities. */
  logprobs: T.Optional(T.Array(NativeLogprob)),
});
export type GenerateStreamEvent = Static<typeof GenerateStreamEvent>;

// ---- native speculative family: POST /generate/speculative, /generate/tree_speculative ----

export const SpeculativeStats = closed({
  ...NativeStats.properties,
  accepted_per_cycle: T.Number(),
  draft_tokens: T.Integer(),
  accepted_tokens: T.Integer(),
});
export type SpeculativeStats = Static<typeof SpeculativeStats>;

export const SpeculativeResponse = closed({ ...generationFields, stats: SpeculativeStats });
export type SpeculativeResponse = Static<typeof SpeculativeResponse>;

// ---- compat family: /v1/models, /v1/chat/completions, /v1/completions ----

export const ModelEntry = closed({
  id: T.String(),
  object: T.Literal("model"),
  created: T.Integer(),
  owned_by: T.String(),
  /** Most prompt + generated tokens a request may use (SERVICE_MAX_SEQ_LEN); vLLM's name for it. */
  max_model_len: T.Integer(),
  /** Depth in steps of a request that sets none; null while the model is not loaded. */
  default_loops: Nullable(T.Integer()),
  /** Early-exit threshold of a request that sets none (docs/early-exit.md); null: fixed depth, or no model loaded. */
  exit_threshold: Nullable(T.Number()),
});
export type ModelEntry = Static<typeof ModelEntry>;

export const ModelList = closed({ object: T.Literal("list"), data: T.Array(ModelEntry) });
export type ModelList = Static<typeof ModelList>;

export const Usage = closed({ prompt_tokens: T.Integer(), completion_tokens: T.Integer(), total_tokens: T.Integer() });
export type Usage = Static<typeof Usage>;

const ChatTopLogprob = closed({ token: T.String(), logprob: T.Number(), bytes: T.Array(T.Integer()) });

/** A chat choice's `logprobs`: one entry per token of its content. */
export const ChatLogprobs = closed({
  content: T.Array(closed({ ...ChatTopLogprob.properties, top_logprobs: T.Array(ChatTopLogprob) })),
  refusal: T.Null(),
});
export type ChatLogprobs = Static<typeof ChatLogprobs>;

/** A text completion choice's `logprobs`, in the legacy completions shape. */
export const CompletionLogprobs = closed({
  tokens: T.Array(T.String()),
  token_logprobs: T.Array(Nullable(T.Number())),
  /** The most likely tokens by text, plus the token itself when it is not among them; null for the first prompt token. */
  top_logprobs: T.Array(Nullable(T.Record(T.String(), T.Number()))),
  /** Where each token's text starts in the choice's text, in characters (code points). */
  text_offset: T.Array(T.Integer()),
});
export type CompletionLogprobs = Static<typeof CompletionLogprobs>;

const head = { id: T.String(), created: T.Integer(), model: T.String() };

export const ChatChoice = closed({
  index: T.Literal(0),
  message: closed({
    role: T.Literal("assistant"),
    /** The answer; for a model that reasons, the text after its reasoning. */
    content: T.String(),
    /** A reasoning model's reasoning (docs/openai-compat.md#reasoning), null when the reply had none; absent for other models and with include_reasoning false. */
    reasoning_content: T.Optional(Nullable(T.String())),
  }),
  logprobs: Nullable(ChatLogprobs),
  finish_reason: FinishReason,
});
export type ChatChoice = Static<typeof ChatChoice>;

export const ChatCompletion = closed({ ...head, object: T.Literal("chat.completion"), choices: T.Array(ChatChoice), usage: Usage });
export type ChatCompletion = Static<typeof ChatCompletion>;

/** A stream's choice: the role first, then content (and reasoning) deltas, then an empty delta with the finish reason. */
export const ChatChunkChoice = closed({
  index: T.Literal(0),
  delta: closed({ role: T.Optional(T.Literal("assistant")), content: T.Optional(T.String()), reasoning_content: T.Optional(T.String()) }),
  logprobs: Nullable(ChatLogprobs),
  finish_reason: Nullable(FinishReason),
});
export type ChatChunkChoice = Static<typeof ChatChunkChoice>;

/** `usage`: null on every chunk and set on a last one without choices, with stream_options.include_usage. */
const chunkUsage = { usage: T.Optional(Nullable(Usage)) };

export const ChatCompletionChunk = closed({
  ...head,
  object: T.Literal("chat.completion.chunk"),
  choices: T.Array(ChatChunkChoice),
  ...chunkUsage,
});
export type ChatCompletionChunk = Static<typeof ChatCompletionChunk>;

export const TextChoice = closed({
  text: T.String(),
  index: T.Literal(0),
  logprobs: Nullable(CompletionLogprobs),
  finish_reason: FinishReason,
});
export type TextChoice = Static<typeof TextChoice>;

export const TextCompletion = closed({ ...head, object: T.Literal("text_completion"), choices: T.Array(TextChoice), usage: Usage });
export type TextCompletion = Static<typeof TextCompletion>;

export const TextChunkChoice = closed({ ...TextChoice.properties, finish_reason: Nullable(FinishReason) });
export type TextChunkChoice = Static<typeof TextChunkChoice>;

export const TextCompletionChunk = closed({ ...head, object: T.Literal("text_completion"), choices: T.Array(TextChunkChoice), ...chunkUsage });
export type TextCompletionChunk = Static<typeof TextCompletionChunk>;

// ---- extended family: /api/v0 = the compat bodies plus these sections ----

export const ModelInfoSection = closed({
  arch: T.Unsafe<ModelInfo["arch"]>(T.String()),
  /** The published family the model was imported from, else its layout (docs/import-hf.md). */
  family: T.Union(MODEL_FAMILIES.map((f) => T.Literal(f))),
  dim: T.Integer(),
  n_heads: T.Integer(),
  ffn_dim: T.Integer(),
  vocab_size: T.Integer(),
  default_loops: T.Integer(),
  /** Distinct layers applied each step (loop): 1 for a weight-shared block. */
  n_layers: T.Integer(),
  /** Whether the model has a learned exit gate, and the exit_threshold a request gets when it sets none (null: fixed depth). */
  exit_gate: T.Boolean(),
  exit_threshold: Nullable(T.Number()),
  quant: T.Unsafe<ModelInfo["quant"]>(T.String()),
  kv_cache_mode: T.Union(KV_CACHE_MODES.map((mode) => T.Literal(mode))),
});
export type ModelInfoSection = Static<typeof ModelInfoSection>;

export const RuntimeSection = closed({ name: T.String(), version: T.String(), commit: Nullable(T.String()) });
export type RuntimeSection = Static<typeof RuntimeSection>;

/** What a generation adds to its response (a stream: to its final chunk). */
const sections = {
  /** speculative modes: the acceptance figures too */
  stats: T.Union([NativeStats, SpeculativeStats]),
  /** null without a loaded model */
  model_info: Nullable(ModelInfoSection),
  runtime: RuntimeSection,
};
export const ExtendedSections = closed(sections);
export type ExtendedSections = Static<typeof ExtendedSections>;

export const ExtendedModelEntry = closed({ ...ModelEntry.properties, model_info: sections.model_info });
export type ExtendedModelEntry = Static<typeof ExtendedModelEntry>;

export const ExtendedModelList = closed({ object: T.Literal("list"), data: T.Array(ExtendedModelEntry), runtime: RuntimeSection });
export type ExtendedModelList = Static<typeof ExtendedModelList>;

export const ExtendedChatCompletion = closed({ ...ChatCompletion.properties, ...sections });
export type ExtendedChatCompletion = Static<typeof ExtendedChatCompletion>;

export const ExtendedTextCompletion = closed({ ...TextCompletion.properties, ...sections });
export type ExtendedTextCompletion = Static<typeof ExtendedTextCompletion>;

const optionalSections = {
  stats: T.Optional(sections.stats),
  model_info: T.Optional(sections.model_info),
  runtime: T.Optional(sections.runtime),
};

/** The sections ride on the final chunk (the one with finish_reason) only. */
export const ExtendedChatCompletionChunk = closed({ ...ChatCompletionChunk.properties, ...optionalSections });
export type ExtendedChatCompletionChunk = Static<typeof ExtendedChatCompletionChunk>;

export const ExtendedTextCompletionChunk = closed({ ...TextCompletionChunk.properties, ...optionalSections });
export type ExtendedTextCompletionChunk = Static<typeof ExtendedTextCompletionChunk>;

// ---- operations: GET /healthz, GET /metrics ----

/** /healthz's body when the server can generate (text/plain); otherwise a 503 ErrorBody. */
export const HealthText = T.Literal("ok\n");
export type HealthText = Static<typeof HealthText>;
