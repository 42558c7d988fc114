// Worker threads that run the tokenizer's encode off the event loop
// (src/tokenizer/worker.ts is their entry point). The workers start together
// on first use and take one text at a time from a queue, in order. A long
// text may occupy all workers but one, so an ordinary prompt never waits
// behind two of them. An encode whose signal aborts (its client went away)
// leaves the queue, or, when it is running, is stopped by its worker: each
// worker shares a flag with the pool that its encoder reads at every
// checkpoint (a few ms apart), and the worker counts as busy until it says
// the encode has stopped, so a cancelled text holds its place in the limit
// on long texts until its CPU is free. (Terminating a worker does not stop
// an encode in progress.) build.ts lists the worker as an entry point of the
// executable, so the same URL resolves inside it (src/worker_url.ts).
import { workerUrl } from "../worker_url.ts";

/** An encode refused or cut short because the pool was closed (shutdown). */
export class TokenizerClosedError extends Error {}

/** An encode stopped because its signal aborted. */
export class TokenizerCancelledError extends Error {}

/** A tokenizer's description (src/tokenizer/tokenizer.ts), from which each worker builds its own copy. */
export type TokenizerSpec = { kind: "gpt2"; tokenizerHome: string | null } | { kind: "bpe"; json: string };

/** A text's ids, or, once they passed the limit, how many it has at least. */
export type LimitedIds = { ids: number[] } | { atLeast: number };

// Bun's Worker has unref(); the DOM typing (in the program for the playground's page) lacks it.
type BunWorker = Worker & { unref(): void };

/**
 * To a worker: build the tokenizer first (`cancelled` holds the id of the
 * encode to stop), then encode texts within a token limit (`rest`: the
 * count bound's suffix minima of the text's UTF-8, when already computed).
 */
export type WorkerRequest =
  | { kind: "init"; spec: TokenizerSpec; cancelled: Int32Array }
  | { kind: "encode"; id: number; text: string; limit: number; rest?: Int32Array };
/** From a worker: the ids of one text, how many it has at least (over the limit), that it stopped, or why it failed. */
export type WorkerReply =
  | { id: number; ids: Uint32Array }
  | { id: number; atLeast: number }
  | { id: number; cancelled: true }
  | { id: number; error: string };

export interface PoolEncodeOptions {
  limit: number;
  heavy: boolean;
  signal?: AbortSignal;
  rest?: Int32Array;
}

interface Job {
  id: number;
  text: string;
  limit: number;
  heavy: boolean;
  rest?: Int32Array;
  /** Its promise is settled (cancelled): a reply is only the worker saying it is free. */
  settled: boolean;
  resolve(out: LimitedIds): void;
  reject(e: Error): void;
  /** Removes the abort listener. */
  release(): void;
}

interface PoolWorker {
  worker: BunWorker;
  /** The id of the encode this worker is to stop (shared with it). */
  cancelled: Int32Array;
  job: Job | null;
}

const WORKER_URL = workerUrl("tokenizer/worker.ts");

export class TokenizerPool {
  private readonly workers: PoolWorker[] = [];
  private readonly queue: Job[] = [];
  private nextId = 0;
  private closed = false;

  constructor(
    /** The tokenizer every worker builds its own copy of (the same ids). */
    private readonly spec: TokenizerSpec,
    private readonly size: number,
  ) {}

  encode(text: string, opts: PoolEncodeOptions): Promise<LimitedIds> {
    if (this.closed) return Promise.reject(new TokenizerClosedError("the tokenizer pool is closed"));
    const { signal } = opts;
    if (signal?.aborted) return Promise.reject(new TokenizerCancelledError("the encode was cancelled"));
    return new Promise((resolve, reject) => {
      const job: Job = {
        id: this.nextId++,
        text,
        limit: opts.limit,
        heavy: opts.heavy,
        rest: opts.rest,
        settled: false,
        resolve,
        reject,
        release: () => signal?.removeEventListener("abort", onAbort),
      };
      const onAbort = () => this.cancel(job);
      signal?.addEventListener("abort", onAbort, { once: true });
      this.queue.push(job);
      this.dispatch();
    });
  }

