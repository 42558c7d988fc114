// The request counters of a running server's /metrics, read once nothing is
// queued or running, and the identity they must satisfy (src/metrics.ts):
// every submitted request ends exactly one way,
//   submitted = completed + rejected + errored + cancelled.
// Shared by the fuzzers (fuzz/properties.ts) and the soak (bench/soak.ts).
import { parsePrometheusText, sampleValue } from "../scheduler/prom_text.ts";

export interface RequestCounters {
  submitted: number;
  completed: number;
  rejected: number;
  errored: number;
  cancelled: number;
  /** Whether the server had settled (queue empty, nothing running) when they were read. */
  settled: boolean;
}

/** Reads the counters, first waiting up to waitMs for the queue and the engine to empty. */
export async function settledRequestCounters(baseUrl: string, waitMs = 30_000): Promise<RequestCounters> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const families = parsePrometheusText(await (await fetch(`${baseUrl}/metrics`)).text());
    const v = (name: string) => sampleValue(families, name);
    const settled = v("service_queue_depth") === 0 && v("service_requests_in_flight") === 0;
    if (settled || Date.now() > deadline) {
      return {
        submitted: v("service_requests_submitted_total"),
        completed: v("service_requests_completed_total"),
        rejected: v("service_requests_rejected_total"),
        errored: v("service_requests_errored_total"),
        cancelled: v("service_requests_cancelled_total"),
        settled,
      };
    }
    await Bun.sleep(50);
  }
}

export function identityHolds(c: RequestCounters): boolean {
  return c.submitted === c.completed + c.rejected + c.errored + c.cancelled;
}

export function describeCounters(c: RequestCounters): string {
  return (
    `submitted ${c.submitted} ${identityHolds(c) ? "=" : "!="} completed ${c.completed} + rejected ${c.rejected} + ` +
    `errored ${c.errored} + cancelled ${c.cancelled}${c.settled ? "" : " (read before the server settled)"}`
  );
}
