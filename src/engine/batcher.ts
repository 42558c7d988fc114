// The step batcher: the next step of every running request, gathered into
// one kernel call (ls_batch_step) per turn of the event loop. A request
// awaits its row; when the call returns, every request's continuation runs
// (tokens to sinks, streams written) and queues its next row before the
// next turn, so a batch holds every running request at every step.
//
// A step carries every decode row plus prompt chunks up to a budget of
// prompt tokens (the oldest chunk always), so a long prompt delays the
// running streams by at most one chunk per step. Each row's result is what
// it would be alone (ls_batch_step is exact), so who shares a step never
// changes an output.
import { LS_ERR_ARG, LS_ERR_FULL, LS_ERR_STATE } from "../abi/abi.generated.ts";
import { type BatchRow, NativeError, type NativeModel } from "./binding.ts";

/** What one kernel call carried, for the metrics. */
export interface BatchStepStats {
  rows: number;
  promptTokens: number;
  sampled: number;
  /** Wall seconds the call took (the event loop was inside the kernels). */
  seconds: number;
}

interface Waiting {
  row: BatchRow;
  prompt: boolean;
  resolve(token: number): void;
  reject(e: unknown): void;
}

/** A refusal ls_batch_step makes before changing any session. */
const refusedUnchanged = (e: unknown) => e instanceof NativeError && [LS_ERR_ARG, LS_ERR_FULL, LS_ERR_STATE].includes(e.code);

export class StepBatcher {
  private waiting: Waiting[] = [];
  private scheduled = false;

  constructor(
    private readonly model: NativeModel,
    /** Prompt tokens one step may carry besides its decode rows. */
    private readonly promptBudget: number,
    private readonly onStep: (stats: BatchStepStats) => void = () => {},
  ) {}

  /**
   * Queues a row for the next batched call; resolves with its sampled token
   * (0 for a forward-only row). `prompt`: the row feeds prompt tokens (counted
   * against the step's prompt budget) rather than the last sampled token.
   */
  step(row: BatchRow, prompt: boolean): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      this.waiting.push({ row, prompt, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.scheduled = false;
    const take: Waiting[] = [];
    const later: Waiting[] = [];
    let promptTokens = 0;
    for (const w of this.waiting) {
      if (!w.prompt) take.push(w);
      else if (promptTokens === 0 || promptTokens + w.row.tokens.length <= this.promptBudget) {
        take.push(w);
        promptTokens += w.row.tokens.length;
      } else later.push(w);
    }
    this.waiting = later;
    if (later.length > 0) {
      this.scheduled = true;
      setImmediate(() => this.flush());
    }
    if (take.length === 0) return;
    try {
      const started = performance.now();
      const out = this.model.batchStep(take.map((w) => w.row));
      const seconds = (performance.now() - started) / 1000;
      let sampled = 0;
      for (const w of take) if (w.row.sampling) sampled++;
      this.onStep({ rows: take.length, promptTokens, sampled, seconds });
      take.forEach((w, i) => w.resolve(out[i]));
    } catch (e) {
      // A refused call changed nothing: run the rows one by one, so only
      // the bad one fails. Any other failure fails every row of the call.
      if (take.length === 1 || !refusedUnchanged(e)) for (const w of take) w.reject(e);
      else
        for (const w of take) {
          try {
            w.resolve(this.model.batchStep([w.row])[0]);
          } catch (one) {
            w.reject(one);
          }
        }
    }
  }
}
