// The scheduler: every generation request goes through here. It owns the
// priority queue, runs up to maxBatch requests at once on the engine (which
// batches their steps), starts a queued request only when its key/value
// cache fits the memory budget, refuses what it cannot serve (queue full,
// latency target, larger than the whole budget, shutting down), reuses
// pooled prompt prefixes, honours cancellation, and keeps the lifecycle
// metrics current (all metric updates happen in lifecycle.transition).
//
// Admission is synchronous: enqueue() either returns a ticket or throws a
// SchedulerRejection before anything is sent to the client, so the HTTP
// layer can answer 503 instead of opening a stream.
import { type EngineRunOptions, type GenerateRequest, type GenerateResult, type PromptLogprobSink, pooledPromptLength, type TokenSink, usesPrefixPool } from "../engine/types.ts";
import type { ServiceMetrics } from "../metrics.ts";
import { createRequest, type RequestRecord, type RequestState, transition } from "./lifecycle.ts";
import { LatencyPredictor, type Work } from "./predictor.ts";
import { type PrefixHit, PrefixPool, type Snapshot } from "./prefix_pool.ts";
import { RequestQueue } from "./queue.ts";

// ---- the engine as the scheduler sees it ----

/**
 * What the scheduler needs from the engine. Engine satisfies it as it is
 * (the extra parameter is optional); it opts into the prefix pool by setting
 * supportsPrefixSnapshots and honouring EngineRunOptions.
 */
export interface SchedulerEngine<S extends Snapshot = Snapshot> {
  /**
   * Runs one request. Must stop at the next step once `signal` is aborted and
   * then resolve with finishReason "cancelled". Throws for a request it
   * refuses or an internal failure (the request is counted as errored).
   */
  generate(req: GenerateRequest, sink: TokenSink, signal?: AbortSignal, options?: EngineRunOptions<S>): Promise<GenerateResult>;
  readonly supportsPrefixSnapshots?: boolean;
}

// ---- public types ----

export type RejectionReason = "queue_full" | "latency_target" | "kv_cache_budget" | "shutting_down";

/** A request the scheduler refuses; the HTTP layer answers 503 with the message. */
export class SchedulerRejection extends Error {
  readonly status = 503;
  constructor(
    readonly reason: RejectionReason,
    message: string,
  ) {
    super(message);
    this.name = "SchedulerRejection";
  }
}

export interface SchedulerOptions {
  metrics: ServiceMetrics;
  maxQueueDepth: number; // SERVICE_MAX_QUEUE_DEPTH: most waiting requests (the running one not counted)
  defaultSloMs?: number | null; // SERVICE_DEFAULT_SLO_MS
  prefixPoolCapacity?: number; // SERVICE_PREFIX_POOL_CAPACITY (default 0: off)
  cacheMode?: string; // the service's key/value cache mode, part of the prefix pool key (default "fp16")
  predictorAlpha?: number; // EWMA weight of the newest sample (default 0.2)
  maxBatch?: number; // SERVICE_MAX_BATCH: requests running at once (default 1)
  kvCache?: KvCacheBudget; // the key/value cache memory budget (default: none)
}

/** Key/value cache memory as the scheduler rations it. */
export interface KvCacheBudget {
  /** Bytes all running requests' caches may take together (SERVICE_KV_CACHE_MB). */
  readonly budgetBytes: number;
  /** Bytes the cache of this request takes while it runs. */
  bytesFor(req: GenerateRequest): number;
}

export interface SubmitOptions {
  priority?: number; // higher runs first; default 0
  sloMs?: number | null; // latency target for this request; overrides defaultSloMs
  signal?: AbortSignal; // abort = client gone: cancels the request, queued or running
  onPromptLogprobs?: PromptLogprobSink; // req.promptLogprobs: the prompt's entries, before the first token
}

export interface Ticket {
  readonly id: number;
  /** Resolves "running" when the request leaves the queue, "cancelled" if it never will; rejects with SchedulerRejection on shutdown. */
  readonly started: Promise<"running" | "cancelled">;
  /**
   * The engine's result; finishReason "cancelled" (with the tokens produced so
   * far) when the client cancelled. Rejects with SchedulerRejection when
   * refused after admission (shutdown), or with the engine's error.
   */
  readonly result: Promise<GenerateResult>;
  readonly state: RequestState;
}

// ---- internals ----

