// `bun run bench:overhead`: the server's own work per streamed token, apart
// from the kernels. On a GPU a batched step of many rows takes about a
// millisecond, so what the event loop spends per token on HTTP, server-sent
// events, detokenization, metrics and scheduling bounds the aggregate rate.
// This measures it where the kernels cost almost nothing: a tiny synthetic
// model (dim 16, one loop, GPT-2 vocabulary) on one kernel thread,
// SERVICE_MAX_BATCH=256, greedy streams of 128 tokens (two requests per
// client, back to back) on each route family, at 64 and 256 clients.
//
// Per cell, from /metrics before and after: process CPU seconds (user and
// system) minus service_engine_step_seconds_total (the event loop waits for
// each kernel call), divided by the generated tokens, is the server's CPU
// time per token; its inverse is the most tokens per second this server
// could stream with kernels that took no time. The client runs in this
// process, the server in its own. Writes bench/results/overhead.json.
//
//   bun run bench:overhead                    64 and 256 clients, every route, 3 rounds
//   bun run bench:overhead -- --quick         256 clients, /generate, 1 round
//   bun run bench:overhead -- --pipeline      with SERVICE_PIPELINE_STEPS=1
import { mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { formatTable, median, type Row } from "../src/cli/bench/table.ts";
import { writeSyntheticModel } from "../src/model/synthetic.ts";
import { parsePrometheusText, sampleValue } from "../test/scheduler/prom_text.ts";
import { startServer, type TestServer } from "../test/helpers/server.ts";
import { benchOptions, positiveInt, positiveInts } from "./options.ts";
import { writeJson } from "./report.ts";

const values = benchOptions({
  clients: { type: "string", default: "64,256" },
  tokens: { type: "string", default: "128" },
  rounds: { type: "string", default: "3" },
  quick: { type: "boolean", default: false },
  pipeline: { type: "boolean", default: false },
});
const CLIENTS = values.quick ? [256] : positiveInts("clients", values.clients);
const TOKENS = positiveInt("tokens", values.tokens);
const ROUNDS = values.quick ? 1 : positiveInt("rounds", values.rounds);
const REQUESTS_PER_CLIENT = 2;

interface Route {
  name: string;
  path: string;
  body(i: number): unknown;
}
const prompt = (i: number) => `In the beginning God created the heaven and the earth. ${i}`;
const ROUTES: Route[] = [
  { name: "/generate", path: "/generate", body: (i) => ({ prompt: prompt(i), max_tokens: TOKENS, temperature: 0, stream: true }) },
  {
    name: "/v1/completions",
    path: "/v1/completions",
    body: (i) => ({ model: "m", prompt: prompt(i), max_tokens: TOKENS, temperature: 0, stream: true }),
  },
  {
    name: "/v1/chat/completions",
    path: "/v1/chat/completions",
    body: (i) => ({ model: "m", messages: [{ role: "user", content: prompt(i) }], max_tokens: TOKENS, temperature: 0, stream: true }),
  },
];
const routes = values.quick ? ROUTES.slice(0, 1) : ROUTES;

function tinyModel(): string {
  const dir = join(tmpdir(), "loopserve-bench");
  mkdirSync(dir, { recursive: true });
  const path = join(dir, "overhead-dim16.safetensors");
  writeSyntheticModel(path, { dim: 16, nHeads: 1, nKvHeads: 1, ffnDim: 32, vocabSize: 50257, loops: 1, seed: 1 });
  return path;
}

const SERIES = [
  "process_cpu_user_seconds_total",
  "process_cpu_system_seconds_total",
  "service_engine_step_seconds_total",
  "service_generated_tokens_total",
] as const;

async function scrape(s: TestServer): Promise<Record<(typeof SERIES)[number], number>> {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  const families = parsePrometheusText(text);
  return Object.fromEntries(SERIES.map((name) => [name, sampleValue(families, name)])) as Record<(typeof SERIES)[number], number>;
}

/** Reads a stream to its end; the events it carried. */
async function drain(res: Response): Promise<void> {
  if (res.status !== 200 || !res.body) throw new Error(`${res.status} ${await res.text()}`);
  for await (const _ of res.body) {
    // the bytes are not needed: the server's counters say how many tokens went out
  }
}

interface Cell {
  route: string;
  clients: number;
  tokens: number;
  seconds: number;
  tokensPerSecond: number;
  kernelShare: number;
  userUsPerToken: number;
  systemUsPerToken: number;
}

async function runCell(s: TestServer, route: Route, clients: number): Promise<Cell> {
  const before = await scrape(s);
  const started = performance.now();
  await Promise.all(
    Array.from({ length: clients }, async (_, c) => {
      for (let r = 0; r < REQUESTS_PER_CLIENT; r++) {
        const body = JSON.stringify(route.body(c * REQUESTS_PER_CLIENT + r));
        await drain(await fetch(s.url + route.path, { method: "POST", headers: { "content-type": "application/json" }, body }));
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const after = await scrape(s);
  const d = (k: (typeof SERIES)[number]) => after[k] - before[k];
  const tokens = d("service_generated_tokens_total");
  const kernel = d("service_engine_step_seconds_total");
  const user = d("process_cpu_user_seconds_total");
  const system = d("process_cpu_system_seconds_total");
  return {
    route: route.name,
    clients,
    tokens,
    seconds,
    tokensPerSecond: tokens / seconds,
    kernelShare: kernel / seconds,
    // The kernel calls run on the event loop's thread (one kernel thread): their time is user time.
    userUsPerToken: (1e6 * (user - kernel)) / tokens,
    systemUsPerToken: (1e6 * system) / tokens,
  };
}

const server = await startServer({
  modelPath: tinyModel(),
  requireModel: true,
  env: { SERVICE_MAX_BATCH: "256", SERVICE_THREADS: "1", SERVICE_MAX_QUEUE_DEPTH: "4096", SERVICE_PIPELINE_STEPS: values.pipeline ? "1" : "0" },
});
const cells: Cell[] = [];
try {
  // Warm-up: the routes' first requests compile their handlers.
  for (const route of routes) await runCell(server, route, 8);
  for (let round = 0; round < ROUNDS; round++)
    for (const clients of CLIENTS) for (const route of routes) cells.push(await runCell(server, route, clients));
} finally {
  await server.stop();
}

const rows: Row[] = [];
for (const clients of CLIENTS)
  for (const route of routes) {
    const mine = cells.filter((c) => c.route === route.name && c.clients === clients);
    const m = (f: (c: Cell) => number) => median(mine.map(f));
    const us = m((c) => c.userUsPerToken + c.systemUsPerToken);
    rows.push({
      route: route.name,
      clients,
      "tok/s": m((c) => c.tokensPerSecond),
      "kernel share": m((c) => c.kernelShare),
      "server µs/token": us,
      "of which system": m((c) => c.systemUsPerToken),
      "tok/s bound": 1e6 / us,
    });
  }
console.log(formatTable(`server work per streamed token (tiny model, ${TOKENS}-token streams, medians of ${ROUNDS})`, rows));
console.log(`wrote ${writeJson("overhead", { commit: Bun.spawnSync(["git", "rev-parse", "--short", "HEAD"]).stdout.toString().trim(), date: new Date().toISOString(), rows, cells })}`);
