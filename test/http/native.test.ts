// POST /generate and GET /healthz against a real server process
// (docs/http.md): fields, native stream framing, errors and stop strings.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { type ErrorBody, GenerateResponse, GenerateStreamEvent } from "../../src/wire/responses.ts";
import { IncrementalDetokenizer, Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { expectErrorShape, expectInvalidRequest, jsonBody, sseData, sseEvents } from "../helpers/http.ts";
import { testTempDir, TINY } from "../helpers/models.ts";
import { serverForTests, startServer, type TestServer } from "../helpers/server.ts";

const MAX_SEQ_LEN = 256;

const server = serverForTests({ env: { SERVICE_MAX_SEQ_LEN: String(MAX_SEQ_LEN) } });
let tok: Tokenizer;

beforeAll(async () => {
  tok = await Tokenizer.load();
});

const generate = async (body: Record<string, unknown>) => jsonBody(await server.post("/generate", body), GenerateResponse);

async function stream(body: Record<string, unknown>): Promise<{ raw: string; events: GenerateStreamEvent[] }> {
  const res = await server.post("/generate", { ...body, stream: true });
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toStartWith("text/event-stream");
  const raw = await res.text();
  return { raw, events: sseEvents(raw, GenerateStreamEvent) };
}

const PROMPT = "The looped transformer said";

describe("GET /healthz", () => {
  test("200 text/plain ok when the model is loaded", async () => {
    const res = await fetch(`${server.url}/healthz`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toStartWith("text/plain");
    expect(await res.text()).toBe("ok\n");
  });
});

describe("POST /generate", () => {
  test("greedy generation is deterministic", async () => {
    const a = await generate({ prompt: PROMPT, max_tokens: 12 });
    const b = await generate({ prompt: PROMPT, max_tokens: 12 });
    expect(a.tokens).toEqual(b.tokens);
    expect(a.text).toBe(b.text);
  });

  test("sample_seed makes sampling deterministic and different seeds differ", async () => {
    const req = { prompt: PROMPT, max_tokens: 16, temperature: 1.0 };
    const a = await generate({ ...req, sample_seed: 1 });
    const b = await generate({ ...req, sample_seed: 1 });
    const c = await generate({ ...req, sample_seed: 2 });
    expect(a.tokens).toEqual(b.tokens);
    expect(c.tokens).not.toEqual(a.tokens);
  });

  test("tokens are the generated ids only and stats count them", async () => {
    const prompt = tok.encode(PROMPT);
    const r = await generate({ prompt, max_tokens: 5 });
    expect(r.tokens).toHaveLength(5);
    expect(r.stats.prompt_tokens).toBe(prompt.length);
    expect(r.stats.completion_tokens).toBe(5);
    expect(r.stats.mode).toBe("generate");
    expect(r.stats.loops_used).toBe(TINY.loops); // the model's default_loops
    expect(r.stats.wall_ms).toBeGreaterThan(0);
    expect(r.stats.tokens_per_second).toBeGreaterThan(0);
  });

  test("loops is honoured and reported as loops_used", async () => {
    const r = await generate({ prompt: PROMPT, max_tokens: 2, loops: 3 });
    expect(r.stats.loops_used).toBe(3);
  });

  test("text is the decoded tokens", async () => {
    const r = await generate({ prompt: PROMPT, max_tokens: 24 });
    expect(r.text).toBe(tok.decode(r.tokens));
  });

  test("a text prompt and its token ids give the same result", async () => {
    const fromText = await generate({ prompt: PROMPT, max_tokens: 10 });
    const fromIds = await generate({ prompt: tok.encode(PROMPT), max_tokens: 10 });
    expect(fromIds).toMatchObject({ tokens: fromText.tokens, text: fromText.text, finish_reason: fromText.finish_reason });
  });

  test("max_tokens reached without a stop finishes with length", async () => {
    const r = await generate({ prompt: PROMPT, max_tokens: 7 });
    expect(r.finish_reason).toBe("length");
    expect(r.tokens).toHaveLength(7);
  });

  test("an integer stop id ends with finish_reason stop and is not returned", async () => {
    const full = await generate({ prompt: PROMPT, max_tokens: 16 });
    // The first token that did not occur earlier: generation must stop right before it.
    const k = full.tokens.findIndex((t, i) => i >= 2 && !full.tokens.slice(0, i).includes(t));
    expect(k).toBeGreaterThan(0);
    const r = await generate({ prompt: PROMPT, max_tokens: 16, stop: [full.tokens[k]] });
    expect(r.finish_reason).toBe("stop");
    expect(r.tokens).toEqual(full.tokens.slice(0, k));
    expect(r.tokens).not.toContain(full.tokens[k]);
  });

  test("a stop string spanning several tokens is matched and not emitted", async () => {
    const full = await generate({ prompt: PROMPT, max_tokens: 32 });
    const pieces = full.tokens.map((t) => tok.decode([t]));
    // A stop string made of the end of one token's text and the start of the next's.
    let stop: string | null = null;
    for (let i = 1; i < pieces.length && stop === null; i++) {
      const candidate = pieces[i - 1].slice(-2) + pieces[i].slice(0, 2);
      if (candidate.length === 4 && !candidate.includes("\uFFFD") && !pieces.some((p) => p.includes(candidate)))
        stop = candidate;
    }
    expect(stop).not.toBeNull();
    const s = stop as string;
    const cut = full.text.indexOf(s);
    // The stop completes in the first token whose prefix decodes to contain it.
    const completing = full.tokens.findIndex((_, i) => tok.decode(full.tokens.slice(0, i + 1)).includes(s));

    const r = await generate({ prompt: PROMPT, max_tokens: 32, stop: s });
    expect(r.finish_reason).toBe("stop");
    expect(r.text).toBe(full.text.slice(0, cut));
    expect(r.tokens).toEqual(full.tokens.slice(0, completing + 1));

    const streamed = await stream({ prompt: PROMPT, max_tokens: 32, stop: [s] });
    const text = streamed.events.map((e) => e.text).join("");
    expect(text).toBe(r.text);
    expect(streamed.events.map((e) => e.token_id)).toEqual([...r.tokens, -1]);
  });

  test("a stop string that never occurs changes nothing", async () => {
    const full = await generate({ prompt: PROMPT, max_tokens: 8 });
    const r = await generate({ prompt: PROMPT, max_tokens: 8, stop: ["\u0001never\u0001"] });
    expect(r).toMatchObject({ tokens: full.tokens, text: full.text, finish_reason: "length" });
  });

  test("null optional fields mean their defaults", async () => {
    const a = await generate({ prompt: PROMPT, max_tokens: 4 });
    const b = await generate({ prompt: PROMPT, max_tokens: 4, stop: null, temperature: null, loops: null });
    expect(b.tokens).toEqual(a.tokens);
  });
});

describe("POST /generate with stream=true", () => {
  test("tokens and concatenated text equal the non-streaming result", async () => {
    const req = { prompt: PROMPT, max_tokens: 20, temperature: 0.8, sample_seed: 5 };
    const whole = await generate(req);
    const { events } = await stream(req);
    expect(events.slice(0, -1).map((e) => e.token_id)).toEqual(whole.tokens);
    expect(events.at(-1)?.token_id).toBe(-1);
    expect(events.map((e) => e.text).join("")).toBe(whole.text);
  });

  test("SSE framing byte for byte: one data line per token, the -1 flush event, [DONE]", async () => {
    const req = { prompt: PROMPT, max_tokens: 12 };
    const whole = await generate(req);
    const d = new IncrementalDetokenizer(tok);
    let expected = "";
    for (const id of whole.tokens) expected += `data: ${JSON.stringify({ token_id: id, text: d.push(id) })}\n\n`;
    expected += `data: ${JSON.stringify({ token_id: -1, text: d.flush() })}\n\n`;
    expected += "data: [DONE]\n\n";
    const { raw } = await stream(req);
    expect(raw).toBe(expected);
  });
});

describe("POST /generate validation", () => {
  const ok = { prompt: PROMPT, max_tokens: 1 };

  test.each([
    ["max_tokens", 0],
    ["max_tokens", 8193],
    ["loops", 0],
    ["loops", 65],
    ["temperature", -0.1],
    ["temperature", 2.01],
    ["top_k", -1],
    ["top_k", 1001],
    ["top_p", -0.01],
    ["top_p", 1.01],
    ["repetition_penalty", 0.49],
    ["repetition_penalty", 2.01],
    ["sample_seed", -1],
    ["cache_window", -1],
    ["cache_window", MAX_SEQ_LEN + 1],
  ])("%s = %p is a 400 naming the field", async (field, value) => {
    const res = await server.post("/generate", { ...ok, [field]: value });
    expect(res.status).toBe(400);
    const body = await res.json();
    expectErrorShape(body);
    expect(body.error.param).toBe(field);
    expect(body.error.message).toContain(`\`${field}\``);
    expect(body.error.message).toContain(`got ${value}`);
  });

  test("the bound message reads like the style guide's", async () => {
    const res = await server.post("/generate", { prompt: PROMPT, max_tokens: 9000 });
    expect(res.status).toBe(400);
    expect(((await res.json()) as ErrorBody).error.message).toBe("`max_tokens` must be at most 8192, got 9000");
  });

  test.each([
    ["max_tokens", MAX_SEQ_LEN - 20],
    ["loops", 1],
    ["loops", 64],
    ["temperature", 2],
    ["top_k", 0],
    ["top_k", 1000],
    ["top_p", 0],
    ["top_p", 1],
    ["repetition_penalty", 0.5],
    ["repetition_penalty", 2],
    ["sample_seed", Number.MAX_SAFE_INTEGER],
    ["cache_window", MAX_SEQ_LEN],
  ])("%s = %p at its bound is accepted", async (field, value) => {
    const res = await server.post("/generate", { ...ok, temperature: 0.5, [field]: value });
    expect(res.status).toBe(200);
  });

  test.each([
    ["empty text prompt", { prompt: "" }, "prompt"],
    ["empty id prompt", { prompt: [] }, "prompt"],
    ["negative token id", { prompt: [1, -1] }, "prompt[1]"],
    ["token id beyond the vocabulary", { prompt: [1, 50257] }, "prompt[1]"],
    ["empty stop string", { prompt: PROMPT, stop: [""] }, "stop[0]"],
    ["negative stop id", { prompt: PROMPT, stop: [-3] }, "stop[0]"],
  ])("%s is a 400", async (_, body, param) => {
    const res = await server.post("/generate", body);
    expect(res.status).toBe(400);
    expectInvalidRequest(await res.json(), param);
  });

  test.each([
    ["missing prompt", { max_tokens: 4 }, "prompt"],
    ["numeric prompt", { prompt: 5 }, "prompt"],
    ["non-integer ids", { prompt: [1.5] }, "prompt"],
    ["string max_tokens", { prompt: PROMPT, max_tokens: "8" }, "max_tokens"],
    ["fractional max_tokens", { prompt: PROMPT, max_tokens: 1.5 }, "max_tokens"],
    ["string temperature", { prompt: PROMPT, temperature: "hot" }, "temperature"],
    ["string stream", { prompt: PROMPT, stream: "yes" }, "stream"],
    ["boolean loops", { prompt: PROMPT, loops: true }, "loops"],
    ["numeric stop", { prompt: PROMPT, stop: 5 }, "stop"],
    ["mixed stop array", { prompt: PROMPT, stop: [1, "a"] }, "stop"],
  ])("%s is a 422", async (_, body, param) => {
    const res = await server.post("/generate", body);
    expect(res.status).toBe(422);
    expectInvalidRequest(await res.json(), param);
  });

  test("a JSON body that is not an object is a 422", async () => {
    const res = await server.post("/generate", "[1, 2]");
    expect(res.status).toBe(422);
    expectErrorShape(await res.json());
  });

  test("a prompt longer than the context names the prompt, not max_tokens: token ids and text alike", async () => {
    const ids = Array.from({ length: MAX_SEQ_LEN + 1 }, () => 464);
    for (const [path, body] of [
      ["/generate", { prompt: ids, max_tokens: 1 }],
      ["/v1/completions", { model: "m", prompt: ids, max_tokens: 1 }],
      ["/generate", { prompt: " the".repeat(MAX_SEQ_LEN + 1), max_tokens: 1 }],
    ] as const) {
      const json = await (await server.post(path, body)).json();
      expect(json.error).toMatchObject({ code: "context_length_exceeded", param: "prompt" });
      expect(json.error.message).toBe(`\`prompt\` is ${MAX_SEQ_LEN + 1} tokens, more than the maximum sequence length ${MAX_SEQ_LEN}`);
    }
    // A prompt that fits alone, with no room left for max_tokens, names max_tokens.
    const json = await (await server.post("/generate", { prompt: ids.slice(0, MAX_SEQ_LEN), max_tokens: 1 })).json();
    expect(json.error).toMatchObject({ code: "context_length_exceeded", param: "max_tokens" });
  });

  test("prompt + max_tokens over SERVICE_MAX_SEQ_LEN is a 400", async () => {
    const prompt = Array.from({ length: 100 }, () => 464);
    const fits = await server.post("/generate", { prompt, max_tokens: MAX_SEQ_LEN - 100 - 150 });
    expect(fits.status).toBe(200);
    const res = await server.post("/generate", { prompt, max_tokens: MAX_SEQ_LEN - 100 + 1 });
    expect(res.status).toBe(400);
    const json = await res.json();
    expectErrorShape(json);
    expect(json.error.code).toBe("context_length_exceeded");
    expect(json.error.message).toContain(String(MAX_SEQ_LEN));
  });

  test.each([
    ["malformed JSON", '{"prompt": "hi"', { "content-type": "application/json" }],
    ["empty body", "", { "content-type": "application/json" }],
    ["no content type and junk", "prompt=hi", {}],
    ["a form content type", "prompt=hi", { "content-type": "application/x-www-form-urlencoded" }],
    ["a multipart body", "--x\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nhi\r\n--x--\r\n", { "content-type": "multipart/form-data; boundary=x" }],
  ])("%s is a 400 in the error shape, never a 500", async (_, raw, headers) => {
    const res = await server.post("/generate", raw, headers);
    expect(res.status).toBe(400);
    expectErrorShape(await res.json());
  });

  test("a JSON body sent as text/plain is accepted (curl -d habits)", async () => {
    const res = await server.post("/generate", JSON.stringify({ prompt: PROMPT, max_tokens: 1 }), { "content-type": "text/plain" });
    expect(res.status).toBe(200);
  });

  test("an unknown route is a 404 in the error shape", async () => {
    const res = await server.post("/generate/nothing-here", { prompt: PROMPT });
    expect(res.status).toBe(404);
    expectErrorShape(await res.json());
  });
});

describe("a server without a usable model", () => {
  async function expectUnavailable(s: TestServer, reason: RegExp): Promise<void> {
    const health = await fetch(`${s.url}/healthz`);
    expect(health.status).toBe(503);
    const body = await health.json();
    expectErrorShape(body);
    expect(body.error.message).toMatch(reason);

    const gen = await s.post("/generate", { prompt: "hi", max_tokens: 2 });
    expect(gen.status).toBe(503);
    expectErrorShape(await gen.json());

    // Validation still comes first: range, then length, then 503.
    expect((await s.post("/generate", { prompt: "hi", max_tokens: 0 })).status).toBe(400);
    expect((await s.post("/generate", { prompt: "hi", max_tokens: 8000 })).status).toBe(400);

    // Still up, and it said why in its log.
    expect((await fetch(`${s.url}/healthz`)).status).toBe(503);
    expect(s.output()).toMatch(reason);
  }

  test("SERVICE_MODEL_PATH unset: 503 with the reason, and the process stays up", async () => {
    const s = await startServer({ modelPath: null });
    try {
      await expectUnavailable(s, /SERVICE_MODEL_PATH is not set/);
    } finally {
      expect(await s.stop()).toBe(0);
    }
  });

  test("a missing model file: 503 naming the path", async () => {
    const missing = join(testTempDir(), "no-such-model.safetensors");
    const s = await startServer({ modelPath: missing });
    try {
      await expectUnavailable(s, /no-such-model\.safetensors/);
    } finally {
      await s.stop();
    }
  });

  test("a corrupt model file: 503 with the loader's reason", async () => {
    const corrupt = join(testTempDir(), "corrupt.safetensors");
    writeFileSync(corrupt, "this is not a safetensors file at all, just some text");
    const s = await startServer({ modelPath: corrupt });
    try {
      await expectUnavailable(s, /corrupt\.safetensors/);
    } finally {
      await s.stop();
    }
  });
});

describe("client disconnect", () => {
  // The engine runs one request at a time, so a generation that kept running
  // after its client left would hold up the next request for its whole length.
  const LONG = 8000;
  let s: TestServer;
  let fullMs: number;

  beforeAll(async () => {
    s = await startServer({ env: { SERVICE_MAX_SEQ_LEN: String(LONG + 64) } });
    const warm = await jsonBody(await s.post("/generate", { prompt: PROMPT, max_tokens: 64 }), GenerateResponse);
    fullMs = (LONG / warm.stats.tokens_per_second) * 1000;
  });
  afterAll(async () => {
    await s?.stop();
  });

  async function nextRequestMs(): Promise<number> {
    const t0 = performance.now();
    const res = await s.post("/generate", { prompt: PROMPT, max_tokens: 1 });
    expect(res.status).toBe(200);
    return performance.now() - t0;
  }

  test("closing a stream cancels its generation", async () => {
    const res = await s.post("/generate", { prompt: PROMPT, max_tokens: LONG, stream: true });
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    await reader.read(); // the first token arrived: the request is running
    await reader.cancel();
    expect(await nextRequestMs()).toBeLessThan(fullMs / 4);
  });

  test("abandoning a non-streaming request cancels its generation", async () => {
    const abort = new AbortController();
    const pending = fetch(`${s.url}/generate`, {
      method: "POST",
      body: JSON.stringify({ prompt: PROMPT, max_tokens: LONG }),
      signal: abort.signal,
    }).catch(() => null);
    await Bun.sleep(100);
    abort.abort();
    await pending;
    expect(await nextRequestMs()).toBeLessThan(fullMs / 4);
  });
});

describe("process lifecycle", () => {
  test("a bad configuration stops the start with exit code 2 and names the variable", async () => {
    const err = await startServer({ env: { SERVICE_MAX_SEQ_LEN: "lots" } }).catch((e: Error) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toContain("exited with 2");
    expect((err as Error).message).toContain("SERVICE_MAX_SEQ_LEN");
  });

  test("SIGTERM lets the running request finish, then exits with code 0", async () => {
    const s = await startServer();
    const res = await s.post("/generate", { prompt: PROMPT, max_tokens: 300, stream: true });
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    const first = await reader.read();
    const exited = s.stop();
    const decoder = new TextDecoder();
    let body = decoder.decode(first.value, { stream: true });
    for (let r = await reader.read(); !r.done; r = await reader.read()) body += decoder.decode(r.value, { stream: true });
    const data = sseData(body);
    expect(data.at(-1)).toBe("[DONE]");
    expect(data).toHaveLength(300 + 2); // every token, the -1 event, [DONE]
    expect(await exited).toBe(0);
  });
});
