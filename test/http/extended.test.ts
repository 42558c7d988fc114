// The extended family (/api/v0) against a real server process: the compat
// responses plus `stats`, `model_info` and `runtime` (docs/http.md), its extra
// request knobs, and both families on a server without a usable model.
// The compat fields and limits shared with /v1 are checked for both families
// in compat.test.ts.
import { describe, expect, test } from "bun:test";
import pkg from "../../package.json" with { type: "json" };
import type { Static, TSchema } from "@sinclair/typebox";
import {
  ChatCompletion,
  type ErrorBody,
  ExtendedChatCompletion,
  ExtendedChatCompletionChunk,
  ExtendedModelEntry,
  ExtendedModelList,
  type ExtendedSections,
  ExtendedTextCompletion,
  ExtendedTextCompletionChunk,
  GenerateResponse,
  type ModelInfoSection,
  ModelList,
  SpeculativeStats,
  type Usage,
} from "../../src/wire/responses.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { expectInvalidRequest, expectSchema, jsonBody, sseEvents } from "../helpers/http.ts";
import { TINY, testTempDir } from "../helpers/models.ts";
import { serverForTests, startServer } from "../helpers/server.ts";

const MAX_SEQ_LEN = 256;
const COMMIT = "0123abcd-test";
const MODEL = "extended-test";
const PROMPT = "The looped transformer said";
const USER = [{ role: "user", content: PROMPT }];
const USER_RENDERED = `User: ${PROMPT}\nAssistant:`;

/** What model_info must say about the tiny synthetic model. */
const TINY_INFO: ModelInfoSection = {
  arch: "looped-llama",
  family: "block",
  dim: TINY.dim,
  n_heads: TINY.nHeads,
  ffn_dim: TINY.ffnDim,
  vocab_size: TINY.vocabSize,
  default_loops: TINY.loops,
  n_layers: 1,
  exit_gate: false,
  exit_threshold: null,
  quant: "fp16",
  kv_cache_mode: "fp16",
};

// One request at a time, so the priority test can queue requests behind a long one.
const server = serverForTests({ env: { SERVICE_MAX_BATCH: "1", SERVICE_MAX_SEQ_LEN: String(MAX_SEQ_LEN), SERVICE_COMMIT: COMMIT } });
const tok = await Tokenizer.load();

const chat = (body: Record<string, unknown>) => server.postOk("/api/v0/chat/completions", { model: MODEL, messages: USER, ...body }, ExtendedChatCompletion);
const complete = (body: Record<string, unknown>) => server.postOk("/api/v0/completions", { model: MODEL, prompt: PROMPT, ...body }, ExtendedTextCompletion);
const native = (body: Record<string, unknown>) => server.postOk("/generate", body, GenerateResponse);

async function streamChunks<S extends TSchema>(path: string, body: unknown, schema: S): Promise<Static<S>[]> {
  const res = await server.post(path, body);
  expect(res.status).toBe(200);
  return sseEvents(await res.text(), schema);
}

/** The three sections with their documented types, consistent with usage (on a stream: its final chunk). */
function expectSections(r: Partial<ExtendedSections>, usage: Usage | null | undefined, loops: number): void {
  const s = r.stats;
  if (!s || !usage) throw new Error(`sections or usage missing: ${JSON.stringify(r)}`);
  expect(Object.keys(s).sort()).toEqual(["completion_tokens", "loops_used", "mode", "prompt_tokens", "tokens_per_second", "wall_ms"]);
  expect(typeof s.wall_ms).toBe("number");
  expect(s.wall_ms).toBeGreaterThan(0);
  expect(typeof s.tokens_per_second).toBe("number");
  expect(s.tokens_per_second).toBeGreaterThan(0);
  expect(s.tokens_per_second).toBeCloseTo(s.completion_tokens / (s.wall_ms / 1000), 3);
  expect(Number.isInteger(s.prompt_tokens)).toBe(true);
  expect(s.prompt_tokens).toBe(usage.prompt_tokens);
  expect(s.completion_tokens).toBe(usage.completion_tokens);
  expect(s.mode).toBe("generate");
  expect(s.loops_used).toBe(loops);
  expect(r.model_info).toEqual(TINY_INFO);
  expect(r.runtime).toEqual({ name: "loopserve", version: pkg.version, commit: COMMIT });
}

// ---- models ----

