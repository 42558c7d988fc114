// The metrics panel's reading of /metrics (src/playground/prom.ts), on the
// text the server's own registry writes.
import { describe, expect, test } from "bun:test";
import { ServiceMetrics } from "../../src/metrics.ts";
import { CounterRate, parsePrometheus } from "../../src/playground/prom.ts";

describe("parsePrometheus", () => {
  test("reads the service's gauges and counters from its registry's text", async () => {
    const metrics = new ServiceMetrics({ maxSeqLen: 512, defaultLoops: 8, processMetrics: false });
    metrics.queueDepth.set(3);
    metrics.requestsInFlight.set(1);
    metrics.completed.inc(7);
    const samples = parsePrometheus(await metrics.metricsText());
    expect(samples.get("service_queue_depth")).toBe(3);
    expect(samples.get("service_requests_in_flight")).toBe(1);
    expect(samples.get("service_requests_completed_total")).toBe(7);
    expect(samples.get("service_default_loops")).toBe(8);
    expect(samples.get('service_queue_wait_ms_bucket{le="+Inf"}')).toBe(0);
  });

  test("labels with spaces, timestamps, Inf and NaN in any case; comments and junk skipped", () => {
    const samples = parsePrometheus(
      ["# HELP x y", 'a{path="/v1 x",code="200"} 12 1700000000000', "b +Inf", "c -inf", "d Nan", "e 1.5e3", "not a sample line", "f"].join("\n"),
    );
    expect(samples.get('a{path="/v1 x",code="200"}')).toBe(12);
    expect(samples.get("b")).toBe(Number.POSITIVE_INFINITY);
    expect(samples.get("c")).toBe(Number.NEGATIVE_INFINITY);
    expect(samples.get("d")).toBeNaN();
    expect(samples.get("e")).toBe(1500);
    expect(samples.has("f")).toBe(false);
    expect(samples.size).toBe(5);
  });
});

describe("CounterRate", () => {
  test("per second from consecutive scrapes; nothing from the first or after a counter reset", () => {
    const r = new CounterRate();
    expect(r.sample(10, 1000)).toBeNull();
    expect(r.sample(14, 3000)).toBe(2);
    expect(r.sample(14, 5000)).toBe(0);
    expect(r.sample(2, 7000)).toBeNull(); // the server restarted
    expect(r.sample(5, 8000)).toBe(3);
  });
});
