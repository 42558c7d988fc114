// GET /metrics of a real server process (docs/http.md#ops, docs/scheduling.md):
// the exposition parses as Prometheus text, carries exactly the documented series
// with their types, and its counters, gauges and histograms follow what
// requests do: complete, error, get rejected or cancelled.
import { beforeAll, describe, expect, test } from "bun:test";
import { GenerateResponse } from "../../src/wire/responses.ts";
import { expectErrorShape, expectSchema } from "../helpers/http.ts";
import {
  delta,
  expect503,
  LIFECYCLE,
  poisonedModelPath,
  PROMPT,
  probed,
  QUEUE_MAX_SEQ_LEN,
  queueingServerForTests,
  schedulingTests,
  SLOW,
} from "../helpers/scheduling.ts";
import { TINY } from "../helpers/models.ts";
import { serverForTests } from "../helpers/server.ts";
import { BATCHING_SERIES, type Family, SPEC_SERIES, SPECULATIVE_SERIES } from "../scheduler/prom_text.ts";

schedulingTests();

const HISTOGRAMS = Object.keys(SPEC_SERIES).filter((n) => SPEC_SERIES[n] === "histogram");

/** Every documented series is declared with its exact type and a HELP line, and histograms are complete. */
function expectSpecFamilies(families: Map<string, Family>): void {
  for (const [name, type] of Object.entries({ ...SPEC_SERIES, ...BATCHING_SERIES })) {
    const f = families.get(name);
    if (!f) throw new Error(`/metrics lacks ${name}`);
    expect({ name, type: f.type }).toEqual({ name, type });
    expect(f.help?.length ?? 0).toBeGreaterThan(0);
    if (type === "histogram") {
      const names = new Set(f.samples.map((x) => x.name));
      expect([...names].sort()).toEqual([`${name}_bucket`, `${name}_count`, `${name}_sum`]);
      const les = f.samples.filter((x) => x.name === `${name}_bucket`).map((x) => x.labels.le);
      expect(les.at(-1)).toBe("+Inf");
      expect(les.length).toBeGreaterThan(5);
    } else {
      // Unlabelled, present (0 before anything happened, never absent).
      expect(f.samples).toHaveLength(1);
      expect(f.samples[0].name).toBe(name);
      expect(f.samples[0].labels).toEqual({});
    }
  }
  // No other service_ series than the documented ones; no doubled _total.
  const service = [...families.values()].filter((f) => f.name.startsWith("service_"));
  expect(Object.fromEntries(service.map((f) => [f.name, f.type]))).toEqual({ ...SPEC_SERIES, ...SPECULATIVE_SERIES, ...BATCHING_SERIES });
}

