// Graceful shutdown of a real server process (docs/scheduling.md#shutdown):
// SIGTERM stops accepting (healthz 503, new requests 503), refuses what is
// queued with 503, lets the running request finish, then exits 0.
import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { expectErrorShape, sseData } from "../helpers/http.ts";
import { cancelOpenStreams, expect503, PROMPT, probed, queueingServer, waitFor } from "../helpers/scheduling.ts";
import { startServer } from "../helpers/server.ts";

setDefaultTimeout(60_000);

describe("graceful shutdown", () => {
  test("SIGTERM during a stream: it finishes with every token and [DONE], queued requests and new ones get 503, /healthz says 503 while draining, exit code 0", async () => {
    // ~1 ms per token on the slow model: the stream outlasts the checks made while draining.
    const TOKENS = 600;
    const s = probed(await startServer(queueingServer()));
    try {
      const stream = await s.startBlocker(TOKENS);
      const queuedPlain = s.post("/generate", { prompt: PROMPT, max_tokens: 4 });
      const queuedStream = s.post("/generate", { prompt: PROMPT, max_tokens: 4, stream: true });
      await s.waitForQueueDepth(2);
      const rejectedBefore = await s.metric("service_requests_rejected_total");

      const exited = s.stop(); // SIGTERM, then the exit code

      // Both queued requests are refused with a plain 503 (the stream is never opened).
      await expect503(await queuedPlain, "shutting_down");
      await expect503(await queuedStream, "shutting_down");
      // Draining: the process still answers, but says it is not taking work.
      const health = await fetch(`${s.url}/healthz`);
      expect(health.status).toBe(503);
      const hb = await health.json();
      expectErrorShape(hb);
      expect(hb.error.code).toBe("shutting_down");
      await expect503(await s.post("/generate", { prompt: PROMPT, max_tokens: 4 }), "shutting_down");
      await expect503(await s.post("/generate", { prompt: PROMPT, max_tokens: 4, stream: true }), "shutting_down");
      // The refusals of the queued requests are counted; the running one still runs.
      expect(await s.metric("service_requests_rejected_total")).toBe(rejectedBefore + 2);
      expect(await s.metric("service_requests_in_flight")).toBe(1);

      // The running stream is complete: every token, the token_id -1 tail, [DONE].
      const events = await stream.readAll();
      expect(events.at(-1)).toBe("[DONE]");
      expect(events).toHaveLength(TOKENS + 2);
      const tail = JSON.parse(events.at(-2) as string) as { token_id: number };
      expect(tail.token_id).toBe(-1);
      for (const e of events.slice(0, TOKENS)) expect((JSON.parse(e) as { token_id: number }).token_id).toBeGreaterThanOrEqual(0);

      expect(await exited).toBe(0);
      // And it is gone.
      expect(await fetch(`${s.url}/healthz`).then(() => "answered", () => "refused")).toBe("refused");
    } finally {
      await cancelOpenStreams(); // only when it failed half-way
      await s.stop();
    }
  });

  test("a second SIGTERM ends the running streams (native and /v1) with a shutting_down error event and [DONE], then exits 0", async () => {
    const TOKENS = 6000; // far more than the test waits for
    const s = probed(await startServer(queueingServer({ SERVICE_MAX_BATCH: "2" })));
    try {
      const native = await s.startBlocker(TOKENS);
      const compat = await s.post("/v1/completions", { model: "m", prompt: PROMPT, max_tokens: TOKENS, stream: true });
      expect(compat.status).toBe(200);
      const compatText = compat.text();

      const exited = s.stop(); // the first SIGTERM: draining, the streams keep running
      await waitFor("draining", async () => (await fetch(`${s.url}/healthz`)).status === 503);
      expect(await s.metric("service_requests_in_flight")).toBe(2);
      process.kill(s.pid, "SIGTERM");

      for (const events of [await native.readAll(), sseData(await compatText)]) {
        expect(events.at(-1)).toBe("[DONE]");
        const error = JSON.parse(events.at(-2) as string);
        expectErrorShape(error);
        expect(error.error).toMatchObject({ type: "service_unavailable_error", code: "shutting_down" });
        expect(events.length).toBeLessThan(TOKENS);
      }
      expect(await exited).toBe(0);
    } finally {
      await cancelOpenStreams();
      await s.stop();
    }
  });

  test("SIGTERM on an idle server exits 0 at once", async () => {
    const s = await startServer(queueingServer());
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    const t0 = performance.now();
    expect(await s.stop()).toBe(0);
    expect(performance.now() - t0).toBeLessThan(5_000);
  });

  test("SIGTERM on a server without a model exits 0", async () => {
    const s = await startServer({ modelPath: null });
    expect(await s.stop()).toBe(0);
  });
});
