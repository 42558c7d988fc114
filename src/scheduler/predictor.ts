// Latency predictor for admission control. Learns two costs from completed
// requests, as exponentially weighted moving averages:
//   prefill: milliseconds per prompt token per loop (engine start → first token)
//   decode:  milliseconds per generated token per loop (each later step)
// Per loop because a looped model's step cost grows linearly with the loop
// depth: a request at loops=32 costs about four times one at loops=8.
//
// A request's predicted completion time is the work that will run before it
// (the running request's remainder plus every queued request of the same or
// higher priority) plus its own prompt and max_tokens cost. max_tokens is an
// upper bound (a stop can end generation sooner), so the prediction errs on
// the side of refusing rather than of missing the target.
//
// Until both costs have been observed at least once the predictor is
// unprimed: it predicts nothing and admission never rejects on it.

/** The work one request asks of the engine. */
export interface Work {
  prefillTokens: number; // prompt tokens to run (prompt minus any reused prefix)
  maxTokens: number; // tokens to generate at most (the first comes from the prefill step)
  loops: number;
}

/** What a completed request measured. */
export interface CostSample {
  prefillTokens: number; // prompt tokens actually run
  loops: number;
  prefillMs: number; // engine start → first token
  decodeSteps: number; // engine steps after the first one
  decodeMs: number; // first token → end
}

export class LatencyPredictor {
  private prefill: number | undefined; // ms per prompt token per loop
  private decode: number | undefined; // ms per decode step per loop

  /** alpha: weight of the newest sample (0 < alpha <= 1). */
  constructor(readonly alpha = 0.2) {
    if (!(alpha > 0 && alpha <= 1)) throw new RangeError(`alpha must be in (0, 1], got ${alpha}`);
  }

  get primed(): boolean {
    return this.prefill !== undefined && this.decode !== undefined;
  }

  /** Current averages, for stats and tests. */
  get rates(): { prefillMsPerTokenLoop: number | undefined; decodeMsPerTokenLoop: number | undefined } {
    return { prefillMsPerTokenLoop: this.prefill, decodeMsPerTokenLoop: this.decode };
  }

  private ewma(old: number | undefined, sample: number): number {
    return old === undefined ? sample : old + this.alpha * (sample - old);
  }

  /** Folds in one completed request; samples with nothing to divide by are skipped. */
  observe(s: CostSample): void {
    const ok = (x: number) => Number.isFinite(x) && x >= 0;
    if (s.loops > 0 && s.prefillTokens > 0 && ok(s.prefillMs))
      this.prefill = this.ewma(this.prefill, s.prefillMs / (s.prefillTokens * s.loops));
    if (s.loops > 0 && s.decodeSteps > 0 && ok(s.decodeMs))
      this.decode = this.ewma(this.decode, s.decodeMs / (s.decodeSteps * s.loops));
  }

  /** Predicted engine time of a whole request in ms; 0 while unprimed. */
  cost(w: Work): number {
    if (!this.primed) return 0;
    return this.prefillCost(w) + this.decodeCost(w, Math.max(0, w.maxTokens - 1));
  }

  /**
   * Predicted remaining time of the running request in ms; 0 while unprimed.
   * elapsedMs: time since it left the queue; generated: tokens produced so far.
   */
  remaining(w: Work, elapsedMs: number, generated: number): number {
    if (!this.primed) return 0;
    if (generated === 0)
      return Math.max(0, this.prefillCost(w) - elapsedMs) + this.decodeCost(w, Math.max(0, w.maxTokens - 1));
    return this.decodeCost(w, Math.max(0, w.maxTokens - generated));
  }

  private prefillCost(w: Work): number {
    return (this.prefill ?? 0) * Math.max(1, w.prefillTokens) * w.loops;
  }

  private decodeCost(w: Work, steps: number): number {
    return (this.decode ?? 0) * steps * w.loops;
  }
}
