// Request bodies as TypeBox schemas: the one source of each request's static
// type (Static<>), its validation and its bounds. Shape failures (missing
// property, wrong type) become 422 and bound failures 400 in src/http/errors.ts.
//
// Optional fields also accept null, meaning "unset" (several optional fields
// default to null, and many clients send null for "not set"), but for
// exit_threshold, whose null asks for no early exit over the model's default.
// Defaults that come from the model (loops, verify_loops, exit_threshold)
// are applied where the request is resolved (src/engine/depth_plan.ts).
import { type Static, type TSchema, Type as T } from "@sinclair/typebox";
import { LS_MAX_LOOPS } from "../abi/abi.generated.ts";
import { MAX_TOP_LOGPROBS } from "../engine/logprobs.ts";
import { EXIT_POLICIES, EXIT_RULES } from "../engine/types.ts";
import { SPEC_LIMITS } from "../engine/spec_plan.ts";
import { GenerationModeSchema } from "./responses.ts";

const optional = <S extends TSchema>(schema: S) => T.Optional(T.Union([schema, T.Null()]));

const MAX_TOKENS_LIMIT = 8192;

// ---- scheduling knobs shared by the native and extended families (docs/scheduling.md) ----

const PRIORITY_LIMIT = 1000;

const SchedulingFields = {
  /** Higher runs first; FIFO within a priority. */
  priority: optional(T.Integer({ minimum: -PRIORITY_LIMIT, maximum: PRIORITY_LIMIT })),
  /** Per-request latency target in ms; overrides SERVICE_DEFAULT_SLO_MS. */
  slo_ms: optional(T.Integer({ minimum: 1 })),
};

// ---- native family: POST /generate (docs/http.md#native) ----

export const NATIVE_DEFAULTS = {
  max_tokens: 128,
  temperature: 0,
  top_k: 50,
  top_p: 0.9,
  repetition_penalty: 1,
  sample_seed: 0,
  stream: false,
  cache_window: 0,
} as const;

/** Text (tokenised server-side) or pre-tokenised ids; never empty. */
export const Prompt = T.Union([T.String({ minLength: 1 }), T.Array(T.Integer(), { minItems: 1 })]);

/**
 * Early exit (docs/early-exit.md). exit_rule "gate" (the default), as the
 * published Ouro code means it: a model with an exit gate stops each token
 * at the first step whose cumulative exit probability reaches
 * exit_threshold, in [0, 1] (0: after the first step; 1: every step, the
 * fixed-depth path). "kl" and "entropy", the published Huginn code's
 * zero-shot rules (any model): at the first step whose KL divergence from
 * the previous step's distribution, or entropy difference, is below
 * exit_threshold (>= 0; 0: never). null: no early exit; absent: the model's
 * default. exit_policy says what fills the skipped steps' cache units:
 * "exact" (the default) or "copy". cache_steps S (docs/kv-cache.md): the
 * core's units share S steps of caches, 0 (the default) keeping every step.
 */
const ExitFields = {
  exit_threshold: optional(T.Number({ minimum: 0 })),
  exit_policy: optional(T.Union(EXIT_POLICIES.map((policy) => T.Literal(policy)))),
  exit_rule: optional(T.Union(EXIT_RULES.map((rule) => T.Literal(rule)))),
  cache_steps: optional(T.Integer({ minimum: 0, maximum: LS_MAX_LOOPS - 1 })),
};

/**
 * Structured output beyond OpenAI's `response_format` (the native and
 * extended families, docs/structured-output.md): an EBNF grammar (rule
 * `root`) the output follows.
 */
const GrammarFields = {
  grammar: optional(T.String({ minLength: 1 })),
};

/** Stop strings (whole-string match on the decoded text) or stop token ids. */
const NativeStop = T.Union([
  T.String({ minLength: 1 }),
  T.Array(T.String({ minLength: 1 })),
  T.Array(T.Integer({ minimum: 0 })),
]);

