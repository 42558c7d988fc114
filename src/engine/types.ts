// The engine's contract with everything above it (scheduler, HTTP). No FFI
// pointers cross this line; no HTTP objects cross it the other way.
import type { ModelConfig } from "../model/format.ts";
import type { ModelFamily } from "../model/family.ts";
import type { TokenLogprob } from "./logprobs.ts";

export type { TokenLogprob } from "./logprobs.ts";

/** SIMD paths of the CPU kernels a model may be loaded with ("auto": the best this CPU runs). */
export const SIMD_CHOICES = ["auto", "portable", "avx2", "avx512"] as const;
export type SimdChoice = (typeof SIMD_CHOICES)[number];

/** What a model file says about itself, as the loader read it. */
/** A model file as the kernel library reports it, with the file's default exit threshold. */
/** A model file as the loader describes it, and the family it belongs to (src/model/family.ts). */
export type ModelFileInfo = Omit<ModelConfig, "formatVersion" | "tokenizer"> & { family: ModelFamily };

/** A loaded model: its file's description and the runtime serving it. */
export interface ModelInfo extends ModelFileInfo {
  simd: string; // SIMD path in use: "portable" | "avx2" | "avx512" ("cuda" on the GPU)
  threads: number;
}

export interface SamplingParams {
  temperature: number; // 0 = greedy
  topK: number; // 0 = off
  topP: number; // 1 = off
  repetitionPenalty: number; // 1 = off
  seed: number; // non-negative integer
}

/** Greedy decoding: the most likely token, nothing else applied. */
export const GREEDY: SamplingParams = { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1, seed: 0 };

/** Generation paths (docs/speculative.md). */
export const GENERATION_MODES = ["generate", "speculative", "tree_speculative"] as const;
export type GenerationMode = (typeof GENERATION_MODES)[number];
export type SpeculativeMode = Exclude<GenerationMode, "generate">;

/**
 * What fills the cache units of the steps an exiting token skipped
 * (docs/early-exit.md): "exact" computes them when a later token first needs
 * them, so every token equals computing every step and selecting its exit
 * step; "copy" gives them copies of the exit step's keys and values.
 */
export const EXIT_POLICIES = ["exact", "copy"] as const;
export type ExitPolicy = (typeof EXIT_POLICIES)[number];
/** What decides a token's exit: the model's learned gate, or a zero-shot rule between successive steps' distributions (docs/early-exit.md). */
export const EXIT_RULES = ["gate", "kl", "entropy"] as const;
export type ExitRule = (typeof EXIT_RULES)[number];

/** A request's early exit, resolved once (planDepth): the engine runs it as given. */
export interface ExitPlan {
  /**
   * The gate's rule: each sampled token stops at the first step whose cumulative exit probability reaches this, in [0, 1)
   * (1 is fixed depth: no plan). A zero-shot rule: at the first step whose value is below this, > 0 (0 is fixed depth).
   */
  readonly threshold: number;
  readonly policy: ExitPolicy;
  /** Absent: the gate. */
  readonly rule?: ExitRule;
}

/** How a speculative request drafts, resolved and checked once (planSpeculative); its verify depth is the request's `loops`. */
export interface SpecPlan {
  readonly mode: SpeculativeMode;
  /** Loop depth of the draft pass; deeper than the verify depth is allowed (slower, still exact). */
  readonly draftLoops: number;
  /** Tokens drafted per cycle (chain), or the tree's depth. */
  readonly draftAhead: number;
  /** The tree's branching factor; 1 for the chain. */
  readonly kBranches: number;
}

export interface GenerateRequest {
  promptTokens: number[];
  /** 0: no generation (a prompt-scoring request). */
  maxTokens: number;
  /** Loop depth; in the speculative modes the verify depth (what the output equals, what the prefix pool keys on). */
  loops: number;
  sampling: SamplingParams;
  stopTokenIds: number[]; // generation ends (finish "stop") when one is sampled; it is not emitted
  cacheWindow: number; // 0 = full
  /** The core's units share this many steps of caches (docs/kv-cache.md, made by planDepth); absent: every step its own. */
  cacheSteps?: number;
  /** A speculative mode's settings, made by planSpeculative (speculative.ts) and run as given; absent: plain generation. */
  speculative?: SpecPlan;
  /**
   * Log-probabilities of every generated token (handed to the sink with it),
   * with this many most likely alternatives, 0..MAX_TOP_LOGPROBS; unset: none.
   * Taken from the raw logits at the request's depth (the verifier's in the
   * speculative modes), before any sampling transform.
   */
  logprobs?: number;
  /** With logprobs: also score the prompt (GenerateResult.promptLogprobs). The prefix pool is not used. */
  promptLogprobs?: boolean;
  /**
   * Learned early exit (a model with an exit gate, plain generation), made
   * by planDepth (depth_plan.ts) and run as given: each sampled token stops
   * once its cumulative exit probability reaches the threshold, within
   * `loops` steps (docs/early-exit.md). Absent: fixed depth.
   */
  exit?: ExitPlan;
  /**
   * Structured output (docs/structured-output.md): every generated token is
   * one the format allows, in every mode; generation ends ("stop") as soon
   * as the format's value is complete, without an end token. The kernels
   * draw under the format's token mask, so logprobs are the masked
   * distribution's. Absent: free text.
   */
  format?: OutputFormat;
}

