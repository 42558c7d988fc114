// The step batcher: the next step of every running request, gathered into
// one kernel call (ls_batch_step) per turn of the event loop. A request
// awaits its row; when the call returns, every request's continuation runs
// (tokens to sinks, streams written) and queues its next row before the
// next turn, so a batch holds every running request at every step.
//
// A step carries every decode row plus prompt chunks up to a budget of
// prompt tokens (the oldest prompt's chunk always), so a long prompt delays
// the running streams by at most one chunk per step. The batcher feeds each
// prompt chunk by chunk itself (prefill). Each row's result is what it would
// be alone (ls_batch_step is exact), so who shares a step never changes an
// output.
//
// Pipelined steps (SERVICE_PIPELINE_STEPS, docs/serving-overhead.md) are a
// parameter of the same path: each step runs on the library's own thread
// (NativeModel.pipelineBegin) while the continuations of the step before
// it run on this one. A decode row's next row is known before its
// continuation runs (the same session fed the token it just sampled), and
// so is a prompt's next chunk, so as one step ends the next begins at once
// with them; a continuation's row then claims its prediction instead of
// queuing. A request that ended instead leaves its prediction unclaimed:
// that step's token for it is dropped and its session freed as the step
// ends. Not pipelined, a step begins and ends in the same turn, and no row
// is predicted.
import { LS_ERR_ARG, LS_ERR_FULL, LS_ERR_STATE } from "../abi/abi.generated.ts";
import { type BatchRow, NativeError, type NativeModel, type NativeSession } from "./binding.ts";

/** What one kernel call carried, for the metrics. */
export interface BatchStepStats {
  rows: number;
  promptTokens: number;
  sampled: number;
  /** Wall seconds the step took (pipelined: from its begin to its end). */
  seconds: number;
}

/** A prompt being fed chunk by chunk: `at` tokens done; `pending`: a chunk is in a step that has not ended. */
interface Prefill {
  row: BatchRow;
  at: number;
  pending: boolean;
  signal?: AbortSignal;
  resolve(first: { token: number; steps: number } | null): void;
  reject(e: unknown): void;
}

interface Waiting {
  row: BatchRow;
  /** The prompt this row is a chunk of (absent for a decode row), and whether the chunk's tokens are counted in it yet. */
  prefill?: Prefill;
  advanced?: boolean;
  /** A decode row whose request, unless it stops, sends the same session's next row fed the token this one samples. */
  continues: boolean;
  /** The continuation waiting for the row's token; null for a prediction nobody claimed (yet). */
  claim: { row: BatchRow; resolve(token: number): void; reject(e: unknown): void } | null;
}

/** A step handed to the kernels: its rows, the prompt tokens among them, when it began, and its predicted decode rows by session. */
interface Step {
  take: Waiting[];
  promptTokens: number;
  started: number;
  predicted: Map<NativeSession, Waiting>;
}

/** A step that ended, with each row's token. */
interface Ended {
  step: Step;
  out: Int32Array;
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
  exit: row.exit,
  mask: row.mask?.successor(token),
});

const sameRow = (a: BatchRow, b: BatchRow) =>
  a.session === b.session &&
  a.tokens.length === 1 &&
  b.tokens.length === 1 &&
  a.tokens[0] === b.tokens[0] &&
  a.loops === b.loops &&
  a.sampling === b.sampling &&
  (a.logitsOut ?? null) === (b.logitsOut ?? null) &&
  a.exit === b.exit &&
  !a.mask === !b.mask;

export class StepBatcher {
  /** Decode rows for the next step. */
  private waiting: Waiting[] = [];
  /** Prompts still being fed, oldest first. */
  private prefills: Prefill[] = [];
  private scheduled = false;
  /** Sessions a dropped prediction advanced past what their request saw: no row may follow on them. */
  private readonly overrun = new WeakSet<NativeSession>();
  /** Pipelined: the step on the library's thread. */
  private running: Step | null = null;

  constructor(
    private readonly model: NativeModel,
    /** Prompt tokens one step may carry besides its decode rows (each prompt's chunk is at most this). */
    private readonly promptBudget: number,
    private readonly onStep: (stats: BatchStepStats) => void = () => {},
    /** Run each step on the library's thread while the continuations of the one before run here. */
    private readonly pipelined = false,
  ) {}

  /**
   * Feeds `row.tokens` (a whole prompt) to its session in chunks, step by
   * step beside the other rows; the last chunk samples as `row` says.
   * Resolves with that token and the steps it ran, or null when the signal
   * aborted between chunks.
   */
  prefill(row: BatchRow, signal?: AbortSignal): Promise<{ token: number; steps: number } | null> {
    return new Promise((resolve, reject) => {
      this.prefills.push({ row, at: 0, pending: false, signal, resolve, reject });
      this.schedule();
    });
  }

