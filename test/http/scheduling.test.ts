// The scheduler seen through HTTP (docs/scheduling.md): priority order and
// FIFO within a priority, the queue cap, latency-target admission, and
// cancellation of running and queued requests, against a real server process
// on 127.0.0.1.
//
// Every test holds the engine with a "blocker" (a long stream, thousands of
// ~1 ms steps) so that what it sends next waits in the queue; it polls
// /metrics (service_queue_depth) to know a request is queued before it acts,
// and cancels the blocker to let the queue drain. Nothing here depends on a
// sleep being long enough.
import { beforeAll, describe, expect, test } from "bun:test";
import { GenerateResponse } from "../../src/wire/responses.ts";
import { jsonBody } from "../helpers/http.ts";
import { delta, expect503, LIFECYCLE, PROMPT, queueingServerForTests, schedulingTests, waitFor } from "../helpers/scheduling.ts";

schedulingTests();

const BLOCKER_TOKENS = 8000; // ~10 s of engine time if it ran to the end

describe("priority queue", () => {
  const s = queueingServerForTests();

  test("a burst queued behind a running request runs by descending priority, FIFO within a priority", async () => {
    // Sent in this order, each one queued before the next is sent.
    const burst = [
      { name: "a", priority: 0 },
      { name: "b", priority: 0 },
      { name: "c", priority: 5 },
      { name: "d", priority: -1 },
      { name: "e", priority: 5 },
      { name: "f", priority: 0 },
      { name: "g", priority: 10 },
      { name: "h", priority: -1 },
      { name: "i", priority: 5 },
    ];
    const expected = ["g", "c", "e", "i", "a", "b", "f", "d", "h"];

    const blocker = await s.startBlocker(BLOCKER_TOKENS);
    const finished: string[] = [];
    const results: Promise<GenerateResponse>[] = [];
    for (const [k, r] of burst.entries()) {
      // Each request takes ~16 engine steps, so completions are well apart.
      const done = s.generateOk({ prompt: `${PROMPT} ${r.name}`, max_tokens: 16, priority: r.priority }).then((res) => {
        finished.push(r.name);
        return res;
      });
      results.push(done);
      await s.waitForQueueDepth(k + 1);
    }
    expect(finished).toEqual([]); // all of them waited behind the blocker
    await blocker.cancel();
    const all = await Promise.all(results);
    expect(finished).toEqual(expected);
    for (const r of all) expect(r.tokens).toHaveLength(16);
  });

  test("a request sent after a queued low-priority one overtakes it only with a higher priority", async () => {
    const blocker = await s.startBlocker(BLOCKER_TOKENS);
    const order: string[] = [];
    const send = async (name: string, priority: number | undefined) => {
      const body: Record<string, unknown> = { prompt: PROMPT, max_tokens: 16 };
      if (priority !== undefined) body.priority = priority;
      await s.generateOk(body);
      order.push(name);
    };
    const runs = [send("low", -5)];
    await s.waitForQueueDepth(1);
    runs.push(send("default", undefined)); // no priority field: 0
    await s.waitForQueueDepth(2);
    runs.push(send("zero", 0));
    await s.waitForQueueDepth(3);
    await blocker.cancel();
    await Promise.all(runs);
    expect(order).toEqual(["default", "zero", "low"]);
  });
});

