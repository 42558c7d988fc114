// The operator's log (src/log.ts, src/http/access_log.ts) read back from a
// real server's output, in both formats: one line per request once its
// response has ended (method, path, status, prompt and completion tokens,
// ms, request id, outcome), streams and cancelled streams included; expected
// refusals (4xx, 503 when overloaded or shutting down) without a stack trace;
// a real fault (500) with exactly one.
import { afterAll, beforeAll, describe, expect, setDefaultTimeout, spyOn, test } from "bun:test";
import type { GenerationEngine } from "../../src/http/generation.ts";
import { ErrorBody, GenerateResponse, TextCompletion } from "../../src/wire/responses.ts";
import { join, resolve } from "node:path";
import { log } from "../../src/log.ts";
import { jsonBody } from "../helpers/http.ts";
import { testTempDir } from "../helpers/models.ts";
import { cancelOpenStreams, expect503, openStream, PROMPT, queueingServer, startBlocker, waitFor, waitForQueueDepth } from "../helpers/scheduling.ts";
import { inProcessApp, serverForTests, startServer, TINY_MODEL_INFO, type TestServer } from "../helpers/server.ts";

setDefaultTimeout(60_000);

type Line = Record<string, string | number>;

const NUMERIC = new Set(["status", "prompt_tokens", "completion_tokens", "ms"]);

/** The `loopserve: request k=v ...` lines of text output, as objects. */
function textRequestLines(output: string): Line[] {
  const lines: Line[] = [];
  for (const m of output.matchAll(/^loopserve: request (.*)$/gm)) {
    const line: Line = {};
    for (const [, key, raw] of m[1].matchAll(/(\w+)=("(?:[^"\\]|\\.)*"|\S+)/g)) {
      const value = raw.startsWith('"') ? (JSON.parse(raw) as string) : raw;
      line[key] = NUMERIC.has(key) ? Number(value) : value;
    }
    lines.push(line);
  }
  return lines;
}

/** Every line of JSON output parsed (each line must be one JSON object); the request lines among them. */
function jsonLines(output: string): Line[] {
  return output
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => {
      try {
        return JSON.parse(l) as Line;
      } catch {
        throw new Error(`not a JSON log line: ${l}`);
      }
    });
}

function expectRequestLine(line: Line | undefined, want: Partial<Line>): void {
  expect(line).toBeDefined();
  expect(line).toMatchObject(want);
  const l = line as Line;
  expect(typeof l.request_id).toBe("string");
  expect(l.ms as number).toBeGreaterThanOrEqual(0);
  for (const key of ["prompt_tokens", "completion_tokens"]) expect(Number.isInteger(l[key])).toBe(true);
}

async function lineFor(s: TestServer, parse: (out: string) => Line[], id: string): Promise<Line> {
  await waitFor(`the log line of request ${id}`, () => parse(s.output()).some((l) => l.request_id === id));
  return parse(s.output()).find((l) => l.request_id === id) as Line;
}

const STACK_FRAME = /^\s+at /m;

