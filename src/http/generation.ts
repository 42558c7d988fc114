// What every endpoint family does between a validated request and its
// response: turn the prompt into checked token ids, run the engine, and turn
// the generated ids into text deltas with whole-string stop matching.
// Families differ only in their request fields and their response framing.
import type { Config } from "../config.ts";
import { type DepthPlan, planDepth } from "../engine/depth_plan.ts";
import type { ExitPolicy, ExitRule, GenerateRequest, GenerateResult, GenerationMode, ModelInfo, PromptLogprobSink, TokenLogprob, TokenSink } from "../engine/types.ts";
import { TextStream } from "../text/stream.ts";
import { TokenLimitExceeded, type Tokenizer, TokenizerCancelledError, TokenizerClosedError } from "../tokenizer/tokenizer.ts";
import type { FormatCompiler } from "../grammar/formats.ts";
import type { ServiceMetrics } from "../metrics.ts";
import { SchedulerRejection } from "../scheduler/scheduler.ts";
import { badRequest, clientClosed, HttpError, outOfRange, unavailable } from "./errors.ts";
import { withoutPaths } from "./redact_paths.ts";
import { currentRequest } from "./request_context.ts";
import type { FinishReason } from "../wire/responses.ts";

/** How a request asks to be scheduled (docs/scheduling.md). */
export interface Scheduling {
  priority?: number | null;
  sloMs?: number | null;
}

/**
 * The part of the serving stack the HTTP layer uses: the model's description
 * and admission into the scheduler. enqueue admits synchronously — it throws
 * SchedulerRejection (queue full, latency target, shutting down) before
 * anything is sent to the client — and then runs the request in turn.
 */
export interface GenerationEngine {
  readonly info: ModelInfo;
  enqueue(
    req: GenerateRequest,
    opts: { priority?: number; sloMs?: number | null; signal?: AbortSignal; onPromptLogprobs?: PromptLogprobSink },
    sink: TokenSink,
  ): { started: Promise<unknown>; result: Promise<GenerateResult> };
}

export interface AppDeps {
  config: Config;
  tokenizer: Tokenizer;
  /** null when the model failed to load; loadError then says why. */
  engine: GenerationEngine | null;
  loadError: string | null;
  /** The Prometheus registry served on /metrics. */
  metrics: ServiceMetrics;
  /** True once shutdown has begun: no new generations, /healthz says 503. */
  draining?: () => boolean;
  /** Compiles response formats (structured output); null or absent: none can be honoured, formatsUnavailable says why. */
  formats?: FormatCompiler | null;
  formatsUnavailable?: string;
}

/**
 * The engine, or the 503 every generation endpoint answers without one.
 * `detail` "public" leaves file paths out of a load error: /healthz is open
 * to callers without the API key.
 */
export function requireEngine(deps: AppDeps, detail: "full" | "public" = "full"): GenerationEngine {
  if (deps.draining?.()) throw unavailable("the server is shutting down", "shutting_down");
  if (!deps.engine) {
    const reason = deps.loadError ?? "unknown reason";
    throw unavailable(`model not loaded: ${detail === "full" ? reason : withoutPaths(reason, [deps.config.modelPath, deps.config.tokenizerHome])}`, "model_not_loaded");
  }
  return deps.engine;
}

// ---- prompt and limits (validation order: range, then length; docs/http.md) ----

/**
 * The ids of a text prompt, encoded off the event loop when long, at most
 * `max` of them (the context less the model's beginning token). A text of
 * more bytes than SERVICE_MAX_SEQ_LEN tokens of the longest token could hold
 * cannot fit the context whatever it says: refused unread. The encode stops
 * as soon as the prompt is known to leave no room for `maxTokens`.
 */
async function encodePrompt(deps: AppDeps, text: string, param: string, max: number, maxTokens: number): Promise<number[]> {
  const maxBytes = max * deps.tokenizer.maxTokenBytes;
  const bytes = Buffer.byteLength(text, "utf8");
  if (bytes > maxBytes)
    throw badRequest(
      `\`${param}\` is ${bytes} bytes of text, more than the maximum sequence length ${max} could hold ` +
        `(${max} tokens of at most ${deps.tokenizer.maxTokenBytes} bytes: ${maxBytes} bytes)`,
      param,
      "context_length_exceeded",
    );
  try {
    // A prompt with no room left for max_tokens can never run, as the final
    // check (checkLength) would say: the encode stops there. The client's
    // signal stops it too when the client goes away.
    return await deps.tokenizer.encodeAsync(text, { limit: max - maxTokens, signal: currentRequest()?.signal });
  } catch (e) {
    if (e instanceof TokenizerClosedError) throw unavailable("the server is shutting down", "shutting_down");
    if (e instanceof TokenLimitExceeded && e.atLeast > max)
      throw badRequest(
        `\`${param}\` is at least ${e.atLeast} tokens, more than the maximum sequence length ${deps.config.maxSeqLen}`,
        param,
        "context_length_exceeded",
      );
    if (e instanceof TokenLimitExceeded)
      throw badRequest(
        `prompt (at least ${e.atLeast} tokens) plus \`max_tokens\` (${maxTokens}) is more than the maximum sequence length ${deps.config.maxSeqLen}`,
        "max_tokens",
        "context_length_exceeded",
      );
    if (e instanceof TokenizerCancelledError) throw clientClosed("the client went away while its prompt was being tokenized");
    throw e;
  }
}

