// `bun run soak`: a bounded soak of a real server on the trained demo model.
// 5,000 requests (--requests) from 6 concurrent clients (--concurrency), a
// fixed mix of every route family: native /generate, /v1 chat and text
// completions, streaming and not, speculative and tree-speculative, and
// clients that hang up mid-stream or while their request waits or runs.
//
// Reported, and written to bench/results/soak.json and soak.txt:
//   - the server's RSS over time (VmRSS from /proc/<pid>/status, every second);
//   - p50/p99 latency per request kind over the first and the last 10% of
//     the requests (by submission order);
//   - answers that were not 2xx, by kind and status;
//   - the request counters of /metrics once the server has settled.
// Targets (exit code 1 when one is missed): RSS growth after warm-up (the
// first 10% of the requests) under 10%; p99 latency of the last 10% within
// 1.5x that of the first 10% (all kinds together: per kind there are too few
// samples for a p99); submitted = completed + rejected + errored + cancelled;
// no engine error, no internal error in the server log.
//
//   bun run soak                       the full run
//   bun run soak -- --requests 300     a short one, for development
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { readSafetensors } from "../src/model/safetensors.ts";
import { TRAINED_MODEL_PATH } from "../src/model/trained.ts";
import { parsePrometheusText, sampleValue } from "../test/scheduler/prom_text.ts";
import { describeCounters, identityHolds, type RequestCounters, settledRequestCounters } from "../test/helpers/request_counters.ts";
import { startServer, type TestServer } from "../test/helpers/server.ts";
import { formatTable, type Row } from "../src/cli/bench/table.ts";
import { benchOptions, positiveInt } from "./options.ts";
import { writeJson } from "./report.ts";

// ---- settings ----

const values = benchOptions({
  requests: { type: "string", default: "5000" },
  concurrency: { type: "string", default: "6" },
  seed: { type: "string", default: "1" },
});

const REQUESTS = positiveInt("requests", values.requests);
const CONCURRENCY = positiveInt("concurrency", values.concurrency);
const SEED = positiveInt("seed", values.seed);
const EDGE = 0.1; // the first and last 10%: warm-up, and the windows compared
const RSS_GROWTH_LIMIT = 0.1;
const P99_RATIO_LIMIT = 1.5;

// ---- the request mix ----

/** A deterministic stream of numbers in [0, 1) (mulberry32). */
function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PROMPTS = [
  "And God said unto Moses,",
  "The LORD is my shepherd;",
  "In the beginning God created the heaven and the earth.",
  "And it came to pass, when the king heard",
  "Blessed are the poor in spirit:",
  "And Jesus answered and said unto them,",
  "Now these are the generations of the sons of Noah,",
  "Let not your heart be troubled:",
];

interface Plan {
  path: string;
  body: Record<string, unknown>;
  stream: boolean;
  /** Hang up after this many stream chunks. */
  cancelAfterChunks?: number;
  /** Hang up after this many milliseconds (queued or running). */
  cancelAfterMs?: number;
}

type Rand = () => number;
const pick = <T>(r: Rand, xs: T[]): T => xs[Math.floor(r() * xs.length)];
const int = (r: Rand, lo: number, hi: number) => lo + Math.floor(r() * (hi - lo + 1));

function nativeBody(r: Rand): Record<string, unknown> {
  const greedy = r() < 0.5;
  return {
    prompt: pick(r, PROMPTS),
    max_tokens: int(r, 8, 48),
    loops: int(r, 2, 8),
    temperature: greedy ? 0 : 0.8,
    sample_seed: int(r, 0, 1000),
  };
}

function chatBody(r: Rand): Record<string, unknown> {
  return {
    model: "kjv",
    messages: [{ role: "user", content: pick(r, PROMPTS) }],
    max_tokens: int(r, 8, 48),
    temperature: r() < 0.5 ? 0 : 0.8,
    seed: int(r, 0, 1000),
  };
}

function completionBody(r: Rand): Record<string, unknown> {
  return { model: "kjv", prompt: pick(r, PROMPTS), max_tokens: int(r, 8, 48), temperature: r() < 0.5 ? 0 : 0.8, seed: int(r, 0, 1000) };
}

