// `bun run bench:serve`: end-to-end HTTP load on the trained demo model.
// Clients stream completions of fixed length from fixed prompts, at several
// concurrencies, against loopserve with batching (SERVICE_MAX_BATCH default)
// and with SERVICE_MAX_BATCH=1, and with --peer against llama.cpp's
// llama-server built from the same source bundle as bench:peer (the model
// exported to GGUF, F16 / Q4_0; -np = concurrency, continuous batching on).
// The servers alternate round by round within each cell.
//
// Per cell (server, model, concurrency, completion length): aggregate
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
//
// On a GPU host, `bun run bench:serve -- --gpu` (one device run, about 8
// minutes): the trained model and a dim-2048 model (GQA 16/4, ffn 5632) in
// fp16 on the GPU, clients 1, 8, 64 and 256, 128- and 512-token
// completions, one request per client, the long prompt mid-run from 64
// clients up; loopserve plain and pipelined against llama-server built with
// its CUDA backend (cached between runs), SERVICE_MAX_BATCH=1 at one client;
// the GPU's utilization sampled through each cell (nvidia-smi); and the
// kernel-level grid (bench/batch.ts on the CUDA library at 1, 8, 64 and 256
// rows beside bench/gpu/torch_decode.py's CUDA-graph decode). Writes
// bench/results/serve-gpu.json with the GPU's name, the commit, every cell
// and the targets, and a dated copy under bench/gpu-runs/ to commit.
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { benchModel } from "../src/cli/bench/models.ts";
import { formatTable, median, type Row } from "../src/cli/bench/table.ts";
import { CUDA_LIBRARY_NAME } from "../src/engine/library.ts";
import { parseModelConfig } from "../src/model/format.ts";
import { readSafetensors } from "../src/model/safetensors.ts";
import { TRAINED_MODEL_PATH } from "../src/model/trained.ts";
import { startServer, type TestServer } from "../test/helpers/server.ts";
import { benchOptions, positiveInt, positiveInts, THREADS_AND_ROUNDS } from "./options.ts";
import { quantizedPath } from "./quant.ts";
import { writeJson } from "./report.ts";

const values = benchOptions({
  concurrency: { type: "string", default: "1,4,8,16" },
  tokens: { type: "string", default: "64,256" },
  formats: { type: "string", default: "fp16,int4" },
  ...THREADS_AND_ROUNDS,
  quick: { type: "boolean", default: false },
  peer: { type: "boolean", default: false },
  "prefill-chunk": { type: "string" },
  pipeline: { type: "boolean", default: false },
  gpu: { type: "boolean", default: false },
});
const GPU = values.gpu;
/** The GPU's name (nvidia-smi) with --gpu. */
const GPU_NAME = GPU ? (spawnSync("nvidia-smi", ["--query-gpu=name", "--format=csv,noheader"], { encoding: "utf8" }).stdout ?? "").trim().split("\n")[0] : "";
if (GPU && !GPU_NAME) {
  console.error("bench:serve --gpu: no NVIDIA GPU here (nvidia-smi answered nothing)");
  process.exit(2);
}

const CONCURRENCY = values.quick ? [1, 8] : GPU ? [1, 8, 64, 256] : positiveInts("concurrency", values.concurrency);
const TOKENS = values.quick ? [64] : GPU ? [128, 512] : positiveInts("tokens", values.tokens);
type Format = "fp16" | "int4";
const isFormat = (f: string): f is Format => f === "fp16" || f === "int4";
const FORMAT_NAMES = values.formats.split(",").map((f) => f.trim());
const unknownFormat = FORMAT_NAMES.find((f) => !isFormat(f));
if (unknownFormat !== undefined) {
  console.error(`bench:serve: unknown format ${unknownFormat} in --formats; choose from fp16, int4`);
  process.exit(2);
}
const ROUNDS = values.quick || GPU ? 1 : positiveInt("rounds", values.rounds);
const THREADS = values.threads;
/** SERVICE_PREFILL_CHUNK for loopserve, when given (else the server's default). */
const PREFILL_CHUNK: Record<string, string> = values["prefill-chunk"] ? { SERVICE_PREFILL_CHUNK: values["prefill-chunk"] } : {};
const REQUESTS_PER_CLIENT = GPU ? 1 : 2;
const LONG_PROMPT_WORDS = 2000; // 2,000 GPT-2 tokens (each word one token)
/** From this many clients up a cell has the long prompt arrive mid-run (on a CPU host: the highest concurrency only). */
const LONG_PROMPT_FROM = GPU ? 64 : Math.max(2, ...CONCURRENCY);

