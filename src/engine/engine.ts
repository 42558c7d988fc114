// The engine: owns the loaded model and runs one generation request at a
// time, one FFI call per step, yielding to the event loop between steps so
// /healthz, /metrics and stream writes keep flowing.
import { existsSync } from "node:fs";
import type { EngineRunOptions } from "../scheduler/scheduler.ts";
import { CPU_LIBRARY_NAME, cacheDirCandidates, resolveCudaLibrary, resolveKernelLibrary } from "./library.ts";
import type { KvCacheMode } from "../model/kvcache.ts";
import { cudaDeviceCount, formatProfile, type KvCacheSettings, NativeError, NativeModel, type NativeSession, type SimdChoice } from "./binding.ts";
import { cycleParams, type DraftOptions, planSpeculative, SPEC_SESSION_SLACK, SpecCounter, type SpecPlan } from "./speculative.ts";
import type { FinishReason, GenerateRequest, GenerateResult, ModelInfo, TokenSink } from "./types.ts";

export class EngineLoadError extends Error {}

/** A request the engine refuses (bad token id, loops beyond the model...). */
export class EngineRequestError extends Error {}

export interface EngineOptions {
  modelPath: string;
  threads: number;
  simd: SimdChoice;
  buildDir: string;
  /** $XDG_CACHE_HOME, where an embedded kernel library is extracted (null: ~/.cache). */
  cacheHome?: string | null;
  /** How speculative requests draft (src/engine/speculative.ts; kernels/spec.c explains the choices). */
  draft?: DraftOptions;
  /** Key/value cache mode of every session (DESIGN.md §3; default fp16). */
  kvCacheMode?: KvCacheMode;
  /** With an H mode: q, k, v rounded to fp16 before the rotation (SERVICE_H_MODE_FP16_ATTN_QKV). */
  hModeFp16AttnQkv?: boolean;
  /** SERVICE_PROFILE: time every kernel op and print a per-op table after each request. */
  profile?: boolean;
}

const NATIVE_STATE_ERROR = -4; // LS_ERR_STATE

/** A pooled copy of a prompt's KV cache (every loop), owned by the prefix pool. */
export class KvSnapshot {
  constructor(readonly session: NativeSession) {}
  release(): void {
    this.session.close();
  }
}

const nextTick = () => new Promise<void>((resolve) => setImmediate(resolve));

export class Engine {
  readonly info: ModelInfo;
  readonly supportsPrefixSnapshots = true;
  private tail: Promise<unknown> = Promise.resolve();

  private profiling = false;

  private constructor(
    private readonly model: NativeModel,
    private readonly draft: DraftOptions = {},
    /** The cache mode every session of this engine uses. */
    readonly kv: KvCacheSettings = { mode: "fp16" },
  ) {
    const n = model.info;
    this.info = {
      arch: "looped-llama",
      dim: n.dim,
      nHeads: n.nHeads,
      nKvHeads: n.nKvHeads,
      headDim: n.headDim,
      ffnDim: n.ffnDim,
      vocabSize: n.vocabSize,
      defaultLoops: n.defaultLoops,
      maxSeqLen: n.maxSeqLen,
      quant: n.quant,
      groupSize: n.groupSize,
      tiedOutput: n.tiedOutput,
      simd: n.simd,
      threads: n.threads,
    };
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
    const engine = new Engine(model, opts.draft, kv);
    if (opts.profile) {
      engine.profiling = model.setProfile(true);
      if (!engine.profiling) console.error("loopserve: this kernel library cannot profile: SERVICE_PROFILE ignored");
    }
    return engine;
  }

  /**
   * The kernel library to load: SERVICE_BUILD_DIR first, else the one
   * embedded in the executable (extracted once to a cache directory); the
   * CUDA library instead when it is present and sees a device.
   */
  private static kernelLibrary(opts: EngineOptions, kv: KvCacheSettings): string {
    try {
      const cacheDirs = cacheDirCandidates({ xdgCacheHome: opts.cacheHome });
      const cpu = resolveKernelLibrary(opts.buildDir, CPU_LIBRARY_NAME, cacheDirs);
      const cuda = resolveCudaLibrary(opts.buildDir, cacheDirs);
      const gpu = cuda !== null && cudaDeviceCount(cuda) > 0;
      // The CUDA kernels keep the fp16 cache only (kernels/cuda/runtime.cu).
      if (gpu && kv.mode !== "fp16") console.error(`loopserve: kv_cache_mode ${kv.mode} runs on the CPU kernels only: using them`);
      else if (gpu) return cuda;
      else if (cuda) console.error("loopserve: no usable CUDA device: using the CPU kernels");
      return cpu;
    } catch (e) {
      throw new EngineLoadError((e as Error).message);
    }
  }

  /** Runs requests strictly one after another, in call order. */
  generate(
    req: GenerateRequest,
    sink: TokenSink,
    signal?: AbortSignal,
    options: EngineRunOptions<KvSnapshot> = {},
  ): Promise<GenerateResult> {
    const run = this.tail.then(() => this.run(req, sink, signal, options));
    this.tail = run.catch(() => undefined);
    return run;
  }

