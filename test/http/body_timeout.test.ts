// Request bodies that stall (docs/limits.md, SERVICE_BODY_TIMEOUT_MS): a
// client that sends headers and part of a body, then nothing, gets 408
// request_timeout and its connection is closed, so such connections cannot
// pile up buffered bodies or descriptors; each is counted on /metrics. A
// body whose bytes keep coming, however slowly, is read to the end. /healthz
// answers promptly throughout.
import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { join } from "node:path";
import { GenerateResponse } from "../../src/wire/responses.ts";
import { expectErrorShape, jsonBody } from "../helpers/http.ts";
import { portOf } from "../helpers/raw_http.ts";
import { metric } from "../helpers/scheduling.ts";
import type { StalledAnswer, StalledSpec } from "../helpers/stalled_bodies.ts";
import { serverForTests } from "../helpers/server.ts";

setDefaultTimeout(60_000);

const TIMEOUT_MS = 1000;
const HEALTHZ_MAX_MS = 50;

const s = serverForTests({ env: { SERVICE_BODY_TIMEOUT_MS: String(TIMEOUT_MS) } });

const STALLED_BODIES = join(import.meta.dir, "../helpers/stalled_bodies.ts");

/** /healthz latencies, polled until `until` settles; each must be a 200. */
async function healthzWhile(until: Promise<unknown>): Promise<number[]> {
  let done = false;
  void until.finally(() => {
    done = true;
  });
  const latencies: number[] = [];
  while (!done) {
    const t0 = performance.now();
    const res = await fetch(`${s.url}/healthz`);
    await res.text();
    latencies.push(performance.now() - t0);
    expect(res.status).toBe(200);
    await Bun.sleep(10);
  }
  return latencies;
}

/**
 * The answers to stalled requests sent from a process of their own, with the
 * /healthz latencies polled throughout: from the first connection until the
 * server closed the last one.
 */
async function answersAndHealthz(spec: StalledSpec[]): Promise<{ answers: StalledAnswer[]; latencies: number[] }> {
  await (await fetch(`${s.url}/healthz`)).text(); // the polling connection, opened before the load
  const proc = Bun.spawn([process.execPath, STALLED_BODIES, String(portOf(s.url)), JSON.stringify(spec)], { stdout: "pipe", stderr: "inherit" });
  const lines = (async function* () {
    let buffer = "";
    for await (const chunk of proc.stdout.pipeThrough(new TextDecoderStream())) {
      buffer += chunk;
      for (let i = buffer.indexOf("\n"); i >= 0; i = buffer.indexOf("\n")) {
        yield buffer.slice(0, i);
        buffer = buffer.slice(i + 1);
      }
    }
  })();
  const answers = (async () => {
    expect((await lines.next()).value).toBe("sent");
    const out: StalledAnswer[] = [];
    for await (const line of lines) out.push(JSON.parse(line) as StalledAnswer);
    return out;
  })();
  const latencies = await healthzWhile(answers);
  expect(await proc.exited).toBe(0);
  return { answers: await answers, latencies };
}

function expectTimedOut(a: StalledAnswer): void {
  expect(a.status).toBe(408);
  const body = JSON.parse(a.text);
  expectErrorShape(body);
  expect(body.error).toMatchObject({ type: "invalid_request_error", code: "request_timeout" });
  expect(body.error.message).toContain("SERVICE_BODY_TIMEOUT_MS");
  // Closed once the stall was seen, not left open.
  expect(a.closedAfterMs).toBeGreaterThanOrEqual(TIMEOUT_MS - 50);
  expect(a.closedAfterMs).toBeLessThan(TIMEOUT_MS + 3000);
}

const head = (method: string, path: string, length: number) =>
  `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n`;

describe("a body that stalls is answered 408 and its connection closed", () => {
  test("40 connections that send most of a 1 MiB body, then nothing", async () => {
    const before = await metric(s, "service_request_body_timeouts_total");
    const declared = 1024 * 1024;
    const { answers, latencies } = await answersAndHealthz([
      { head: head("POST", "/v1/chat/completions", declared), body: '{"model": "m", "messages": [{"role": "user", "content": "', padTo: declared * 0.75, count: 40 },
    ]);
    expect(answers).toHaveLength(40);
    for (const a of answers) expectTimedOut(a);
    expect(Math.max(...latencies)).toBeLessThan(HEALTHZ_MAX_MS);
    expect(await metric(s, "service_request_body_timeouts_total")).toBe(before + 40);
  });

  test("300 connections that declare 1000 bytes and send one; GETs that declare a body are answered and closed", async () => {
    const before = await metric(s, "service_request_body_timeouts_total");
    const { answers, latencies } = await answersAndHealthz([
      { head: head("POST", "/v1/completions", 1000), body: "{", count: 150 },
      { head: head("POST", "/generate", 1000), body: "{", count: 150 },
      { head: head("GET", "/healthz", 1000), body: "x", count: 20 },
    ]);
    const posts = answers.slice(0, 300);
    expect(answers).toHaveLength(320);
    for (const a of posts) expectTimedOut(a);
    for (const a of answers.slice(300)) {
      // Answered at once, and closed rather than kept waiting for the 999 bytes that never come.
      expect(a.status).toBe(200);
      expect(a.text).toBe("ok\n");
      expect(a.closedAfterMs).toBeLessThan(TIMEOUT_MS);
    }
    expect(Math.max(...latencies)).toBeLessThan(HEALTHZ_MAX_MS);
    expect(await metric(s, "service_request_body_timeouts_total")).toBe(before + 300);
  });
});

test("a body whose bytes keep coming, slower than the timeout in all, is read and served", async () => {
  const before = await metric(s, "service_request_body_timeouts_total");
  const body = JSON.stringify({ prompt: "Hello", max_tokens: 2 });
  const pieces = [body.slice(0, 5), body.slice(5, 10), body.slice(10, 20), body.slice(20)];
  const stream = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const piece = pieces.shift();
      if (piece === undefined) return controller.close();
      await Bun.sleep(TIMEOUT_MS / 2);
      controller.enqueue(new TextEncoder().encode(piece));
    },
  });
  const t0 = performance.now();
  const res = await fetch(`${s.url}/generate`, { method: "POST", body: stream, headers: { "content-type": "application/json" } });
  expect(performance.now() - t0).toBeGreaterThan(TIMEOUT_MS * 1.5);
  const out = await jsonBody(res, GenerateResponse);
  expect(out.tokens).toHaveLength(2);
  expect(await metric(s, "service_request_body_timeouts_total")).toBe(before);
});
