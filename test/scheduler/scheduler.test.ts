import { describe, expect, test } from "bun:test";
import type { GenerateResult } from "../../src/engine/types.ts";
import { ServiceMetrics } from "../../src/metrics.ts";
import { Scheduler, SchedulerRejection, type SchedulerOptions } from "../../src/scheduler/scheduler.ts";
import { FakeEngine, fakeToken, request } from "./fake_engine.ts";
import { parsePrometheusText, sampleValue } from "./prom_text.ts";

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const noSink = () => {};

function setup(engine = new FakeEngine(), opts: Partial<SchedulerOptions> = {}) {
  const metrics = new ServiceMetrics({ maxSeqLen: 2048, defaultLoops: 2, processMetrics: false });
  const scheduler = new Scheduler(engine, { metrics, maxQueueDepth: 128, prefixPoolCapacity: 16, ...opts });
  const value = async (name: string) => sampleValue(parsePrometheusText(await metrics.metricsText()), name);
  const counters = async () => ({
    submitted: await value("service_requests_submitted_total"),
    completed: await value("service_requests_completed_total"),
    rejected: await value("service_requests_rejected_total"),
    errored: await value("service_requests_errored_total"),
    cancelled: await value("service_requests_cancelled_total"),
  });
  return { engine, metrics, scheduler, value, counters };
}

async function rejection(p: () => unknown): Promise<SchedulerRejection> {
  try {
    await p();
  } catch (e) {
    if (e instanceof SchedulerRejection) return e;
    throw e;
  }
  throw new Error("expected a SchedulerRejection");
}

describe("scheduler: order", () => {
  test("a burst of queued requests runs by descending priority, FIFO within a priority, one at a time", async () => {
    const { engine, scheduler } = setup();
    const release = engine.hold();
    const first = scheduler.submit(request(100), {}, noSink); // starts at once, holds the engine
    const burst: [number, number][] = [
      [1, 0], [2, 5], [3, 0], [4, 5], [5, -3], [6, 10], [7, 0], [8, 5], [9, 10], [10, -3],
    ];
    const done = burst.map(([marker, priority]) => scheduler.submit(request(marker), { priority }, noSink));
    expect(scheduler.queueDepth).toBe(burst.length);
    release();
    await Promise.all([first, ...done]);
    expect(engine.startOrder).toEqual([100, 6, 9, 2, 4, 8, 1, 3, 7, 5, 10]);
    expect(engine.maxConcurrent).toBe(1);
  });

  test("results are the engine's, streamed through the caller's sink in order", async () => {
    const { scheduler } = setup();
    const seen: number[] = [];
    const res = await scheduler.submit(request(7, { maxTokens: 5 }), {}, (t) => void seen.push(t));
    const expected = [0, 1, 2, 3, 4].map((i) => fakeToken(request(7).promptTokens, i));
    expect(res.tokens).toEqual(expected);
    expect(seen).toEqual(expected);
    expect(res.finishReason).toBe("length");
  });
});