const KINDS: { name: string; weight: number; plan: (r: Rand) => Plan }[] = [
  { name: "native", weight: 3, plan: (r) => ({ path: "/generate", body: nativeBody(r), stream: false }) },
  { name: "native-stream", weight: 2, plan: (r) => ({ path: "/generate", body: { ...nativeBody(r), stream: true }, stream: true }) },
  { name: "chat", weight: 3, plan: (r) => ({ path: "/v1/chat/completions", body: chatBody(r), stream: false }) },
  {
    name: "chat-stream",
    weight: 2,
    plan: (r) => ({ path: "/v1/chat/completions", body: { ...chatBody(r), stream: true, stream_options: { include_usage: true } }, stream: true }),
  },
  { name: "completion", weight: 2, plan: (r) => ({ path: "/v1/completions", body: completionBody(r), stream: false }) },
  { name: "completion-stream", weight: 1, plan: (r) => ({ path: "/v1/completions", body: { ...completionBody(r), stream: true }, stream: true }) },
  {
    name: "speculative",
    weight: 2,
    plan: (r) => ({ path: "/generate/speculative", body: { ...nativeBody(r), draft_loops: int(r, 1, 3), verify_loops: 8, draft_ahead: int(r, 2, 6) }, stream: false }),
  },
  {
    name: "tree-speculative",
    weight: 1,
    plan: (r) => ({
      path: "/generate/tree_speculative",
      body: { ...nativeBody(r), temperature: 0, draft_loops: 2, verify_loops: 8, draft_ahead: 4, K_branches: int(r, 2, 4) },
      stream: false,
    }),
  },
  {
    name: "api-v0-chat",
    weight: 1,
    // Priorities at or above the default 0: under constant load a negative one
    // waits until nothing else is queued (strict priority, by design), and
    // those waits of many seconds would be all the p99 measured.
    plan: (r) => ({ path: "/api/v0/chat/completions", body: { ...chatBody(r), mode: pick(r, ["generate", "speculative"]), priority: int(r, 0, 3) }, stream: false }),
  },
  {
    name: "cancel-stream",
    weight: 2,
    plan: (r) =>
      r() < 0.5
        ? { path: "/generate", body: { ...nativeBody(r), max_tokens: 200, stream: true }, stream: true, cancelAfterChunks: int(r, 1, 4) }
        : { path: "/v1/chat/completions", body: { ...chatBody(r), max_tokens: 200, stream: true }, stream: true, cancelAfterChunks: int(r, 1, 4) },
  },
  {
    name: "cancel-wait",
    weight: 1,
    plan: (r) => ({ path: "/generate", body: { ...nativeBody(r), max_tokens: 200 }, stream: false, cancelAfterMs: int(r, 1, 80) }),
  },
];
const TOTAL_WEIGHT = KINDS.reduce((a, k) => a + k.weight, 0);

function planFor(index: number): { kind: string; plan: Plan } {
  const r = random(SEED * 1_000_003 + index);
  let w = r() * TOTAL_WEIGHT;
  for (const k of KINDS) {
    w -= k.weight;
    if (w < 0) return { kind: k.name, plan: k.plan(r) };
  }
  const last = KINDS[KINDS.length - 1];
  return { kind: last.name, plan: last.plan(r) };
}

// ---- running one request ----

type Outcome = "ok" | "http-error" | "cancelled" | "transport-error";

interface Record_ {
  index: number;
  kind: string;
  startMs: number;
  latencyMs: number;
  status: number | null;
  outcome: Outcome;
  detail?: string;
}