  /**
   * Queues a decode row for the next batched call; resolves with its sampled
   * token. `continues`: unless it stops, the request sends the same session's
   * next row fed this token (pipelined, that row is predicted).
   */
  step(row: BatchRow, continues: boolean): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      const claim = { row, resolve, reject };
      const predicted = this.running?.predicted.get(row.session);
      if (predicted && predicted.claim === null) {
        this.running?.predicted.delete(row.session);
        if (sameRow(predicted.row, row)) predicted.claim = claim;
        else reject(new Error("internal: the row sent after a step differs from its prediction"));
        return;
      }
      if (this.overrun.has(row.session)) return reject(new Error("internal: a row came after its session's prediction was dropped"));
      this.waiting.push({ row, continues, claim });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  /** One step's rows from what waits: every decode row, then the next chunk of each prompt while the budget allows (the first always). */
  private takeWaiting(): { take: Waiting[]; promptTokens: number } {
    const take = this.waiting;
    this.waiting = [];
    let promptTokens = 0;
    for (const p of [...this.prefills]) {
      if (p.pending || p.at === p.row.tokens.length) continue; // a chunk in a step, or all fed and the first token on its way
      if (p.signal?.aborted) {
        this.drop(p);
        p.resolve(null);
        continue;
      }
      const n = Math.min(p.row.tokens.length - p.at, this.promptBudget);
      if (promptTokens > 0 && promptTokens + n > this.promptBudget) continue;
      take.push(this.chunk(p, n));
      promptTokens += n;
    }
    return { take, promptTokens };
  }

  /** The row feeding a prompt's next n tokens; the last chunk samples. */
  private chunk(p: Prefill, n: number): Waiting {
    const last = p.at + n === p.row.tokens.length;
    const row: BatchRow = {
      session: p.row.session,
      tokens: p.row.tokens.subarray(p.at, p.at + n),
      loops: p.row.loops,
      sampling: last ? p.row.sampling : null,
      logitsOut: p.row.logitsOut,
      exit: last ? p.row.exit : undefined,
      mask: last ? p.row.mask : undefined,
    };
    p.pending = true;
    const w: Waiting = { row, prefill: p, continues: false, claim: null };
    const fail = (e: unknown) => {
      this.drop(p);
      p.reject(e);
    };
    w.claim = { row, resolve: (token) => this.chunkDone(w, token), reject: fail };
    return w;
  }

  private drop(p: Prefill): void {
    this.prefills = this.prefills.filter((q) => q !== p);
  }

  /** A chunk's step ended: its tokens are in the session, and the prompt may send its next chunk. */
  private advance(w: Waiting): void {
    const p = w.prefill;
    if (!p || w.advanced) return;
    w.advanced = true;
    p.at += w.row.tokens.length;
    p.pending = false;
  }

  /** After a chunk: the prompt's first token when it was the last, else null when cancelled, else more chunks. */
  private chunkDone(w: Waiting, token: number): void {
    const p = w.prefill as Prefill;
    this.advance(w);
    const finished = p.at === p.row.tokens.length;
    if (!finished && !p.signal?.aborted) return this.schedule();
    this.drop(p);
    p.resolve(finished ? { token, steps: w.row.steps ?? w.row.loops } : null);
  }

  /**
   * One turn: the step in flight ends (pipelined, the one the turn before
   * began), the next begins (each continuing decode row's successor, each
   * prompt's next chunk, then what waits), and then the ended step's tokens
   * are handed on, so that, pipelined, the next step runs meanwhile. Not
   * pipelined, the step begun in a turn ends in it.
   */
  private flush(): void {
    this.scheduled = false;
    const ended = this.endRunning();
    const next = this.nextStep(ended);
    const done = next && this.begin(next);
    for (const e of [ended, done]) e?.step.take.forEach((w, i) => this.deliver(w, e.out[i]));
    if (this.running || this.prefills.length > 0) this.schedule();
  }

  /** The next step's rows: the successors of the ended step's continuing decode rows (predicted), then what waits; null when there are none. */
  private nextStep(ended: Ended | null): Step | null {
    const take: Waiting[] = [];
    const predicted = new Map<NativeSession, Waiting>();
    ended?.step.take.forEach((w, i) => {
      if (w.prefill || !w.claim || !w.continues) return;
      const p: Waiting = { row: successor(w.claim.row, ended.out[i]), continues: true, claim: null };
      take.push(p);
      predicted.set(p.row.session, p);
    });
    const waiting = this.takeWaiting();
    take.push(...waiting.take);
    return take.length === 0 ? null : { take, promptTokens: waiting.promptTokens, started: performance.now(), predicted };
  }

  /** Hands a step to the kernels: pipelined, it runs on the library's thread until the next turn ends it; else it runs now and ends here. */
  private begin(step: Step): Ended | null {
    const rows = step.take.map((w) => w.row);
    try {
      if (!this.pipelined) return this.ended(step, this.model.batchStep(rows));
      this.model.pipelineBegin(rows);
      this.running = step;
    } catch (e) {
      this.failed(step.take, e);
    }
    return null;
  }

  /** Pipelined: ends the step the turn before began; null when none was running or it failed. */
  private endRunning(): Ended | null {
    const step = this.running;
    this.running = null;
    if (!step) return null;
    try {
      return this.ended(step, this.model.pipelineEnd());
    } catch (e) {
      this.failed(step.take, e);
      return null;
    }
  }

  /** A step's tokens are in: counted for the metrics, and each prompt chunk's tokens in its prompt, which may then send its next chunk. */
  private ended(step: Step, out: Int32Array): Ended {
    this.stepped(step.take, step.promptTokens, step.started);
    for (const w of step.take) this.advance(w);
    return { step, out };
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
   * one and only the bad one fails; any other failure fails every row. A
   * prediction nobody claimed yet is left out: its continuation, when it
   * comes, queues its row anew.
   */
  private failed(step: Waiting[], e: unknown): void {
    const take = step.filter((w) => w.claim);
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
