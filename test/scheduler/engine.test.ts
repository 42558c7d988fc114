// The scheduler over the real Engine and kernel library on a tiny synthetic
// model: ordering, cancellation, admission and results equal to running the
// engine directly, one request after another.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { resolve } from "node:path";
import { Engine, type KvSnapshot } from "../../src/engine/engine.ts";
import type { GenerateRequest, GenerateResult } from "../../src/engine/types.ts";
import { ServiceMetrics } from "../../src/metrics.ts";
import { Scheduler, SchedulerRejection, type SchedulerEngine, type SchedulerOptions } from "../../src/scheduler/scheduler.ts";
import { ensureLibrary } from "../helpers/kernels.ts";
import { tinyModelPath } from "../helpers/models.ts";
import { parsePrometheusText, sampleValue } from "./prom_text.ts";

const BUILD_DIR = resolve(import.meta.dir, "../../build");

// Engine satisfies the scheduler's narrow interface as it is (compile-time check).
export const engineFitsScheduler: (e: Engine) => SchedulerEngine<KvSnapshot> = (e) => e;

function req(prompt: number[], over: Partial<GenerateRequest> = {}): GenerateRequest {
  return {
    promptTokens: prompt,
    maxTokens: 6,
    loops: 2,
    sampling: { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1, seed: 0 },
    stopTokenIds: [],
    cacheWindow: 0,
    ...over,
  };
}