async function runOne(url: string, index: number, t0: number): Promise<Record_> {
  const { kind, plan } = planFor(index);
  const start = performance.now();
  const abort = new AbortController();
  const timer = plan.cancelAfterMs !== undefined ? setTimeout(() => abort.abort(), plan.cancelAfterMs) : null;
  const done = (status: number | null, outcome: Outcome, detail?: string): Record_ => ({
    index,
    kind,
    startMs: start - t0,
    latencyMs: performance.now() - start,
    status,
    outcome,
    ...(detail ? { detail } : {}),
  });
  try {
    const res = await fetch(`${url}${plan.path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(plan.body),
      signal: abort.signal,
    });
    if (!res.ok) return done(res.status, "http-error", (await res.text()).slice(0, 300));
    if (plan.cancelAfterChunks !== undefined && res.body) {
      const reader = res.body.getReader();
      for (let i = 0; i < plan.cancelAfterChunks; i++) if ((await reader.read()).done) break;
      await reader.cancel();
      return done(res.status, "cancelled");
    }
    const text = await res.text();
    if (plan.stream && !text.includes("data: [DONE]")) return done(res.status, "transport-error", "stream ended without [DONE]");
    if (plan.stream && text.includes('"error"')) return done(res.status, "http-error", text.slice(0, 300));
    return done(res.status, "ok");
  } catch (e) {
    if (abort.signal.aborted) return done(null, "cancelled");
    return done(null, "transport-error", (e as Error).message);
  } finally {
    if (timer !== null) clearTimeout(timer);
  }
}

// ---- memory ----

interface RssSample {
  t: number; // seconds since the start
  rssMb: number;
  /** JavaScript heap in use (nodejs_heap_size_used_bytes of /metrics, read every 5 s): tells a JS leak from allocator growth. */
  jsHeapMb: number;
  finished: number; // requests finished so far
}

function rssMb(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : Number.NaN;
}

// ---- statistics ----

function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
}

const round = (x: number, d = 1) => (Number.isFinite(x) ? Number(x.toFixed(d)) : Number.NaN);

function latencyRows(records: Record_[]): { rows: Row[]; start: number[]; end: number[] } {
  const edge = Math.max(1, Math.floor(records.length * EDGE));
  const ok = (r: Record_) => r.outcome === "ok";
  const first = records.filter((r) => r.index < edge && ok(r));
  const last = records.filter((r) => r.index >= records.length - edge && ok(r));
  const rows: Row[] = [];
  for (const kind of [...KINDS.map((k) => k.name), "all"]) {
    const a = first.filter((r) => kind === "all" || r.kind === kind).map((r) => r.latencyMs);
    const b = last.filter((r) => kind === "all" || r.kind === kind).map((r) => r.latencyMs);
    if (a.length === 0 && b.length === 0) continue;
    rows.push({
      kind,
      n_start: a.length,
      p50_start_ms: round(percentile(a, 50)),
      p99_start_ms: round(percentile(a, 99)),
      n_end: b.length,
      p50_end_ms: round(percentile(b, 50)),
      p99_end_ms: round(percentile(b, 99)),
      p99_end_over_start: round(percentile(b, 99) / percentile(a, 99), 2),
    });
  }
  return { rows, start: first.map((r) => r.latencyMs), end: last.map((r) => r.latencyMs) };
}

function outcomeRows(records: Record_[]): Row[] {
  const rows: Row[] = [];
  for (const { name } of KINDS) {
    const mine = records.filter((r) => r.kind === name);
    const count = (o: Outcome) => mine.filter((r) => r.outcome === o).length;
    const statuses = new Map<string, number>();
    for (const r of mine.filter((x) => x.outcome === "http-error" || x.outcome === "transport-error")) {
      const key = String(r.status ?? "none");
      statuses.set(key, (statuses.get(key) ?? 0) + 1);
    }
    rows.push({
      kind: name,
      requests: mine.length,
      ok: count("ok"),
      cancelled_by_client: count("cancelled"),
      non_2xx: count("http-error"),
      transport_errors: count("transport-error"),
      statuses: [...statuses].map(([s, n]) => `${s}:${n}`).join(" ") || "-",
    });
  }
  return rows;
}

// ---- the run ----

async function soak(): Promise<number> {
  const maxSeqLen = readSafetensors(TRAINED_MODEL_PATH).metadata.max_seq_len;
  const server: TestServer = await startServer({ modelPath: TRAINED_MODEL_PATH, gpu: true, env: { SERVICE_MAX_SEQ_LEN: maxSeqLen } });
  console.log(`soak: ${REQUESTS} requests, concurrency ${CONCURRENCY}, server pid ${server.pid} on ${TRAINED_MODEL_PATH}`);
  const t0 = performance.now();
  const records: Record_[] = [];
  const samples: RssSample[] = [];
  let jsHeapMb = Number.NaN;
  const readHeap = async () => {
    const families = parsePrometheusText(await (await fetch(`${server.url}/metrics`)).text());
    jsHeapMb = round(sampleValue(families, "nodejs_heap_size_used_bytes") / 2 ** 20, 2);
  };
  await readHeap();
  const heapReader = setInterval(() => void readHeap().catch(() => undefined), 5000);
  const sample = () =>
    samples.push({ t: round((performance.now() - t0) / 1000, 2), rssMb: round(rssMb(server.pid), 2), jsHeapMb, finished: records.length });
  sample();
  const sampler = setInterval(sample, 1000);
  const progress = setInterval(() => console.log(`  ${records.length}/${REQUESTS} requests, RSS ${samples.at(-1)?.rssMb} MB`), 30_000);

  let next = 0;
  let warmupRss: number | null = null;
  const warmup = Math.max(1, Math.floor(REQUESTS * EDGE));
  const worker = async () => {
    for (let i = next++; i < REQUESTS; i = next++) {
      records.push(await runOne(server.url, i, t0));
      if (warmupRss === null && records.length >= warmup) {
        sample();
        warmupRss = samples.at(-1)!.rssMb;
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  clearInterval(sampler);
  clearInterval(progress);
  clearInterval(heapReader);
  const counters: RequestCounters = await settledRequestCounters(server.url);
  await readHeap();
  sample();
  const seconds = (performance.now() - t0) / 1000;
  const healthy = (await fetch(`${server.url}/healthz`)).status === 200;
  const internalErrors = server.output().split("\n").filter((l) => l.includes("internal error on"));
  await server.stop();

  records.sort((a, b) => a.index - b.index);
  const finalRss = samples.at(-1)!.rssMb;
  const afterWarmup = samples.filter((s) => s.finished >= warmup);
  const peakRss = Math.max(...afterWarmup.map((s) => s.rssMb));
  const rssGrowth = (finalRss - warmupRss!) / warmupRss!;
  const latency = latencyRows(records);
  const p99Ratio = percentile(latency.end, 99) / percentile(latency.start, 99);

  const verdicts: Row[] = [
    { target: `RSS growth after warm-up < ${RSS_GROWTH_LIMIT * 100}%`, measured: `${round(warmupRss!)} -> ${round(finalRss)} MB (${round(rssGrowth * 100)}%), peak ${round(peakRss)} MB`, met: rssGrowth < RSS_GROWTH_LIMIT ? "yes" : "NO" },
    { target: `p99 end <= ${P99_RATIO_LIMIT}x p99 start (all kinds)`, measured: `${round(percentile(latency.start, 99))} -> ${round(percentile(latency.end, 99))} ms (${round(p99Ratio, 2)}x)`, met: p99Ratio <= P99_RATIO_LIMIT ? "yes" : "NO" },
    { target: "submitted = completed + rejected + errored + cancelled", measured: describeCounters(counters), met: counters.settled && identityHolds(counters) ? "yes" : "NO" },
    { target: "no engine errors, no internal errors, healthy at the end", measured: `errored ${counters.errored}, internal ${internalErrors.length}, healthz ${healthy ? 200 : "not 200"}`, met: counters.errored === 0 && internalErrors.length === 0 && healthy ? "yes" : "NO" },
  ];

  const rssRows: Row[] = samples.filter((_, i) => i % Math.max(1, Math.ceil(samples.length / 20)) === 0 || i === samples.length - 1).map((s) => ({ t_s: s.t, requests_done: s.finished, rss_mb: s.rssMb, js_heap_used_mb: s.jsHeapMb }));
  const title = `soak: ${REQUESTS} requests at concurrency ${CONCURRENCY} in ${round(seconds)} s (${round(REQUESTS / seconds)} req/s), trained model`;
  const tables = [
    formatTable(`${title}\n\ntargets`, verdicts),
    formatTable(`latency (ms) of completed requests, first vs last ${EDGE * 100}% of requests`, latency.rows),
    formatTable("outcomes by kind", outcomeRows(records)),
    formatTable("server RSS over time", rssRows),
  ].join("\n\n");
  console.log(`\n${tables}`);
  const txt = join(import.meta.dir, "results", "soak.txt");
  const json = writeJson("soak", {
    settings: { requests: REQUESTS, concurrency: CONCURRENCY, seed: SEED, model: TRAINED_MODEL_PATH, max_seq_len: Number(maxSeqLen) },
    seconds: round(seconds, 2),
    targets: verdicts,
    latency: latency.rows,
    outcomes: outcomeRows(records),
    counters,
    rss: { warmup_mb: warmupRss, final_mb: finalRss, peak_after_warmup_mb: peakRss, growth: round(rssGrowth, 4), samples },
    failures: records.filter((r) => r.outcome === "http-error" || r.outcome === "transport-error").slice(0, 50),
  });
  writeFileSync(txt, `${tables}\n`);
  console.log(`\nwrote ${json} and ${txt}`);
  return verdicts.every((v) => v.met === "yes") ? 0 : 1;
}

process.exit(await soak());