/** One model the servers are measured on: its file, the fp16 file a GGUF is exported from, the llama.cpp format, its depth. */
interface ModelCase {
  label: string;
  path: string;
  fp16: string;
  format: Format;
  loops: number;
}

const TRAINED_LOOPS = parseModelConfig(readSafetensors(TRAINED_MODEL_PATH)).defaultLoops;
/** On a CPU host the trained model in each format (int4: its quantized copy, int8 head, group 32, made on first use); on a GPU the trained model and a dim-2048 one, fp16. */
const MODELS: ModelCase[] = GPU
  ? [
      { label: "trained fp16", path: TRAINED_MODEL_PATH, fp16: TRAINED_MODEL_PATH, format: "fp16", loops: TRAINED_LOOPS },
      ...[await benchModel({ dim: 2048, nHeads: 16, nKvHeads: 4, ffnDim: 5632, loops: 8 })].map(
        (path): ModelCase => ({ label: "dim-2048 fp16", path, fp16: path, format: "fp16", loops: 8 }),
      ),
    ]
  : FORMAT_NAMES.filter(isFormat).map((format) => ({
      label: format,
      path: format === "fp16" ? TRAINED_MODEL_PATH : quantizedPath(TRAINED_MODEL_PATH, { quant: "int4", head: "int8" }, 32),
      fp16: TRAINED_MODEL_PATH,
      format,
      loops: TRAINED_LOOPS,
    }));

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
  start(model: ModelCase, concurrency: number): Promise<{ url: string; stop(): Promise<unknown> }>;
  /** Request body for a stream of exactly `tokens` tokens. */
  body(prompt: string, tokens: number): unknown;
  path: string;
  /** Only at one client (SERVICE_MAX_BATCH=1 on a GPU host, where more would take minutes a cell). */
  oneClientOnly?: boolean;
}

async function llamaServer(): Promise<Target> {
  const { ggufF16, ggufFor, llamaServerCuda, llamaTools } = await import("./peer/llama.ts");
  const { llamaCompletionBody, startLlamaServer } = await import("./peer/llama_server.ts");
  if (GPU) {
    const cuda = llamaServerCuda();
    return {
      name: `llama-server ${cuda.version}`,
      path: "/completion",
      start: (m, concurrency) => startLlamaServer(cuda.server, ggufF16(m.fp16, m.loops), concurrency, THREADS, true),
      body: llamaCompletionBody,
    };
  }
  const tools = llamaTools();
  return {
    name: `llama-server ${tools.version}`,
    path: "/completion",
    start: (m, concurrency) =>
      startLlamaServer(tools.server, ggufFor(tools, m.fp16, m.loops, m.format, (s) => console.error(`[serve] ${s}`)), concurrency, THREADS),
    body: llamaCompletionBody,
  };
}

/** The kernel paths loopserve's start-up lines named ("avx512", "cuda", ...). */
const kernelPaths = new Set<string>();

