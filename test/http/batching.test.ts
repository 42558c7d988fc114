// Continuous batching through HTTP (docs/batching.md), on the trained model:
// many concurrent requests of every kind, arriving at different times, each
// get exactly the tokens they get when the server runs one request at a
// time, with 1 and with 2 kernel threads, with steps pipelined or not. The batch metrics count what ran,
// a request waits in the queue while its key/value cache does not fit the
// budget, and one larger than the whole budget is refused.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { GenerateResponse, GenerateStreamEvent, SpeculativeResponse } from "../../src/wire/responses.ts";
import { TRAINED_MODEL_PATH } from "../../src/model/trained.ts";
import { expectErrorShape, jsonBody, sseEvents } from "../helpers/http.ts";
import { NativeModel } from "../../src/engine/binding.ts";
import { ensureLibrary, LIB } from "../helpers/kernels.ts";
import { metrics, waitForQueueDepth } from "../helpers/scheduling.ts";
import { serverForTests, type TestServer } from "../helpers/server.ts";

setDefaultTimeout(120_000);

const BASE = { SERVICE_MAX_SEQ_LEN: "512", SERVICE_PREFIX_POOL_CAPACITY: "8" };

const PROMPTS = [
  "In the beginning God created the heaven and the earth.",
  "And the LORD spake unto Moses, saying,",
  "Blessed are the poor in spirit: for theirs is the kingdom of heaven.",
  "The LORD is my shepherd; I shall not want.",
  "And it came to pass",
  "Thus saith the LORD of hosts, the God of Israel; Amend your ways and your doings, and I will cause you to dwell in this place. Trust ye not in lying words, saying, The temple of the LORD, The temple of the LORD, The temple of the LORD, are these.",
];

interface Job {
  route: "/generate" | "/generate/speculative";
  body: Record<string, unknown>;
  delayMs: number;
}

/** 20 requests: every prompt, depths 1 to 12, greedy and seeded sampling, stops, windows, priorities, streams, repeats (prefix pool hits), speculative ones. */
function jobs(): Job[] {
  return Array.from({ length: 20 }, (_, i) => {
    const body: Record<string, unknown> = {
      prompt: PROMPTS[i % PROMPTS.length] + (i >= 12 ? "" : ` ${i}`),
      max_tokens: 6 + ((i * 7) % 17),
      loops: [8, 1, 4, 12, 2, 8, 6][i % 7],
      priority: i % 3,
    };
    if (i % 4 === 1) Object.assign(body, { temperature: 0.9, top_k: 40, top_p: 0.95, sample_seed: 1000 + i });
    if (i % 5 === 2) body.repetition_penalty = 1.3;
    if (i % 6 === 3) body.cache_window = 16;
    if (i % 7 === 4) body.stop = i % 2 ? [" and", "."] : [13, 11];
    if (i % 3 === 2) body.stream = true;
    const speculative = i % 9 === 5;
    if (speculative) Object.assign(body, { draft_loops: 2, verify_loops: body.loops, draft_ahead: 3, stream: false, temperature: 0 });
    return { route: speculative ? "/generate/speculative" : "/generate", body, delayMs: (i * 37) % 120 };
  });
}

/** A job's generated token ids (a stream's events put together). */
async function run(s: TestServer, job: Job): Promise<number[]> {
  const res = await s.post(job.route, job.body);
  if (job.body.stream) {
    expect(res.status).toBe(200);
    return sseEvents(await res.text(), GenerateStreamEvent)
      .map((e) => e.token_id)
      .filter((id) => id >= 0);
  }
  return (await jsonBody(res, job.route === "/generate" ? GenerateResponse : SpeculativeResponse)).tokens;
}

const solo = serverForTests({ modelPath: TRAINED_MODEL_PATH, env: { ...BASE, SERVICE_MAX_BATCH: "1", SERVICE_THREADS: "2" } });
let reference: number[][];

beforeAll(async () => {
  reference = [];
  for (const job of jobs()) reference.push(await run(solo, job)); // strictly one at a time
});