export const GenerateBody = T.Object({
  prompt: Prompt,
  max_tokens: optional(T.Integer({ minimum: 1, maximum: MAX_TOKENS_LIMIT })),
  loops: optional(T.Integer({ minimum: 1, maximum: LS_MAX_LOOPS })),
  temperature: optional(T.Number({ minimum: 0, maximum: 2 })),
  top_k: optional(T.Integer({ minimum: 0, maximum: 1000 })),
  top_p: optional(T.Number({ minimum: 0, maximum: 1 })),
  repetition_penalty: optional(T.Number({ minimum: 0.5, maximum: 2 })),
  sample_seed: optional(T.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER })),
  stream: optional(T.Boolean()),
  stop: optional(NativeStop),
  // Upper bound SERVICE_MAX_SEQ_LEN is checked at run time (it is configuration).
  cache_window: optional(T.Integer({ minimum: 0 })),
  /** Log-probability of each generated token with this many most likely alternatives (docs/openai-compat.md). */
  logprobs: optional(T.Integer({ minimum: 0, maximum: MAX_TOP_LOGPROBS })),
  /** Structured output as on /v1 (src/http/response_format.ts). */
  response_format: T.Optional(T.Unknown()),
  ...GrammarFields,
  ...ExitFields,
  ...SchedulingFields,
});
export type GenerateBody = Static<typeof GenerateBody>;

// ---- compat family: /v1/chat/completions, /v1/completions (docs/http.md#requests) ----

export const COMPAT_DEFAULTS = {
  max_tokens: 128,
  temperature: 1,
  top_p: 1,
  /** Not a request field: a top-k of 50 is always active on this family. */
  top_k: 50,
  presence_penalty: 0,
  frequency_penalty: 0,
  stream: false,
} as const;

const MaxTokens = T.Integer({ minimum: 1, maximum: MAX_TOKENS_LIMIT });
const Penalty = T.Number({ minimum: -2, maximum: 2 });

/** Stop strings, matched whole on the decoded text; `[]` means none. */
const CompatStop = T.Union([T.String({ minLength: 1 }), T.Array(T.String({ minLength: 1 }))]);

/**
 * Sampling fields shared by chat and text completions (and, through them, the
 * extended family). Fields a standard client may send that are not listed
 * here are stripped by the validator: accepted and ignored
 * (docs/openai-compat.md). Among them are the tool-calling fields (tools,
 * tool_choice, parallel_tool_calls, functions, function_call), which agent
 * frameworks send on every request: the model only writes text, so the
 * reply is the one the request gets without them.
 */
const CompatSamplingFields = {
  /** Echoed into the response; any string. */
  model: T.String(),
  max_tokens: optional(MaxTokens),
  /** The newer clients' name for max_tokens; both may be sent only with the same value. */
  max_completion_tokens: optional(MaxTokens),
  temperature: optional(T.Number({ minimum: 0, maximum: 2 })),
  top_p: optional(T.Number({ minimum: 0, maximum: 1 })),
  /** One choice per request: anything but 1 is a 400. */
  n: optional(T.Integer({ minimum: 1, maximum: 1 })),
  stop: optional(CompatStop),
  stream: optional(T.Boolean()),
  stream_options: optional(T.Object({ include_usage: optional(T.Boolean()) })),
  /** Sample seed; a random one when unset. */
  seed: optional(T.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER })),
  presence_penalty: optional(Penalty),
  frequency_penalty: optional(Penalty),
  /** Extension: the depth in steps; the model's default_loops when unset. */
  loops: optional(T.Integer({ minimum: 1, maximum: LS_MAX_LOOPS })),
  /** Structured output: text, json_object or json_schema, read by src/http/response_format.ts (400s naming the part at fault). */
  response_format: T.Optional(T.Unknown()),
};

export const ChatRole = T.Union([T.Literal("system"), T.Literal("user"), T.Literal("assistant")]);
export type ChatRole = Static<typeof ChatRole>;

/** OpenAI's content-part form; only `text` parts are supported (checked in chat_template.ts). */
const ContentPart = T.Object({ type: T.String(), text: T.Optional(T.String()) });

export const ChatMessage = T.Object({
  role: ChatRole,
  /** A string, text parts (joined), or null (an assistant turn that only called tools). */
  content: T.Union([T.String(), T.Array(ContentPart), T.Null()]),
});
export type ChatMessage = Static<typeof ChatMessage>;