describe("queue cap", () => {
  const DEPTH = 2;
  const s = queueingServerForTests({ SERVICE_MAX_QUEUE_DEPTH: String(DEPTH) });

  test("SERVICE_MAX_QUEUE_DEPTH=2: a burst of 7 behind a running request gets exactly 5 × 503 queue_full, counted as rejected", async () => {
    const BURST = 7;
    const before = await s.metrics(LIFECYCLE);
    const blocker = await s.startBlocker(BLOCKER_TOKENS);
    const settled: Response[] = [];
    const burst = Array.from({ length: BURST }, () =>
      s.post("/generate", { prompt: PROMPT, max_tokens: 4 }).then((res) => {
        settled.push(res);
        return res;
      }),
    );
    // The overflow is answered at once; the admitted ones wait behind the blocker.
    await waitFor("the overflow to be refused", () => settled.length === BURST - DEPTH);
    expect(await s.metric("service_queue_depth")).toBe(DEPTH);
    for (const res of settled) {
      const body = await expect503(res, "queue_full");
      expect(body.error.message).toContain("queue is full");
    }
    await blocker.cancel();
    const responses = await Promise.all(burst);
    const admitted = responses.filter((r) => !settled.slice(0, BURST - DEPTH).includes(r));
    expect(admitted).toHaveLength(DEPTH);
    for (const res of admitted) {
      expect((await jsonBody(res, GenerateResponse)).tokens).toHaveLength(4);
    }
    const d = delta(await s.metrics(LIFECYCLE), before);
    expect(d).toEqual({
      service_requests_submitted_total: 1 + BURST,
      service_requests_completed_total: DEPTH,
      service_requests_rejected_total: BURST - DEPTH,
      service_requests_errored_total: 0,
      service_requests_cancelled_total: 1, // the blocker
    });
  });

  test("a streaming request refused by the queue cap gets a plain 503, not a stream", async () => {
    const blocker = await s.startBlocker(BLOCKER_TOKENS);
    const queued = [0, 1].map(() => s.post("/generate", { prompt: PROMPT, max_tokens: 2 }));
    await s.waitForQueueDepth(DEPTH);
    const res = await s.post("/generate", { prompt: PROMPT, max_tokens: 2, stream: true });
    await expect503(res, "queue_full");
    await blocker.cancel();
    for (const r of await Promise.all(queued)) expect(r.status).toBe(200);
  });
});

describe("latency target", () => {
  // Small requests cost a few ms on an idle engine; the blocker's remainder
  // is thousands of steps (seconds), far beyond the target.
  const DEFAULT_SLO_MS = 500;
  const s = queueingServerForTests({ SERVICE_DEFAULT_SLO_MS: String(DEFAULT_SLO_MS) });

  test("an unprimed predictor rejects nothing: the first request is admitted even with slo_ms 1", async () => {
    const r = await s.generateOk({ prompt: PROMPT, max_tokens: 32, slo_ms: 1 });
    expect(r.tokens).toHaveLength(32);
  });

  test("once primed, per-request slo_ms refuses a request predicted to miss it (503 latency_target) and admits one that fits", async () => {
    // Prime (or prime further) and measure this machine's cost per token.
    const primer = await s.generateOk({ prompt: PROMPT, max_tokens: 32 });
    const msPerToken = primer.stats.wall_ms / 32;
    const big = 4000;
    // A target a sixteenth of the big request's measured cost: that request
    // cannot meet it, while an 8-token request meets it easily. (msPerToken
    // includes the primer's prefill, so it overstates a decode step: the
    // wide margin absorbs that.)
    const slo = Math.max(20, Math.round((big * msPerToken) / 16));
    const before = await s.metrics(LIFECYCLE);
    const refused = await expect503(await s.post("/generate", { prompt: PROMPT, max_tokens: big, slo_ms: slo }), "latency_target");
    expect(refused.error.message).toContain(`latency target of ${slo} ms`);
    const ok = await s.generateOk({ prompt: PROMPT, max_tokens: 8, slo_ms: slo });
    expect(ok.tokens).toHaveLength(8);
    const d = delta(await s.metrics(LIFECYCLE), before);
    expect(d.service_requests_submitted_total).toBe(2);
    expect(d.service_requests_rejected_total).toBe(1);
    expect(d.service_requests_completed_total).toBe(1); // the refused one never ran
  });

  test("SERVICE_DEFAULT_SLO_MS: a small request is refused while slow work runs ahead, admitted on an idle engine; slo_ms overrides the default", async () => {
    // Idle engine: a few ms of predicted work, well within the default target.
    await s.generateOk({ prompt: PROMPT, max_tokens: 4 });
    // The blocker itself is predicted to take seconds: it needs a larger per-request target.
    await expect503(await s.post("/generate", { prompt: PROMPT, max_tokens: BLOCKER_TOKENS, stream: true }), "latency_target");
    const blocker = await s.startBlocker(BLOCKER_TOKENS, { slo_ms: 3_600_000 });
    // The same small request, now behind seconds of work: refused under the default target.
    await expect503(await s.post("/generate", { prompt: PROMPT, max_tokens: 4 }), "latency_target");
    // With its own generous target it is admitted and waits its turn.
    const patient = s.generateOk({ prompt: PROMPT, max_tokens: 4, slo_ms: 3_600_000 });
    await s.waitForQueueDepth(1);
    await blocker.cancel();
    expect((await patient).tokens).toHaveLength(4);
    // And once the engine is idle again the default target admits it.
    await s.generateOk({ prompt: PROMPT, max_tokens: 4 });
  });
});