/**
 * Token ids of a text or pre-tokenised prompt; ids must exist in the model's
 * vocabulary. A text prompt starts with the model's beginning-of-sequence id
 * when it has one (bos_token_id) unless `withBos` is false (a prompt from the
 * model's chat template, which writes its own); pre-tokenised ids are taken
 * as they are. A prompt longer than the context is refused naming the
 * prompt; one that leaves no room for `maxTokens` may be refused naming max_tokens.
 */
export async function promptTokens(deps: AppDeps, prompt: string | number[], param = "prompt", maxTokens = 0, withBos = true): Promise<number[]> {
  const { bosId } = deps.tokenizer.conventions;
  const { maxSeqLen } = deps.config;
  const bos = typeof prompt === "string" && bosId !== null && withBos ? [bosId] : [];
  const ids = typeof prompt === "string" ? [...bos, ...(await encodePrompt(deps, prompt, param, maxSeqLen - bos.length, maxTokens))] : prompt;
  if (ids.length === bos.length) throw badRequest(`\`${param}\` must not be empty`, param);
  if (ids.length > maxSeqLen)
    throw badRequest(`\`${param}\` is ${ids.length} tokens, more than the maximum sequence length ${maxSeqLen}`, param, "context_length_exceeded");
  // Without a loaded model the vocabulary is unknown; the 503 comes next anyway.
  const vocab = deps.engine?.info.vocabSize ?? Number.POSITIVE_INFINITY;
  const at = ids.findIndex((id) => id < 0 || id >= vocab);
  if (at < 0) return ids;
  const range = Number.isFinite(vocab) ? `[0, ${vocab})` : "[0, vocabulary size)";
  // A text prompt can only fail this with a model whose vocabulary is smaller than its tokenizer's (GPT-2's: a model file with its own is checked at load).
  const where = typeof prompt === "string" ? param : `${param}[${at}]`;
  const what = typeof prompt === "string" ? "contains token id" : "is token id";
  throw badRequest(`\`${where}\` ${what} ${ids[at]}, outside the model's vocabulary ${range}`, where);
}

/** A request's depth fields as its body carries them (every family names them alike). */
export interface DepthFields {
  loops?: number | null;
  verify_loops?: number | null;
  draft_loops?: number | null;
  draft_ahead?: number | null;
  K_branches?: number | null;
  exit_threshold?: number | null;
  exit_policy?: ExitPolicy | null;
  exit_rule?: ExitRule | null;
  cache_window?: number | null;
  cache_steps?: number | null;
}

/**
 * The request's depth (steps, speculative plan, early exit) resolved once,
 * at the range stage (src/engine/depth_plan.ts): defaults from the model,
 * refusals as 400s naming the field. Null only when no model is loaded
 * (engineRequest then answers 503, after the length check).
 */
export function resolveDepth(deps: AppDeps, mode: GenerationMode, body: DepthFields, temperature: number): DepthPlan | null {
  const settings = {
    mode,
    loops: body.loops ?? undefined,
    verifyLoops: body.verify_loops ?? undefined,
    draftLoops: body.draft_loops ?? undefined,
    draftAhead: body.draft_ahead ?? undefined,
    kBranches: body.K_branches ?? undefined,
    exitThreshold: body.exit_threshold, // null: no early exit
    exitPolicy: body.exit_policy ?? undefined,
    exitRule: body.exit_rule ?? undefined,
    cacheWindow: body.cache_window ?? undefined,
    cacheSteps: body.cache_steps ?? undefined,
  };
  return planDepth(settings, { model: deps.engine?.info ?? null, temperature, kvCacheMode: deps.config.kvCacheMode });
}

/**
 * The last checks every family makes, in order (the length, then the model
 * loaded: its 503), and the engine request they let through: `fields` with
 * the depth resolveDepth resolved and the model's end ids among the stop ids.
 */
export function engineRequest(
  deps: AppDeps,
  depth: DepthPlan | null,
  fields: Omit<GenerateRequest, keyof DepthPlan>,
): { engine: GenerationEngine; request: GenerateRequest } {
  checkLength(deps, fields.promptTokens.length, fields.maxTokens);
  const engine = requireEngine(deps);
  if (depth === null) throw new Error("internal: a request was resolved without the model that is loaded");
  return { engine, request: { ...fields, stopTokenIds: stopTokenIds(deps, fields.stopTokenIds), ...depth } };
}

