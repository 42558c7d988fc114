// `bun run bench:serve`: end-to-end HTTP load on the trained demo model.
// Clients stream completions of fixed length from fixed prompts, at several
// concurrencies, against loopserve with batching (SERVICE_MAX_BATCH default)
// and with SERVICE_MAX_BATCH=1, and with --peer against llama.cpp's
// llama-server built from the same source bundle as bench:peer (the model
// exported to GGUF, F16 / Q4_0; -np = concurrency, continuous batching on).
// The servers alternate round by round within each cell.
//
// Per cell (server, format, concurrency, completion length): aggregate
// generated tokens/s, time to first token p50/p99, inter-token latency
// p50/p99 (the gap between consecutive token events of one stream) and time
// per output token (a stream's first to last token over its gaps, the mean
// across streams). A server that outruns the client's reads delivers
// several tokens in one read (gaps of 0), so the single-client baselines of
// the targets are the time per output token, not an ITL percentile. At the
// highest concurrency a ~2,000-token prompt arrives halfway through the
// run, so the inter-token latencies include what a long prefill does to the
// running streams. Writes bench/results/serve.json and prints a table.
//
//   bun run bench:serve                          the full grid, loopserve only
//   bun run bench:serve -- --peer                with llama-server (built once, ~12 minutes on 2 cores)
//   bun run bench:serve -- --quick               concurrency 1 and 8, 64 tokens, 1 round
//   bun run bench:serve -- --prefill-chunk 64    loopserve with SERVICE_PREFILL_CHUNK=64
//   bun run bench:serve -- --pipeline            loopserve with SERVICE_PIPELINE_STEPS=1 as well, alternated
import { parseArgs } from "node:util";
import { formatTable, median, type Row } from "../src/bench/table.ts";
import { parseModelConfig } from "../src/model/format.ts";
import { readSafetensors } from "../src/model/safetensors.ts";
import { TRAINED_MODEL_PATH } from "../src/model/trained.ts";
import { startServer, type TestServer } from "../test/helpers/server.ts";
import { quantizedPath } from "./quant.ts";
import { writeJson } from "./report.ts";

const { values } = parseArgs({
  args: process.argv.slice(2),
  options: {
    concurrency: { type: "string", default: "1,4,8,16" },
    tokens: { type: "string", default: "64,256" },
    formats: { type: "string", default: "fp16,int4" },
    rounds: { type: "string", default: "3" },
    threads: { type: "string", default: "2" },
    quick: { type: "boolean", default: false },
    peer: { type: "boolean", default: false },
    "prefill-chunk": { type: "string" },
    pipeline: { type: "boolean", default: false },
  },
  strict: true,
});

const list = (s: string) => s.split(",").map((x) => Number(x.trim()));
const CONCURRENCY = values.quick ? [1, 8] : list(values.concurrency);
const TOKENS = values.quick ? [64] : list(values.tokens);
type Format = "fp16" | "int4";
const isFormat = (f: string): f is Format => f === "fp16" || f === "int4";
const FORMAT_NAMES = values.formats.split(",").map((f) => f.trim());
const unknownFormat = FORMAT_NAMES.find((f) => !isFormat(f));
if (unknownFormat !== undefined) {
  console.error(`bench:serve: unknown format ${unknownFormat} in --formats; choose from fp16, int4`);
  process.exit(2);
}
const FORMATS = FORMAT_NAMES.filter(isFormat);
const ROUNDS = values.quick ? 1 : Number(values.rounds);
const THREADS = values.threads;
/** SERVICE_PREFILL_CHUNK for loopserve, when given (else the server's default). */
const PREFILL_CHUNK: Record<string, string> = values["prefill-chunk"] ? { SERVICE_PREFILL_CHUNK: values["prefill-chunk"] } : {};
const REQUESTS_PER_CLIENT = 2;
const LONG_PROMPT_WORDS = 2000; // 2,000 GPT-2 tokens (each word one token)

/** The trained model in a format: int4 is its quantized copy (int8 head, group 32), made on first use. */
const modelFile = (format: Format): string =>
  format === "fp16" ? TRAINED_MODEL_PATH : quantizedPath(TRAINED_MODEL_PATH, { quant: "int4", head: "int8" }, 32);

const PROMPTS = [
  "In the beginning God created the heaven and the earth.",
  "And the LORD spake unto Moses, saying,",
  "The LORD is my shepherd; I shall not want.",
  "And it came to pass in those days,",
];
const LONG_PROMPT = Array.from({ length: LONG_PROMPT_WORDS }, (_, i) => ["and", "the", "LORD", "said", "unto", "them"][i % 6]).join(" ");

/** One server under test: how to start it for a cell, and how to ask it for a stream. */
interface Target {
  name: string;
  start(format: Format, concurrency: number): Promise<{ url: string; stop(): Promise<unknown> }>;
  /** Request body for a stream of exactly `tokens` tokens. */
  body(prompt: string, tokens: number): unknown;
  path: string;
}

