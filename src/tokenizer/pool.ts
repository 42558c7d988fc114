// Worker threads that run the tokenizer's encode off the event loop
// (src/tokenizer/worker.ts is their entry point). The workers start together
// on first use and take one text at a time from a queue, in order. A heavy text (a long
// run without spaces, whose BPE cost is its square) may occupy all workers
// but one, so an ordinary prompt never waits behind two of them. An encode
// whose signal aborts (its client went away) leaves the queue, or, when it
// is running, its worker is terminated (BPE cannot be interrupted) and a new
// one starts for the next text. build.ts lists the worker as an entry point
// of the executable, so the same URL resolves inside it.

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

/** To a worker: build the tokenizer first, then encode texts within a token limit. */
export type WorkerRequest = { kind: "init"; spec: TokenizerSpec } | { kind: "encode"; id: number; text: string; limit: number };
/** From a worker: the ids of one text, how many it has at least (over the limit), or why it failed. */
export type WorkerReply = { id: number; ids: Uint32Array } | { id: number; atLeast: number } | { id: number; error: string };

export interface PoolEncodeOptions {
  limit: number;
  heavy: boolean;
  signal?: AbortSignal;
}

interface Job {
  id: number;
  text: string;
  limit: number;
  heavy: boolean;
  resolve(out: LimitedIds): void;
  reject(e: Error): void;
  /** Removes the abort listener. */
  release(): void;
}

interface PoolWorker {
  worker: BunWorker;
  job: Job | null;
}

const WORKER_URL = new URL("./worker.ts", import.meta.url);

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
      w.worker.postMessage({ kind: "encode", id: job.id, text: job.text, limit: job.limit } satisfies WorkerRequest);
    }
  }

  private cancel(job: Job): void {
    const error = new TokenizerCancelledError("the encode was cancelled");
    const queued = this.queue.indexOf(job);
    if (queued >= 0) {
      this.queue.splice(queued, 1);
      this.settle(job, error);
      return;
    }
    const w = this.workers.find((it) => it.job === job);
    if (!w) return; // already settled
    this.retire(w, error);
  }

  /** Ends a worker (dead, or running a cancelled encode); its job fails with `error`; queued jobs go on. */
  private retire(w: PoolWorker, error: Error): void {
    w.worker.terminate();
    const at = this.workers.indexOf(w);
    if (at >= 0) this.workers.splice(at, 1);
    if (w.job) this.settle(w.job, error);
    w.job = null;
    this.dispatch();
  }

  private settle(job: Job, outcome: LimitedIds | Error): void {
    job.release();
    if (outcome instanceof Error) job.reject(outcome);
    else job.resolve(outcome);
  }

  private start(): void {
    const w: PoolWorker = { worker: new Worker(WORKER_URL) as BunWorker, job: null };
    // Idle workers must not keep a finished command-line process alive.
    w.worker.unref();
    w.worker.onmessage = (event: MessageEvent<WorkerReply>) => {
      const reply = event.data;
      const job = w.job;
      if (!job || job.id !== reply.id) return;
      w.job = null;
      if ("ids" in reply) this.settle(job, { ids: Array.from(reply.ids) });
      else if ("atLeast" in reply) this.settle(job, { atLeast: reply.atLeast });
      else this.settle(job, new Error(`tokenizer worker: ${reply.error}`));
      this.dispatch();
    };
    // A worker that died takes its encode with it; the next one starts a new worker.
    w.worker.onerror = (event: ErrorEvent) => this.retire(w, new Error(`tokenizer worker failed: ${event.message}`));
    w.worker.postMessage({ kind: "init", spec: this.spec } satisfies WorkerRequest);
    this.workers.push(w);
  }
}