describe("GET /api/v0/models", () => {
  test("the compat list with model_info per entry and the runtime section", async () => {
    const compat = await jsonBody(await fetch(`${server.url}/v1/models`), ModelList);
    const list = await jsonBody(await fetch(`${server.url}/api/v0/models`), ExtendedModelList);
    expect(list.object).toBe("list");
    expect(list.data).toEqual([{ ...compat.data[0], model_info: TINY_INFO }]);
    expect(list.runtime).toEqual({ name: "loopserve", version: pkg.version, commit: COMMIT });
  });

  test("GET /api/v0/models/{id} returns the extended entry", async () => {
    const list = await jsonBody(await fetch(`${server.url}/api/v0/models`), ExtendedModelList);
    const entry = await jsonBody(await fetch(`${server.url}/api/v0/models/${encodeURIComponent(list.data[0].id)}`), ExtendedModelEntry);
    expect(entry).toEqual(list.data[0]);
  });
});

// ---- response sections ----

describe("extended response sections", () => {
  test("chat completion: the compat object plus stats, model_info, runtime", async () => {
    const r = await chat({ max_tokens: 6, temperature: 0 });
    expect(Object.keys(r)).toEqual(["id", "object", "created", "model", "choices", "usage", "stats", "model_info", "runtime"]);
    expect(r.id).toMatch(/^chatcmpl-[0-9a-f]+$/);
    expect(r.object).toBe("chat.completion");
    expect(r.model).toBe(MODEL);
    expect(r.usage.prompt_tokens).toBe(tok.encode(USER_RENDERED).length);
    expect(r.usage.total_tokens).toBe(r.usage.prompt_tokens + r.usage.completion_tokens);
    expectSections(r, r.usage, TINY.loops);
  });

  test("text completion: the compat object plus the sections; loops_used follows loops", async () => {
    const r = await complete({ max_tokens: 5, loops: 3 });
    expect(r.id).toMatch(/^cmpl-[0-9a-f]+$/);
    expect(r.object).toBe("text_completion");
    expect(r.usage.prompt_tokens).toBe(tok.encode(PROMPT).length);
    expectSections(r, r.usage, 3);
  });

  test("the generated text equals the compat family's for the same request", async () => {
    const req = { model: MODEL, messages: USER, max_tokens: 12, temperature: 0.8, seed: 9 };
    const v1 = await server.postOk("/v1/chat/completions", req, ChatCompletion);
    const v0 = await chat(req);
    expect(v0.choices).toEqual(v1.choices);
    expect(v0.usage).toEqual(v1.usage);
    expect(v1).not.toHaveProperty("stats");
  });

  test("stream: the sections ride on the final chunk only, before the usage chunk", async () => {
    const chunks = await streamChunks(
      "/api/v0/chat/completions",
      { model: MODEL, messages: USER, max_tokens: 5, temperature: 0, stream: true, stream_options: { include_usage: true } },
      ExtendedChatCompletionChunk,
    );
    expect(chunks[0].choices[0].delta).toEqual({ role: "assistant" });
    const [final, usageChunk] = chunks.slice(-2);
    expect(usageChunk.choices).toEqual([]);
    expect(final.choices[0]).toEqual({ index: 0, delta: {}, logprobs: null, finish_reason: "length" });
    expectSections(final, usageChunk.usage, TINY.loops);
    for (const c of [...chunks.slice(0, -2), usageChunk]) expect(c).not.toHaveProperty("stats");
  });

  test("text-completion stream: the sections on the final chunk", async () => {
    const chunks = await streamChunks("/api/v0/completions", { model: MODEL, prompt: PROMPT, max_tokens: 4, stream: true }, ExtendedTextCompletionChunk);
    const final = chunks[chunks.length - 1];
    expect(final.object).toBe("text_completion");
    expect(final.choices[0]).toEqual({ text: "", index: 0, logprobs: null, finish_reason: "length" });
    const n = tok.encode(PROMPT).length;
    expectSections(final, { prompt_tokens: n, completion_tokens: 4, total_tokens: n + 4 }, TINY.loops);
  });
});

// ---- extended knobs ----

