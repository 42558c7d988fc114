// Shared pieces of the HTTP-level scheduler tests (test/http/scheduling,
// metrics, load, shutdown): the set-up they share (a queueing server, the
// probes they read it by), /metrics scraping, polling for a server-side
// state, a long-running "blocker" stream that keeps the engine busy, the
// 503 answer, and a model whose every generation is an engine error.
import { afterEach, expect, setDefaultTimeout } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type ErrorBody, GenerateResponse } from "../../src/wire/responses.ts";
import type { SyntheticOptions } from "../../src/model/synthetic.ts";
import { type Family, parsePrometheusText, sampleValue } from "../scheduler/prom_text.ts";
import { expectErrorShape, jsonBody } from "./http.ts";
import { testTempDir, tinyModelPath } from "./models.ts";
import { type ServerOptions, serverForTests, type TestServer } from "./server.ts";

/**
 * A model slow enough (about 1 ms per decode step on one core; the GPT-2
 * vocabulary's output projection dominates) that a queued request takes a
 * visible, ordered slot on the engine, and long enough (8192 positions) for a
 * blocker of thousands of tokens.
 */
export const SLOW: Partial<SyntheticOptions> = { dim: 256, nHeads: 4, nKvHeads: 2, ffnDim: 1024, maxSeqLen: 8192 };

/** SERVICE_MAX_SEQ_LEN of a queueing server: the slow model's whole length. */
export const QUEUE_MAX_SEQ_LEN = 8192;

export const slowModelPath = () => tinyModelPath(SLOW);

export const PROMPT = "The looped transformer said";

// ---- the set-up ----

/**
 * What a test file of the scheduler over HTTP registers first: a minute per
 * test (a blocker holds the engine for seconds) and no stream left open
 * after a test, even one that failed half-way.
 */
export function schedulingTests(): void {
  setDefaultTimeout(60_000);
  afterEach(cancelOpenStreams);
}

/**
 * A server on the slow model that runs one request at a time, with room for
 * a blocker of thousands of tokens: whatever is sent while one runs waits
 * in its queue. `env` adds to its settings or overrides them.
 */
export function queueingServer(env: Record<string, string> = {}): ServerOptions {
  return { modelPath: slowModelPath(), env: { SERVICE_MAX_BATCH: "1", SERVICE_MAX_SEQ_LEN: String(QUEUE_MAX_SEQ_LEN), ...env } };
}

/** A server with the probes these tests read it by, each the function of the same name below. */
export type ProbedServer = TestServer & ReturnType<typeof probes>;

function probes(server: TestServer) {
  return {
    scrape: () => scrape(server),
    metric: (sample: string) => metric(server, sample),
    metrics: <K extends string>(samples: readonly K[]) => metrics(server, samples),
    waitForQueueDepth: (depth: number) => waitForQueueDepth(server, depth),
    generateOk: (body: Record<string, unknown>) => generateOk(server, body),
    openStream: (body: Record<string, unknown>) => openStream(server, body),
    startBlocker: (maxTokens: number, extra: Record<string, unknown> = {}) => startBlocker(server, maxTokens, extra),
  };
}

/** `server` (a handle of serverForTests too: nothing of it is read here) with the probes. */
export function probed(server: TestServer): ProbedServer {
  return Object.assign(server, probes(server));
}

/** A queueing server (`env` added) for the tests of the enclosing file or describe block (serverForTests), with the probes. */
export function queueingServerForTests(env: Record<string, string> = {}): ProbedServer {
  return probed(serverForTests(() => queueingServer(env)));
}

// ---- /metrics ----

/** GET /metrics, checked to be Prometheus text and parsed strictly. */
export async function scrape(server: TestServer): Promise<Map<string, Family>> {
  const res = await fetch(`${server.url}/metrics`);
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type") ?? "").toStartWith("text/plain");
  return parsePrometheusText(await res.text());
}

/** One unlabelled sample (counter, gauge, histogram _count/_sum) from a fresh scrape. */
export async function metric(server: TestServer, sample: string): Promise<number> {
  return sampleValue(await scrape(server), sample);
}

/** Several unlabelled samples from one scrape. */
export async function metrics<K extends string>(server: TestServer, samples: readonly K[]): Promise<Record<K, number>> {
  const fams = await scrape(server);
  return Object.fromEntries(samples.map((s) => [s, sampleValue(fams, s)])) as Record<K, number>;
}

/** How much each sample moved between two readings (metrics()). */
export function delta<K extends string>(after: Record<K, number>, before: Record<K, number>): Record<K, number> {
  return Object.fromEntries(Object.keys(after).map((k) => [k, after[k as K] - before[k as K]])) as Record<K, number>;
}

export const LIFECYCLE = [
  "service_requests_submitted_total",
  "service_requests_completed_total",
  "service_requests_rejected_total",
  "service_requests_errored_total",
  "service_requests_cancelled_total",
] as const;

/** Polls until `cond` holds; fails naming `what` after `timeoutMs`. */
export async function waitFor(what: string, cond: () => Promise<boolean> | boolean, timeoutMs = 15_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await cond())) {
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await Bun.sleep(5);
  }
}

/** Waits until the scheduler holds exactly `depth` queued requests. */
export const waitForQueueDepth = (server: TestServer, depth: number) =>
  waitFor(`service_queue_depth == ${depth}`, async () => (await metric(server, "service_queue_depth")) === depth);

