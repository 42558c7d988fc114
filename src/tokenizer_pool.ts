// Worker threads that run the tokenizer's encode off the event loop
// (src/tokenizer_worker.ts is their entry point). Workers start on first use;
// each text goes to an idle worker, or to the least busy one once all are
// started. build.ts lists the worker as an entry point of the executable, so
// the same URL resolves inside it.

/** An encode refused or cut short because the pool was closed (shutdown). */
export class TokenizerClosedError extends Error {}

// Bun's Worker has unref(); the DOM typing (in the program for the playground's page) lacks it.
type BunWorker = Worker & { unref(): void };

/** To a worker: load the ranks first, then encode texts. */
export type WorkerRequest = { kind: "init"; tokenizerHome: string | null } | { kind: "encode"; id: number; text: string };
/** From a worker: the ids of one text, or why it failed. */
export type WorkerReply = { id: number; ids: Uint32Array } | { id: number; error: string };

interface Pending {
  resolve(ids: number[]): void;
  reject(e: Error): void;
}

interface PoolWorker {
  worker: BunWorker;
  pending: Map<number, Pending>;
}

const WORKER_URL = new URL("./tokenizer_worker.ts", import.meta.url);

export class TokenizerPool {
  private readonly workers: PoolWorker[] = [];
  private nextId = 0;
  private closed = false;

  constructor(
    private readonly tokenizerHome: string | null,
    private readonly size: number,
  ) {}

  encode(text: string): Promise<number[]> {
    if (this.closed) return Promise.reject(new TokenizerClosedError("the tokenizer pool is closed"));
    const w = this.pick();
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      w.pending.set(id, { resolve, reject });
      w.worker.postMessage({ kind: "encode", id, text } satisfies WorkerRequest);
    });
  }

  /** Terminates every worker; their unfinished encodes reject with TokenizerClosedError. */
  close(): void {
    this.closed = true;
    for (const w of this.workers.splice(0)) this.fail(w, new TokenizerClosedError("the tokenizer pool was closed"));
  }

  private pick(): PoolWorker {
    const idle = this.workers.find((w) => w.pending.size === 0);
    if (idle) return idle;
    if (this.workers.length < this.size) return this.start();
    return this.workers.reduce((a, b) => (b.pending.size < a.pending.size ? b : a));
  }

  private start(): PoolWorker {
    const w: PoolWorker = { worker: new Worker(WORKER_URL) as BunWorker, pending: new Map() };
    // Idle workers must not keep a finished command-line process alive.
    w.worker.unref();
    w.worker.onmessage = (event: MessageEvent<WorkerReply>) => {
      const reply = event.data;
      const p = w.pending.get(reply.id);
      if (!p) return;
      w.pending.delete(reply.id);
      if ("ids" in reply) p.resolve(Array.from(reply.ids));
      else p.reject(new Error(`tokenizer worker: ${reply.error}`));
    };
    // A worker that died takes its unfinished encodes with it; the next encode starts a new one.
    w.worker.onerror = (event: ErrorEvent) => {
      const at = this.workers.indexOf(w);
      if (at >= 0) this.workers.splice(at, 1);
      this.fail(w, new Error(`tokenizer worker failed: ${event.message}`));
    };
    w.worker.postMessage({ kind: "init", tokenizerHome: this.tokenizerHome } satisfies WorkerRequest);
    this.workers.push(w);
    return w;
  }

  private fail(w: PoolWorker, error: Error): void {
    w.worker.terminate();
    for (const p of w.pending.values()) p.reject(error);
    w.pending.clear();
  }
}