describe("text format (the default)", () => {
  let s: TestServer;
  const lines = () => textRequestLines(s.output());

  beforeAll(async () => {
    s = await startServer(queueingServer({ SERVICE_MAX_QUEUE_DEPTH: "1" }));
  });
  afterAll(async () => {
    await cancelOpenStreams();
    await s?.stop();
  });

  test("a whole response: its line carries the tokens the response reports, and the client's request id", async () => {
    const res = await s.post("/generate", { prompt: PROMPT, max_tokens: 3, temperature: 0 }, { "content-type": "application/json", "x-request-id": "client-req-1" });
    expect(res.headers.get("x-request-id")).toBe("client-req-1");
    const body = await jsonBody(res, GenerateResponse);
    const line = await lineFor(s, textRequestLines, "client-req-1");
    expectRequestLine(line, {
      method: "POST",
      path: "/generate",
      status: 200,
      prompt_tokens: body.stats.prompt_tokens,
      completion_tokens: 3,
      outcome: "complete",
    });
  });

  test("a stream is logged when it ends, with its usage", async () => {
    const res = await s.post("/v1/chat/completions?trace=1", {
      model: "m",
      messages: [{ role: "user", content: "Hello" }],
      max_tokens: 5,
      stream: true,
      stream_options: { include_usage: true },
    });
    const id = res.headers.get("x-request-id") as string;
    expect(id).toMatch(/^[0-9a-f]{32}$/);
    const text = await res.text();
    const usage = JSON.parse(text.split("\n\n").filter((e) => e.includes('"usage":{')).at(-1)?.slice(6) as string).usage;
    const line = await lineFor(s, textRequestLines, id);
    // The path without its query string.
    // a sampled reply may end at an end id before max_tokens: the line says what the usage says
    expect(usage.completion_tokens).toBeGreaterThan(0);
    expect(usage.completion_tokens).toBeLessThanOrEqual(5);
    expectRequestLine(line, { method: "POST", path: "/v1/chat/completions", status: 200, prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens, outcome: "complete" });
  });

  test("a stream the client abandons is logged as cancelled, with the tokens generated until then", async () => {
    const stream = await openStream(s, { prompt: PROMPT, max_tokens: 3000 });
    const id = stream.response.headers.get("x-request-id") as string;
    await stream.waitForEvents(3);
    await stream.cancel();
    const line = await lineFor(s, textRequestLines, id);
    expectRequestLine(line, { path: "/generate", status: 200, outcome: "cancelled" });
    expect(line.completion_tokens as number).toBeGreaterThanOrEqual(3);
    expect(line.completion_tokens as number).toBeLessThan(3000);
  });

  test("refusals (400, 403, 404, 422) are one line each, no stack trace", async () => {
    const ids: Record<number, string> = {};
    for (const [status, res] of [
      [400, await s.post("/generate", { prompt: PROMPT, max_tokens: 100000 })],
      [403, await s.post("/generate", { prompt: PROMPT }, { "content-type": "text/plain", origin: "https://evil.example" })],
      [404, await fetch(`${s.url}/no/such/route`)],
      [422, await s.post("/generate", { max_tokens: 3 })],
    ] as const) {
      expect(res.status).toBe(status);
      ids[status] = res.headers.get("x-request-id") as string;
    }
    for (const [status, id] of Object.entries(ids)) expectRequestLine(await lineFor(s, textRequestLines, id), { status: Number(status), completion_tokens: 0 });
    expect(s.output()).not.toMatch(STACK_FRAME);
  });

  test("503s when the queue is full and while shutting down: request lines only, no stack trace", async () => {
    const blocker = await startBlocker(s, 400);
    const queued = s.post("/generate", { prompt: PROMPT, max_tokens: 4 });
    await waitForQueueDepth(s, 1);
    const full = await s.post("/generate", { prompt: PROMPT, max_tokens: 4 });
    const fullId = full.headers.get("x-request-id") as string;
    await expect503(full, "queue_full");

    const exited = s.stop();
    const refused = await queued;
    const refusedId = refused.headers.get("x-request-id") as string;
    await expect503(refused, "shutting_down");
    await blocker.readAll();
    expect(await exited).toBe(0);

    const out = s.output();
    expectRequestLine(lines().find((l) => l.request_id === fullId), { status: 503, path: "/generate" });
    expectRequestLine(lines().find((l) => l.request_id === refusedId), { status: 503, path: "/generate" });
    expect(out).toContain("SIGTERM: finishing the running request");
    expect(out).not.toMatch(STACK_FRAME);
    expect(out).not.toContain("error: the server is shutting down");
    // Every request of this server was logged exactly once.
    const all = lines().map((l) => l.request_id);
    expect(new Set(all).size).toBe(all.length);
  });
});

