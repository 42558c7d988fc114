// Request lifecycle (docs/scheduling.md):
//
//   queued ──► running ──► completed | errored | cancelled
//      └─────► rejected | cancelled
//
// Every state change goes through transition(), which refuses anything not
// drawn above and is the only code that moves the lifecycle metrics. The
// gauges are therefore exact counts of records in a state: queue_depth =
// records in `queued`, requests_in_flight = records in `running`.
import type { ServiceMetrics } from "../metrics.ts";

export type RequestState = "queued" | "running" | "completed" | "errored" | "cancelled" | "rejected";

const TERMINAL_STATES: ReadonlySet<RequestState> = new Set(["completed", "errored", "cancelled", "rejected"]);

const ALLOWED: Record<RequestState, readonly RequestState[]> = {
  queued: ["running", "rejected", "cancelled"],
  running: ["completed", "errored", "cancelled"],
  completed: [],
  errored: [],
  cancelled: [],
  rejected: [],
};

export class InvalidTransitionError extends Error {}

/** Timestamps are performance.now() milliseconds (monotonic). */
export interface RequestTimes {
  submitted: number; // accepted by submit()
  started?: number; // left the queue (state running)
  engineStarted?: number; // engine's first step began
  firstToken?: number; // first generated token handed to the sink
  finished?: number; // terminal state reached
}

export class RequestRecord {
  state: RequestState = "queued";
  readonly times: RequestTimes;

  constructor(
    readonly id: number,
    readonly priority: number,
    now: number,
  ) {
    this.times = { submitted: now };
  }

  get terminal(): boolean {
    return TERMINAL_STATES.has(this.state);
  }
}

/**
 * Creates a record in state `queued` and counts the submission. Every
 * submission, admitted or not, is counted here exactly once, so
 * submitted = completed + rejected + errored + cancelled once all are done.
 */
export function createRequest(id: number, priority: number, metrics: ServiceMetrics, now = performance.now()): RequestRecord {
  const rec = new RequestRecord(id, priority, now);
  metrics.submitted.inc();
  metrics.queueDepth.inc();
  return rec;
}

/** Moves `rec` to `to`, validating the edge and updating counters, gauges and histograms. */
export function transition(rec: RequestRecord, to: RequestState, metrics: ServiceMetrics, now = performance.now()): void {
  const from = rec.state;
  if (!ALLOWED[from].includes(to)) throw new InvalidTransitionError(`request ${rec.id}: cannot go from ${from} to ${to}`);
  rec.state = to;
  const t = rec.times;

  if (from === "queued") metrics.queueDepth.dec();
  if (from === "running") metrics.requestsInFlight.dec();

  switch (to) {
    case "running":
      t.started = now;
      metrics.requestsInFlight.inc();
      metrics.queueWaitMs.observe(now - t.submitted);
      return;
    case "rejected":
      t.finished = now;
      metrics.rejected.inc();
      return;
    case "completed":
      metrics.completed.inc();
      metrics.requestWallMs.observe(now - t.submitted);
      break;
    case "errored":
      metrics.errored.inc();
      break;
    case "cancelled":
      metrics.cancelled.inc();
      break;
  }
  // A terminal state after running (or a cancellation while queued).
  t.finished = now;
  if (from !== "running") return;
  if (t.engineStarted !== undefined && t.started !== undefined)
    metrics.dispatchMs.observe(Math.max(0, t.engineStarted - t.started));
  if (t.firstToken !== undefined && to !== "errored") metrics.firstTokenMs.observe(t.firstToken - t.submitted);
}