describe("extended request knobs", () => {
  test("mode generate is the default and can be named", async () => {
    const r = await complete({ max_tokens: 2, mode: "generate" });
    expect(r.stats.mode).toBe("generate");
  });

  test.each(["speculative", "tree_speculative"])("greedy mode %p gives the plain output at verify_loops, with acceptance stats", async (mode) => {
    const knobs = { mode, draft_loops: 1, verify_loops: 3, draft_ahead: 4, K_branches: 2 };
    const spec = await complete({ max_tokens: 20, temperature: 0, ...knobs });
    const plain = await complete({ max_tokens: 20, temperature: 0, loops: 3 });
    expect(spec.choices[0].text).toBe(plain.choices[0].text);
    expect(spec.stats.mode).toBe(mode);
    expect(spec.stats.loops_used).toBe(3);
    const extra = spec.stats;
    expectSchema(SpeculativeStats, extra);
    expect(extra.draft_tokens).toBeGreaterThan(0);
    expect(extra.accepted_tokens).toBeLessThanOrEqual(extra.draft_tokens);
    expect(extra.accepted_per_cycle).toBeGreaterThanOrEqual(1);
  });

  test("tree_speculative refuses sampling (the compat default temperature is 1.0) with a 400 naming temperature", async () => {
    const res = await server.post("/api/v0/chat/completions", { model: MODEL, messages: USER, mode: "tree_speculative" });
    expect(res.status).toBe(400);
    const body = await res.json();
    expectInvalidRequest(body, "temperature");
  });

  test.each(["speculative", "tree_speculative"])("mode %p with draft_loops above verify_loops is served: the plain output at verify_loops", async (mode) => {
    const spec = await complete({ max_tokens: 20, temperature: 0, mode, draft_loops: 5, verify_loops: 3, draft_ahead: 4, K_branches: 2 });
    const plain = await complete({ max_tokens: 20, temperature: 0, loops: 3 });
    expect(spec.choices[0].text).toBe(plain.choices[0].text);
    expect(spec.stats.loops_used).toBe(3);
  });

  test("an unknown mode is a 400 listing the modes", async () => {
    const res = await server.post("/api/v0/chat/completions", { model: MODEL, messages: USER, mode: "fast" });
    expect(res.status).toBe(400);
    const body = await res.json();
    expectInvalidRequest(body, "mode");
    expect(body.error.message).toContain('"generate", "speculative", "tree_speculative"');
  });

  test("repetition_penalty replaces the penalty folded from presence/frequency_penalty", async () => {
    const r = await complete({ max_tokens: 24, temperature: 0, presence_penalty: 2, frequency_penalty: 2, repetition_penalty: 1.2 });
    const n = await native({ prompt: PROMPT, max_tokens: 24, temperature: 0, loops: TINY.loops, repetition_penalty: 1.2 });
    expect(r.choices[0].text).toBe(n.text);
  });

  test("without repetition_penalty the penalties fold as in the compat family", async () => {
    const r = await complete({ max_tokens: 24, temperature: 0, presence_penalty: 0.6, frequency_penalty: 0.4 });
    const n = await native({ prompt: PROMPT, max_tokens: 24, temperature: 0, loops: TINY.loops, repetition_penalty: 1.5 });
    expect(r.choices[0].text).toBe(n.text);
  });

  test("cache_window reaches the engine", async () => {
    const prompt = "loop ".repeat(40);
    const r = await complete({ prompt, max_tokens: 24, temperature: 0, cache_window: 8 });
    const n = await native({ prompt, max_tokens: 24, temperature: 0, loops: TINY.loops, cache_window: 8 });
    expect(r.choices[0].text).toBe(n.text);
  });

  test("slo_ms reaches the scheduler: an impossible target is a 503 (ignored on /v1)", async () => {
    await complete({ max_tokens: 8 }); // the latency predictor has samples
    const req = { model: MODEL, prompt: PROMPT, max_tokens: 200, loops: 64, slo_ms: 1 };
    const res = await server.post("/api/v0/completions", req);
    expect(res.status).toBe(503);
    const body = (await res.json()) as ErrorBody;
    expect(body.error.code).toBe("latency_target");
    expect((await server.post("/v1/completions", { ...req, max_tokens: 2 })).status).toBe(200);
  });

  test("priority reaches the scheduler: a higher priority queued later runs first", async () => {
    const long = server.post("/api/v0/completions", { model: MODEL, prompt: PROMPT, max_tokens: 200, loops: 64 });
    await Bun.sleep(30);
    const order: string[] = [];
    const queued = (name: string, priority: number) =>
      server.post("/api/v0/completions", { model: MODEL, prompt: PROMPT, max_tokens: 2, priority }).then((r) => {
        expect(r.status).toBe(200);
        order.push(name);
      });
    const low = queued("low", -5);
    await Bun.sleep(10);
    const high = queued("high", 5);
    await Promise.all([long, low, high]);
    expect(order).toEqual(["high", "low"]);
  });

  test.each([
    ["draft_loops", 0],
    ["draft_loops", 33],
    ["verify_loops", 0],
    ["verify_loops", 65],
    ["draft_ahead", 0],
    ["draft_ahead", 17],
    ["K_branches", 0],
    ["K_branches", 17],
    ["cache_window", -1],
    ["cache_window", MAX_SEQ_LEN + 1],
    ["repetition_penalty", 0.49],
    ["repetition_penalty", 2.01],
    ["priority", 1001],
    ["priority", -1001],
    ["slo_ms", 0],
  ])("%s = %p is a 400 naming the field", async (field, value) => {
    for (const path of ["/api/v0/chat/completions", "/api/v0/completions"]) {
      const res = await server.post(path, { model: MODEL, messages: USER, prompt: PROMPT, max_tokens: 1, [field]: value });
      expect(res.status).toBe(400);
      const body = await res.json();
      expectInvalidRequest(body, field);
      expect(body.error.message).toContain(`\`${field}\``);
    }
  });

  test.each([
    ["draft_loops", 1],
    ["draft_loops", 32],
    ["verify_loops", 64],
    ["draft_ahead", 16],
    ["K_branches", 16],
    ["cache_window", 0],
    ["cache_window", MAX_SEQ_LEN],
    ["repetition_penalty", 0.5],
    ["repetition_penalty", 2],
    ["priority", 1000],
    ["priority", -1000],
    ["slo_ms", 600000],
  ])("%s = %p at its bound is accepted", async (field, value) => {
    const res = await server.post("/api/v0/completions", { model: MODEL, prompt: PROMPT, max_tokens: 1, [field]: value });
    expect(res.status).toBe(200);
  });

  test.each([
    ["string draft_loops", { draft_loops: "2" }, "draft_loops"],
    ["fractional cache_window", { cache_window: 1.5 }, "cache_window"],
    ["string priority", { priority: "high" }, "priority"],
  ])("%s is a 422", async (_, extra, param) => {
    const res = await server.post("/api/v0/completions", { model: MODEL, prompt: PROMPT, ...extra });
    expect(res.status).toBe(422);
    expectInvalidRequest(await res.json(), param);
  });
});