  /** Terminates every worker; queued and unfinished encodes reject with TokenizerClosedError. */
  close(): void {
    this.closed = true;
    const error = new TokenizerClosedError("the tokenizer pool was closed");
    for (const job of this.queue.splice(0)) this.settle(job, error);
    for (const w of this.workers.splice(0)) {
      w.worker.terminate();
      if (w.job) this.settle(w.job, error);
    }
  }

  /** Starts queued jobs on idle workers, in order, heavy ones on all workers but one. */
  private dispatch(): void {
    if (this.closed) return;
    // All workers at once (each loads its tables, ~0.5 s), and a retired one
    // replaced at once: none is cold when a text comes.
    while (this.workers.length < this.size) this.start();
    for (let i = 0; i < this.queue.length; ) {
      const job = this.queue[i];
      if (job.heavy && this.size > 1 && this.workers.filter((w) => w.job?.heavy).length >= this.size - 1) {
        i++;
        continue;
      }
      const w = this.workers.find((it) => it.job === null);
      if (w === undefined) return;
      this.queue.splice(i, 1);
      w.job = job;
      const request: WorkerRequest = { kind: "encode", id: job.id, text: job.text, limit: job.limit, rest: job.rest };
      w.worker.postMessage(request, job.rest ? [job.rest.buffer] : []);
      job.rest = undefined;
    }
  }

  /** A queued job leaves the queue; a running one is asked to stop, and its worker stays busy until it has. */
  private cancel(job: Job): void {
    const error = new TokenizerCancelledError("the encode was cancelled");
    const queued = this.queue.indexOf(job);
    if (queued >= 0) this.queue.splice(queued, 1);
    const w = this.workers.find((it) => it.job === job);
    if (w) Atomics.store(w.cancelled, 0, job.id);
    if (queued >= 0 || w) this.settle(job, error);
  }

  /** Ends a dead worker; its job fails with `error`; queued jobs go on. */
  private retire(w: PoolWorker, error: Error): void {
    w.worker.terminate();
    const at = this.workers.indexOf(w);
    if (at >= 0) this.workers.splice(at, 1);
    if (w.job) this.settle(w.job, error);
    w.job = null;
    this.dispatch();
  }

  private settle(job: Job, outcome: LimitedIds | Error): void {
    if (job.settled) return;
    job.settled = true;
    job.release();
    if (outcome instanceof Error) job.reject(outcome);
    else job.resolve(outcome);
  }

  private start(): void {
    const cancelled = new Int32Array(new SharedArrayBuffer(4)).fill(-1);
    const w: PoolWorker = { worker: new Worker(WORKER_URL) as BunWorker, cancelled, job: null };
    // Idle workers must not keep a finished command-line process alive.
    w.worker.unref();
    w.worker.onmessage = (event: MessageEvent<WorkerReply>) => {
      const reply = event.data;
      const job = w.job;
      if (!job || job.id !== reply.id) return;
      w.job = null;
      if ("ids" in reply) this.settle(job, { ids: Array.from(reply.ids) });
      else if ("atLeast" in reply) this.settle(job, { atLeast: reply.atLeast });
      else if ("cancelled" in reply) this.settle(job, new TokenizerCancelledError("the encode was cancelled"));
      else this.settle(job, new Error(`tokenizer worker: ${reply.error}`));
      this.dispatch();
    };
    // A worker that died takes its encode with it; the next one starts a new worker.
    w.worker.onerror = (event: ErrorEvent) => this.retire(w, new Error(`tokenizer worker failed: ${event.message}`));
    w.worker.postMessage({ kind: "init", spec: this.spec, cancelled } satisfies WorkerRequest);
    this.workers.push(w);
  }
}