  /** Checks the request; returns its speculative plan, or null for plain generation. */
  private validate(req: GenerateRequest): SpecPlan | null {
    const { vocabSize } = this.info;
    if (req.promptTokens.length === 0) throw new EngineRequestError("prompt is empty");
    const bad = req.promptTokens.find((t) => !Number.isInteger(t) || t < 0 || t >= vocabSize);
    if (bad !== undefined) throw new EngineRequestError(`prompt token id ${bad} is outside the vocabulary [0, ${vocabSize})`);
    if (req.loops < 1 || req.loops > 64) throw new EngineRequestError(`loops must be between 1 and 64, got ${req.loops}`);
    const plan = planSpeculative(req);
    if (plan && !this.model.hasSpeculative)
      throw new EngineRequestError(`mode '${plan.mode}' is not available: this kernel library has no speculative decoding`);
    // Tree verification moves accepted leaves' fp16 cache rows (kernels/spec.c): fp16 cache only (DESIGN.md §4).
    if (plan?.mode === "tree_speculative" && this.kv.mode !== "fp16")
      throw new EngineRequestError(
        `tree_speculative needs the fp16 key/value cache, but this engine runs kv_cache_mode ${this.kv.mode} (use mode speculative)`,
      );
    return plan;
  }

  private async run(
    req: GenerateRequest,
    sink: TokenSink,
    signal: AbortSignal | undefined,
    { prefix, capture }: EngineRunOptions<KvSnapshot>,
  ): Promise<GenerateResult> {
    const plan = this.validate(req);
    const start = performance.now();
    let firstTokenMs = 0;
    const tokens: number[] = [];
    const stops = new Set(req.stopTokenIds);
    const s = req.sampling;
    const counter = plan ? new SpecCounter() : null;
    // A speculative cycle writes rows past the last token before rolling back.
    const maxSeq = req.promptTokens.length + req.maxTokens + (plan ? SPEC_SESSION_SLACK : 0);
    // A draft deeper than the verify depth keeps caches for its extra loops too.
    const session = this.model.newSession(maxSeq, Math.max(req.loops, plan?.draftLoops ?? 0), req.cacheWindow, this.kv);
    const done = (finishReason: FinishReason): GenerateResult => ({
      tokens,
      finishReason,
      promptTokens: req.promptTokens.length,
      wallMs: performance.now() - start,
      firstTokenMs,
      ...(counter ? { speculative: counter.stats() } : {}),
    });
    /** Hands one token on; returns the finish reason when generation ends with it. */
    const emit = (next: number): FinishReason | null => {
      if (stops.has(next)) return "stop";
      tokens.push(next);
      if (sink(next) === false) return "stop";
      if (tokens.length >= req.maxTokens) return "length";
      return null;
    };
    try {
      const reused = prefix && this.reusePrefix(session, prefix.snapshot, prefix.length) ? prefix.length : 0;
      if (signal?.aborted) return done("cancelled");
      // Prefill and the first token: the same call in every mode.
      let next = session.step(
        Int32Array.from(req.promptTokens.slice(reused)),
        req.loops,
        s.temperature,
        s.topK,
        s.topP,
        s.repetitionPenalty,
        BigInt(s.seed),
      );
      firstTokenMs = performance.now() - start;
      if (capture) capture(this.snapshot(session, req));
      let end = emit(next);
      // One FFI call per step: a plain decode step, or a whole speculative
      // cycle whose tokens are then handed on one by one (cut at a stop id,
      // max_tokens or a sink that says stop, as plain decoding would be).
      const out = new Int32Array((plan?.draftAhead ?? 0) + 1);
      const cycle = { drafted: 0, accepted: 0 };
      while (!end) {
        await nextTick();
        if (signal?.aborted) return done("cancelled");
        if (plan && counter) {
          const n = session.specCycle(next, cycleParams(plan, req, req.maxTokens - tokens.length, this.draft), out, cycle);
          counter.add(cycle, n);
          for (let i = 0; i < n && !end; i++) end = emit(out[i]);
          next = out[n - 1];
        } else {
          next = session.step(Int32Array.of(next), req.loops, s.temperature, s.topK, s.topP, s.repetitionPenalty, BigInt(s.seed));
          end = emit(next);
        }
      }
      return done(end);
    } catch (e) {
      // Requests are validated before they reach the kernels, so a kernel
      // error here is the engine's own fault: finish_reason "error" with the
      // tokens so far (SPEC.md §2), counted as errored.
      if (!(e instanceof NativeError)) throw e;
      console.error(`loopserve: engine error after ${tokens.length} tokens: ${e.message}`);
      return done("error");
    } finally {
      session.close();
      if (this.profiling) this.printProfile(req, tokens.length);
    }
  }

  /** The per-op time of the request that just ended (SERVICE_PROFILE=1), on stderr. */
  private printProfile(req: GenerateRequest, generated: number): void {
    const p = this.model.readProfile(true);
    const mode = req.mode ?? "generate";
    if (p) console.error(formatProfile(p, `${mode}: ${req.promptTokens.length} prompt + ${generated} generated tokens, loops ${req.loops}`));
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
      if (e instanceof NativeError && e.code === NATIVE_STATE_ERROR) return false;
      throw e;
    }
  }

  /** A copy of the prompt now in `session`'s cache, for the prefix pool. */
  private snapshot(session: NativeSession, req: GenerateRequest): KvSnapshot {
    const copy = this.model.newSession(req.promptTokens.length, req.loops, req.cacheWindow, this.kv);
    try {
      copy.copyPrefixFrom(session, req.promptTokens.length);
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