describe("/metrics with a model loaded", () => {
  let startedAt: number;
  beforeAll(() => {
    startedAt = Date.now() / 1000; // before the server's own beforeAll starts it
  });
  const s = queueingServerForTests();

  test("parses as Prometheus text format with every documented series, its exact TYPE and a HELP line", async () => {
    const res = await fetch(`${s.url}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toStartWith("text/plain");
    const families = await s.scrape();
    expectSpecFamilies(families);
    // prom-client's default process metrics are there too.
    expect(families.get("process_cpu_seconds_total")?.type).toBe("counter");
  });

  test("gauges report the configuration: service_max_seq_len, service_default_loops, service_up_timestamp_seconds", async () => {
    const m = await s.metrics(["service_max_seq_len", "service_default_loops", "service_up_timestamp_seconds"]);
    expect(m.service_max_seq_len).toBe(QUEUE_MAX_SEQ_LEN);
    expect(m.service_default_loops).toBe(SLOW.loops ?? TINY.loops);
    expect(m.service_up_timestamp_seconds).toBeGreaterThanOrEqual(Math.floor(startedAt));
    expect(m.service_up_timestamp_seconds).toBeLessThanOrEqual(Date.now() / 1000);
  });

  test("completed requests move submitted, completed and every histogram's _count and _sum", async () => {
    const keys = [...LIFECYCLE, ...HISTOGRAMS.flatMap((h) => [`${h}_count`, `${h}_sum`])];
    const before = await s.metrics(keys);
    await s.generateOk({ prompt: PROMPT, max_tokens: 4 });
    await s.generateOk({ prompt: [464, 2068, 7586], max_tokens: 3 });
    const events = await (await s.openStream({ prompt: PROMPT, max_tokens: 5 })).readAll();
    expect(events.at(-1)).toBe("[DONE]");
    const after = await s.metrics(keys);
    expect(after.service_requests_submitted_total - before.service_requests_submitted_total).toBe(3);
    expect(after.service_requests_completed_total - before.service_requests_completed_total).toBe(3);
    for (const k of ["rejected", "errored", "cancelled"])
      expect(after[`service_requests_${k}_total`]).toBe(before[`service_requests_${k}_total`]);
    for (const h of HISTOGRAMS) {
      expect({ h, n: after[`${h}_count`] - before[`${h}_count`] }).toEqual({ h, n: 3 });
      expect(after[`${h}_sum`]).toBeGreaterThanOrEqual(before[`${h}_sum`]);
    }
    // The wall time of three generations on this model is real time, not zero.
    expect(after.service_request_wall_ms_sum).toBeGreaterThan(before.service_request_wall_ms_sum);
    const rest = await s.metrics(["service_queue_depth", "service_requests_in_flight"]);
    expect(rest).toEqual({ service_queue_depth: 0, service_requests_in_flight: 0 });
  });

  test("service_requests_in_flight and service_queue_depth count the running and the waiting requests", async () => {
    const blocker = await s.startBlocker(8000);
    expect(await s.metric("service_requests_in_flight")).toBe(1);
    expect(await s.metric("service_queue_depth")).toBe(0);
    const queued = [s.generateOk({ prompt: PROMPT, max_tokens: 2 }), s.generateOk({ prompt: PROMPT, max_tokens: 2 })];
    await s.waitForQueueDepth(2);
    expect(await s.metric("service_requests_in_flight")).toBe(1);
    const before = await s.metric("service_requests_cancelled_total");
    await blocker.cancel();
    await Promise.all(queued);
    const after = await s.metrics(["service_queue_depth", "service_requests_in_flight", "service_requests_cancelled_total"]);
    expect(after).toEqual({ service_queue_depth: 0, service_requests_in_flight: 0, service_requests_cancelled_total: before + 1 });
  });

  test("a rejected request moves submitted and rejected only; a request failing validation never reaches the scheduler", async () => {
    await s.generateOk({ prompt: PROMPT, max_tokens: 16 }); // the latency predictor is primed
    const keys = [...LIFECYCLE, "service_request_wall_ms_count", "service_queue_wait_ms_count"] as const;
    const before = await s.metrics(keys);
    await expect503(await s.post("/generate", { prompt: PROMPT, max_tokens: 4000, slo_ms: 1 }), "latency_target");
    // 400 (length) and 422 (shape) are answered before admission.
    expect((await s.post("/generate", { prompt: PROMPT, max_tokens: QUEUE_MAX_SEQ_LEN })).status).toBe(400);
    expect((await s.post("/generate", { max_tokens: 4 })).status).toBe(422);
    expect(delta(await s.metrics(keys), before)).toEqual({
      service_requests_submitted_total: 1,
      service_requests_rejected_total: 1,
      service_requests_completed_total: 0,
      service_requests_errored_total: 0,
      service_requests_cancelled_total: 0,
      service_queue_wait_ms_count: 0, // never ran
      service_request_wall_ms_count: 0,
    });
  });
});

describe("/metrics when the engine fails", () => {
  const s = probed(serverForTests(() => ({ modelPath: poisonedModelPath() })));

  test("an engine error moves submitted and errored, not completed, and no completion latency is recorded", async () => {
    const keys = [...LIFECYCLE, "service_request_wall_ms_count"] as const;
    const before = await s.metrics(keys);
    // Non-streaming: finish_reason "error" is allowed there; otherwise an error status in the common shape.
    const res = await s.post("/generate", { prompt: PROMPT, max_tokens: 4 });
    const body: unknown = await res.json();
    if (res.status !== 200) expectErrorShape(body);
    else {
      expectSchema(GenerateResponse, body);
      expect(body.finish_reason).toBe("error");
    }
    // Streaming: the stream was opened, so the error arrives as an event before [DONE].
    const events = await (await s.openStream({ prompt: PROMPT, max_tokens: 4 })).readAll();
    expect(events.at(-1)).toBe("[DONE]");
    expectErrorShape(JSON.parse(events.at(-2) as string));
    expect(delta(await s.metrics(keys), before)).toMatchObject({
      service_requests_submitted_total: 2,
      service_requests_errored_total: 2,
      service_requests_completed_total: 0,
      service_request_wall_ms_count: 0,
    });
    // The failure was the request's, not the server's.
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
  });
});

describe("/metrics without a model", () => {
  const s = probed(serverForTests({ modelPath: null }));

  test("still answers 200 in Prometheus text with every documented series while /healthz and /generate answer 503", async () => {
    expect((await fetch(`${s.url}/healthz`)).status).toBe(503);
    await expect503(await s.post("/generate", { prompt: PROMPT, max_tokens: 4 }), "model_not_loaded");
    const families = await s.scrape();
    expectSpecFamilies(families);
    const m = await s.metrics([...LIFECYCLE, "service_max_seq_len", "service_queue_depth", "service_requests_in_flight"]);
    expect(m.service_max_seq_len).toBe(2048); // SERVICE_MAX_SEQ_LEN's default
    // Nothing reached a scheduler: there is none.
    for (const k of LIFECYCLE) expect({ k, v: m[k] }).toEqual({ k, v: 0 });
    expect(m.service_queue_depth).toBe(0);
    expect(m.service_requests_in_flight).toBe(0);
  });
});
