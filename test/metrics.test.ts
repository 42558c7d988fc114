import { describe, expect, test } from "bun:test";
import { LATENCY_BUCKETS_MS, ServiceMetrics } from "../src/metrics.ts";
import { BATCHING_SERIES, parsePrometheusText, sampleValue, SPEC_SERIES, SPECULATIVE_SERIES } from "./scheduler/prom_text.ts";

// The documented /metrics series (docs/http.md#ops), speculative-decoding counters included.
const SERVICE_SERIES = { ...SPEC_SERIES, ...SPECULATIVE_SERIES, ...BATCHING_SERIES };

describe("metrics", () => {
  test("exposition parses as Prometheus text with exactly the documented service_ series, names and types", async () => {
    const m = new ServiceMetrics({ maxSeqLen: 2048, defaultLoops: 8, upTimestampSeconds: 1_700_000_000 });
    const families = parsePrometheusText(await m.metricsText());
    const service = [...families.values()].filter((f) => f.name.startsWith("service_"));
    expect(Object.fromEntries(service.map((f) => [f.name, f.type]))).toEqual(SERVICE_SERIES);
    for (const f of service) expect(f.help?.length ?? 0).toBeGreaterThan(0);
    expect(sampleValue(families, "service_max_seq_len")).toBe(2048);
    expect(sampleValue(families, "service_default_loops")).toBe(8);
    expect(sampleValue(families, "service_up_timestamp_seconds")).toBe(1_700_000_000);
    // Counters and gauges show 0 before anything happens (not absent).
    for (const [name, type] of Object.entries(SERVICE_SERIES))
      if (type !== "histogram") expect(Number.isFinite(sampleValue(families, name))).toBe(true);
    // Counter names are exposed exactly as declared: no doubled suffix.
    expect(families.has("service_requests_submitted_total_total")).toBe(false);
    expect(m.contentType.startsWith("text/plain")).toBe(true);
  });

  test("histograms are in milliseconds with log-spaced buckets from 1 ms to 120 s", async () => {
    const m = new ServiceMetrics({ maxSeqLen: 64, defaultLoops: 2, processMetrics: false });
    m.requestWallMs.observe(0.5);
    m.requestWallMs.observe(1500);
    m.requestWallMs.observe(500_000);
    const fam = parsePrometheusText(await m.metricsText()).get("service_request_wall_ms");
    const les = fam!.samples.filter((s) => s.name.endsWith("_bucket")).map((s) => s.labels.le);
    expect(les).toEqual([...LATENCY_BUCKETS_MS.map(String), "+Inf"]);
    const bucket = (le: string) => fam!.samples.find((s) => s.labels.le === le)!.value;
    expect(bucket("1")).toBe(1);
    expect(bucket("2500")).toBe(2);
    expect(bucket("120000")).toBe(2);
    expect(bucket("+Inf")).toBe(3);
    expect(fam!.samples.find((s) => s.name === "service_request_wall_ms_sum")!.value).toBe(501500.5);
  });

  test("includes prom-client's default process metrics", async () => {
    const families = parsePrometheusText(await new ServiceMetrics({ maxSeqLen: 64, defaultLoops: 2 }).metricsText());
    expect(families.get("process_cpu_seconds_total")?.type).toBe("counter");
    expect(families.get("process_resident_memory_bytes")?.type).toBe("gauge");
    expect(families.get("process_start_time_seconds")?.type).toBe("gauge");
  });

  test("each instance has its own registry", async () => {
    const a = new ServiceMetrics({ maxSeqLen: 64, defaultLoops: 2 });
    const b = new ServiceMetrics({ maxSeqLen: 128, defaultLoops: 4 });
    a.submitted.inc(3);
    const fa = parsePrometheusText(await a.metricsText());
    const fb = parsePrometheusText(await b.metricsText());
    expect(sampleValue(fa, "service_requests_submitted_total")).toBe(3);
    expect(sampleValue(fb, "service_requests_submitted_total")).toBe(0);
    expect(sampleValue(fb, "service_max_seq_len")).toBe(128);
  });

  test("the test parser rejects malformed exposition", () => {
    expect(() => parsePrometheusText("x 1\n")).toThrow(/no TYPE/);
    expect(() => parsePrometheusText("# TYPE x counter\nx{a=1} 1\n")).toThrow(/quoted/);
    expect(() => parsePrometheusText("# TYPE x counter\nx one\n")).toThrow(/value/);
    expect(() =>
      parsePrometheusText('# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n'),
    ).toThrow(/cumulative/);
  });
});