describe("cancellation", () => {
  const s = queueingServerForTests();
  let idleMs: number;
  beforeAll(async () => {
    await s.generateOk({ prompt: PROMPT, max_tokens: 8 }); // warm up
    const t0 = performance.now();
    await s.generateOk({ prompt: PROMPT, max_tokens: 1 });
    idleMs = performance.now() - t0;
  });

  // The blocker would need seconds more; a request queued behind it must
  // finish within about one engine step (~1 ms) plus its own short run and the
  // time for the server to see the closed connection.
  const promptly = () => Math.max(300, 10 * idleMs);

  test("cancelling a running stream frees the engine within a step: the request queued behind it starts at once; counted cancelled", async () => {
    const blocker = await s.startBlocker(BLOCKER_TOKENS);
    await blocker.waitForEvents(10);
    const next = s.generateOk({ prompt: PROMPT, max_tokens: 1 });
    await s.waitForQueueDepth(1);
    const before = await s.metrics(LIFECYCLE);
    const t0 = performance.now();
    await blocker.cancel();
    expect((await next).tokens).toHaveLength(1);
    const elapsed = performance.now() - t0;
    expect(elapsed).toBeLessThan(promptly());
    const d = delta(await s.metrics(LIFECYCLE), before);
    expect(d.service_requests_cancelled_total).toBe(1);
    expect(d.service_requests_completed_total).toBe(1);
    expect(await s.metric("service_requests_in_flight")).toBe(0);
  });

  test("abandoning a running non-streaming request frees the engine and counts it cancelled", async () => {
    const before = await s.metrics(LIFECYCLE);
    const abort = new AbortController();
    const pending = fetch(`${s.url}/generate`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: PROMPT, max_tokens: BLOCKER_TOKENS }),
      signal: abort.signal,
    }).catch((e: Error) => e);
    await waitFor("the request to run", async () => (await s.metric("service_requests_in_flight")) === 1);
    const next = s.generateOk({ prompt: PROMPT, max_tokens: 1 });
    await s.waitForQueueDepth(1);
    const t0 = performance.now();
    abort.abort();
    expect(await pending).toBeInstanceOf(Error);
    await next;
    expect(performance.now() - t0).toBeLessThan(promptly());
    const d = delta(await s.metrics(LIFECYCLE), before);
    expect(d.service_requests_cancelled_total).toBe(1);
    expect(d.service_requests_completed_total).toBe(1);
  });

  for (const stream of [false, true])
    test(`a queued ${stream ? "streaming" : "non-streaming"} request whose client disconnects is cancelled and never runs`, async () => {
      const blocker = await s.startBlocker(BLOCKER_TOKENS);
      const keys = [...LIFECYCLE, "service_queue_wait_ms_count"] as const; // queue wait is observed when a request starts
      const before = await s.metrics(keys);
      const abort = new AbortController();
      const pending = fetch(`${s.url}/generate`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: PROMPT, max_tokens: 4, stream }),
        signal: abort.signal,
      }).catch((e: Error) => e);
      await s.waitForQueueDepth(1);
      abort.abort();
      expect(await pending).toBeInstanceOf(Error);
      await waitFor("the queued request to be cancelled", async () => {
        const m = await s.metrics(["service_queue_depth", "service_requests_cancelled_total"]);
        return m.service_queue_depth === 0 && m.service_requests_cancelled_total === before.service_requests_cancelled_total + 1;
      });
      expect(await s.metric("service_requests_in_flight")).toBe(1); // the blocker still runs
      await blocker.cancel();
      await waitFor("the engine to go idle", async () => (await s.metric("service_requests_in_flight")) === 0);
      const d = delta(await s.metrics(keys), before);
      expect(d).toEqual({
        service_requests_submitted_total: 1,
        service_requests_completed_total: 0,
        service_requests_rejected_total: 0,
        service_requests_errored_total: 0,
        service_requests_cancelled_total: 2, // it and the blocker
        service_queue_wait_ms_count: 0, // it never left the queue to run
      });
    });

  test("a stream that is cancelled keeps the server healthy: the next stream is complete", async () => {
    const blocker = await s.startBlocker(BLOCKER_TOKENS);
    await blocker.cancel();
    const next = await s.openStream({ prompt: PROMPT, max_tokens: 5 });
    const events = await next.readAll();
    expect(events.at(-1)).toBe("[DONE]");
    expect(events).toHaveLength(5 + 2); // 5 tokens, the token_id -1 tail, [DONE]
  });
});