describe("scheduler: admission", () => {
  test("queue cap: exactly the overflow is rejected (queue_full, 503) and rejected_total counts it", async () => {
    const { engine, scheduler, value, counters } = setup(new FakeEngine(), { maxQueueDepth: 3 });
    const release = engine.hold();
    const accepted: Promise<GenerateResult>[] = [];
    let rejected = 0;
    for (let i = 0; i < 9; i++) {
      try {
        accepted.push(scheduler.enqueue(request(i), {}, noSink).result);
      } catch (e) {
        expect(e).toBeInstanceOf(SchedulerRejection);
        expect((e as SchedulerRejection).reason).toBe("queue_full");
        expect((e as SchedulerRejection).status).toBe(503);
        rejected++;
      }
    }
    expect(accepted.length).toBe(1 + 3); // the running one plus a full queue
    expect(rejected).toBe(5);
    expect(await value("service_queue_depth")).toBe(3);
    expect(await value("service_requests_in_flight")).toBe(1);
    expect(await value("service_requests_rejected_total")).toBe(5);
    release();
    await Promise.all(accepted);
    expect(await counters()).toEqual({ submitted: 9, completed: 4, rejected: 5, errored: 0, cancelled: 0 });
    expect(await value("service_queue_depth")).toBe(0);
    expect(await value("service_requests_in_flight")).toBe(0);
  });

  test("queue depth 0 still serves a request when the engine is idle", async () => {
    const { scheduler } = setup(new FakeEngine(), { maxQueueDepth: 0 });
    const r = scheduler.submit(request(1), {}, noSink);
    expect((await rejection(() => scheduler.submit(request(2), {}, noSink))).reason).toBe("queue_full");
    expect((await r).finishReason).toBe("length");
  });

  test("an unprimed predictor never rejects, whatever the latency target", async () => {
    const { scheduler } = setup(new FakeEngine(), { defaultSloMs: 0.001 });
    expect(scheduler.predictor.primed).toBe(false);
    expect((await scheduler.submit(request(1), { sloMs: 0.001 }, noSink)).finishReason).toBe("length");
  });

  test("latency target: rejected once the predictor is primed with slow work", async () => {
    const engine = new FakeEngine();
    engine.stepMs = 20; // 20 ms a step at loops=2: 10 ms per token-loop
    const { scheduler, value } = setup(engine, { defaultSloMs: 100 });
    await scheduler.submit(request(1, { maxTokens: 4 }), { sloMs: 60_000 }, noSink); // primes
    expect(scheduler.predictor.primed).toBe(true);
    expect(scheduler.predictor.rates.decodeMsPerTokenLoop!).toBeGreaterThan(8);

    // 64 tokens at ~20 ms each cannot finish in the 100 ms default target...
    const e = await rejection(() => scheduler.submit(request(2, { maxTokens: 64 }), {}, noSink));
    expect(e.reason).toBe("latency_target");
    expect(e.status).toBe(503);
    expect(e.message).toMatch(/exceeds the latency target of 100 ms/);
    // ...nor in a per-request one, while a generous per-request target admits it.
    expect((await rejection(() => scheduler.submit(request(3, { maxTokens: 64 }), { sloMs: 500 }, noSink))).reason).toBe(
      "latency_target",
    );
    expect((await scheduler.submit(request(4, { maxTokens: 8 }), { sloMs: 60_000 }, noSink)).tokens.length).toBe(8);
    expect(await value("service_requests_rejected_total")).toBe(2);
  });

  test("latency target counts the work queued ahead, at the same or higher priority only", async () => {
    const engine = new FakeEngine();
    const { scheduler } = setup(engine);
    // 1 ms per prompt token-loop, 10 ms per generated token-loop.
    scheduler.predictor.observe({ prefillTokens: 1, loops: 1, prefillMs: 1, decodeSteps: 1, decodeMs: 10 });
    const release = engine.hold();
    const running = scheduler.submit(request(1, { maxTokens: 11 }), {}, noSink); // ~ 200 ms left
    const small = { maxTokens: 2 }; // alone: 4 tokens*2 loops*1 + 1*2*10 = 28 ms
    expect(scheduler.predict({ prefillTokens: 4, maxTokens: 2, loops: 2 })).toBeGreaterThan(200);
    const queued = [0, 1, 2].map((i) => scheduler.submit(request(10 + i, { maxTokens: 11 }), { priority: 0 }, noSink)); // 3 x 208 ms
    const predicted = scheduler.predict({ prefillTokens: 4, maxTokens: 2, loops: 2 }, 0);
    expect(predicted).toBeGreaterThan(800);
    expect((await rejection(() => scheduler.submit(request(20, small), { sloMs: 600 }, noSink))).reason).toBe("latency_target");
    // A higher priority request jumps the queued work, so only the running remainder is ahead of it.
    const urgent = scheduler.submit(request(21, small), { sloMs: 600, priority: 9 }, noSink);
    release();
    await Promise.all([running, ...queued, urgent]);
    expect(engine.startOrder).toEqual([1, 21, 10, 11, 12]);
  });
});

