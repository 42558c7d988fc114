// A scripted engine for scheduler tests that need control over timing: it
// honours the SchedulerEngine contract (one step per event-loop turn, stops
// at the next step on abort, prefix snapshots) without any model.
import type { EngineRunOptions, GenerateRequest, GenerateResult, TokenSink } from "../../src/engine/types.ts";
import type { SchedulerEngine } from "../../src/scheduler/scheduler.ts";

export class FakeSnapshot {
  released = 0;
  constructor(readonly tokens: readonly number[]) {}
  release(): void {
    this.released++;
  }
}

export interface FakeCall {
  req: GenerateRequest;
  options: EngineRunOptions<FakeSnapshot> | undefined;
}

const sleep = (ms: number) => new Promise<void>((r) => (ms > 0 ? setTimeout(r, ms) : setImmediate(r)));

/** The deterministic "model": token i of the output depends only on the prompt. */
export function fakeToken(prompt: readonly number[], i: number): number {
  let h = 17;
  for (const t of prompt) h = (h * 31 + t) % 50000;
  return (h + 7 * i) % 50000;
}

export class FakeEngine implements SchedulerEngine<FakeSnapshot> {
  readonly supportsPrefixSnapshots: boolean;
  readonly calls: FakeCall[] = [];
  /** Millisecond delay of every step (0: one event-loop turn). */
  stepMs = 0;
  /** Extra delay of the prefill step per prompt token. */
  prefillMsPerToken = 0;
  /** While set, a starting request waits for it before its first step. */
  gate: Promise<void> | null = null;
  /** Makes the next generate() throw this. */
  failNext: Error | null = null;
  steps = 0;
  running = 0;
  maxConcurrent = 0;

  constructor(opts: { prefixSnapshots?: boolean } = {}) {
    this.supportsPrefixSnapshots = opts.prefixSnapshots ?? false;
  }

  /** Holds every request at its start until the returned function is called. */
  hold(): () => void {
    let open!: () => void;
    this.gate = new Promise<void>((r) => (open = r));
    return () => {
      this.gate = null;
      open();
    };
  }

  /** Prompt markers (first prompt token) in the order requests started. */
  get startOrder(): number[] {
    return this.calls.map((c) => c.req.promptTokens[0]);
  }

  async generate(
    req: GenerateRequest,
    sink: TokenSink,
    signal?: AbortSignal,
    options?: EngineRunOptions<FakeSnapshot>,
  ): Promise<GenerateResult> {
    this.calls.push({ req, options });
    this.running++;
    this.maxConcurrent = Math.max(this.maxConcurrent, this.running);
    try {
      const start = performance.now();
      if (this.gate) await this.gate;
      if (this.failNext) {
        const e = this.failNext;
        this.failNext = null;
        throw e;
      }
      const tokens: number[] = [];
      let firstTokenMs = 0;
      const done = (finishReason: GenerateResult["finishReason"]): GenerateResult => ({
        tokens,
        finishReason,
        promptTokens: req.promptTokens.length,
        wallMs: performance.now() - start,
        firstTokenMs,
      });
      const reused = options?.prefix?.length ?? 0;
      for (let i = 0; ; i++) {
        if (signal?.aborted) return done("cancelled");
        await sleep(this.stepMs + (i === 0 ? this.prefillMsPerToken * (req.promptTokens.length - reused) : 0));
        this.steps++;
        if (i === 0) {
          options?.capture?.(new FakeSnapshot(req.promptTokens));
          firstTokenMs = performance.now() - start;
        }
        const t = fakeToken(req.promptTokens, i);
        if (req.stopTokenIds.includes(t)) return done("stop");
        tokens.push(t);
        if (sink(t) === false) return done("stop");
        if (tokens.length >= req.maxTokens) return done("length");
      }
    } finally {
      this.running--;
    }
  }
}

export function request(marker: number, over: Partial<GenerateRequest> = {}): GenerateRequest {
  return {
    promptTokens: [marker, 1, 2, 3],
    maxTokens: 4,
    loops: 2,
    sampling: { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1, seed: 0 },
    stopTokenIds: [],
    cacheWindow: 0,
    ...over,
  };
}
