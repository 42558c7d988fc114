// The engine: owns the loaded model and runs every request the scheduler
// starts. Plain steps of all running requests go to the kernels together,
// one batched call per turn of the event loop (batcher.ts); speculative
// cycles and prompt scoring run as their own calls between those steps.
// Between calls the event loop runs, so /healthz, /metrics and stream
// writes keep flowing.
import { existsSync } from "node:fs";
import { log } from "../log.ts";
import { CPU_LIBRARY_NAME, cacheDirCandidates, resolveCudaLibrary, resolveKernelLibrary } from "./library.ts";
import type { KvCacheMode } from "../model/kvcache.ts";
import { LS_ERR_STATE } from "../abi/abi.generated.ts";
import { type BatchStepStats, StepBatcher } from "./batcher.ts";
import { type BatchRow, cudaDeviceCount, formatProfile, type KvCacheSettings, NativeError, NativeModel, type NativeSession } from "./binding.ts";
import { EngineLoadError, EngineRequestError } from "./errors.ts";
import { Guide } from "./guide.ts";
import { type TokenLogprob, tokenLogprob } from "./logprobs.ts";
import { cycleParams, type DraftOptions, SPEC_SESSION_SLACK, SpecCounter } from "./speculative.ts";
import { type EngineRunOptions, type FinishReason, type GenerateRequest, type GenerateResult, type ModelInfo, pooledPromptLength, type SimdChoice, type TokenSink } from "./types.ts";

export interface EngineOptions {
  modelPath: string;
  threads: number;
  simd: SimdChoice;
  buildDir: string;
  /** $XDG_CACHE_HOME, where an embedded kernel library is extracted (null: ~/.cache). */
  cacheHome?: string | null;
  /** How speculative requests draft (src/engine/speculative.ts; kernels/cpu/spec.c explains the choices). */
  draft?: DraftOptions;
  /** Key/value cache mode of every session (docs/kv-cache.md; default fp16). */
  kvCacheMode?: KvCacheMode;
  /** With an H mode: q, k, v rounded to fp16 before the rotation (SERVICE_H_MODE_FP16_ATTN_QKV). */
  hModeFp16AttnQkv?: boolean;
  /** SERVICE_PROFILE: time every kernel op and print a per-op table after each request. */
  profile?: boolean;
  /**
   * Prompt tokens fed per step while other requests run (SERVICE_PREFILL_CHUNK);
   * null: a prompt goes in one call (one request at a time, nothing to interleave).
   */
  prefillChunk?: number | null;
  /** Called after every batched kernel call (metrics). */
  onBatchStep?: (stats: BatchStepStats) => void;
  /**
   * SERVICE_PIPELINE_STEPS: each batched step runs on the kernel library's
   * own thread while the tokens of the step before are streamed
   * (docs/serving-overhead.md); default false.
   */
  pipelineSteps?: boolean;
  /** false: the CPU kernels even where a GPU is usable (default true: the GPU then). */
  gpu?: boolean;
}


/**
 * Prompt tokens forwarded per call when a prompt is scored: each returns
 * every row's logits (rows x vocab floats, 12.9 MB for 64 rows of GPT-2's
 * vocabulary), and the event loop gets a turn between calls.
 */
const SCORE_CHUNK = 64;

/** A pooled copy of a prompt's KV cache (every loop), owned by the prefix pool. */
export class KvSnapshot {
  constructor(readonly session: NativeSession) {}
  release(): void {
    this.session.close();
  }
}

/** The session a request runs in: room for its prompt and output, caches for every loop it runs. */
function sessionShape(req: GenerateRequest): { maxSeq: number; loops: number } {
  const plan = req.speculative;
  return {
    // A speculative cycle writes rows past the last token before rolling back.
    maxSeq: req.promptTokens.length + req.maxTokens + (plan ? SPEC_SESSION_SLACK : 0),
    // A draft deeper than the verify depth keeps caches for its extra loops too.
    loops: Math.max(req.loops, plan?.draftLoops ?? 0),
  };
}

