// The service's Prometheus registry: exactly the series docs/http.md lists
// for /metrics, plus the speculative-decoding token counters and prom-client's
// default process metrics. One registry per server instance (never the
// global one), so tests can run several servers in one process.
//
// Clocks: every interval is measured with performance.now() (monotonic), so
// a wall-clock step never produces a negative or inflated latency.
//
// What each histogram measures (all in milliseconds):
//   service_queue_wait_ms     submission accepted → request leaves the queue
//                             to start running (observed for every request
//                             that starts; ~0 when the engine was idle).
//   service_dispatch_ms       request leaves the queue → the engine begins its
//                             first step: admission/dispatch overhead (prefix
//                             pool lookup, engine hand-off), never model work.
//   service_first_token_ms    submission accepted → first generated token
//                             handed to the client: the time to first token a
//                             client sees (queue wait + dispatch + prefill).
//                             Observed for completed and cancelled requests
//                             that produced a token.
//   service_request_wall_ms   submission accepted → result ready, for
//                             completed requests only (a cancellation or an
//                             engine error would skew the latency picture).
// And one histogram of counts: service_batch_rows, the rows (requests) each
// batched kernel call advanced.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";

/**
 * Latency buckets for LLM serving, roughly log-spaced from 1 ms to 120 s:
 * sub-10 ms covers dispatch and single decode steps of small models; the
 * 1-120 s range covers long prompts and long generations on CPU.
 */
export const LATENCY_BUCKETS_MS = [
  1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 20000, 30000, 60000, 120000,
] as const;

/** Rows per batched kernel call: 1 to LS_BATCH_MAX_ROWS. */
const BATCH_ROWS_BUCKETS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256] as const;
/** Steps of a token under early exit: every depth up to 8, then coarser up to LS_MAX_LOOPS. */
const EXIT_STEPS_BUCKETS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64] as const;

/** Dispatch overhead is normally well under a millisecond: finer low buckets. */
const DISPATCH_BUCKETS_MS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000] as const;

export interface ServiceMetricsOptions {
  maxSeqLen: number; // SERVICE_MAX_SEQ_LEN
  defaultLoops: number; // the model's default loop depth
  /** Unix seconds at the service start; defaults to now. */
  upTimestampSeconds?: number;
  /** prom-client default process metrics (cpu, memory, fds, event loop); default true. */
  processMetrics?: boolean;
}

export class ServiceMetrics {
  readonly registry = new Registry();
  // Each series is registered as its field is initialized: /metrics lists them in this order.

  // ---- gauges ----
  readonly maxSeqLen = this.gauge("service_max_seq_len", "Maximum prompt plus generated length, in tokens (SERVICE_MAX_SEQ_LEN).");
  readonly defaultLoops = this.gauge("service_default_loops", "Default loop depth of the loaded model.");
  readonly upTimestampSeconds = this.gauge("service_up_timestamp_seconds", "Unix time in seconds at which the service started.");
  /** Requests in state queued. */
  readonly queueDepth = this.gauge("service_queue_depth", "Requests waiting in the scheduler queue.");
  /** Requests in state running (up to SERVICE_MAX_BATCH). */
  readonly requestsInFlight = this.gauge("service_requests_in_flight", "Requests currently running on the engine (batched together).");
  readonly kvCacheBudgetBytes = this.gauge("service_kv_cache_budget_bytes", "Bytes the running requests' key/value caches may take together (SERVICE_KV_CACHE_MB).");
  /** Reserved for the running requests' caches. */
  readonly kvCacheBytesInUse = this.gauge("service_kv_cache_bytes_in_use", "Bytes of key/value cache reserved for the running requests (each its most: prompt plus max_tokens), counted against the budget.");
  private kvAllocatedSource: () => number = () => 0;
  /** What their caches hold now, read at each scrape. */
  readonly kvCacheBytesAllocated = this.gauge("service_kv_cache_bytes_allocated", "Bytes of key/value cache the running requests' sessions hold now (allocated as positions arrive).", () => this.kvAllocatedSource());