interface Job {
  readonly rec: RequestRecord;
  readonly priority: number;
  readonly req: GenerateRequest;
  readonly sink: TokenSink;
  readonly signal?: AbortSignal;
  readonly onPromptLogprobs?: PromptLogprobSink;
  readonly work: Work;
  readonly kvBytes: number; // its key/value cache while it runs
  readonly tokens: number[]; // tokens handed to the sink so far
  sinkStopped: boolean;
  onAbort?: () => void;
  settleStarted(v: "running" | "cancelled" | SchedulerRejection): void;
  settleResult(v: GenerateResult | Error): void;
}

const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(1);

function deferred<T>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => undefined); // a rejection nobody awaits must not be "unhandled"
  return { promise, resolve, reject };
}

export class Scheduler<S extends Snapshot = Snapshot> {
  readonly predictor: LatencyPredictor;
  readonly prefixPool: PrefixPool<S>;
  private readonly queue: RequestQueue<Job>;
  private readonly metrics: ServiceMetrics;
  private readonly defaultSloMs: number | null;
  private readonly cacheMode: string;
  private readonly running = new Set<Job>();
  private readonly maxBatch: number;
  private readonly kvCache: KvCacheBudget | null;
  private kvBytesInUse = 0;
  private nextId = 1;
  private closing = false;
  private idleWaiters: (() => void)[] = [];
  private shutdownDone: Promise<void> | null = null;

  constructor(
    private readonly engine: SchedulerEngine<S>,
    opts: SchedulerOptions,
  ) {
    this.metrics = opts.metrics;
    this.queue = new RequestQueue<Job>(opts.maxQueueDepth);
    this.defaultSloMs = opts.defaultSloMs ?? null;
    this.cacheMode = opts.cacheMode ?? "fp16";
    this.predictor = new LatencyPredictor(opts.predictorAlpha);
    this.maxBatch = opts.maxBatch ?? 1;
    if (!(Number.isInteger(this.maxBatch) && this.maxBatch >= 1)) throw new RangeError(`maxBatch must be a positive integer, got ${this.maxBatch}`);
    this.kvCache = opts.kvCache ?? null;
    this.metrics.kvCacheBudgetBytes.set(this.kvCache?.budgetBytes ?? 0);
    const capacity = engine.supportsPrefixSnapshots ? (opts.prefixPoolCapacity ?? 0) : 0;
    this.prefixPool = new PrefixPool<S>(capacity, this.metrics.prefixPoolHits);
  }

  /** False once shutdown() was called (healthz answers 503). */
  get accepting(): boolean {
    return !this.closing;
  }

  get queueDepth(): number {
    return this.queue.size;
  }

  get inFlight(): number {
    return this.running.size;
  }

  /** Key/value cache bytes the running requests hold. */
  get kvCacheBytesInUse(): number {
    return this.kvBytesInUse;
  }

  /**
   * Admits a request or throws SchedulerRejection (queue_full,
   * latency_target, shutting_down). A request whose signal is already
   * aborted is counted as cancelled and never runs.
   */
  enqueue(req: GenerateRequest, opts: SubmitOptions, sink: TokenSink): Ticket {
    const priority = Number.isFinite(opts.priority) ? (opts.priority as number) : 0;
    const rec = createRequest(this.nextId++, priority, this.metrics);
    const started = deferred<"running" | "cancelled">();
    const result = deferred<GenerateResult>();
    const prefill = req.promptTokens.length - this.reusable(req);
    const job: Job = {
      rec,
      priority,
      req,
      sink,
      signal: opts.signal,
      onPromptLogprobs: opts.onPromptLogprobs,
      work: { prefillTokens: prefill, maxTokens: req.maxTokens, loops: req.loops },
      kvBytes: this.kvCache?.bytesFor(req) ?? 0,
      tokens: [],
      sinkStopped: false,
      settleStarted: (v) => (v instanceof SchedulerRejection ? started.reject(v) : started.resolve(v)),
      settleResult: (v) => (v instanceof Error ? result.reject(v) : result.resolve(v)),
    };
    const ticket: Ticket = {
      id: rec.id,
      started: started.promise,
      result: result.promise,
      get state() {
        return rec.state;
      },
    };

    if (opts.signal?.aborted) {
      this.cancelQueued(job);
      return ticket;
    }
    const rejection = this.admission(job, opts);
    if (rejection) {
      transition(rec, "rejected", this.metrics);
      throw rejection;
    }
    if (opts.signal) {
      job.onAbort = () => this.onAbort(job);
      opts.signal.addEventListener("abort", job.onAbort, { once: true });
    }
    if (this.queue.size === 0 && this.canStart(job)) this.start(job); // a free slot: straight to running, even with a queue depth of 0
    else this.queue.push(job);
    return ticket;
  }

