// The engine: owns the loaded model and runs one generation request at a
// time, one FFI call per step, yielding to the event loop between steps so
// /healthz, /metrics and stream writes keep flowing.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { NativeError, NativeModel, type SimdChoice } from "./binding.ts";
import type { GenerateRequest, GenerateResult, ModelInfo, TokenSink } from "./types.ts";

export class EngineLoadError extends Error {}

/** A request the engine refuses (bad token id, loops beyond the model...). */
export class EngineRequestError extends Error {}

export interface EngineOptions {
  modelPath: string;
  threads: number;
  simd: SimdChoice;
  buildDir: string;
}

export const LIBRARY_NAME = "libloopserve.so";

const nextTick = () => new Promise<void>((resolve) => setImmediate(resolve));

export class Engine {
  readonly info: ModelInfo;
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
    const library = join(opts.buildDir, LIBRARY_NAME);
    if (!existsSync(library))
      throw new EngineLoadError(`kernel library not found at ${library} (build it with \`bun run build:lib\`)`);
    if (!existsSync(opts.modelPath)) throw new EngineLoadError(`model file not found: ${opts.modelPath}`);
    try {
      return new Engine(NativeModel.load(library, opts.modelPath, opts.threads, opts.simd));
    } catch (e) {
      throw new EngineLoadError(`cannot load model ${opts.modelPath}: ${(e as Error).message}`);
    }
  }

  /** Runs requests strictly one after another, in call order. */
  generate(req: GenerateRequest, sink: TokenSink, signal?: AbortSignal): Promise<GenerateResult> {
    const run = this.tail.then(() => this.run(req, sink, signal));
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

  private async run(req: GenerateRequest, sink: TokenSink, signal?: AbortSignal): Promise<GenerateResult> {
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
      let input = Int32Array.from(req.promptTokens);
      for (;;) {
        if (signal?.aborted) return done("cancelled");
        const next = session.step(input, req.loops, s.temperature, s.topK, s.topP, s.repetitionPenalty, BigInt(s.seed));
        if (tokens.length === 0) firstTokenMs = performance.now() - start;
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

  close(): void {
    this.model.close();
  }
}