async function llamaServer(): Promise<Target> {
  const { llamaTools } = await import("./peer/llama.ts");
  const { llamaCompletionBody, startLlamaServer } = await import("./peer/llama_server.ts");
  const tools = llamaTools();
  const loops = parseModelConfig(readSafetensors(TRAINED_MODEL_PATH)).defaultLoops;
  return {
    name: `llama-server ${tools.version}`,
    path: "/completion",
    start: (format, concurrency) => startLlamaServer(tools, TRAINED_MODEL_PATH, loops, format, concurrency, THREADS),
    body: llamaCompletionBody,
  };
}

/** The kernel paths loopserve's start-up lines named ("avx512", "cuda", ...). */
const kernelPaths = new Set<string>();

function loopserve(name: string, env: Record<string, string>): Target {
  return {
    name,
    path: "/generate",
    async start(format) {
      // gpu: the server takes a GPU where it would in production (the kernel path is in the report).
      const s: TestServer = await startServer({ modelPath: modelFile(format), gpu: true, env: { SERVICE_THREADS: THREADS, SERVICE_MAX_SEQ_LEN: "4096", ...PREFILL_CHUNK, ...env } });
      const simd = /simd (\w+)\)/.exec(s.output())?.[1];
      if (simd) kernelPaths.add(simd);
      return { url: s.url, stop: () => s.stop() };
    },
    body: (prompt, tokens) => ({ prompt, max_tokens: tokens, temperature: 0, stream: true }),
  };
}

/** Times of one stream: request sent, each token event. */
interface StreamTimes {
  sent: number;
  tokenAt: number[];
}

/** Reads an SSE stream, recording the arrival time of every event carrying a token. */
async function stream(url: string, body: unknown): Promise<StreamTimes> {
  const sent = performance.now();
  // A fresh connection per request, for every server alike: servers are restarted per cell, often on a
  // port a stopped one had, and a pooled keep-alive socket to that port would be reset.
  const headers = { "content-type": "application/json", connection: "close" };
  const res = await fetch(url, { method: "POST", headers, body: JSON.stringify(body) });
  if (res.status !== 200 || !res.body) throw new Error(`${url}: ${res.status} ${await res.text()}`);
  const tokenAt: number[] = [];
  const decoder = new TextDecoder();
  let buf = "";
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true });
    let nl = buf.indexOf("\n\n");
    for (; nl >= 0; nl = buf.indexOf("\n\n")) {
      const event = buf.slice(0, nl);
      buf = buf.slice(nl + 2);
      const data = event.split("\n").find((l) => l.startsWith("data: "));
      if (!data || data === "data: [DONE]") continue;
      const j = JSON.parse(data.slice(6));
      // loopserve: {token_id, text}, closed by token_id -1; llama-server: {content, stop}, one token per event
      const isToken = j.token_id !== undefined ? j.token_id >= 0 : j.stop !== true;
      if (isToken) tokenAt.push(performance.now());
    }
  }
  return { sent, tokenAt };
}