describe("scheduler: cancellation", () => {
  test("a queued request whose client goes away is removed and counted cancelled, never reaching the engine", async () => {
    const { engine, scheduler, value, counters } = setup();
    const release = engine.hold();
    const a = scheduler.submit(request(1), {}, noSink);
    const ctl = new AbortController();
    const b = scheduler.enqueue(request(2), { signal: ctl.signal }, noSink);
    const c = scheduler.submit(request(3), {}, noSink);
    expect(await value("service_queue_depth")).toBe(2);
    ctl.abort();
    expect(await b.started).toBe("cancelled");
    expect((await b.result).finishReason).toBe("cancelled");
    expect(b.state).toBe("cancelled");
    expect(await value("service_queue_depth")).toBe(1);
    release();
    await Promise.all([a, c]);
    expect(engine.startOrder).toEqual([1, 3]);
    expect(await counters()).toEqual({ submitted: 3, completed: 2, rejected: 0, errored: 0, cancelled: 1 });
  });

  test("cancelling a running request stops the engine at its next step and the next request starts", async () => {
    const engine = new FakeEngine();
    engine.stepMs = 2;
    const { scheduler, counters, value } = setup(engine);
    const ctl = new AbortController();
    let sent = 0;
    const stepsAtAbort: number[] = [];
    const a = scheduler.submit(request(1, { maxTokens: 10_000 }), { signal: ctl.signal }, () => {
      if (++sent === 3) {
        stepsAtAbort.push(engine.steps);
        ctl.abort();
      }
    });
    const b = scheduler.enqueue(request(2, { maxTokens: 2 }), {}, noSink);
    const ra = await a;
    expect(ra.finishReason).toBe("cancelled");
    expect(ra.tokens.length).toBe(3);
    expect(engine.steps).toBe(stepsAtAbort[0]); // no step ran after the abort
    expect(await b.started).toBe("running");
    expect((await b.result).finishReason).toBe("length");
    expect(await counters()).toEqual({ submitted: 2, completed: 1, rejected: 0, errored: 0, cancelled: 1 });
    expect(await value("service_first_token_ms_count")).toBe(2); // the cancelled request did get a first token
    expect(await value("service_request_wall_ms_count")).toBe(1); // wall: completed requests only
  });

  test("a request whose signal is already aborted is counted cancelled and never runs", async () => {
    const { engine, scheduler, counters } = setup();
    const ctl = new AbortController();
    ctl.abort();
    const t = scheduler.enqueue(request(1), { signal: ctl.signal }, noSink);
    expect((await t.result).finishReason).toBe("cancelled");
    expect(engine.calls.length).toBe(0);
    expect(await counters()).toEqual({ submitted: 1, completed: 0, rejected: 0, errored: 0, cancelled: 1 });
  });
});

describe("scheduler: errors and shutdown", () => {
  test("an engine error fails that request only and is counted errored", async () => {
    const { engine, scheduler, counters } = setup();
    engine.failNext = new Error("prompt token id 99999 is outside the vocabulary");
    await expect(scheduler.submit(request(1), {}, noSink)).rejects.toThrow(/outside the vocabulary/);
    expect((await scheduler.submit(request(2), {}, noSink)).finishReason).toBe("length");
    expect(await counters()).toEqual({ submitted: 2, completed: 1, rejected: 0, errored: 1, cancelled: 0 });
  });

  test("shutdown refuses new and queued requests with 503, lets the running one finish, then resolves", async () => {
    const engine = new FakeEngine();
    engine.stepMs = 2;
    const { scheduler, counters, value } = setup(engine);
    const release = engine.hold();
    const running = scheduler.enqueue(request(1, { maxTokens: 5 }), {}, noSink);
    const queued = [2, 3].map((m) => scheduler.enqueue(request(m), {}, noSink));
    await running.started;
    let finished = false;
    const down = scheduler.shutdown().then(() => (finished = true));
    expect(scheduler.accepting).toBe(false);
    for (const q of queued) {
      const e = await rejection(() => q.result);
      expect(e.reason).toBe("shutting_down");
      expect(e.status).toBe(503);
      await expect(q.started).rejects.toBeInstanceOf(SchedulerRejection);
    }
    expect((await rejection(() => scheduler.submit(request(4), {}, noSink))).reason).toBe("shutting_down");
    await sleep(10);
    expect(finished).toBe(false); // the running request is still going
    release();
    expect((await running.result).tokens.length).toBe(5);
    await down;
    expect(finished).toBe(true);
    expect(scheduler.shutdown()).toBe(scheduler.shutdown()); // idempotent
    expect(engine.startOrder).toEqual([1]);
    expect(await counters()).toEqual({ submitted: 4, completed: 1, rejected: 3, errored: 0, cancelled: 0 });
    expect(await value("service_queue_depth")).toBe(0);
  });

  test("shutdown when idle resolves at once", async () => {
    const { scheduler } = setup();
    await scheduler.shutdown();
    expect(scheduler.accepting).toBe(false);
  });
});