const nextTick = () => new Promise<void>((resolve) => setImmediate(resolve));

export class Engine {
  readonly info: ModelInfo;
  readonly supportsPrefixSnapshots = true;
  private readonly batcher: StepBatcher;
  private profiling = false;
  /** The running requests' sessions (their caches grow as positions arrive). */
  private readonly live = new Set<NativeSession>();

  private constructor(
    private readonly model: NativeModel,
    private readonly draft: DraftOptions = {},
    /** The cache mode every session of this engine uses. */
    readonly kv: KvCacheSettings = { mode: "fp16" },
    prefillChunk: number | null = null,
    onBatchStep?: (stats: BatchStepStats) => void,
    pipelineSteps = false,
  ) {
    this.info = model.info;
    this.batcher = new StepBatcher(model, prefillChunk ?? Number.POSITIVE_INFINITY, onBatchStep, pipelineSteps);
  }

  static load(opts: EngineOptions): Engine {
    const kv: KvCacheSettings = { mode: opts.kvCacheMode ?? "fp16", fp16AttnQkv: opts.hModeFp16AttnQkv ?? false };
    const library = Engine.kernelLibrary(opts, kv);
    if (!existsSync(opts.modelPath)) throw new EngineLoadError(`model file not found: ${opts.modelPath}`);
    let model: NativeModel;
    try {
      model = NativeModel.load(library, opts.modelPath, opts.threads, opts.simd);
    } catch (e) {
      throw new EngineLoadError(`cannot load model ${opts.modelPath}: ${(e as Error).message}`);
    }
    // The cache mode must suit the model (the H modes need a power-of-two
    // head_dim): a one-position session says so now, not at the first request.
    try {
      model.newSession(1, 1, 0, kv).close();
    } catch (e) {
      model.close();
      throw new EngineLoadError(`kv_cache_mode ${kv.mode} cannot serve ${opts.modelPath}: ${(e as Error).message}`);
    }
    const engine = new Engine(model, opts.draft, kv, opts.prefillChunk, opts.onBatchStep, opts.pipelineSteps);
    if (opts.profile) {
      engine.profiling = model.setProfile(true);
      if (!engine.profiling) log.warn("this kernel library cannot profile: SERVICE_PROFILE ignored");
    }
    return engine;
  }

  /**
   * The kernel library to load: SERVICE_BUILD_DIR first, else the one
   * embedded in the executable (extracted once to a cache directory); the
   * CUDA library instead when it is present and sees a device, unless the
   * cache mode, a named SIMD path or opts.gpu false asks for the CPU kernels.
   */
  private static kernelLibrary(opts: EngineOptions, kv: KvCacheSettings): string {
    try {
      const cacheDirs = cacheDirCandidates({ xdgCacheHome: opts.cacheHome });
      const cpu = resolveKernelLibrary(opts.buildDir, CPU_LIBRARY_NAME, cacheDirs);
      const cuda = opts.gpu === false ? null : resolveCudaLibrary(opts.buildDir, cacheDirs);
      const gpu = cuda !== null && cudaDeviceCount(cuda) > 0;
      // The CUDA kernels keep the fp16 cache only (kernels/cuda/runtime.cu).
      if (gpu && kv.mode !== "fp16") log.warn(`kv_cache_mode ${kv.mode} runs on the CPU kernels only: using them`);
      else if (gpu && opts.simd !== "auto") log.info(`SERVICE_SIMD ${opts.simd} names a CPU path: using the CPU kernels, not the GPU`);
      else if (gpu) return cuda;
      else if (cuda) log.info("no usable CUDA device: using the CPU kernels");
      return cpu;
    } catch (e) {
      throw new EngineLoadError((e as Error).message);
    }
  }

  /**
   * Runs a request alongside every other running one (the scheduler decides
   * how many): its plain steps share batched kernel calls, and its tokens are
   * exactly those it would get alone.
   */
  generate(
    req: GenerateRequest,
    sink: TokenSink,
    signal?: AbortSignal,
    options: EngineRunOptions<KvSnapshot> = {},
  ): Promise<GenerateResult> {
    return this.run(req, sink, signal, options);
  }