describe("json format", () => {
  const s = serverForTests({ env: { SERVICE_LOG_FORMAT: "json" } });

  test("every line is one JSON object; request lines carry every field with its type", async () => {
    const plain = await s.post("/v1/completions", { model: "m", prompt: PROMPT, max_tokens: 4 });
    const { usage } = await jsonBody(plain, TextCompletion);
    const stream = await s.post("/generate", { prompt: PROMPT, max_tokens: 2, stream: true });
    await stream.text();
    const bad = await s.post("/generate", "{not json");
    expect(bad.status).toBe(400);
    const ids = [plain, stream, bad].map((r) => r.headers.get("x-request-id") as string);
    const requests = () => jsonLines(s.output()).filter((l) => l.msg === "request");
    await waitFor("three request lines", () => ids.every((id) => requests().some((l) => l.request_id === id)));

    const byId = (id: string) => requests().find((l) => l.request_id === id);
    expectRequestLine(byId(ids[0]), { level: "info", method: "POST", path: "/v1/completions", status: 200, prompt_tokens: usage.prompt_tokens, completion_tokens: 4, outcome: "complete" });
    expectRequestLine(byId(ids[1]), { level: "info", path: "/generate", status: 200, completion_tokens: 2 });
    expectRequestLine(byId(ids[2]), { level: "info", path: "/generate", status: 400, prompt_tokens: 0, completion_tokens: 0 });
    for (const l of requests()) {
      expect(Object.keys(l).sort()).toEqual(
        ["completion_tokens", "level", "method", "ms", "msg", "outcome", "path", "prompt_tokens", "request_id", "status", "time"].sort(),
      );
      expect(Number.isNaN(Date.parse(l.time as string))).toBe(false);
    }
    const startup = jsonLines(s.output()).find((l) => String(l.msg).includes("listening on"));
    expect(startup).toMatchObject({ level: "info" });

    expect(await s.stop()).toBe(0);
    const all = jsonLines(s.output());
    expect(all.some((l) => String(l.msg).startsWith("SIGTERM"))).toBe(true);
  });
});

describe("json format: a configuration that stops the start", () => {
  test.each<[string, Record<string, string>, string]>([
    ["a setting that is not a number", { SERVICE_MAX_SEQ_LEN: "abc" }, "SERVICE_MAX_SEQ_LEN must be an integer"],
    ["an empty API key", { SERVICE_API_KEY: "" }, "SERVICE_API_KEY is empty"],
    ["an unknown SIMD path", { SERVICE_SIMD: "sse9" }, "SERVICE_SIMD must be one of"],
    ["too many threads", { SERVICE_THREADS: "100000" }, "SERVICE_THREADS must be between"],
    ["an unreadable key file", { SERVICE_API_KEY_FILE: "/nonexistent/key" }, "SERVICE_API_KEY_FILE: cannot read"],
    ["conflicting cache modes", { SERVICE_KV_INT4: "1", SERVICE_KV_INT8: "1" }, "SERVICE_KV_INT4=1 and SERVICE_KV_INT8=1 conflict"],
  ])("%s: exit 2, and the reason is a JSON error line", async (_, env, reason) => {
    const err = await startServer({ env: { SERVICE_LOG_FORMAT: "json", ...env } }).catch((e: Error) => e);
    expect(err).toBeInstanceOf(Error);
    const [first, ...output] = (err as Error).message.split("\n");
    expect(first).toContain("exited with 2");
    const lines = jsonLines(output.join("\n")); // throws on any line that is not JSON
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: "error" });
    expect(String(lines[0].msg)).toContain(reason);
  });
});