/**
 * A compiled output format (src/grammar): the one grammar compiled for a
 * schema, from which each generation gets a fresh matcher.
 */
export interface OutputFormat {
  matcher(): Promise<TokenConstraint>;
  /** The ids that end a complete value (the model's end ids): a mask allowing nothing else means the value is complete. */
  readonly endIds: readonly number[];
}

/**
 * One generation's place in its output format: which token may come next,
 * advanced by each generated token. The engine asks it for the mask of the
 * next token (one bit per vocabulary id, bit t % 32 of word t / 32 for id
 * t: the kernels' token mask).
 */
export interface TokenConstraint {
  /** Advances past `token`; false (state unchanged) when the format does not allow it here. */
  accept(token: number): boolean;
  /** Writes the mask of the next token; false (mask unwritten) when no token may follow: the value is complete and no end id may end it, or an end id did. */
  fillMask(out: Uint32Array): boolean;
  /** Undoes the last n accepted tokens. */
  rollback(n: number): void;
  /** Frees the matcher. */
  dispose(): void;
}

/** What the speculative modes did for one request. */
export interface SpeculativeStats {
  draftTokens: number; // tokens proposed by the draft passes (tree: every node)
  acceptedTokens: number; // draft tokens the verifier accepted
  cycles: number; // verify calls
  /** Mean tokens produced per verify call: accepted drafts plus the verifier's own token (0 without cycles). */
  acceptedPerCycle: number;
}

/** "error": an internal engine failure; the tokens before it are kept. */
export type FinishReason = "stop" | "length" | "cancelled" | "error";

export interface GenerateResult {
  tokens: number[]; // generated ids only, stop token excluded
  finishReason: FinishReason;
  promptTokens: number;
  wallMs: number; // engine start of this request to its end
  firstTokenMs: number; // engine start to the first sampled token
  speculative?: SpeculativeStats; // set by the speculative modes
  /** With promptLogprobs: one entry per prompt token, null for the first (nothing precedes it). */
  promptLogprobs?: (TokenLogprob | null)[];
  /** With exit: the steps each generated token was computed with (its exit step + 1). */
  exitSteps?: number[];
}

// Called once per generated token, in order, with its log-probability when
// the request asked for them. Returning false stops generation after this
// token (used for stop strings and client disconnects).
export type TokenSink = (tokenId: number, logprob?: TokenLogprob) => boolean | void;

/** Receives the prompt's log-probabilities (GenerateResult.promptLogprobs) as soon as they are known, before any token. */
export type PromptLogprobSink = (entries: (TokenLogprob | null)[]) => void;

/** Per-run prefix-cache instructions from the scheduler to the engine. */
export interface EngineRunOptions<S> {
  /**
   * Start from this pooled cache state instead of an empty cache: restore the
   * snapshot and keep its first `length` positions, which hold exactly
   * promptTokens[0, length) (1 <= length < promptTokens.length) computed with
   * at least req.loops loops, the same cache mode and req.cacheWindow; then
   * prefill promptTokens[length..]. The engine only reads the snapshot, and
   * only during this call; the pool keeps ownership.
   */
  prefix?: { snapshot: S; length: number };
  /**
   * When given, call it at most once, after the whole prompt is in the cache
   * and before the first token is sampled or sent, with a new snapshot of the
   * cache holding positions [0, promptTokens.length) at req.loops loops.
   * Ownership passes to the callee (the pool releases it when evicted). An
   * engine that cannot snapshot this run (e.g. a wrapped sliding window) just
   * does not call it.
   */
  capture?: (snapshot: S) => void;
  /** Passed on from SubmitOptions: where a prompt-scoring request's prompt log-probabilities go first. */
  onPromptLogprobs?: PromptLogprobSink;
}

/**
 * Prompt positions a run's pooled snapshot holds: all of them (under the
 * exact exit policy the last one's deferred steps travel with the copy), but
 * for the last under the copy policy, whose deeper cache units hold copies
 * rather than its own keys/values (a later prompt extending this one runs
 * that position at full depth); none with shared steps' caches, which the
 * kernels do not copy.
 */
export function pooledPromptLength(req: GenerateRequest): number {
  if (req.cacheSteps) return 0;
  return req.exit?.policy === "copy" ? req.promptTokens.length - 1 : req.promptTokens.length;
}

/** Whether a request may start from a pooled prefix: not when scoring its prompt (a prefix has no logits) nor with shared steps' caches (not copied). */
export function usesPrefixPool(req: GenerateRequest): boolean {
  return !req.promptLogprobs && !req.cacheSteps;
}