  /** enqueue() as one promise: rejects with SchedulerRejection when refused. */
  submit(req: GenerateRequest, opts: SubmitOptions, sink: TokenSink): Promise<GenerateResult> {
    try {
      // The ticket's own promise (not an async wrapper's): it never counts as
      // an unhandled rejection while the caller has not awaited it yet.
      return this.enqueue(req, opts, sink).result;
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /**
   * Predicted milliseconds from now until a request with this work and
   * priority would complete: its own cost (the predictor learns step costs
   * from requests that ran batched, so they include sharing a step), plus,
   * when every slot is taken, its share of the work ahead of it: the
   * running requests' remainders and every queued request that runs before
   * it, spread over the maxBatch slots. 0 while unprimed.
   */
  predict(work: Work, priority = 0): number {
    const p = this.predictor;
    if (!p.primed) return 0;
    const ahead = [...this.queue.items()].filter((j) => j.priority >= priority);
    if (this.running.size + ahead.length < this.maxBatch) return p.cost(work);
    let backlog = 0;
    const now = performance.now();
    for (const j of this.running) backlog += p.remaining(j.work, now - (j.rec.times.started ?? now), j.tokens.length);
    for (const j of ahead) backlog += p.cost(j.work);
    return p.cost(work) + backlog / this.maxBatch;
  }

  /**
   * Stops accepting (new submissions get "shutting_down"), refuses every
   * queued request with 503, lets the running one finish, then releases the
   * prefix pool. Resolves when idle. Idempotent.
   */
  shutdown(): Promise<void> {
    if (this.shutdownDone) return this.shutdownDone;
    this.closing = true;
    for (const job of this.queue.drain()) {
      this.detach(job);
      transition(job.rec, "rejected", this.metrics);
      const err = new SchedulerRejection("shutting_down", "the server is shutting down");
      job.settleStarted(err);
      job.settleResult(err);
    }
    this.shutdownDone = this.idle().then(() => this.prefixPool.clear());
    return this.shutdownDone;
  }

  /** Resolves when nothing is running or queued. */
  idle(): Promise<void> {
    if (this.running.size === 0 && this.queue.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** Prompt positions a pooled prefix would spare this request (none for a prompt-scoring one). */
  private reusable(req: GenerateRequest): number {
    return usesPrefixPool(req) ? this.prefixPool.peek(req.promptTokens, req.loops, this.cacheMode, req.cacheWindow) : 0;
  }

  // ---- admission ----

  private admission(job: Job, opts: SubmitOptions): SchedulerRejection | null {
    if (this.closing) return new SchedulerRejection("shutting_down", "the server is shutting down");
    if (this.kvCache && job.kvBytes > this.kvCache.budgetBytes)
      return new SchedulerRejection(
        "kv_cache_budget",
        `this request's key/value cache needs ${mib(job.kvBytes)} MiB, more than the whole budget of ${mib(this.kvCache.budgetBytes)} MiB (SERVICE_KV_CACHE_MB): ask for fewer tokens`,
      );
    const busy = !this.canStart(job) || this.queue.size > 0;
    if (busy && this.queue.full)
      return new SchedulerRejection("queue_full", `the request queue is full (${this.queue.capacity} waiting)`);
    const slo = opts.sloMs ?? this.defaultSloMs;
    if (slo !== null && slo !== undefined && this.predictor.primed) {
      const predicted = this.predict(job.work, job.priority);
      if (predicted > slo)
        return new SchedulerRejection(
          "latency_target",
          `predicted completion in ${Math.round(predicted)} ms exceeds the latency target of ${slo} ms`,
        );
    }
    return null;
  }

  // ---- cancellation ----

  private onAbort(job: Job): void {
    // Running: the engine sees the aborted signal at its next step.
    if (job.rec.state === "queued" && this.queue.remove(job)) this.cancelQueued(job);
  }

  private cancelQueued(job: Job): void {
    this.detach(job);
    transition(job.rec, "cancelled", this.metrics);
    job.settleStarted("cancelled");
    job.settleResult({
      tokens: [],
      finishReason: "cancelled",
      promptTokens: job.req.promptTokens.length,
      wallMs: 0,
      firstTokenMs: 0,
    });
    this.notifyIdle();
  }

  private detach(job: Job): void {
    if (job.onAbort) job.signal?.removeEventListener("abort", job.onAbort);
    job.onAbort = undefined;
  }

  // ---- dispatch ----

  /** A slot is free and the request's cache fits beside the running ones. */
  private canStart(job: Job): boolean {
    if (this.running.size >= this.maxBatch) return false;
    return !this.kvCache || this.kvBytesInUse + job.kvBytes <= this.kvCache.budgetBytes;
  }

  /** Starts queued requests in priority order while the next one can start (it waits, not skipped, when its cache does not fit yet). */
  private pump(): void {
    for (let next = this.queue.peek(); next && this.canStart(next); next = this.queue.peek()) this.start(this.queue.pop() as Job);
    this.notifyIdle();
  }

  private start(job: Job): void {
    this.running.add(job);
    this.kvBytesInUse += job.kvBytes;
    this.metrics.kvCacheBytesInUse.set(this.kvBytesInUse);
    transition(job.rec, "running", this.metrics);
    job.settleStarted("running");
    void this.run(job);
  }

  private async run(job: Job): Promise<void> {
    const { req, rec } = job;
    const pool = this.prefixPool;
    let hit: PrefixHit<S> | null = null;
    try {
      // Scoring a prompt needs the logits of every prompt position, which a pooled prefix does not hold;
      // shared steps' caches are not copied.
      hit = usesPrefixPool(req) ? pool.lookup(req.promptTokens, req.loops, this.cacheMode, req.cacheWindow) : null;
      const pooled = req.promptTokens.slice(0, pooledPromptLength(req));
      const wantCapture = pooled.length > 0 && pool.wants(pooled, req.loops, this.cacheMode, req.cacheWindow);
      const options: EngineRunOptions<S> = { onPromptLogprobs: job.onPromptLogprobs };
      if (hit) options.prefix = { snapshot: hit.snapshot, length: hit.length };
      if (wantCapture)
        options.capture = (snap) => void pool.insert(pooled, req.loops, this.cacheMode, req.cacheWindow, snap);
      const sink: TokenSink = (id, logprob) => {
        if (rec.times.firstToken === undefined) rec.times.firstToken = performance.now();
        job.tokens.push(id);
        const go = job.sink(id, logprob);
        if (go === false) job.sinkStopped = true;
        return go;
      };
      const res = await this.engine.generate(req, sink, job.signal, options);
      const now = performance.now();
      rec.times.engineStarted = Math.max(rec.times.started ?? now, now - res.wallMs);
      if (rec.times.firstToken === undefined && res.finishReason === "stop" && res.firstTokenMs > 0)
        rec.times.firstToken = rec.times.engineStarted + res.firstTokenMs; // the first sampled token was a stop
      // Every token the model ran counts, a cancelled request's too.
      for (const steps of res.exitSteps ?? []) this.metrics.exitSteps.observe(steps);
      if (res.finishReason === "cancelled") {
        transition(rec, "cancelled", this.metrics, now);
      } else if (res.finishReason === "error") {
        transition(rec, "errored", this.metrics, now);
      } else {
        this.learn(job, res, hit?.length ?? 0);
        if (res.speculative) {
          this.metrics.specDraftTokens.inc(res.speculative.draftTokens);
          this.metrics.specAcceptedTokens.inc(res.speculative.acceptedTokens);
        }
        transition(rec, "completed", this.metrics, now);
      }
      job.settleResult(res);
    } catch (e) {
      const err = e instanceof Error ? e : new Error(String(e));
      if (job.signal?.aborted) {
        transition(rec, "cancelled", this.metrics);
        job.settleResult({
          tokens: job.tokens.slice(),
          finishReason: "cancelled",
          promptTokens: req.promptTokens.length,
          wallMs: performance.now() - (rec.times.started ?? performance.now()),
          firstTokenMs: 0,
        });
      } else {
        transition(rec, "errored", this.metrics);
        job.settleResult(err);
      }
    } finally {
      hit?.done();
      this.detach(job);
      this.running.delete(job);
      this.kvBytesInUse -= job.kvBytes;
      this.metrics.kvCacheBytesInUse.set(this.kvBytesInUse);
      this.pump();
    }
  }

  /** Feeds a completed request's measured costs to the predictor. */
  private learn(job: Job, res: GenerateResult, reused: number): void {
    // A scored prompt also runs the output head on every position: not what a prefill costs.
    if (!(res.firstTokenMs > 0) || job.req.promptLogprobs) return;
    const extraStopStep = res.finishReason === "stop" && !job.sinkStopped ? 1 : 0; // a sampled stop token cost a step
    this.predictor.observe({
      prefillTokens: job.req.promptTokens.length - reused,
      loops: job.req.loops,
      prefillMs: res.firstTokenMs,
      decodeSteps: Math.max(0, res.tokens.length - 1 + extraStopStep),
      decodeMs: res.wallMs - res.firstTokenMs,
    });
  }

  private notifyIdle(): void {
    if (this.running.size > 0 || this.queue.size > 0) return;
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const w of waiters) w();
  }
}