const ChatFields = {
  messages: T.Array(ChatMessage, { minItems: 1 }),
  ...CompatSamplingFields,
  /** Log-probability of each generated token (choices[].logprobs.content). */
  logprobs: optional(T.Boolean()),
  /** Most likely alternatives per token; needs `logprobs: true`. */
  top_logprobs: optional(T.Integer({ minimum: 0, maximum: MAX_TOP_LOGPROBS })),
  /** A reasoning model's reasoning in `reasoning_content` (true, the default), or left out of the reply (vLLM's field). */
  include_reasoning: optional(T.Boolean()),
};

/** Text, several texts (only the first is used), pre-tokenised ids, or several id lists (likewise). */
export const CompletionPrompt = T.Union([
  T.String({ minLength: 1 }),
  T.Array(T.String({ minLength: 1 }), { minItems: 1 }),
  T.Array(T.Integer(), { minItems: 1 }),
  T.Array(T.Array(T.Integer(), { minItems: 1 }), { minItems: 1 }),
]);

/** OpenAI's bound on a text completion's `logprobs`. */
const MAX_COMPLETION_LOGPROBS = 5;

/** A text completion may ask for no tokens when it only scores its prompt (`echo`); checked in compat.ts. */
const ScoringMaxTokens = T.Integer({ minimum: 0, maximum: MAX_TOKENS_LIMIT });

const CompletionFields = {
  prompt: CompletionPrompt,
  /** Prepend the prompt text to the returned text. */
  echo: optional(T.Boolean()),
  /** Text after the insertion point: not supported, refused unless null or "". */
  suffix: optional(T.String()),
  /** Server-side candidates to pick from: only 1. */
  best_of: optional(T.Integer({ minimum: 1, maximum: 1 })),
  ...CompatSamplingFields,
  max_tokens: optional(ScoringMaxTokens),
  max_completion_tokens: optional(ScoringMaxTokens),
  /** Log-probability of each token with this many most likely alternatives (choices[].logprobs). */
  logprobs: optional(T.Integer({ minimum: 0, maximum: MAX_COMPLETION_LOGPROBS })),
};

export const ChatCompletionBody = T.Object(ChatFields);
export type ChatCompletionBody = Static<typeof ChatCompletionBody>;

export const CompletionBody = T.Object(CompletionFields);
export type CompletionBody = Static<typeof CompletionBody>;

// ---- extended family: /api/v0/* = compat fields + these ----

/** Self-speculative decoding knobs, the same on the native and extended families (docs/speculative.md). */
export const SpeculativeFields = {
  draft_loops: optional(T.Integer({ minimum: 1, maximum: SPEC_LIMITS.draftLoops })),
  verify_loops: optional(T.Integer({ minimum: 1, maximum: SPEC_LIMITS.verifyLoops })),
  draft_ahead: optional(T.Integer({ minimum: 1, maximum: SPEC_LIMITS.draftAhead })),
  K_branches: optional(T.Integer({ minimum: 1, maximum: SPEC_LIMITS.kBranches })),
};

const SpeculativeKnobs = T.Object(SpeculativeFields);
/** The speculative knobs as the handlers read them (both speculative families). */
export type SpeculativeKnobs = Static<typeof SpeculativeKnobs>;

/** The extended family's own defaults; the speculative knobs' are the engine's (src/engine/depth_plan.ts). */
export const EXTENDED_DEFAULTS = {
  mode: "generate",
  cache_window: 0,
} as const;

const ExtendedFields = {
  mode: optional(GenerationModeSchema),
  ...SpeculativeFields,
  // Upper bound SERVICE_MAX_SEQ_LEN is checked at run time (it is configuration).
  cache_window: optional(T.Integer({ minimum: 0 })),
  /** When given, replaces the penalty folded from presence/frequency_penalty. */
  repetition_penalty: optional(T.Number({ minimum: 0.5, maximum: 2 })),
  ...GrammarFields,
  ...ExitFields,
  ...SchedulingFields,
};

const ExtendedKnobs = T.Object(ExtendedFields);
/** The extended family's own fields, as its handlers read them. */
export type ExtendedKnobs = Static<typeof ExtendedKnobs>;

export const ExtendedChatCompletionBody = T.Object({ ...ChatFields, ...ExtendedFields });
export type ExtendedChatCompletionBody = Static<typeof ExtendedChatCompletionBody>;

export const ExtendedCompletionBody = T.Object({ ...CompletionFields, ...ExtendedFields });
export type ExtendedCompletionBody = Static<typeof ExtendedCompletionBody>;
