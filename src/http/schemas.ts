// Request bodies as TypeBox schemas: the one source of each request's static
// type (Static<>), its validation and its bounds. Shape failures (missing
// property, wrong type) become 422 and bound failures 400 in errors.ts.
//
// Optional fields also accept null, meaning "unset" (SPEC.md gives several
// optional fields a null default, and many clients send null for "not set").
import { type Static, type TSchema, Type as T } from "@sinclair/typebox";

const optional = <S extends TSchema>(schema: S) => T.Optional(T.Union([schema, T.Null()]));

export const MAX_TOKENS_LIMIT = 8192;

// ---- scheduling knobs shared by the native and extended families (DESIGN.md §5) ----

export const PRIORITY_LIMIT = 1000;

export const SchedulingFields = {
  /** Higher runs first; FIFO within a priority. */
  priority: optional(T.Integer({ minimum: -PRIORITY_LIMIT, maximum: PRIORITY_LIMIT })),
  /** Per-request latency target in ms; overrides SERVICE_DEFAULT_SLO_MS. */
  slo_ms: optional(T.Integer({ minimum: 1 })),
};

// ---- native family: POST /generate (SPEC.md §4) ----

export const NATIVE_DEFAULTS = {
  max_tokens: 128,
  loops: 8,
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

/** Stop strings (whole-string match on the decoded text) or stop token ids. */
export const NativeStop = T.Union([
  T.String({ minLength: 1 }),
  T.Array(T.String({ minLength: 1 })),
  T.Array(T.Integer({ minimum: 0 })),
]);

export const GenerateBody = T.Object({
  prompt: Prompt,
  max_tokens: optional(T.Integer({ minimum: 1, maximum: MAX_TOKENS_LIMIT })),
  loops: optional(T.Integer({ minimum: 1, maximum: 64 })),
  temperature: optional(T.Number({ minimum: 0, maximum: 2 })),
  top_k: optional(T.Integer({ minimum: 0, maximum: 1000 })),
  top_p: optional(T.Number({ minimum: 0, maximum: 1 })),
  repetition_penalty: optional(T.Number({ minimum: 0.5, maximum: 2 })),
  sample_seed: optional(T.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER })),
  stream: optional(T.Boolean()),
  stop: optional(NativeStop),
  // Upper bound SERVICE_MAX_SEQ_LEN is checked at run time (it is configuration).
  cache_window: optional(T.Integer({ minimum: 0 })),
  ...SchedulingFields,
});
export type GenerateBody = Static<typeof GenerateBody>;