  /** The GPU's memory, bytes free and in all, with the weights loaded; null on the CPU kernels. */
  deviceMemory(): { free: number; total: number } | null {
    return this.model.deviceMemory();
  }

  /** Bytes of key/value cache the running requests' sessions hold now. */
  kvCacheBytesHeld(): number {
    let bytes = 0;
    for (const s of this.live) bytes += s.cacheBytesHeld;
    return bytes;
  }

  /** Bytes of key/value cache the request's session takes at most while it runs (0 for a request the engine will refuse). */
  kvCacheBytes(req: GenerateRequest): number {
    try {
      const shape = sessionShape(req);
      return this.model.sessionCacheBytes(shape.maxSeq, shape.loops, req.cacheWindow, this.kvFor(req));
    } catch {
      return 0;
    }
  }

  /**
   * What only the engine can check: its prompt against the vocabulary (for
   * callers that build requests themselves) and its mode against the kernel
   * library. Every other field was resolved and checked where the request
   * was made (planDepth, the HTTP layer), and the kernels check their ABI.
   */
  private validate(req: GenerateRequest): void {
    const { vocabSize } = this.info;
    if (req.promptTokens.length === 0) throw new EngineRequestError("prompt is empty");
    const bad = req.promptTokens.find((t) => !Number.isInteger(t) || t < 0 || t >= vocabSize);
    if (bad !== undefined) throw new EngineRequestError(`prompt token id ${bad} is outside the vocabulary [0, ${vocabSize})`);
    const plan = req.speculative;
    if (plan && !this.model.hasSpeculative)
      throw new EngineRequestError(`mode '${plan.mode}' is not available: this kernel library has no speculative decoding`);
    if ((req.cacheSteps || (req.exit?.rule ?? "gate") !== "gate") && !this.model.hasRecurrent)
      throw new EngineRequestError("`cache_steps` and the zero-shot exit rules are not available: this kernel library has no recurrent depth");
    if (req.format && !this.model.hasTokenMasks)
      throw new EngineRequestError("structured output is not available: this kernel library has no token masks");
  }

  /** True when this engine's kernels can constrain output to a format (token masks). */
  get supportsFormats(): boolean {
    return this.model.hasTokenMasks;
  }

  /** The service's cache mode, with the request's shared steps. */
  private kvFor(req: GenerateRequest): KvCacheSettings {
    return req.cacheSteps ? { ...this.kv, cacheSteps: req.cacheSteps } : this.kv;
  }

