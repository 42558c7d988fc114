// Load through the public surface: 200 requests from 16 concurrent
// clients on loopback, once with the default queue (all served) and once with
// a queue cap below the client count (some refused). Every response must be a
// 200 whose result equals the sequential (greedy) result for its prompt, or a
// well-formed 503; the lifecycle counters must add up and agree with what the
// clients saw.
import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { GenerateResponse, GenerateStreamEvent } from "../../src/wire/responses.ts";
import { expectErrorShape, expectSchema, sseEvents } from "../helpers/http.ts";
import { generateOk, LIFECYCLE, metrics } from "../helpers/scheduling.ts";
import { startServer, type TestServer } from "../helpers/server.ts";

setDefaultTimeout(60_000);

const REQUESTS = 200;
const CLIENTS = 16;
const SMALL_QUEUE = 8; // below the client count: the queue fills and overflows
const BACKOFF_MS = 10; // a refused client waits this long before its next request

interface Case {
  prompt: string;
  max_tokens: number;
  loops: number;
}

// Distinct prompts, lengths and loop depths, so a result delivered to the
// wrong request (or computed with another request's state) cannot match.
const CASES: Case[] = Array.from({ length: 10 }, (_, i) => ({
  prompt: `Request number ${i}: the looped transformer ${"again ".repeat(i)}said`,
  max_tokens: 3 + ((i * 7) % 10),
  loops: 1 + (i % 5),
}));

interface Outcome {
  status: number;
  tokens?: number[];
  text?: string;
  code?: string | null;
}

/** One request of the load; every third streams, priorities vary. */
async function send(s: TestServer, i: number): Promise<Outcome> {
  const c = CASES[i % CASES.length];
  const stream = i % 3 === 0;
  const res = await s.post("/generate", { ...c, stream, priority: (i % 5) - 2 });
  const raw = await res.text();
  if (res.status !== 200) {
    const body = JSON.parse(raw);
    expectErrorShape(body);
    return { status: res.status, code: body.error.code };
  }
  if (!stream) {
    const r: unknown = JSON.parse(raw);
    expectSchema(GenerateResponse, r);
    return { status: 200, tokens: r.tokens, text: r.text };
  }
  const events = sseEvents(raw, GenerateStreamEvent);
  expect(events.at(-1)?.token_id).toBe(-1);
  return { status: 200, tokens: events.filter((e) => e.token_id >= 0).map((e) => e.token_id), text: events.map((e) => e.text).join("") };
}

/**
 * Runs the load against a fresh server with the given environment and checks
 * everything but the 200/503 split, which it returns.
 */
async function runLoad(env: Record<string, string>): Promise<{ ok: number; refused: number }> {
  const s = await startServer({ env: { SERVICE_MAX_SEQ_LEN: "512", ...env } });
  try {
    // Sequential references, one request at a time.
    const reference: GenerateResponse[] = [];
    for (const c of CASES) reference.push(await generateOk(s, { ...c }));

    const before = await metrics(s, LIFECYCLE);
    const outcomes: { i: number; o: Outcome }[] = [];
    let next = 0;
    const client = async () => {
      for (let i = next++; i < REQUESTS; i = next++) {
        const o = await send(s, i);
        outcomes.push({ i, o });
        // A refused client backs off a little, as a real one would; the
        // others keep the queue full meanwhile.
        if (o.status === 503) await Bun.sleep(BACKOFF_MS);
      }
    };
    await Promise.all(Array.from({ length: CLIENTS }, client));
    const after = await metrics(s, LIFECYCLE);

    expect(outcomes).toHaveLength(REQUESTS);
    const byStatus = new Map<number, number>();
    for (const { o } of outcomes) byStatus.set(o.status, (byStatus.get(o.status) ?? 0) + 1);
    // Nothing but 200 and 503 (no 500, no 4xx: every request was valid).
    expect([...byStatus.keys()].filter((st) => st !== 200 && st !== 503)).toEqual([]);
    const ok = byStatus.get(200) ?? 0;
    const refused = byStatus.get(503) ?? 0;

    for (const { i, o } of outcomes) {
      if (o.status === 503) {
        expect(o.code).toBe("queue_full");
        continue;
      }
      const ref = reference[i % CASES.length];
      expect({ i, tokens: o.tokens, text: o.text }).toEqual({ i, tokens: ref.tokens, text: ref.text });
    }

    const d = Object.fromEntries(LIFECYCLE.map((k) => [k, after[k] - before[k]])) as Record<(typeof LIFECYCLE)[number], number>;
    expect(d.service_requests_submitted_total).toBe(REQUESTS);
    expect(d.service_requests_submitted_total).toBe(
      d.service_requests_completed_total +
        d.service_requests_rejected_total +
        d.service_requests_errored_total +
        d.service_requests_cancelled_total,
    );
    expect(d.service_requests_completed_total).toBe(ok);
    expect(d.service_requests_rejected_total).toBe(refused);
    expect(d.service_requests_errored_total).toBe(0);
    expect(d.service_requests_cancelled_total).toBe(0);
    // Quiescent afterwards.
    const rest = await metrics(s, ["service_queue_depth", "service_requests_in_flight"]);
    expect(rest).toEqual({ service_queue_depth: 0, service_requests_in_flight: 0 });
    return { ok, refused };
  } finally {
    await s.stop();
  }
}

describe("load", () => {
  test(`${REQUESTS} requests from ${CLIENTS} concurrent clients, default queue: every one served, each equal to its sequential result; counters add up`, async () => {
    const { ok, refused } = await runLoad({});
    expect({ ok, refused }).toEqual({ ok: REQUESTS, refused: 0 });
  });

  test(`${REQUESTS} requests from ${CLIENTS} concurrent clients, SERVICE_MAX_BATCH=1, SERVICE_MAX_QUEUE_DEPTH=${SMALL_QUEUE}: only sequential-equal 200s and well-formed 503s; counters add up`, async () => {
    const { ok, refused } = await runLoad({ SERVICE_MAX_BATCH: "1", SERVICE_MAX_QUEUE_DEPTH: String(SMALL_QUEUE) });
    console.log(`load: ${ok} × 200, ${refused} × 503 (queue cap ${SMALL_QUEUE}, ${CLIENTS} clients)`);
    expect(refused).toBeGreaterThan(0); // 16 clients outnumber 1 running + 8 queued
    expect(ok).toBeGreaterThanOrEqual(CLIENTS); // and a real share was still served
  });
});