describe("every request of a busy batch is bit-identical to its solo run", () => {
  for (const [threads, pipelined] of [["1", false], ["2", false], ["1", true], ["2", true]] as const) {
    const batched = serverForTests({
      modelPath: TRAINED_MODEL_PATH,
      env: { ...BASE, SERVICE_MAX_BATCH: "16", SERVICE_PREFILL_CHUNK: "16", SERVICE_THREADS: threads, SERVICE_PIPELINE_STEPS: pipelined ? "1" : "0" },
    });
    test(`20 concurrent mixed requests, ${threads} thread(s)${pipelined ? ", steps pipelined" : ""}`, async () => {
      const series = ["service_batch_rows_count", "service_batch_rows_sum", "service_prefix_pool_hits_total", "service_engine_step_seconds_total"];
      const before = await metrics(batched, series);
      const started = performance.now();
      const all = jobs();
      const got = await Promise.all(all.map(async (job) => (await Bun.sleep(job.delayMs), run(batched, job))));
      all.forEach((job, i) => expect(got[i], `request ${i}: ${JSON.stringify(job.body)}`).toEqual(reference[i]));
      const wallSeconds = (performance.now() - started) / 1000;
      const after = await metrics(batched, series);
      const calls = after.service_batch_rows_count - before.service_batch_rows_count;
      const rows = after.service_batch_rows_sum - before.service_batch_rows_sum;
      // Requests really shared calls: fewer kernel calls than rows.
      expect(calls).toBeGreaterThan(0);
      expect(rows / calls).toBeGreaterThan(1.5);
      expect(after.service_prefix_pool_hits_total).toBeGreaterThan(before.service_prefix_pool_hits_total);
      // The kernel calls took time, and no more than the run itself.
      const kernelSeconds = after.service_engine_step_seconds_total - before.service_engine_step_seconds_total;
      expect(kernelSeconds).toBeGreaterThan(0);
      expect(kernelSeconds).toBeLessThan(wallSeconds);
    });
  }
});

describe("the key/value cache budget", () => {
  // A budget of 1.5 full-context caches at loops 8 (measured by the library itself).
  let fullContext = 0;
  const tight = serverForTests(() => {
    ensureLibrary();
    const m = NativeModel.load(LIB, TRAINED_MODEL_PATH, 1, "auto");
    fullContext = m.sessionCacheBytes(512, 8, 0);
    m.close();
    return { modelPath: TRAINED_MODEL_PATH, env: { ...BASE, SERVICE_MAX_BATCH: "8", SERVICE_KV_CACHE_MB: String(Math.ceil((1.5 * fullContext) / 2 ** 20)) } };
  });
  const long = { prompt: PROMPTS[0], max_tokens: 480, loops: 8 };

  test("requests whose caches do not fit together wait in the queue, then run; the gauges report budget and use", async () => {
    const budget = (await metrics(tight, ["service_kv_cache_budget_bytes"])).service_kv_cache_budget_bytes;
    expect(budget).toBeGreaterThanOrEqual(1.5 * fullContext);
    // Three short ones fit together.
    const three = await Promise.all([1, 2, 3].map(() => tight.post("/generate", { ...long, max_tokens: 40 })));
    for (const r of three) expect((await jsonBody(r, GenerateResponse)).tokens).toHaveLength(40);
    // Two long ones do not: the second waits for the first.
    const both = [1, 2].map(() => tight.post("/generate", long));
    await waitForQueueDepth(tight, 1);
    const running = await metrics(tight, ["service_requests_in_flight", "service_kv_cache_bytes_in_use", "service_kv_cache_bytes_allocated"]);
    expect(running.service_requests_in_flight).toBe(1);
    expect(running.service_kv_cache_bytes_in_use).toBeGreaterThan(0.9 * fullContext);
    expect(running.service_kv_cache_bytes_in_use).toBeLessThanOrEqual(budget);
    // The running session holds what it has been fed, at most its reservation.
    expect(running.service_kv_cache_bytes_allocated).toBeGreaterThan(0);
    expect(running.service_kv_cache_bytes_allocated).toBeLessThanOrEqual(running.service_kv_cache_bytes_in_use);
    for (const r of await Promise.all(both)) expect((await jsonBody(r, GenerateResponse)).tokens).toHaveLength(480);
    expect(await metrics(tight, ["service_kv_cache_bytes_in_use", "service_kv_cache_bytes_allocated", "service_queue_depth"])).toEqual({
      service_kv_cache_bytes_in_use: 0,
      service_kv_cache_bytes_allocated: 0,
      service_queue_depth: 0,
    });
  });

  test("a request larger than the whole budget is refused with a 503 that says why, and the server keeps serving", async () => {
    const r = await tight.post("/generate", { ...long, loops: 16 });
    expect(r.status).toBe(503);
    const body = await r.json();
    expectErrorShape(body);
    expect(JSON.stringify(body)).toContain("SERVICE_KV_CACHE_MB");
    expect((await tight.post("/generate", { prompt: PROMPTS[0], max_tokens: 3 })).status).toBe(200);
  });
});