  // ---- counters (names end in _total as the documented series do; prom-client
  // adds no suffix in the Prometheus text format) ----
  readonly submitted = this.counter("service_requests_submitted_total", "Requests submitted to the scheduler.");
  readonly rejected = this.counter("service_requests_rejected_total", "Requests refused with 503: queue full, latency target unattainable, or shutting down.");
  readonly completed = this.counter("service_requests_completed_total", "Requests that finished generating.");
  readonly errored = this.counter("service_requests_errored_total", "Requests that failed with an engine error.");
  readonly cancelled = this.counter("service_requests_cancelled_total", "Requests cancelled by the client, queued or running.");
  readonly prefixPoolHits = this.counter("service_prefix_pool_hits_total", "Requests that reused a pooled key/value prefix instead of prefilling it.");
  readonly specDraftTokens = this.counter("service_spec_draft_tokens_total", "Tokens proposed by speculative draft passes.");
  readonly specAcceptedTokens = this.counter("service_spec_accepted_tokens_total", "Draft tokens accepted by speculative verify passes.");
  readonly generatedTokens = this.counter("service_generated_tokens_total", "Tokens sampled by batched engine steps (speculative cycles not included).");
  readonly engineStepSeconds = this.counter("service_engine_step_seconds_total", "Seconds the batched kernel steps took. Without pipelined steps the event loop waits for each, so process CPU time beyond this is the server's own work (HTTP, streams, text, scheduling); pipelined, a step counts from its begin to its end.");
  readonly promptTokensRun = this.counter("service_prompt_tokens_total", "Prompt tokens run through the model by batched engine steps (pooled prefixes not included).");
  readonly bodyTimeouts = this.counter("service_request_body_timeouts_total", "Requests whose body stalled for SERVICE_BODY_TIMEOUT_MS: answered 408, connection closed.");

  // ---- histograms (milliseconds; see the file header for each interval) ----
  readonly queueWaitMs = this.histogram("service_queue_wait_ms", "Milliseconds from submission to leaving the queue to run.", LATENCY_BUCKETS_MS);
  readonly dispatchMs = this.histogram("service_dispatch_ms", "Milliseconds from leaving the queue to the engine's first step (admission/dispatch overhead).", DISPATCH_BUCKETS_MS);
  readonly firstTokenMs = this.histogram("service_first_token_ms", "Milliseconds from submission to the first generated token.", LATENCY_BUCKETS_MS);
  readonly requestWallMs = this.histogram("service_request_wall_ms", "Milliseconds from submission to the result of a completed request.", LATENCY_BUCKETS_MS);
  readonly batchRows = this.histogram("service_batch_rows", "Requests advanced by each batched kernel call.", BATCH_ROWS_BUCKETS);
  readonly exitSteps = this.histogram("service_exit_steps", "Steps each generated token of an early-exit request ran before its exit gate stopped it (exit_threshold).", EXIT_STEPS_BUCKETS);

  constructor(opts: ServiceMetricsOptions) {
    this.maxSeqLen.set(opts.maxSeqLen);
    this.defaultLoops.set(opts.defaultLoops);
    this.upTimestampSeconds.set(opts.upTimestampSeconds ?? Date.now() / 1000);
    this.queueDepth.set(0);
    this.requestsInFlight.set(0);
    this.kvCacheBudgetBytes.set(0);
    this.kvCacheBytesInUse.set(0);

    if (opts.processMetrics ?? true) collectDefaultMetrics({ register: this.registry });
  }

  /** A gauge; with `read`, one set from it at each scrape. */
  private gauge(name: string, help: string, read?: () => number): Gauge {
    const sampled = read ? { collect: function (this: Gauge) { this.set(read()); } } : {};
    return new Gauge({ name, help, registers: [this.registry], ...sampled });
  }

  private counter(name: string, help: string): Counter {
    return new Counter({ name, help, registers: [this.registry] });
  }

  private histogram(name: string, help: string, buckets: readonly number[]): Histogram {
    return new Histogram({ name, help, buckets: [...buckets], registers: [this.registry] });
  }

  /** Where service_kv_cache_bytes_allocated is read from at each scrape (the engine's running sessions). */
  watchKvCacheAllocated(source: () => number): void {
    this.kvAllocatedSource = source;
  }

  /** Content-Type of metricsText(): Prometheus text format 0.0.4. */
  get contentType(): string {
    return this.registry.contentType;
  }

  /** The whole registry in the Prometheus text exposition format. */
  metricsText(): Promise<string> {
    return this.registry.metrics();
  }
}