  private async run(
    req: GenerateRequest,
    sink: TokenSink,
    signal: AbortSignal | undefined,
    { prefix, capture, onPromptLogprobs }: EngineRunOptions<KvSnapshot>,
  ): Promise<GenerateResult> {
    this.validate(req);
    const plan = req.speculative;
    const start = performance.now();
    let firstTokenMs = 0;
    const tokens: number[] = [];
    const stops = new Set(req.stopTokenIds);
    const s = req.sampling;
    const counter = plan ? new SpecCounter() : null;
    const { exit } = req;
    const exitSteps: number[] | undefined = exit ? [] : undefined;
    const shape = sessionShape(req);
    const session = this.model.newSession(shape.maxSeq, shape.loops, req.cacheWindow, this.kvFor(req));
    this.live.add(session);
    let guide: Guide | null = null;
    // With logprobs, every step hands back its raw logits (a cycle: one row per new token).
    const top = req.logprobs;
    const vocab = this.info.vocabSize;
    const stepLogits = top === undefined ? null : new Float32Array(vocab);
    const cycleLogits = top === undefined || !plan ? null : new Float32Array((plan.draftAhead + 1) * vocab);
    let promptLogprobs: (TokenLogprob | null)[] | undefined;
    const done = (finishReason: FinishReason): GenerateResult => ({
      tokens,
      finishReason,
      promptTokens: req.promptTokens.length,
      wallMs: performance.now() - start,
      firstTokenMs,
      ...(counter ? { speculative: counter.stats() } : {}),
      ...(promptLogprobs ? { promptLogprobs } : {}),
      ...(exitSteps ? { exitSteps } : {}),
    });
    /**
     * Hands one token on (with its log-probability from `logits` and the
     * steps it ran); returns the finish reason when generation ends with it:
     * a stop id, a sink that says stop, a format's complete value, max_tokens.
     */
    const emit = (next: number, logits: Float32Array | null, steps: number): FinishReason | null => {
      if (stops.has(next)) return "stop";
      tokens.push(next);
      exitSteps?.push(steps);
      guide?.advance(tokens.length, next);
      if (sink(next, logits && top !== undefined ? tokenLogprob(logits, next, top) : undefined) === false) return "stop";
      if (guide?.finished) return "stop";
      if (tokens.length >= req.maxTokens) return "length";
      return null;
    };
    try {
      if (req.format) {
        guide = new Guide(await req.format.matcher(), vocab, req.format.endIds);
        if (guide.finished) return done("stop"); // a format whose only value is empty
      }
      if (req.maxTokens === 0 && !req.promptLogprobs) return done("length"); // nothing to generate or score
      // A scored prompt is prefilled whole: a pooled prefix has no logits.
      const reused = prefix && !req.promptLogprobs && this.reusePrefix(session, prefix.snapshot, prefix.length) ? prefix.length : 0;
      if (signal?.aborted) return done("cancelled");
      let next: number;
      let steps = req.loops; // a scored prompt runs at full depth, the first token drawn from it too
      if (req.promptLogprobs) {
        // Prefill that scores every prompt token, then the first token drawn
        // from the last row as ls_session_step draws it.
        const scored = await this.scorePrompt(session, req, top ?? 0, signal);
        if (!scored) return done("cancelled");
        promptLogprobs = scored.entries;
        onPromptLogprobs?.(promptLogprobs);
        if (capture) capture(this.snapshot(session, req));
        if (req.maxTokens === 0) return done("length");
        guide?.maskLogits(scored.last);
        stepLogits?.set(scored.last);
        next = this.model.sample(scored.last, Int32Array.from(req.promptTokens), s, req.promptTokens.length);
      } else {
        // Prefill and the first token: the same steps in every mode.
        // The batcher feeds the prompt a chunk per step; the last chunk samples the first token.
        const prompt = Int32Array.from(req.promptTokens.slice(reused));
        // A zero-shot rule never exits the prompt's last position (the published Huginn code's rule): its first token runs every step.
        const promptExit = (exit?.rule ?? "gate") === "gate" ? exit : undefined;
        const first = await this.batcher.prefill(
          { session, tokens: prompt, loops: req.loops, sampling: s, logitsOut: stepLogits, exit: promptExit, mask: guide?.rowMask(0) },
          signal,
        );
        if (first === null) return done("cancelled");
        next = first.token;
        steps = first.steps;
        if (capture && pooledPromptLength(req) > 0) capture(this.snapshot(session, req));
      }
      firstTokenMs = performance.now() - start;
      let end = emit(next, stepLogits, steps);
      // One FFI call per step: a plain decode step, or a whole speculative
      // cycle whose tokens are then handed on one by one (cut at a stop id,
      // max_tokens or a sink that says stop, as plain decoding would be).
      const out = new Int32Array((plan?.draftAhead ?? 0) + 1);
      const cycle = { drafted: 0, accepted: 0 };
      while (!end) {
        if (plan && counter) {
          await nextTick();
          if (signal?.aborted) return done("cancelled");
          const params = cycleParams(plan, req.loops, s, req.maxTokens - tokens.length, this.draft);
          const n = session.specCycle(next, params, out, cycle, cycleLogits, guide?.pathMask ?? null);
          counter.add(cycle, n);
          for (let i = 0; i < n && !end; i++) end = emit(out[i], cycleLogits && cycleLogits.subarray(i * vocab, (i + 1) * vocab), req.loops);
          next = out[n - 1];
        } else {
          if (signal?.aborted) return done("cancelled");
          const row: BatchRow = {
            session,
            tokens: Int32Array.of(next),
            loops: req.loops,
            sampling: s,
            logitsOut: stepLogits,
            exit,
            mask: guide?.rowMask(tokens.length),
          };
          next = await this.batcher.step(row, tokens.length + 1 < req.maxTokens);
          if (signal?.aborted) return done("cancelled");
          end = emit(next, stepLogits, row.steps ?? req.loops);
        }
      }
      return done(end);
    } catch (e) {
      // Requests are validated before they reach the kernels, so a kernel
      // error here is the engine's own fault: finish_reason "error" with the
      // tokens so far (docs/http.md#responses), counted as errored.
      if (!(e instanceof NativeError)) throw e;
      log.error(`engine error after ${tokens.length} tokens: ${e.message}`);
      return done("error");
    } finally {
      guide?.dispose();
      this.live.delete(session);
      session.close();
      if (this.profiling) this.printProfile(req, tokens.length);
    }
  }