// ---- responses ----

/** Asserts a 503 in the OpenAI error shape with the scheduler's reason code; returns the body. */
export async function expect503(res: Response, code: string): Promise<ErrorBody> {
  const text = await res.text();
  if (res.status !== 503) throw new Error(`expected 503 ${code}, got ${res.status}: ${text}`);
  expect(res.headers.get("content-type") ?? "").toStartWith("application/json");
  const body: unknown = JSON.parse(text);
  expectErrorShape(body);
  expect(body.error.type).toBe("service_unavailable_error");
  expect(body.error.code).toBe(code);
  // Every 503 tells the client when to try again.
  expect(Number(res.headers.get("retry-after"))).toBeGreaterThan(0);
  return body;
}

export async function generateOk(server: TestServer, body: Record<string, unknown>): Promise<GenerateResponse> {
  return jsonBody(await server.post("/generate", body), GenerateResponse);
}

// ---- streams ----

const openStreams = new Set<OpenStream>();

/**
 * Closes every stream still open (call it in afterEach): when a test fails
 * half-way, its blocker must not keep the engine busy for seconds and hold
 * up the next test or the server's graceful stop.
 */
export async function cancelOpenStreams(): Promise<void> {
  const open = [...openStreams];
  openStreams.clear();
  await Promise.all(open.map((s) => s.cancel().catch(() => undefined)));
}

/** An open native stream (POST /generate, stream: true) read event by event. */
export class OpenStream {
  private readonly reader: { read(): Promise<{ done: boolean; value?: Uint8Array }>; cancel(): Promise<void> };
  private readonly decoder = new TextDecoder();
  private buffer = "";
  /** Every complete event payload read so far. */
  readonly events: string[] = [];
  ended = false;

  constructor(readonly response: Response) {
    this.reader = (response.body as ReadableStream<Uint8Array>).getReader();
    openStreams.add(this);
  }

  /** Reads until at least `n` events have arrived (or the stream ended). */
  async waitForEvents(n: number): Promise<void> {
    while (this.events.length < n && !this.ended) await this.pull();
  }

  /** Reads to the end; returns every event payload. */
  async readAll(): Promise<string[]> {
    while (!this.ended) await this.pull();
    return this.events;
  }

  /** Closes the connection: the server sees the client go away. */
  async cancel(): Promise<void> {
    this.ended = true;
    openStreams.delete(this);
    await this.reader.cancel();
  }

  private async pull(): Promise<void> {
    const r = await this.reader.read();
    if (r.done) {
      this.ended = true;
      openStreams.delete(this);
      this.buffer += this.decoder.decode();
    } else this.buffer += this.decoder.decode(r.value, { stream: true });
    for (let i = this.buffer.indexOf("\n\n"); i >= 0; i = this.buffer.indexOf("\n\n")) {
      const event = this.buffer.slice(0, i);
      this.buffer = this.buffer.slice(i + 2);
      expect(event.startsWith("data: ")).toBe(true);
      this.events.push(event.slice("data: ".length));
    }
    if (this.ended) expect(this.buffer).toBe("");
  }
}

/** Starts a native stream and waits for its 200 headers (sent once the request left the queue). */
export async function openStream(server: TestServer, body: Record<string, unknown>): Promise<OpenStream> {
  const res = await server.post("/generate", { ...body, stream: true });
  if (res.status !== 200) throw new Error(`stream refused: ${res.status}: ${await res.text()}`);
  expect(res.headers.get("content-type") ?? "").toStartWith("text/event-stream");
  return new OpenStream(res);
}

/**
 * A long streaming request holding the engine: resolves once its first token
 * arrived, so it is running and everything sent afterwards queues behind it.
 */
export async function startBlocker(server: TestServer, maxTokens: number, extra: Record<string, unknown> = {}): Promise<OpenStream> {
  const s = await openStream(server, { prompt: PROMPT, max_tokens: maxTokens, ...extra });
  await s.waitForEvents(1);
  expect(s.ended).toBe(false);
  return s;
}

// ---- a model that always fails in the engine ----

let poisoned: string | null = null;

/**
 * The tiny model with its attention norm and Wk at the largest finite fp16
 * value (65504): the loader accepts it (every weight is finite), but every
 * key overflows the fp16 cache to infinity, the attention scores are NaN, the
 * sampler refuses the first step and every admitted generation ends as an
 * engine error (counted errored).
 */
export function poisonedModelPath(): string {
  if (poisoned !== null) return poisoned;
  const bytes = new Uint8Array(readFileSync(tinyModelPath()));
  const view = new DataView(bytes.buffer);
  const headerLength = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLength))) as Record<
    string,
    { dtype: string; data_offsets: [number, number] }
  >;
  const start = 8 + headerLength;
  for (const name of ["block.attn_norm.weight", "block.wk.weight"]) {
    const t = header[name];
    if (t?.dtype !== "F16") throw new Error(`${name} is not an F16 tensor`);
    for (let at = start + t.data_offsets[0]; at < start + t.data_offsets[1]; at += 2) view.setUint16(at, 0x7bff, true); // fp16 65504
  }
  const path = join(testTempDir(), "poisoned-overflowing-keys.safetensors");
  writeFileSync(path, bytes);
  poisoned = path;
  return path;
}