const pct = (xs: number[], p: number) => {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

interface CellResult {
  tokensPerSecond: number;
  ttftP50: number;
  ttftP99: number;
  itlP50: number;
  itlP99: number;
  tpot: number;
  tokens: number;
}

/** `concurrency` clients, each streaming REQUESTS_PER_CLIENT completions back to back; the long prompt mid-run when asked. */
async function runCell(t: Target, url: string, concurrency: number, tokens: number, longPrompt: boolean): Promise<CellResult> {
  const times: StreamTimes[] = [];
  const start = performance.now();
  const clients = Array.from({ length: concurrency }, async (_, c) => {
    for (let r = 0; r < REQUESTS_PER_CLIENT; r++) times.push(await stream(url + t.path, t.body(PROMPTS[(c + r) % PROMPTS.length], tokens)));
  });
  let long: Promise<StreamTimes> | null = null;
  if (longPrompt) {
    await Bun.sleep(0);
    const expectedMs = 500; // about half of a short run; the exact moment does not matter
    long = Bun.sleep(expectedMs).then(() => stream(url + t.path, t.body(LONG_PROMPT, 8)));
  }
  await Promise.all(clients);
  const wall = performance.now() - start;
  if (long) await long;
  const produced = times.reduce((a, s) => a + s.tokenAt.length, 0);
  const ttft = times.map((s) => s.tokenAt[0] - s.sent);
  const itl = times.flatMap((s) => s.tokenAt.slice(1).map((at, i) => at - s.tokenAt[i]));
  const tpots = times.filter((s) => s.tokenAt.length > 1).map((s) => (s.tokenAt[s.tokenAt.length - 1] - s.tokenAt[0]) / (s.tokenAt.length - 1));
  return {
    tokensPerSecond: produced / (wall / 1000),
    ttftP50: pct(ttft, 50),
    ttftP99: pct(ttft, 99),
    itlP50: pct(itl, 50),
    itlP99: pct(itl, 99),
    tpot: tpots.reduce((a, b) => a + b, 0) / Math.max(1, tpots.length),
    tokens: produced,
  };
}

/**
 * The batching targets, per format and completion length: 8 clients against
 * llama-server and against one client; one client's time per output token
 * against SERVICE_MAX_BATCH=1's; the inter-token p99 at the highest
 * concurrency against one client's time per output token.
 */
function targetsMet(rows: Row[]): Row[] {
  const out: Row[] = [];
  const find = (server: (s: string) => boolean, format: string, clients: number, tokens: number) =>
    rows.find((r) => server(String(r.server)) && r.format === format && r.clients === clients && r.tokens === tokens);
  const ours = (s: string) => s === "loopserve";
  const check = (what: string, value: number | undefined, limit: number, atLeast: boolean) => {
    if (value === undefined || Number.isNaN(value)) return;
    out.push({ target: what, value: value.toFixed(2), limit: `${atLeast ? ">=" : "<="} ${limit}`, met: (atLeast ? value >= limit : value <= limit) ? "yes" : "NO" });
  };
  const top = Math.max(...CONCURRENCY);
  for (const format of FORMATS)
    for (const tokens of TOKENS) {
      const tps = (r: Row | undefined) => (r ? Number(r["tok/s"]) : undefined);
      const eight = tps(find(ours, format, 8, tokens));
      const one = find(ours, format, 1, tokens);
      const peer8 = tps(find((s) => s.startsWith("llama-server"), format, 8, tokens));
      check(`${format} ${tokens} tok: 8 clients / llama-server's`, eight && peer8 ? eight / peer8 : undefined, 2, true);
      check(`${format} ${tokens} tok: 8 clients / 1 client`, eight && one ? eight / Number(one["tok/s"]) : undefined, 2.5, true);
      const solo = find((s) => s === "loopserve batch=1", format, 1, tokens);
      check(`${format} ${tokens} tok: 1 client time per token, batching / batch=1`, one && solo ? Number(one["tpot ms"]) / Number(solo["tpot ms"]) : undefined, 1.05, false);
      const busy = find(ours, format, top, tokens);
      check(`${format} ${tokens} tok: ITL p99 at ${top} clients / 1 client's time per token`, busy && one ? Number(busy["itl p99 ms"]) / Number(one["tpot ms"]) : undefined, 3, false);
    }
  return out;
}

async function main(): Promise<void> {
  const targets: Target[] = [loopserve("loopserve", {}), loopserve("loopserve batch=1", { SERVICE_MAX_BATCH: "1" })];
  if (values.pipeline) targets.push(loopserve("loopserve pipelined", { SERVICE_PIPELINE_STEPS: "1" }));
  if (values.peer) targets.push(await llamaServer());
  const results: Record<string, CellResult[]> = {};
  for (const format of FORMATS) {
    for (const concurrency of CONCURRENCY)
      for (let round = 0; round < ROUNDS; round++)
        for (const t of targets) {
          const server = await t.start(format, concurrency);
          try {
            // Warm-up at the cell's concurrency: a server just started runs
            // its first concurrent requests with cold code paths (loopserve's
            // JIT; first batches), which is not the steady state being measured.
            await runCell(t, server.url, concurrency, 8, false);
            for (const tokens of TOKENS) {
              const longPrompt = concurrency === Math.max(...CONCURRENCY) && concurrency > 1;
              const r = await runCell(t, server.url, concurrency, tokens, longPrompt);
              const key = `${t.name}|${format}|${concurrency}|${tokens}`;
              (results[key] ??= []).push(r);
              console.error(`${key} round ${round + 1}: ${r.tokensPerSecond.toFixed(0)} tok/s, itl p99 ${r.itlP99.toFixed(2)} ms`);
            }
          } finally {
            await server.stop();
          }
        }
  }
  const rows: Row[] = Object.entries(results).map(([key, rs]) => {
    const [server, format, concurrency, tokens] = key.split("|");
    const m = (f: (r: CellResult) => number) => median(rs.map(f));
    return {
      server,
      format,
      clients: Number(concurrency),
      tokens: Number(tokens),
      "tok/s": m((r) => r.tokensPerSecond),
      "ttft p50 ms": m((r) => r.ttftP50),
      "ttft p99 ms": m((r) => r.ttftP99),
      "itl p50 ms": m((r) => r.itlP50),
      "itl p99 ms": m((r) => r.itlP99),
      "tpot ms": m((r) => r.tpot),
    };
  });
  const verdicts = targetsMet(rows);
  const kernels = [...kernelPaths].join(", ");
  const prefillChunk = values["prefill-chunk"] ?? "default";
  const file = writeJson("serve", { threads: Number(THREADS), kernels, prefillChunk, rounds: ROUNDS, requestsPerClient: REQUESTS_PER_CLIENT, rows, verdicts });
  console.log(formatTable(`serving: ${ROUNDS} round(s), medians, ${THREADS} threads, loopserve's kernels ${kernels}, prefill chunk ${prefillChunk} (${file})`, rows));
  console.log(`\n${formatTable("targets", verdicts)}`);
}

await main();
