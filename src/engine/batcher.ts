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
//
// Pipelined (docs/serving-overhead.md): the step runs on the library's own
// thread (NativeModel.batchBegin) while the continuations of the step
// before it run on this one. A decode row's next row is known before its
// continuation runs (the same session fed the token it just sampled), so
// as one step ends the next begins at once with that row predicted, and
// the continuation's row claims the prediction instead of queuing. A
// request that ended instead leaves its prediction unclaimed: that step's
// token for it is dropped and its session freed as the step ends.
import { LS_ERR_ARG, LS_ERR_FULL, LS_ERR_STATE } from "../abi/abi.generated.ts";
import { type BatchRow, NativeError, type NativeModel, type NativeSession } from "./binding.ts";

/** What one kernel call carried, for the metrics. */
export interface BatchStepStats {
  rows: number;
  promptTokens: number;
  sampled: number;
  /** Wall seconds the event loop waited inside the kernel call. */
  seconds: number;
}

/** What step() is told of a row. */
export interface RowKind {
  /** The row feeds prompt tokens (counted against the step's prompt budget) rather than the last sampled token. */
  prompt: boolean;
  /** A decode row whose request, unless it stops, sends the same session's next row fed the token this one samples. */
  continues?: boolean;
}

interface Waiting {
  row: BatchRow;
  kind: RowKind;
  /** The continuation waiting for the row's token; null for a prediction nobody claimed (yet). */
  claim: { row: BatchRow; resolve(token: number): void; reject(e: unknown): void } | null;
}

/** A refusal ls_batch_step makes before changing any session. */
const refusedUnchanged = (e: unknown) => e instanceof NativeError && [LS_ERR_ARG, LS_ERR_FULL, LS_ERR_STATE].includes(e.code);

/** The row a decode row's continuation will send next: the same session fed the token it sampled. */
const successor = (row: BatchRow, token: number): BatchRow => ({
  session: row.session,
  tokens: Int32Array.of(token),
  loops: row.loops,
  sampling: row.sampling,
  logitsOut: row.logitsOut,
  exitThreshold: row.exitThreshold,
});

const sameRow = (a: BatchRow, b: BatchRow) =>
  a.session === b.session &&
  a.tokens.length === 1 &&
  b.tokens.length === 1 &&
  a.tokens[0] === b.tokens[0] &&
  a.loops === b.loops &&
  a.sampling === b.sampling &&
  (a.logitsOut ?? null) === (b.logitsOut ?? null) &&
  (a.exitThreshold ?? 0) === (b.exitThreshold ?? 0);

export class StepBatcher {
  private waiting: Waiting[] = [];
  private scheduled = false;
  /** Sessions a dropped prediction advanced past what their request saw: no row may follow on them. */
  private readonly overrun = new WeakSet<NativeSession>();
  /** Pipelined: the step on the library's thread, and its predicted rows by session. */
  private running: { take: Waiting[]; promptTokens: number; started: number; predicted: Map<NativeSession, Waiting> } | null = null;

  constructor(
    private readonly model: NativeModel,
    /** Prompt tokens one step may carry besides its decode rows. */
    private readonly promptBudget: number,
    private readonly onStep: (stats: BatchStepStats) => void = () => {},
    /** Run each step on the library's thread while the continuations of the one before run here. */
    private readonly pipelined = false,
  ) {}