describe("scheduler: prefix pool", () => {
  test("chat requests sharing a system prompt reuse its pooled prefix; hits are counted", async () => {
    const engine = new FakeEngine({ prefixSnapshots: true });
    const { scheduler, value } = setup(engine, { prefixPoolCapacity: 4 });
    const system = [50, 51, 52, 53, 54, 55];
    const r1 = await scheduler.submit(request(0, { promptTokens: [...system, 1, 2] }), {}, noSink);
    const r2 = await scheduler.submit(request(0, { promptTokens: [...system, 3] }), {}, noSink);
    expect(engine.calls[0].options?.prefix).toBeUndefined();
    expect(engine.calls[0].options?.capture).toBeDefined();
    expect(engine.calls[1].options?.prefix?.length).toBe(system.length);
    expect(engine.calls[1].options?.prefix?.snapshot.tokens).toEqual([...system, 1, 2]);
    expect(await value("service_prefix_pool_hits_total")).toBe(1);
    // Same prompt again: reuses all but the last token, and no new snapshot is asked for.
    await scheduler.submit(request(0, { promptTokens: [...system, 3] }), {}, noSink);
    expect(engine.calls[2].options?.prefix?.length).toBe(system.length);
    expect(engine.calls[2].options?.capture).toBeUndefined();
    expect(await value("service_prefix_pool_hits_total")).toBe(2);
    // A deeper loop count than pooled cannot reuse shallower snapshots.
    await scheduler.submit(request(0, { promptTokens: [...system, 3], loops: 4 }), {}, noSink);
    expect(engine.calls[3].options?.prefix).toBeUndefined();
    expect(r1.tokens).toEqual([0, 1, 2, 3].map((i) => fakeToken([...system, 1, 2], i)));
    expect(r2.tokens).toEqual([0, 1, 2, 3].map((i) => fakeToken([...system, 3], i)));
    await scheduler.shutdown();
    expect(scheduler.prefixPool.size).toBe(0);
  });

  test("a prompt-scoring request never takes a pooled prefix (it needs every position's logits) but may be pooled", async () => {
    const engine = new FakeEngine({ prefixSnapshots: true });
    const { scheduler, value } = setup(engine, { prefixPoolCapacity: 4 });
    const prompt = [60, 61, 62, 63, 64];
    const scoring = request(0, { promptTokens: prompt, logprobs: 1, promptLogprobs: true });
    const onPromptLogprobs = () => {};
    await scheduler.submit(request(0, { promptTokens: prompt }), {}, noSink);
    const rates = { ...scheduler.predictor.rates };
    await scheduler.submit(scoring, { onPromptLogprobs }, noSink);
    expect(engine.calls[1].options?.prefix).toBeUndefined();
    expect(engine.calls[1].options?.onPromptLogprobs).toBe(onPromptLogprobs);
    expect(await value("service_prefix_pool_hits_total")).toBe(0);
    // Scoring costs more than a prefill: the latency predictor does not learn from it.
    expect(scheduler.predictor.rates).toEqual(rates);
    // The same prompt without scoring reuses the pooled prefix as usual.
    await scheduler.submit(request(0, { promptTokens: prompt }), {}, noSink);
    expect(engine.calls[2].options?.prefix?.length).toBe(prompt.length - 1);
    expect(await value("service_prefix_pool_hits_total")).toBe(1);
    await scheduler.shutdown();
  });

  test("an engine without snapshot support gets no prefix options", async () => {
    const engine = new FakeEngine({ prefixSnapshots: false });
    const { scheduler, value } = setup(engine, { prefixPoolCapacity: 16 });
    await scheduler.submit(request(1), {}, noSink);
    await scheduler.submit(request(1), {}, noSink);
    expect(engine.calls.every((c) => !c.options?.prefix && !c.options?.capture)).toBe(true);
    expect(await value("service_prefix_pool_hits_total")).toBe(0);
  });
});

describe("scheduler: telemetry under load", () => {
  test("200 requests from 16 concurrent clients: every outcome well formed, counters add up, results equal sequential ones", async () => {
    const engine = new FakeEngine({ prefixSnapshots: true });
    engine.stepMs = 1;
    const { scheduler, counters, value } = setup(engine, { maxQueueDepth: 8, prefixPoolCapacity: 4 });
    let seed = 7;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const outcomes = { ok: 0, rejected: 0, cancelled: 0 };
    const client = async (c: number) => {
      for (let i = 0; i < Math.floor(200 / 16) + (c < 200 % 16 ? 1 : 0); i++) {
        const marker = (c * 100 + i) % 37;
        const req = request(marker, { promptTokens: [9, 9, marker, marker + 1], maxTokens: 1 + (marker % 6) });
        const ctl = new AbortController();
        if (rand() < 0.15) setTimeout(() => ctl.abort(), rand() * 10);
        try {
          const res = await scheduler.submit(req, { priority: Math.floor(rand() * 3), signal: ctl.signal }, noSink);
          if (res.finishReason === "cancelled") {
            outcomes.cancelled++;
            continue;
          }
          outcomes.ok++;
          expect(res.tokens).toEqual(Array.from({ length: req.maxTokens }, (_, k) => fakeToken(req.promptTokens, k)));
        } catch (e) {
          expect(e).toBeInstanceOf(SchedulerRejection);
          outcomes.rejected++;
          await sleep(rand() * 2);
        }
      }
    };
    await Promise.all(Array.from({ length: 16 }, (_, c) => client(c)));
    const n = await counters();
    expect(n.submitted).toBe(200);
    expect(n.completed + n.rejected + n.errored + n.cancelled).toBe(200);
    expect(n).toEqual({ submitted: 200, completed: outcomes.ok, rejected: outcomes.rejected, errored: 0, cancelled: outcomes.cancelled });
    expect(outcomes.ok).toBeGreaterThan(50);
    expect(outcomes.rejected).toBeGreaterThan(0);
    expect(outcomes.cancelled).toBeGreaterThan(0);
    expect(engine.maxConcurrent).toBe(1);
    expect(await value("service_queue_depth")).toBe(0);
    expect(await value("service_requests_in_flight")).toBe(0);
    expect(await value("service_request_wall_ms_count")).toBe(outcomes.ok);
    expect(await value("service_queue_wait_ms_count")).toBe(engine.calls.length);
    expect(await value("service_dispatch_ms_count")).toBe(engine.calls.length);
    expect(await value("service_prefix_pool_hits_total")).toBeGreaterThan(0);
  });
});