export function checkCacheWindow(deps: AppDeps, cacheWindow: number): void {
  const max = deps.config.maxSeqLen;
  if (cacheWindow > max) throw outOfRange("cache_window", `must be at most SERVICE_MAX_SEQ_LEN (${max}), got ${cacheWindow}`);
}

function checkLength(deps: AppDeps, promptLength: number, maxTokens: number): void {
  const max = deps.config.maxSeqLen;
  if (promptLength + maxTokens > max)
    throw badRequest(
      `prompt (${promptLength} tokens) plus \`max_tokens\` (${maxTokens}) is ${promptLength + maxTokens} tokens, ` +
        `more than the maximum sequence length ${max}`,
      "max_tokens",
      "context_length_exceeded",
    );
}

/** Explicit stop ids plus the model's end-of-sequence ids (GPT-2: end-of-text, as in every GPT-2 server). */
function stopTokenIds(deps: AppDeps, explicit: readonly number[]): number[] {
  const ids = new Set(explicit);
  const vocab = deps.engine?.info.vocabSize ?? 0;
  for (const eos of deps.tokenizer.conventions.eosIds) if (eos < vocab) ids.add(eos);
  return [...ids];
}

// ---- running a request ----

export interface Completion {
  tokens: number[];
  /** With request.logprobs: one entry per token of `tokens`. */
  logprobs: TokenLogprob[];
  text: string;
  finishReason: FinishReason;
  result: GenerateResult;
}

/**
 * Called per generated token with its text delta ("" while a character or a
 * possible stop is incomplete) and, when the request asked, its log-probability.
 */
export type DeltaSink = (tokenId: number, text: string, logprob?: TokenLogprob) => void;

/** Streams report an engine failure as an error event (docs/http.md#streaming) rather than as a finish_reason. */
export function completedForStream<C extends { finishReason: FinishReason }>(c: C): C {
  if (c.finishReason === "error")
    throw new HttpError(500, "the engine failed while generating (see the server log)", "server_error", null, "engine_error");
  return c;
}

/** A generation in progress: the completion, plus when it left the queue. */
export type GenerationRun = Promise<Completion & { tail: string }> & {
  /** Settles when the request starts running (or was cancelled while queued); rejects with a 503 when refused in the queue. */
  started: Promise<void>;
};

const schedulerToHttp = (e: unknown): never => {
  if (e instanceof SchedulerRejection) throw unavailable(e.message, e.reason);
  throw e;
};

/**
 * Runs one request: each generated token goes to onToken with its text delta;
 * a matched stop string ends generation and is not part of the text.
 * The returned text is the concatenation of every delta plus the flushed tail
 * (`tail`, which streaming responses send last).
 *
 * Admission happens synchronously in this call: a refused request throws a
 * 503 HttpError here, before any response has been opened.
 *
 * onPromptLogprobs (a request scoring its prompt) gets the prompt's entries
 * before the first token reaches onToken.
 */
export function runGeneration(
  engine: GenerationEngine,
  tokenizer: Tokenizer,
  request: GenerateRequest,
  stopStrings: readonly string[],
  signal: AbortSignal | undefined,
  onToken: DeltaSink = () => {},
  scheduling: Scheduling = {},
  onPromptLogprobs?: PromptLogprobSink,
): GenerationRun {
  const text = new TextStream(tokenizer, stopStrings);
  const logprobs: TokenLogprob[] = [];
  // The request's log line reports its tokens, those of a cancelled stream included.
  const logged = currentRequest();
  if (logged) logged.promptTokens = request.promptTokens.length;
  const sink = (id: number, logprob?: TokenLogprob) => {
    if (logged) logged.completionTokens++;
    const delta = text.push(id);
    if (logprob) logprobs.push(logprob);
    onToken(id, delta.text, logprob);
    return !delta.stopped;
  };
  let ticket: ReturnType<GenerationEngine["enqueue"]>;
  try {
    const opts = { priority: scheduling.priority ?? 0, sloMs: scheduling.sloMs, signal, onPromptLogprobs };
    ticket = engine.enqueue(request, opts, sink);
  } catch (e) {
    return schedulerToHttp(e);
  }
  const done = ticket.result.then((result) => {
    const tail = text.finish();
    const finishReason: FinishReason =
      result.finishReason === "error" ? "error" : text.stopped || result.finishReason !== "length" ? "stop" : "length";
    return { tokens: result.tokens, logprobs, text: text.text, tail, finishReason, result };
  }, schedulerToHttp);
  const started = ticket.started.then(() => undefined, schedulerToHttp);
  // A refusal in the queue also rejects `done`, which every caller awaits;
  // callers that never look at `started` must not leave it unhandled.
  started.catch(() => undefined);
  return Object.assign(done, { started });
}