  /** Queues a row for the next batched call; resolves with its sampled token (0 for a forward-only row). */
  step(row: BatchRow, kind: RowKind): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      const claim = { row, resolve, reject };
      const predicted = kind.prompt ? undefined : this.running?.predicted.get(row.session);
      if (predicted && predicted.claim === null) {
        this.running?.predicted.delete(row.session);
        if (sameRow(predicted.row, row)) predicted.claim = claim;
        else reject(new Error(`internal: the row sent after a step differs from its prediction`));
        return;
      }
      if (this.overrun.has(row.session)) return reject(new Error("internal: a row came after its session's prediction was dropped"));
      this.waiting.push({ row, kind, claim });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  /** The waiting rows one step takes (every decode row, prompt chunks within the budget); the rest stay. */
  private takeWaiting(): { take: Waiting[]; promptTokens: number } {
    const take: Waiting[] = [];
    const later: Waiting[] = [];
    let promptTokens = 0;
    for (const w of this.waiting) {
      if (!w.kind.prompt) take.push(w);
      else if (promptTokens === 0 || promptTokens + w.row.tokens.length <= this.promptBudget) {
        take.push(w);
        promptTokens += w.row.tokens.length;
      } else later.push(w);
    }
    this.waiting = later;
    return { take, promptTokens };
  }

  private flush(): void {
    this.scheduled = false;
    if (this.pipelined) return this.flushPipelined();
    const { take, promptTokens } = this.takeWaiting();
    if (this.waiting.length > 0) this.schedule();
    if (take.length === 0) return;
    const started = performance.now();
    let out: Int32Array;
    try {
      out = this.model.batchStep(take.map((w) => w.row));
    } catch (e) {
      return this.failed(take, e);
    }
    this.stepped(take, promptTokens, started);
    take.forEach((w, i) => this.deliver(w, out[i]));
  }

  /** Ends the running step and delivers its tokens; begins the next step first, so it runs while they are handed on. */
  private flushPipelined(): void {
    const ended = this.running;
    this.running = null;
    let out: Int32Array | null = null;
    if (ended) {
      try {
        out = this.model.batchEnd();
        this.stepped(ended.take, ended.promptTokens, ended.started);
      } catch (e) {
        this.failed(
          ended.take.filter((w) => w.claim),
          e,
        );
      }
    }
    // The next step: each continuing decode row's successor, then what waits.
    const next: Waiting[] = [];
    const predicted = new Map<NativeSession, Waiting>();
    if (ended && out)
      ended.take.forEach((w, i) => {
        if (!w.claim || w.kind.prompt || !w.kind.continues) return;
        const p: Waiting = { row: successor(w.claim.row, out[i]), kind: w.kind, claim: null };
        next.push(p);
        predicted.set(p.row.session, p);
      });
    const { take, promptTokens } = this.takeWaiting();
    next.push(...take);
    if (next.length > 0) {
      try {
        const started = performance.now();
        this.model.batchBegin(next.map((w) => w.row));
        this.running = { take: next, promptTokens, started, predicted };
      } catch (e) {
        this.failed(take, e); // a prediction's own continuation, when it comes, queues its row anew
      }
    }
    if (this.running || this.waiting.length > 0) this.schedule();
    if (ended && out) ended.take.forEach((w, i) => this.deliver(w, (out as Int32Array)[i]));
  }

  private stepped(take: Waiting[], promptTokens: number, started: number): void {
    let sampled = 0;
    for (const w of take) if (w.row.sampling) sampled++;
    this.onStep({ rows: take.length, promptTokens, sampled, seconds: (performance.now() - started) / 1000 });
  }

  /** Hands a row's token to its continuation; an unclaimed prediction's token is dropped, and its session is done. */
  private deliver(w: Waiting, token: number): void {
    if (!w.claim) {
      this.overrun.add(w.row.session);
      return;
    }
    if (w.claim.row !== w.row) w.claim.row.steps = w.row.steps;
    w.claim.resolve(token);
  }

  /**
   * A call that threw: a refusal changed nothing, so the rows run one by
   * one and only the bad one fails; any other failure fails every row.
   */
  private failed(take: Waiting[], e: unknown): void {
    if (take.length === 1 || !refusedUnchanged(e)) {
      for (const w of take) w.claim?.reject(e);
      return;
    }
    for (const w of take) {
      try {
        const token = this.model.batchStep([w.claim?.row ?? w.row])[0];
        w.claim?.resolve(token);
      } catch (one) {
        w.claim?.reject(one);
      }
    }
  }
}
