// The engine: owns the loaded model and runs one generation request at a
// time, one FFI call per step, yielding to the event loop between steps so
// /healthz, /metrics and stream writes keep flowing.
import { existsSync } from "node:fs";
import type { EngineRunOptions } from "../scheduler/scheduler.ts";
import { CPU_LIBRARY_NAME, cacheDirCandidates, resolveCudaLibrary, resolveKernelLibrary } from "./library.ts";
import { cudaDeviceCount, NativeError, NativeModel, type NativeSession, type SimdChoice } from "./binding.ts";
import type { GenerateRequest, GenerateResult, ModelInfo, TokenSink } from "./types.ts";

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

  private constructor(private readonly model: NativeModel) {
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
    const library = Engine.kernelLibrary(opts);
    if (!existsSync(opts.modelPath)) throw new EngineLoadError(`model file not found: ${opts.modelPath}`);
    try {
      return new Engine(NativeModel.load(library, opts.modelPath, opts.threads, opts.simd));
    } catch (e) {
      throw new EngineLoadError(`cannot load model ${opts.modelPath}: ${(e as Error).message}`);
    }
  }

  /**
   * The kernel library to load: SERVICE_BUILD_DIR first, else the one
   * embedded in the executable (extracted once to a cache directory); the
   * CUDA library instead when it is present and sees a device.
   */
  private static kernelLibrary(opts: EngineOptions): string {
    try {
      const cacheDirs = cacheDirCandidates({ xdgCacheHome: opts.cacheHome });
      const cpu = resolveKernelLibrary(opts.buildDir, CPU_LIBRARY_NAME, cacheDirs);
      const cuda = resolveCudaLibrary(opts.buildDir, cacheDirs);
      if (cuda && cudaDeviceCount(cuda) > 0) return cuda;
      if (cuda) console.error("loopserve: no usable CUDA device: using the CPU kernels");
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

  private validate(req: GenerateRequest): void {
    const { vocabSize } = this.info;
    if (req.promptTokens.length === 0) throw new EngineRequestError("prompt is empty");
    const bad = req.promptTokens.find((t) => !Number.isInteger(t) || t < 0 || t >= vocabSize);
    if (bad !== undefined) throw new EngineRequestError(`prompt token id ${bad} is outside the vocabulary [0, ${vocabSize})`);
    if (req.loops < 1 || req.loops > 64) throw new EngineRequestError(`loops must be between 1 and 64, got ${req.loops}`);
  }

  private async run(
    req: GenerateRequest,
    sink: TokenSink,
    signal: AbortSignal | undefined,
    { prefix, capture }: EngineRunOptions<KvSnapshot>,
  ): Promise<GenerateResult> {
    this.validate(req);
    const start = performance.now();
    let firstTokenMs = 0;
    const tokens: number[] = [];
    const stops = new Set(req.stopTokenIds);
    const s = req.sampling;
    const session = this.model.newSession(req.promptTokens.length + req.maxTokens, req.loops, req.cacheWindow);
    const done = (finishReason: GenerateResult["finishReason"]): GenerateResult => ({
      tokens,
      finishReason,
      promptTokens: req.promptTokens.length,
      wallMs: performance.now() - start,
      firstTokenMs,
    });
    try {
      const reused = prefix && this.reusePrefix(session, prefix.snapshot, prefix.length) ? prefix.length : 0;
      let input = Int32Array.from(req.promptTokens.slice(reused));
      for (;;) {
        if (signal?.aborted) return done("cancelled");
        const next = session.step(input, req.loops, s.temperature, s.topK, s.topP, s.repetitionPenalty, BigInt(s.seed));
        if (tokens.length === 0) {
          firstTokenMs = performance.now() - start;
          if (capture) capture(this.snapshot(session, req));
        }
        if (stops.has(next)) return done("stop");
        tokens.push(next);
        if (sink(next) === false) return done("stop");
        if (tokens.length >= req.maxTokens) return done("length");
        input = Int32Array.of(next);
        await nextTick();
      }
    } catch (e) {
      if (e instanceof NativeError && e.code === -1) throw new EngineRequestError(e.message);
      throw e;
    } finally {
      session.close();
    }
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
    const copy = this.model.newSession(req.promptTokens.length, req.loops, req.cacheWindow);
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