// ---- without a usable model ----

describe("both families on a server without a usable model", () => {
  const missing = () => `${testTempDir()}/no-such-model.safetensors`;
  const s = serverForTests(() => ({ modelPath: missing() }));


  test("the models lists still name the configured model; model_info is null; commit is null", async () => {
    const v1 = await jsonBody(await fetch(`${s.url}/v1/models`), ModelList);
    expect(v1.data.map((m) => m.id)).toEqual([missing()]);
    const v0 = await jsonBody(await fetch(`${s.url}/api/v0/models`), ExtendedModelList);
    expect(v0.data[0].model_info).toBeNull();
    expect(v0.runtime.commit).toBeNull();
  });

  test.each([
    ["/v1/chat/completions", { messages: USER }],
    ["/v1/completions", { prompt: PROMPT }],
    ["/api/v0/chat/completions", { messages: USER }],
    ["/api/v0/completions", { prompt: PROMPT }],
  ])("%s: 503 after validation (422, 400 and the length check come first)", async (path, body) => {
    const req = { model: MODEL, max_tokens: 4, ...body };
    const res = await s.post(path, req);
    expect(res.status).toBe(503);
    expect(((await res.json()) as ErrorBody).error.code).toBe("model_not_loaded");
    expect((await s.post(path, { ...req, stream: true })).status).toBe(503);
    expect((await s.post(path, { ...req, model: undefined })).status).toBe(422);
    expect((await s.post(path, { ...req, n: 2 })).status).toBe(400);
    expect((await s.post(path, { ...req, max_tokens: 4000 })).status).toBe(400);
  });

  test("SERVICE_MODEL_PATH unset: an empty models list", async () => {
    const none = await startServer({ modelPath: null });
    try {
      const v1 = await jsonBody(await fetch(`${none.url}/v1/models`), ModelList);
      expect(v1).toEqual({ object: "list", data: [] });
    } finally {
      await none.stop();
    }
  });
});