describe("json format from the minified executable", () => {
  // `bun run build` minifies the executable's code; Elysia reads each hook's
  // source to infer what it uses, and a hook shape it misreads once the
  // whitespace is gone printed a multi-line warning at the first /v1 POST,
  // breaking the one-JSON-object-per-line log. Compiled here with the
  // executable's minification (the kernel library is read from build/).
  let s: TestServer;
  beforeAll(async () => {
    const out = join(testTempDir(), "minified-loopserve");
    const root = resolve(import.meta.dir, "../..");
    const build = Bun.spawnSync(
      [process.execPath, "build", "--compile", "--minify-syntax", "--minify-whitespace", "--asset-naming=[name].[ext]",
        "--root", join(root, "src/tokenizer"), join(root, "src/cli/main.ts"), join(root, "src/tokenizer/worker.ts"), "--outfile", out],
      { stdout: "pipe", stderr: "pipe" },
    );
    if (build.exitCode !== 0) throw new Error(`bun build --compile failed:\n${build.stderr}`);
    s = await startServer({ command: [out, "serve"], env: { SERVICE_LOG_FORMAT: "json" }, requireModel: true });
  }, 120_000);
  afterAll(async () => {
    await s?.stop();
  });

  test("every line stays one JSON object through the first POST of every route family", async () => {
    const chat = { model: "m", messages: [{ role: "user", content: "Hello" }], max_tokens: 2 };
    const text = { model: "m", prompt: PROMPT, max_tokens: 2 };
    for (const [path, body] of [
      ["/v1/chat/completions", chat],
      ["/v1/completions", text],
      ["/api/v0/chat/completions", chat],
      ["/api/v0/completions", text],
      ["/generate", { prompt: PROMPT, max_tokens: 2 }],
      ["/generate/speculative", { prompt: PROMPT, max_tokens: 2 }],
      ["/generate/tree_speculative", { prompt: PROMPT, max_tokens: 2, K_branches: 2 }],
    ] as const)
      expect((await s.post(path, body)).status).toBe(200);
    await waitFor("seven POST request lines", () => jsonLines(s.output()).filter((l) => l.msg === "request" && l.method === "POST").length === 7);
    expect(await s.stop()).toBe(0);
    expect(jsonLines(s.output()).length).toBeGreaterThan(8); // jsonLines throws on any line that is not JSON
  });
});

describe("a real fault (500)", () => {
  test("the 500 answer, one error line with exactly one stack trace, and the request line", async () => {
    const engine: GenerationEngine = {
      info: TINY_MODEL_INFO,
      enqueue: () => {
        throw new TypeError("a bug in the scheduler");
      },
    };
    const { handle } = await inProcessApp(engine);
    const out: string[] = [];
    const err: string[] = [];
    const logSpy = spyOn(console, "log").mockImplementation((s: string) => void out.push(s));
    const errSpy = spyOn(console, "error").mockImplementation((s: string) => void err.push(s));
    try {
      for (const format of ["text", "json"] as const) {
        log.setFormat(format);
        out.length = 0;
        err.length = 0;
        const res = await handle(
          new Request("http://localhost/generate", { method: "POST", headers: { "x-request-id": `fault-${format}` }, body: JSON.stringify({ prompt: PROMPT }) }),
        );
        expect(res.status).toBe(500);
        expect((await jsonBody(res, ErrorBody, 500)).error.code).toBe("internal_error");
        // stderr: one entry, naming the request, with the stack once.
        expect(err).toHaveLength(1);
        const entry = format === "json" ? (JSON.parse(err[0]) as Line) : null;
        const stack = entry ? String(entry.stack) : err[0];
        expect(stack.match(/TypeError: a bug in the scheduler/g)).toHaveLength(1);
        expect(stack).toMatch(STACK_FRAME);
        if (entry) expect(entry).toMatchObject({ level: "error", request_id: "fault-json", msg: "internal error on POST /generate" });
        else expect(err[0]).toStartWith("loopserve: error: internal error on POST /generate request_id=fault-text\nTypeError: a bug in the scheduler");
        // stdout: the request line.
        expect(out).toHaveLength(1);
        const line = format === "json" ? (JSON.parse(out[0]) as Line) : textRequestLines(out[0])[0];
        expectRequestLine(line, { request_id: `fault-${format}`, status: 500, method: "POST", path: "/generate" });
      }
    } finally {
      log.setFormat("text");
      logSpy.mockRestore();
      errSpy.mockRestore();
    }
  });
});