function loopserve(name: string, env: Record<string, string>, oneClientOnly = false): Target {
  return {
    name,
    path: "/generate",
    oneClientOnly,
    async start(m) {
      // gpu: the server takes a GPU where it would in production (the kernel path is in the report).
      const maxBatch: Record<string, string> = GPU ? { SERVICE_MAX_BATCH: "256", SERVICE_MAX_QUEUE_DEPTH: "1024" } : {};
      const s: TestServer = await startServer({
        modelPath: m.path,
        gpu: true,
        env: { SERVICE_THREADS: THREADS, SERVICE_MAX_SEQ_LEN: "4096", ...maxBatch, ...PREFILL_CHUNK, ...env },
      });
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

/** Samples the GPU's utilization (nvidia-smi, every 200 ms) until stopped; resolves to the mean percentage. */
function gpuUtilization(): { stop(): Promise<number> } {
  const proc = Bun.spawn(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"], { stdout: "pipe", stderr: "ignore" });
  const text = new Response(proc.stdout).text();
  return {
    async stop() {
      proc.kill();
      const samples = (await text).split("\n").map(Number).filter((x) => Number.isFinite(x) && x >= 0);
      return samples.length ? samples.reduce((a, b) => a + b, 0) / samples.length : Number.NaN;
    },
  };
}

type Verdict = { target: string; value: string; limit: string; met: string };

/**
 * The batching targets, per model and completion length: 8 clients against
 * llama-server and against one client; one client's time per output token
 * against SERVICE_MAX_BATCH=1's; the inter-token p99 under load (the long
 * prompt mid-run) against one client's time per output token. On a GPU also
 * the aggregate at 64 and 256 clients and 64 clients against llama-server.
 */
function targetsMet(rows: Row[]): Verdict[] {
  const out: Verdict[] = [];
  const find = (server: (s: string) => boolean, model: string, clients: number, tokens: number) =>
    rows.find((r) => server(String(r.server)) && r.model === model && r.clients === clients && r.tokens === tokens);
  const ours = (s: string) => s === "loopserve";
  const peer = (s: string) => s.startsWith("llama-server");
  const check = (what: string, value: number | undefined, limit: number, atLeast: boolean) => {
    if (value === undefined || Number.isNaN(value)) return;
    out.push({ target: what, value: value.toFixed(2), limit: `${atLeast ? ">=" : "<="} ${limit}`, met: (atLeast ? value >= limit : value <= limit) ? "yes" : "NO" });
  };
  const tps = (r: Row | undefined) => (r ? Number(r["tok/s"]) : undefined);
  const busyAt = GPU ? 64 : Math.max(...CONCURRENCY);
  for (const { label } of MODELS)
    for (const tokens of TOKENS) {
      const at = (n: number) => `${label} ${tokens} tok: ${n} client${n === 1 ? "" : "s"}`;
      const one = find(ours, label, 1, tokens);
      const solo = find((s) => s === "loopserve batch=1", label, 1, tokens);
      check(`${at(1)}, time per token, batching / batch=1`, one && solo ? Number(one["tpot ms"]) / Number(solo["tpot ms"]) : undefined, 1.05, false);
      const busy = find(ours, label, busyAt, tokens);
      check(`${at(busyAt)}, ITL p99 / 1 client's time per token`, busy && one ? Number(busy["itl p99 ms"]) / Number(one["tpot ms"]) : undefined, 3, false);
      if (GPU) {
        const many = tps(busy);
        const peerMany = tps(find(peer, label, 64, tokens));
        check(`${at(64)}, tok/s / llama-server CUDA's`, many && peerMany ? many / peerMany : undefined, 2, true);
        if (label.startsWith("dim-2048")) {
          check(`${at(64)}, tok/s`, many, 40_000, true);
          check(`${at(256)}, tok/s`, tps(find(ours, label, 256, tokens)), 80_000, true);
        }
      } else {
        const eight = tps(find(ours, label, 8, tokens));
        const peer8 = tps(find(peer, label, 8, tokens));
        check(`${at(8)} / llama-server's`, eight && peer8 ? eight / peer8 : undefined, 2, true);
        check(`${at(8)} / 1 client`, eight && one ? eight / Number(one["tok/s"]) : undefined, 2.5, true);
      }
    }
  return out;
}

/** On a GPU host: the kernel-level grid (ls_batch_step on the CUDA library beside the PyTorch CUDA-graph decode), cells and targets. */
async function kernelGrid(): Promise<{ cells: Row[]; verdicts: Verdict[] }> {
  const { kernelDecode, torchPeers } = await import("./gpu/kernel.ts");
  const sh = (cmd: string[], opts: { allowFail?: boolean } = {}) => {
    const r = spawnSync(cmd[0], cmd.slice(1), { cwd: join(import.meta.dir, ".."), encoding: "utf8", maxBuffer: 1 << 26 });
    const out = `${r.stdout ?? ""}${r.stderr ?? ""}`;
    if (r.status !== 0 && !opts.allowFail) throw new Error(`${cmd.join(" ")} exited ${r.status}:\n${out.slice(-4000)}`);
    return out;
  };
  const lib = join(import.meta.dir, "..", "build", CUDA_LIBRARY_NAME);
  const rows = [1, 8, 64, 256];
  const cells: Row[] = [];
  const verdicts: Verdict[] = [];
  for (const m of MODELS) {
    const graph = torchPeers(sh, m.path, m.loops, rows.join(","), "graph").cells;
    for (const n of rows) {
      const ours = kernelDecode(sh, lib, m.path, m.loops, n);
      const theirs = graph.find((c) => c.rows === n)?.tok_s ?? Number.NaN;
      cells.push({ model: m.label, loops: m.loops, rows: n, "loopserve tok/s": ours, "pytorch cuda graph tok/s": theirs });
      if (m.label.startsWith("dim-2048") && n >= 64) {
        const ratio = ours / theirs;
        verdicts.push({ target: `kernel level ${m.label} loops ${m.loops}, ${n} rows, x pytorch cuda graph`, value: ratio.toFixed(2), limit: ">= 1.5", met: ratio >= 1.5 ? "yes" : "NO" });
      }
    }
  }
  return { cells, verdicts };
}

async function main(): Promise<void> {
  const started = performance.now();
  const targets: Target[] = [loopserve("loopserve", {}), loopserve("loopserve batch=1", { SERVICE_MAX_BATCH: "1" }, GPU)];
  if (values.pipeline || GPU) targets.push(loopserve("loopserve pipelined", { SERVICE_PIPELINE_STEPS: "1" }));
  if (values.peer || GPU) targets.push(await llamaServer());
  const results: Record<string, (CellResult & { gpuUtil: number })[]> = {};
  for (const m of MODELS) {
    for (const concurrency of CONCURRENCY)
      for (let round = 0; round < ROUNDS; round++)
        for (const t of targets) {
          if (t.oneClientOnly && concurrency > 1) continue;
          const server = await t.start(m, concurrency);
          try {
            // Warm-up at the cell's concurrency: a server just started runs
            // its first concurrent requests with cold code paths (loopserve's
            // JIT; first batches), which is not the steady state being measured.
            await runCell(t, server.url, concurrency, 8, false);
            for (const tokens of TOKENS) {
              const util = GPU ? gpuUtilization() : null;
              const r = await runCell(t, server.url, concurrency, tokens, concurrency >= LONG_PROMPT_FROM && concurrency > 1);
              const gpuUtil = util ? await util.stop() : Number.NaN;
              const key = `${t.name}|${m.label}|${concurrency}|${tokens}`;
              (results[key] ??= []).push({ ...r, gpuUtil });
              console.error(`${key} round ${round + 1}: ${r.tokensPerSecond.toFixed(0)} tok/s, itl p99 ${r.itlP99.toFixed(2)} ms`);
            }
          } finally {
            await server.stop();
          }
        }
  }
  const rows: Row[] = Object.entries(results).map(([key, rs]) => {
    const [server, model, concurrency, tokens] = key.split("|");
    const m = (f: (r: CellResult & { gpuUtil: number }) => number) => median(rs.map(f));
    return {
      server,
      model,
      clients: Number(concurrency),
      tokens: Number(tokens),
      "tok/s": m((r) => r.tokensPerSecond),
      "ttft p50 ms": m((r) => r.ttftP50),
      "ttft p99 ms": m((r) => r.ttftP99),
      "itl p50 ms": m((r) => r.itlP50),
      "itl p99 ms": m((r) => r.itlP99),
      "tpot ms": m((r) => r.tpot),
      ...(GPU ? { "gpu util %": m((r) => r.gpuUtil) } : {}),
    };
  });
  const verdicts = targetsMet(rows);
  const kernels = [...kernelPaths].join(", ");
  const prefillChunk = values["prefill-chunk"] ?? "default";
  console.log(formatTable(`serving: ${ROUNDS} round(s), medians, ${THREADS} threads, loopserve's kernels ${kernels}, prefill chunk ${prefillChunk}`, rows));
  if (!GPU) {
    const file = writeJson("serve", { threads: Number(THREADS), kernels, prefillChunk, rounds: ROUNDS, requestsPerClient: REQUESTS_PER_CLIENT, rows, verdicts });
    console.log(`\n${formatTable("targets", verdicts)}\n(${file})`);
    return;
  }
  const grid = await kernelGrid();
  console.log(`\n${formatTable(`kernel level on ${GPU_NAME}`, grid.cells)}`);
  const seconds = (performance.now() - started) / 1000;
  const all = [...verdicts, ...grid.verdicts, { target: "bench:serve --gpu wall seconds", value: seconds.toFixed(0), limit: "< 480", met: seconds < 480 ? "yes" : "NO" }];
  console.log(`\n${formatTable("targets", all)}`);
  const commit = spawnSync("git", ["rev-parse", "HEAD"], { encoding: "utf8" }).stdout?.trim() || "unknown";
  const date = new Date().toISOString();
  const file = writeJson("serve-gpu", { gpu: GPU_NAME, commit, date, threads: Number(THREADS), kernels, rows, kernelLevel: grid.cells, targets: all });
  const runs = join(import.meta.dir, "gpu-runs");
  mkdirSync(runs, { recursive: true });
  const slug = String(GPU_NAME).replace(/^NVIDIA /, "").replace(/[^A-Za-z0-9]+/g, "-").toLowerCase();
  const copy = join(runs, `serve-${date.slice(0, 10)}-${slug}.json`);
  copyFileSync(file, copy);
  console.log(`wrote ${file} and ${copy}`);
}

await main();