describe("scheduler over the real engine", () => {
  let engine: Engine;
  beforeAll(() => {
    ensureLibrary();
    engine = Engine.load({ modelPath: tinyModelPath(), threads: 1, simd: "auto", buildDir: BUILD_DIR, gpu: false });
  });
  afterAll(() => engine?.close());

  function setup(opts: Partial<SchedulerOptions> = {}) {
    const metrics = new ServiceMetrics({ maxSeqLen: 2048, defaultLoops: engine.info.defaultLoops, processMetrics: false });
    const scheduler = new Scheduler(engine, { metrics, maxQueueDepth: 128, prefixPoolCapacity: 16, ...opts });
    const value = async (name: string) => sampleValue(parsePrometheusText(await metrics.metricsText()), name);
    return { scheduler, value };
  }

  const prompts = Array.from({ length: 8 }, (_, i) => [100 + i, 200 + i, 300 + i, 400]);

  test("results through the scheduler equal the engine's sequential results", async () => {
    const expected: number[][] = [];
    for (const p of prompts) expected.push((await engine.generate(req(p), () => {})).tokens);
    const { scheduler, value } = setup();
    const results = await Promise.all(prompts.map((p) => scheduler.submit(req(p), {}, () => {})));
    expect(results.map((r) => r.tokens)).toEqual(expected);
    expect(await value("service_requests_completed_total")).toBe(prompts.length);
  });

  test("the prefix pool is hit by prompts sharing a prefix and outputs are bit-identical with the pool on or off", async () => {
    const system = Array.from({ length: 40 }, (_, i) => (i * 131 + 7) % 50000);
    const chats = [0, 1, 2, 3].map((i) => [...system, 1000 + i, 2000 + i, 3000]);
    for (const [loops, cacheWindow, temperature] of [
      [4, 0, 0],
      [3, 0, 0.8],
      [4, 9, 0],
    ]) {
      const r = (p: number[]) => req(p, { loops, cacheWindow, maxTokens: 12, sampling: { temperature, topK: 40, topP: 0.9, repetitionPenalty: 1.1, seed: 5 } });
      const off = setup({ prefixPoolCapacity: 0 });
      const on = setup({ prefixPoolCapacity: 4 });
      const without: number[][] = [];
      const withPool: number[][] = [];
      for (const p of chats) without.push((await off.scheduler.submit(r(p), {}, () => {})).tokens);
      for (const p of chats) withPool.push((await on.scheduler.submit(r(p), {}, () => {})).tokens);
      expect(withPool).toEqual(without);
      expect(await off.value("service_prefix_pool_hits_total")).toBe(0);
      expect(await on.value("service_prefix_pool_hits_total")).toBe(chats.length - 1);
    }
  });

  test("the prefix pool evicts the least recently used entry at capacity", async () => {
    const { scheduler, value } = setup({ prefixPoolCapacity: 2 });
    const family = (k: number) => Array.from({ length: 12 }, (_, i) => 500 * k + i);
    const run = (k: number, tail: number) => scheduler.submit(req([...family(k), tail]), {}, () => {});
    await run(1, 1); // pool: 1
    await run(2, 1); // pool: 1 2
    await run(1, 2); // hit 1; pool keeps 1 most recent
    await run(3, 1); // pool full: evicts 2
    expect(await value("service_prefix_pool_hits_total")).toBe(1);
    await run(2, 2); // 2 was evicted: miss
    expect(await value("service_prefix_pool_hits_total")).toBe(1);
    await run(3, 2); // 3 is still pooled: hit
    expect(await value("service_prefix_pool_hits_total")).toBe(2);
  });

  test("a burst queued behind a long request runs by priority, FIFO within a priority", async () => {
    const { scheduler } = setup();
    const order: number[] = [];
    const track = (id: number) => (r: GenerateResult) => {
      order.push(id);
      return r;
    };
    const first = scheduler.submit(req([1, 2, 3], { maxTokens: 64 }), {}, () => {}).then(track(0));
    const priorities = [0, 2, 0, 1, 2, 0];
    const rest = priorities.map((priority, i) =>
      scheduler.submit(req(prompts[i]), { priority }, () => {}).then(track(i + 1)),
    );
    expect(scheduler.queueDepth).toBe(priorities.length);
    await Promise.all([first, ...rest]);
    expect(order).toEqual([0, 2, 5, 4, 1, 3, 6]);
  });

  test("cancelling a running request stops the engine within one step and the next request starts", async () => {
    const { scheduler, value } = setup();
    const ctl = new AbortController();
    let sent = 0;
    let sentAfterAbort = 0;
    const a = scheduler.submit(req([5, 6, 7], { maxTokens: 500 }), { signal: ctl.signal }, () => {
      if (ctl.signal.aborted) sentAfterAbort++;
      if (++sent === 3) ctl.abort();
    });
    const b = scheduler.enqueue(req(prompts[0]), {}, () => {});
    const ra = await a;
    expect(ra.finishReason).toBe("cancelled");
    expect(ra.tokens.length).toBe(3);
    expect(sentAfterAbort).toBe(0);
    expect(await b.started).toBe("running");
    expect((await b.result).tokens.length).toBe(6);
    expect(await value("service_requests_cancelled_total")).toBe(1);
    expect(await value("service_requests_completed_total")).toBe(1);
  });

  test("queue cap and latency target reject with 503 and are counted", async () => {
    const { scheduler, value } = setup({ maxQueueDepth: 2 });
    await scheduler.submit(req(prompts[0]), {}, () => {}); // primes the predictor
    expect(scheduler.predictor.primed).toBe(true);
    const accepted = [scheduler.submit(req(prompts[1], { maxTokens: 32 }), {}, () => {})];
    accepted.push(scheduler.submit(req(prompts[2]), {}, () => {}), scheduler.submit(req(prompts[3]), {}, () => {}));
    const reasons: string[] = [];
    for (const p of prompts.slice(4))
      try {
        scheduler.enqueue(req(p), {}, () => {});
      } catch (e) {
        reasons.push((e as SchedulerRejection).reason);
      }
    expect(reasons).toEqual(["queue_full", "queue_full", "queue_full", "queue_full"]);
    await Promise.all(accepted);
    // A target no real request can meet, once the predictor has seen real costs.
    try {
      await scheduler.submit(req(prompts[0], { maxTokens: 64 }), { sloMs: 0.01 }, () => {});
      throw new Error("expected a rejection");
    } catch (e) {
      expect((e as SchedulerRejection).reason).toBe("latency_target");
    }
    expect(await value("service_requests_rejected_total")).toBe(5);
    expect(await value("service_requests_submitted_total")).toBe(9);
  });

  test("an engine refusal (token outside the vocabulary) is counted errored", async () => {
    const { scheduler, value } = setup();
    await expect(scheduler.submit(req([engine.info.vocabSize + 5]), {}, () => {})).rejects.toThrow(/vocabulary/);
    expect(await value("service_requests_errored_total")).toBe(1);
    expect((await scheduler.submit(req(prompts[0]), {}, () => {})).tokens.length).toBe(6);
  });

  test("shutdown lets the running request finish and refuses the queued ones", async () => {
    const { scheduler, value } = setup();
    const running = scheduler.submit(req([9, 9, 9], { maxTokens: 32 }), {}, () => {});
    const queued = scheduler.submit(req(prompts[0]), {}, () => {});
    await scheduler.shutdown();
    expect((await running).tokens.length).toBe(32);
    await expect(queued).rejects.toBeInstanceOf(SchedulerRejection);
    expect(await value("service_requests_completed_total")).toBe(1);
    expect(await value("service_requests_rejected_total")).toBe(1);
  });
});
