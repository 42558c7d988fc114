import { describe, expect, test } from "bun:test";
import { ServiceMetrics } from "../../src/metrics.ts";
import { createRequest, InvalidTransitionError, type RequestState, transition } from "../../src/scheduler/lifecycle.ts";
import { parsePrometheusText, sampleValue } from "./prom_text.ts";

const metrics = () => new ServiceMetrics({ maxSeqLen: 64, defaultLoops: 2, processMetrics: false });
const value = async (m: ServiceMetrics, name: string) => sampleValue(parsePrometheusText(await m.metricsText()), name);

describe("request lifecycle", () => {
  test("allows exactly the edges queued→running→completed|errored|cancelled and queued→rejected|cancelled", () => {
    const all: RequestState[] = ["queued", "running", "completed", "errored", "cancelled", "rejected"];
    const allowed = new Set([
      "queued>running",
      "queued>rejected",
      "queued>cancelled",
      "running>completed",
      "running>errored",
      "running>cancelled",
    ]);
    // Reach each state by a legal path, then try every edge out of it.
    const pathTo: Record<RequestState, RequestState[]> = {
      queued: [],
      running: ["running"],
      completed: ["running", "completed"],
      errored: ["running", "errored"],
      cancelled: ["cancelled"],
      rejected: ["rejected"],
    };
    for (const from of all)
      for (const to of all) {
        const m = metrics();
        const rec = createRequest(1, 0, m);
        for (const s of pathTo[from]) transition(rec, s, m);
        if (allowed.has(`${from}>${to}`)) {
          transition(rec, to, m);
          expect(rec.state).toBe(to);
        } else {
          expect(() => transition(rec, to, m)).toThrow(InvalidTransitionError);
          expect(rec.state).toBe(from);
        }
      }
  });

  test("gauges count records per state and terminal states move their counters", async () => {
    const m = metrics();
    const a = createRequest(1, 0, m);
    const b = createRequest(2, 0, m);
    const c = createRequest(3, 0, m);
    expect(await value(m, "service_queue_depth")).toBe(3);
    transition(a, "running", m);
    expect(await value(m, "service_queue_depth")).toBe(2);
    expect(await value(m, "service_requests_in_flight")).toBe(1);
    a.times.engineStarted = a.times.started! + 0.2;
    a.times.firstToken = a.times.started! + 5;
    transition(a, "completed", m);
    transition(b, "rejected", m);
    transition(c, "cancelled", m);
    expect(await value(m, "service_queue_depth")).toBe(0);
    expect(await value(m, "service_requests_in_flight")).toBe(0);
    expect(await value(m, "service_requests_submitted_total")).toBe(3);
    expect(await value(m, "service_requests_completed_total")).toBe(1);
    expect(await value(m, "service_requests_rejected_total")).toBe(1);
    expect(await value(m, "service_requests_cancelled_total")).toBe(1);
    expect(await value(m, "service_queue_wait_ms_count")).toBe(1);
    expect(await value(m, "service_dispatch_ms_count")).toBe(1);
    expect(await value(m, "service_first_token_ms_count")).toBe(1);
    expect(await value(m, "service_request_wall_ms_count")).toBe(1);
  });
});