describe("scheduler: batching", () => {
  test("up to maxBatch requests run at once; the rest start in priority order as slots free up", async () => {
    const { engine, scheduler, value } = setup(new FakeEngine(), { maxBatch: 3 });
    const release = engine.hold();
    const first = [1, 2, 3].map((m) => scheduler.submit(request(m), {}, noSink));
    expect(scheduler.inFlight).toBe(3);
    const queued = [
      [4, 0],
      [5, 7],
      [6, 0],
    ].map(([m, priority]) => scheduler.submit(request(m), { priority }, noSink));
    expect(scheduler.queueDepth).toBe(3);
    expect(await value("service_requests_in_flight")).toBe(3);
    release();
    await Promise.all([...first, ...queued]);
    expect(engine.startOrder).toEqual([1, 2, 3, 5, 4, 6]);
    expect(engine.maxConcurrent).toBe(3);
  });

  test("a request waits until its key/value cache fits beside the running ones; nothing behind it overtakes it", async () => {
    const bytes = (m: number) => (m === 2 ? 700 : 300); // request 2 is big
    const kvCache = { budgetBytes: 1000, bytesFor: (r: { promptTokens: number[] }) => bytes(r.promptTokens[0]) };
    const { engine, scheduler, value } = setup(new FakeEngine(), { maxBatch: 8, kvCache });
    engine.stepMs = 2;
    const runs = [1, 2, 3].map((m) => scheduler.submit(request(m, { maxTokens: 4 }), {}, noSink));
    // 1 runs (300); 2 (700) fits beside it; 3 (300) would exceed 1000 and waits.
    expect(scheduler.inFlight).toBe(2);
    expect(scheduler.queueDepth).toBe(1);
    expect(scheduler.kvCacheBytesInUse).toBe(1000);
    expect(await value("service_kv_cache_bytes_in_use")).toBe(1000);
    expect(await value("service_kv_cache_budget_bytes")).toBe(1000);
    await Promise.all(runs);
    expect(engine.startOrder).toEqual([1, 2, 3]);
    expect(scheduler.kvCacheBytesInUse).toBe(0);
    // Larger than the whole budget: refused, with the sizes.
    const big = { budgetBytes: 1000, bytesFor: () => 4 * 2 ** 20 };
    const e = await rejection(() => setup(new FakeEngine(), { kvCache: big }).scheduler.submit(request(9), {}, noSink));
    expect(e.reason).toBe("kv_cache_budget");
    expect(e.message).toMatch(/needs 4\.0 MiB, more than the whole budget/);
  });

  test("the predicted completion spreads the work ahead over the batch slots", async () => {
    const engine = new FakeEngine();
    const { scheduler } = setup(engine, { maxBatch: 2 });
    scheduler.predictor.observe({ prefillTokens: 1, loops: 1, prefillMs: 1, decodeSteps: 1, decodeMs: 10 });
    const own = { prefillTokens: 4, maxTokens: 2, loops: 2 }; // 4*2*1 + 1*2*10 = 28 ms
    expect(scheduler.predict(own)).toBeCloseTo(28);
    const release = engine.hold();
    const running = [1, 2].map((m) => scheduler.submit(request(m, { maxTokens: 11 }), {}, noSink)); // ~208 ms each
    const predicted = scheduler.predict(own);
    expect(predicted).toBeGreaterThan(28 + 200); // both slots busy: half of ~416 ms ahead
    expect(predicted).toBeLessThan(28 + 420);
    release();
    await Promise.all(running);
  });
});