  /**
   * Prefills the whole prompt SCORE_CHUNK tokens at a time with every row's
   * logits (batch invariance: the same values as one call): each prompt
   * token's log-probability comes from the row before it. Returns the
   * entries (null first) and the last row, the first generated token's
   * distribution; null when cancelled.
   */
  private async scorePrompt(
    session: NativeSession,
    req: GenerateRequest,
    top: number,
    signal: AbortSignal | undefined,
  ): Promise<{ entries: (TokenLogprob | null)[]; last: Float32Array } | null> {
    const prompt = req.promptTokens;
    const vocab = this.info.vocabSize;
    const rows = new Float32Array(Math.min(prompt.length, SCORE_CHUNK) * vocab);
    const entries: (TokenLogprob | null)[] = [null];
    const last = new Float32Array(vocab);
    for (let at = 0; at < prompt.length; at += SCORE_CHUNK) {
      if (at > 0) {
        await nextTick();
        if (signal?.aborted) return null;
      }
      const chunk = prompt.slice(at, at + SCORE_CHUNK);
      session.forward(Int32Array.from(chunk), req.loops, rows, chunk.length);
      for (let r = 0; r < chunk.length; r++) {
        const row = rows.subarray(r * vocab, (r + 1) * vocab);
        const following = at + r + 1;
        if (following < prompt.length) entries.push(tokenLogprob(row, prompt[following], top));
        else last.set(row);
      }
    }
    return { entries, last };
  }

  /** The per-op time of the request that just ended (SERVICE_PROFILE=1), in the log. */
  private printProfile(req: GenerateRequest, generated: number): void {
    const p = this.model.readProfile(true);
    const mode = req.speculative?.mode ?? "generate";
    if (p) log.info(formatProfile(p, `${mode}: ${req.promptTokens.length} prompt + ${generated} generated tokens, loops ${req.loops}`));
  }

  /**
   * Starts `session` from a pooled prefix. A windowed snapshot keeps only its
   * last window + chunk rows, so a much shorter prefix of it may be
   * unavailable: then the prompt is simply prefilled in full.
   */
  private reusePrefix(session: NativeSession, snapshot: KvSnapshot, length: number): boolean {
    try {
      session.copyPrefixFrom(snapshot.session, length);
      return true;
    } catch (e) {
      if (e instanceof NativeError && e.code === LS_ERR_STATE) return false;
      throw e;
    }
  }

  /** A copy of the prompt now in `session`'s cache (pooledPromptLength(req) positions), for the prefix pool. */
  private snapshot(session: NativeSession, req: GenerateRequest): KvSnapshot {
    const n = pooledPromptLength(req);
    const copy = this.model.newSession(n, req.loops, req.cacheWindow, this.kv);
    try {
      copy.copyPrefixFrom(session, n);
    } catch (e) {
      copy.close();
      throw e;
    }
    return new KvSnapshot(copy);
  }

  close(): void {
    this.model.close();
  }
}
