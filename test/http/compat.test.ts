// The compat family (/v1) against a real server process: response objects,
// every request field, default and limit (docs/http.md) — the limits for
// both families, since /api/v0 takes the same fields — the SSE framing byte
// for byte and whole-string stop matching.
//
// Sampling-field checks compare against POST /generate, whose knobs are
// explicit: a compat request must give exactly the tokens of the native
// request its fields map to.
import { beforeAll, describe, expect, test } from "bun:test";
import type { Static, TSchema } from "@sinclair/typebox";
import {
  ChatCompletion,
  ChatCompletionChunk,
  type ErrorBody,
  ExtendedChatCompletion,
  ExtendedTextCompletion,
  GenerateResponse,
  ModelEntry,
  ModelList,
  TextCompletion,
  TextCompletionChunk,
} from "../../src/wire/responses.ts";
import { IncrementalDetokenizer, Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { expectInvalidRequest, jsonBody, sseEvents } from "../helpers/http.ts";
import { TINY } from "../helpers/models.ts";
import { serverForTests } from "../helpers/server.ts";

const MAX_SEQ_LEN = 256;
const DEFAULT_LOOPS = TINY.loops; // the tiny model's default_loops
const MODEL = "any-model-name";
const PROMPT = "The looped transformer said";
const USER = [{ role: "user", content: PROMPT }];
/** The chat template (docs/http.md) applied to USER, written out by hand. */
const USER_RENDERED = `User: ${PROMPT}\nAssistant:`;

const server = serverForTests({ env: { SERVICE_MAX_SEQ_LEN: String(MAX_SEQ_LEN) } });
const tok = await Tokenizer.load();

// ---- helpers ----

const chat = (body: Record<string, unknown>) => server.postOk("/v1/chat/completions", { model: MODEL, messages: USER, ...body }, ChatCompletion);
const complete = (body: Record<string, unknown>) => server.postOk("/v1/completions", { model: MODEL, prompt: PROMPT, ...body }, TextCompletion);
const native = (body: Record<string, unknown>) => server.postOk("/generate", body, GenerateResponse);

/** The native request a compat request's defaults map to: top-k 50, top_p 1, penalty 1. */
const nativeDefaults = { loops: DEFAULT_LOOPS, temperature: 1, top_k: 50, top_p: 1, repetition_penalty: 1 };

/** A whole stream: the raw body, and its chunks checked against `schema`. */
async function streamRaw<S extends TSchema>(path: string, body: unknown, schema: S): Promise<{ raw: string; chunks: Static<S>[] }> {
  const res = await server.post(path, body);
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toStartWith("text/event-stream");
  const raw = await res.text();
  return { raw, chunks: sseEvents(raw, schema) };
}

/** Text deltas exactly as the server must emit them: whole characters, empty ones dropped. */
function deltas(tokens: number[]): string[] {
  const d = new IncrementalDetokenizer(tok);
  return [...tokens.map((t) => d.push(t)), d.flush()].filter((s) => s !== "");
}

// ---- models ----

describe("GET /v1/models", () => {
  test("lists the one served model: id = SERVICE_MODEL_PATH", async () => {
    const list = await jsonBody(await fetch(`${server.url}/v1/models`), ModelList);
    expect(list.object).toBe("list");
    expect(list.data).toHaveLength(1);
    const [m] = list.data;
    expect(m).toEqual({
      id: expect.stringMatching(/\.safetensors$/),
      object: "model",
      created: expect.any(Number),
      owned_by: "loopserve",
      max_model_len: MAX_SEQ_LEN,
      default_loops: DEFAULT_LOOPS,
      exit_threshold: null,
    });
    expect(Number.isInteger(m.created)).toBe(true);
    expect(Math.abs(m.created - Date.now() / 1000)).toBeLessThan(600);
  });

  test("GET /v1/models/{id} returns the entry for the percent-encoded id, 404 for others", async () => {
    const list = await jsonBody(await fetch(`${server.url}/v1/models`), ModelList);
    const id = list.data[0].id;
    expect(await jsonBody(await fetch(`${server.url}/v1/models/${encodeURIComponent(id)}`), ModelEntry)).toEqual(list.data[0]);
    const missing = await fetch(`${server.url}/v1/models/gpt-4o`);
    expect(missing.status).toBe(404);
    expect(((await missing.json()) as ErrorBody).error.type).toBe("not_found_error");
    // Malformed percent-encoding is compared as sent, never a 500.
    expect((await fetch(`${server.url}/v1/models/a%zz`)).status).toBe(404);
  });
});

// ---- response objects ----

/** A whole response's fields, in OpenAI's order, and the ones every response starts with: an id with its prefix, the object, created (Unix seconds), the model echoed. */
function expectHead(r: { id: string; object: string; created: number; model: string }, idPrefix: string, object: string): void {
  expect(Object.keys(r)).toEqual(["id", "object", "created", "model", "choices", "usage"]);
  expect(r.id).toMatch(new RegExp(`^${idPrefix}[0-9a-f]+$`));
  expect(r.object).toBe(object);
  expect(Number.isInteger(r.created)).toBe(true);
  expect(r.model).toBe(MODEL);
}

describe("POST /v1/chat/completions response", () => {
  test("has the chat.completion shape with one choice and consistent usage", async () => {
    const before = Math.floor(Date.now() / 1000);
    const r = await chat({ max_tokens: 6, temperature: 0 });
    expectHead(r, "chatcmpl-", "chat.completion");
    expect(r.created).toBeGreaterThanOrEqual(before);
    expect(r.created).toBeLessThanOrEqual(Math.ceil(Date.now() / 1000));
    expect(r.choices).toHaveLength(1);
    expect(r.choices[0]).toEqual({ index: 0, message: { role: "assistant", content: expect.any(String) }, logprobs: null, finish_reason: "length" });
    expect(r.usage).toEqual({ prompt_tokens: tok.encode(USER_RENDERED).length, completion_tokens: 6, total_tokens: tok.encode(USER_RENDERED).length + 6 });
  });

  test("ids are unique per response", async () => {
    const a = await chat({ max_tokens: 1 });
    const b = await chat({ max_tokens: 1 });
    expect(a.id).not.toBe(b.id);
  });

  test("model is echoed whatever it says", async () => {
    for (const model of ["gpt-4o", "", "some/path with spaces ✓"]) {
      const r = await server.postOk("/v1/chat/completions", { model, messages: USER, max_tokens: 1 }, ChatCompletion);
      expect(r.model).toBe(model);
    }
  });
});

describe("POST /v1/completions response", () => {
  test("has the text_completion shape with one choice and consistent usage", async () => {
    const r = await complete({ max_tokens: 5, temperature: 0 });
    expectHead(r, "cmpl-", "text_completion");
    expect(r.choices).toEqual([{ text: expect.any(String), index: 0, logprobs: null, finish_reason: "length" }]);
    const n = tok.encode(PROMPT).length;
    expect(r.usage).toEqual({ prompt_tokens: n, completion_tokens: 5, total_tokens: n + 5 });
  });
});

// ---- the chat template and usage.prompt_tokens ----

describe("chat rendering", () => {
  const conversation = [
    { role: "system", content: "You are terse." },
    { role: "user", content: "Hello there, ünïcödé 🙂" },
    { role: "assistant", content: "Hi!" },
    { role: "user", content: "What is a loop?" },
  ];
  const rendered = "System: You are terse.\nUser: Hello there, ünïcödé 🙂\nAssistant: Hi!\nUser: What is a loop?\nAssistant:";

  test("usage.prompt_tokens is the GPT-2 token count of the rendered prompt", async () => {
    const r = await chat({ messages: conversation, max_tokens: 3 });
    expect(r.usage.prompt_tokens).toBe(tok.encode(rendered).length);
    expect(r.usage.total_tokens).toBe(r.usage.prompt_tokens + r.usage.completion_tokens);
  });

  test("the model sees exactly 'Role: content' lines then 'Assistant:'", async () => {
    const r = await chat({ messages: conversation, max_tokens: 12, temperature: 0 });
    const n = await native({ prompt: rendered, max_tokens: 12, temperature: 0, loops: DEFAULT_LOOPS });
    expect(r.choices[0].message.content).toBe(n.text);
  });

  test("content parts are accepted and their texts joined with a newline", async () => {
    const parts = [{ role: "user", content: [{ type: "text", text: "first" }, { type: "text", text: "second" }] }];
    const joined = [{ role: "user", content: "first\nsecond" }];
    const a = await chat({ messages: parts, max_tokens: 8, temperature: 0 });
    const b = await chat({ messages: joined, max_tokens: 8, temperature: 0 });
    expect(a.usage.prompt_tokens).toBe(tok.encode("User: first\nsecond\nAssistant:").length);
    expect(a.choices[0].message.content).toBe(b.choices[0].message.content);
  });

  test("null content (an assistant turn that only called tools) renders as empty", async () => {
    const messages = [...USER, { role: "assistant", content: null, tool_calls: [] }, { role: "user", content: "Go on" }];
    const r = await chat({ messages, max_tokens: 1 });
    expect(r.usage.prompt_tokens).toBe(tok.encode(`${USER_RENDERED} \nUser: Go on\nAssistant:`).length);
  });

  test("a non-text content part is a 400 naming the part", async () => {
    const messages = [{ role: "user", content: [{ type: "text", text: "look" }, { type: "image_url", image_url: { url: "x" } }] }];
    const res = await server.post("/v1/chat/completions", { model: MODEL, messages });
    expect(res.status).toBe(400);
    const body = await res.json();
    expectInvalidRequest(body, "messages[0].content[1].type");
    expect(body.error.message).toContain("image_url");
  });

  test("a text part without text is a 422", async () => {
    const res = await server.post("/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: [{ type: "text" }] }] });
    expect(res.status).toBe(422);
    expectInvalidRequest(await res.json(), "messages[0].content[0].text");
  });
});

// ---- sampling fields against their native equivalents ----

describe("sampling fields", () => {
  test("defaults: temperature 1, top_p 1, top-k 50, no penalty, max_tokens 128, loops = default_loops", async () => {
    const r = await chat({ seed: 7 });
    const n = await native({ prompt: USER_RENDERED, ...nativeDefaults, sample_seed: 7, max_tokens: 128 });
    expect(r.choices[0].message.content).toBe(n.text);
    expect(r.usage.completion_tokens).toBe(n.tokens.length);
    expect(r.choices[0].finish_reason).toBe(n.finish_reason);
    if (n.finish_reason === "length") expect(r.usage.completion_tokens).toBe(128);
  });

  test("null optional fields mean their defaults", async () => {
    const a = await chat({ seed: 3, max_tokens: 10 });
    const nulls = { temperature: null, top_p: null, n: null, stop: null, stream: null, presence_penalty: null, frequency_penalty: null, loops: null };
    const b = await chat({ seed: 3, max_tokens: 10, ...nulls });
    expect(b.choices[0].message.content).toBe(a.choices[0].message.content);
  });

  test("temperature 0 is greedy", async () => {
    const r = await complete({ max_tokens: 16, temperature: 0 });
    const n = await native({ prompt: PROMPT, max_tokens: 16, temperature: 0, loops: DEFAULT_LOOPS });
    expect(r.choices[0].text).toBe(n.text);
  });

  test("temperature, top_p and seed map to the engine's sampler", async () => {
    const r = await complete({ max_tokens: 16, temperature: 0.7, top_p: 0.4, seed: 11 });
    const n = await native({ prompt: PROMPT, max_tokens: 16, ...nativeDefaults, temperature: 0.7, top_p: 0.4, sample_seed: 11 });
    expect(r.choices[0].text).toBe(n.text);
  });

  test("seed makes sampling deterministic; different seeds differ", async () => {
    const a = await chat({ max_tokens: 16, seed: 1 });
    const b = await chat({ max_tokens: 16, seed: 1 });
    const c = await chat({ max_tokens: 16, seed: 2 });
    expect(b.choices[0].message.content).toBe(a.choices[0].message.content);
    expect(c.choices[0].message.content).not.toBe(a.choices[0].message.content);
  });

  test("without a seed each request samples with a fresh one", async () => {
    const texts = new Set<string>();
    for (let i = 0; i < 3; i++) texts.add((await chat({ max_tokens: 16 })).choices[0].message.content);
    expect(texts.size).toBeGreaterThan(1);
  });

  test("presence and frequency penalties fold into repetition penalty 1 + max(0, p + f) / 2", async () => {
    const r = await complete({ max_tokens: 24, temperature: 0, presence_penalty: 0.6, frequency_penalty: 0.4 });
    const n = await native({ prompt: PROMPT, max_tokens: 24, temperature: 0, loops: DEFAULT_LOOPS, repetition_penalty: 1.5 });
    expect(r.choices[0].text).toBe(n.text);
  });

  test("a negative penalty sum means no penalty", async () => {
    const r = await complete({ max_tokens: 24, temperature: 0, presence_penalty: -2, frequency_penalty: 1 });
    const plain = await complete({ max_tokens: 24, temperature: 0 });
    expect(r.choices[0].text).toBe(plain.choices[0].text);
  });

  test("loops sets the loop depth", async () => {
    const r = await complete({ max_tokens: 12, temperature: 0, loops: 2 });
    const n = await native({ prompt: PROMPT, max_tokens: 12, temperature: 0, loops: 2 });
    expect(r.choices[0].text).toBe(n.text);
  });

  test("max_tokens caps the completion and finishes with length", async () => {
    const r = await chat({ max_tokens: 3, temperature: 0 });
    expect(r.usage.completion_tokens).toBe(3);
    expect(r.choices[0].finish_reason).toBe("length");
  });

  test("max_completion_tokens (newer clients) is an alias of max_tokens; both only with the same value", async () => {
    expect((await chat({ max_completion_tokens: 4 })).usage.completion_tokens).toBe(4);
    expect((await chat({ max_completion_tokens: 3, max_tokens: 3 })).usage.completion_tokens).toBe(3);
    const res = await server.post("/v1/chat/completions", { model: MODEL, messages: USER, max_completion_tokens: 2, max_tokens: 9 });
    expect(res.status).toBe(400);
    const body = await res.json();
    expectInvalidRequest(body, "max_completion_tokens");
    expect(body.error.message).toContain("`max_tokens` (9)");
    expect(body.error.message).toContain("`max_completion_tokens` (2)");
  });

  test("tool-calling fields, whatever they ask, and other unknown fields are accepted and ignored on both families", async () => {
    const tool = { type: "function", function: { name: "f", description: "calls f", parameters: { type: "object", properties: {} } } };
    const extras = {
      tools: [tool],
      tool_choice: { type: "function", function: { name: "f" } },
      parallel_tool_calls: true,
      functions: [{ name: "g", parameters: { type: "object" } }],
      function_call: "auto",
      user: "someone",
      logit_bias: { "50256": -100 },
      metadata: { a: "b" },
      store: false,
      service_tier: "auto",
      something_new: [1, 2, 3],
    };
    const chat = { model: MODEL, messages: USER, max_tokens: 8, temperature: 0.9, seed: 7 };
    const text = { model: MODEL, prompt: PROMPT, max_tokens: 8, temperature: 0.9, seed: 7 };
    for (const [path, schema, request] of [
      ["/v1/chat/completions", ChatCompletion, chat],
      ["/api/v0/chat/completions", ExtendedChatCompletion, chat],
      ["/v1/completions", TextCompletion, text],
      ["/api/v0/completions", ExtendedTextCompletion, text],
    ] as const) {
      const plain = await server.postOk(path, request, schema);
      const withTools = await server.postOk(path, { ...request, ...extras }, schema);
      expect(withTools.choices).toEqual(plain.choices);
      expect(withTools.usage).toEqual(plain.usage);
      expect(JSON.stringify(withTools.choices)).not.toContain("tool_calls");
    }
  });

  test("an Authorization header or API key is accepted and ignored", async () => {
    const res = await server.post(
      "/v1/chat/completions",
      { model: MODEL, messages: USER, max_tokens: 1 },
      { "content-type": "application/json", authorization: "Bearer sk-whatever", "api-key": "x" },
    );
    expect(res.status).toBe(200);
  });
});

// ---- text-completion specifics ----

describe("POST /v1/completions prompt forms", () => {
  test("of an array of prompts only the first is used", async () => {
    const one = await complete({ max_tokens: 8, temperature: 0 });
    const many = await complete({ prompt: [PROMPT, "something else entirely"], max_tokens: 8, temperature: 0 });
    expect(many.choices[0].text).toBe(one.choices[0].text);
    expect(many.usage.prompt_tokens).toBe(one.usage.prompt_tokens);
  });

  test("a pre-tokenised prompt equals its text", async () => {
    const one = await complete({ max_tokens: 8, temperature: 0 });
    const ids = await complete({ prompt: tok.encode(PROMPT), max_tokens: 8, temperature: 0 });
    expect(ids.choices[0].text).toBe(one.choices[0].text);
  });

  test("of a list of pre-tokenised prompts only the first is used", async () => {
    const one = await complete({ max_tokens: 8, temperature: 0 });
    const many = await complete({ prompt: [tok.encode(PROMPT), tok.encode("something else")], max_tokens: 8, temperature: 0 });
    expect(many.choices[0].text).toBe(one.choices[0].text);
    expect(many.usage.prompt_tokens).toBe(one.usage.prompt_tokens);
  });

  test("max_tokens 0 only scores the prompt: allowed with echo, and then nothing is generated", async () => {
    const r = await complete({ max_tokens: 0, echo: true });
    expect(r.choices[0]).toEqual({ text: PROMPT, index: 0, logprobs: null, finish_reason: "length" });
    expect(r.usage).toEqual({ prompt_tokens: tok.encode(PROMPT).length, completion_tokens: 0, total_tokens: tok.encode(PROMPT).length });
    for (const field of ["max_tokens", "max_completion_tokens"]) {
      const res = await server.post("/v1/completions", { model: MODEL, prompt: PROMPT, [field]: 0 });
      expect(res.status).toBe(400);
      const body = await res.json();
      expectInvalidRequest(body, field);
      expect(body.error.message).toContain("echo");
    }
  });

  test("echo prepends the prompt to the text", async () => {
    const plain = await complete({ max_tokens: 6, temperature: 0 });
    const echoed = await complete({ max_tokens: 6, temperature: 0, echo: true });
    expect(echoed.choices[0].text).toBe(PROMPT + plain.choices[0].text);
    expect(echoed.usage).toEqual(plain.usage);
  });

  test.each([
    ["suffix", "and then", "suffix"],
    ["best_of", 2, "best_of"],
    ["logprobs", 6, "logprobs"],
    ["logprobs", -1, "logprobs"],
  ])("%s = %p is a 400 naming the field", async (field, value, param) => {
    const res = await server.post("/v1/completions", { model: MODEL, prompt: PROMPT, [field]: value });
    expect(res.status).toBe(400);
    expectInvalidRequest(await res.json(), param);
  });

  test("default values of the unsupported fields are accepted", async () => {
    const res = await server.post("/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 1, suffix: "", best_of: 1, logprobs: null, echo: false });
    expect(res.status).toBe(200);
  });
});

// ---- stop strings ----

describe("stop strings (whole-string match on the decoded text)", () => {
  /** A 4-character stop made of the end of one token's text and the start of the next's, and where it cuts. */
  async function spanningStop(maxTokens: number) {
    const full = await native({ prompt: PROMPT, max_tokens: maxTokens, temperature: 0, loops: DEFAULT_LOOPS });
    const pieces = full.tokens.map((t) => tok.decode([t]));
    for (let i = 1; i < pieces.length; i++) {
      const stop = pieces[i - 1].slice(-2) + pieces[i].slice(0, 2);
      if (stop.length === 4 && !stop.includes("\uFFFD") && !pieces.some((p) => p.includes(stop)))
        return { stop, full, before: full.text.slice(0, full.text.indexOf(stop)) };
    }
    throw new Error("no spanning stop candidate in the greedy output");
  }

  test("a stop string spanning several tokens ends with stop and is not returned", async () => {
    const { stop, before } = await spanningStop(32);
    const r = await complete({ max_tokens: 32, temperature: 0, stop });
    expect(r.choices[0].finish_reason).toBe("stop");
    expect(r.choices[0].text).toBe(before);
    expect(r.choices[0].text).not.toContain(stop);
  });

  test("streamed: the stop string is never emitted and the deltas add up to the same text", async () => {
    const { stop, before } = await spanningStop(32);
    const { chunks } = await streamRaw("/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 32, temperature: 0, stop: ["\u0001never", stop], stream: true }, TextCompletionChunk);
    const text = chunks.map((c) => c.choices[0].text).join("");
    expect(text).toBe(before);
    expect(chunks.at(-1)?.choices[0].finish_reason).toBe("stop");
  });

  test("chat: a stop array with one matching string", async () => {
    const full = await chat({ max_tokens: 24, temperature: 0 });
    const content = full.choices[0].message.content;
    const stop = content.slice(5, 9);
    const r = await chat({ max_tokens: 24, temperature: 0, stop: ["\u0001never", stop] });
    expect(r.choices[0].message.content).toBe(content.slice(0, content.indexOf(stop)));
    expect(r.choices[0].finish_reason).toBe("stop");
  });

  test("a stop string that never occurs changes nothing", async () => {
    const plain = await complete({ max_tokens: 8, temperature: 0 });
    const r = await complete({ max_tokens: 8, temperature: 0, stop: "\u0001never\u0001" });
    expect(r.choices[0]).toEqual(plain.choices[0]);
  });
});

// ---- streaming ----

describe("compat SSE framing", () => {
  test("chat: role chunk, one chunk per non-empty delta, final chunk, [DONE] — byte for byte", async () => {
    const n = await native({ prompt: USER_RENDERED, max_tokens: 12, temperature: 0, loops: DEFAULT_LOOPS });
    const { raw, chunks } = await streamRaw("/v1/chat/completions", { model: MODEL, messages: USER, max_tokens: 12, temperature: 0, stream: true }, ChatCompletionChunk);
    const { id, created } = chunks[0];
    expect(id).toMatch(/^chatcmpl-[0-9a-f]+$/);
    expect(Number.isInteger(created)).toBe(true);
    const head = { id, object: "chat.completion.chunk", created, model: MODEL };
    const event = (choice: unknown) => `data: ${JSON.stringify({ ...head, choices: [choice] })}\n\n`;
    let expected = event({ index: 0, delta: { role: "assistant" }, logprobs: null, finish_reason: null });
    for (const d of deltas(n.tokens)) expected += event({ index: 0, delta: { content: d }, logprobs: null, finish_reason: null });
    expected += event({ index: 0, delta: {}, logprobs: null, finish_reason: n.finish_reason });
    expected += "data: [DONE]\n\n";
    expect(raw).toBe(expected);
  });

  test("text completion: text chunks, final chunk with finish_reason, [DONE] — byte for byte", async () => {
    const n = await native({ prompt: PROMPT, max_tokens: 12, temperature: 0, loops: DEFAULT_LOOPS });
    const { raw, chunks } = await streamRaw("/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 12, temperature: 0, stream: true }, TextCompletionChunk);
    const { id, created } = chunks[0];
    expect(id).toMatch(/^cmpl-[0-9a-f]+$/);
    const head = { id, object: "text_completion", created, model: MODEL };
    const event = (choice: unknown) => `data: ${JSON.stringify({ ...head, choices: [choice] })}\n\n`;
    let expected = "";
    for (const d of deltas(n.tokens)) expected += event({ text: d, index: 0, logprobs: null, finish_reason: null });
    expected += event({ text: "", index: 0, logprobs: null, finish_reason: n.finish_reason });
    expected += "data: [DONE]\n\n";
    expect(raw).toBe(expected);
  });

  test("streamed content equals the non-streamed content (sampled, same seed)", async () => {
    const req = { model: MODEL, messages: USER, max_tokens: 20, temperature: 0.9, seed: 42 };
    const whole = await chat(req);
    const { chunks } = await streamRaw("/v1/chat/completions", { ...req, stream: true }, ChatCompletionChunk);
    const content = chunks.map((c) => c.choices[0].delta.content ?? "").join("");
    expect(content).toBe(whole.choices[0].message.content);
    expect(chunks.at(-1)?.choices[0].finish_reason).toBe(whole.choices[0].finish_reason);
    for (const c of chunks.slice(1, -1)) expect(c.choices[0].delta.content?.length).toBeGreaterThan(0);
  });

  test("include_usage: usage null on every chunk, then a usage chunk with empty choices", async () => {
    const req = { model: MODEL, messages: USER, max_tokens: 7, temperature: 0 };
    const whole = await chat(req);
    const { chunks } = await streamRaw("/v1/chat/completions", { ...req, stream: true, stream_options: { include_usage: true } }, ChatCompletionChunk);
    const last = chunks.at(-1);
    expect(last?.choices).toEqual([]);
    expect(last?.usage).toEqual(whole.usage);
    expect(last?.id).toBe(chunks[0].id);
    for (const c of chunks.slice(0, -1)) {
      expect(c).toHaveProperty("usage", null);
      expect(c.choices).toHaveLength(1);
    }
    expect(chunks.at(-2)?.choices[0]).toEqual({ index: 0, delta: {}, logprobs: null, finish_reason: "length" });
  });

  test("include_usage on a text-completion stream", async () => {
    const { chunks } = await streamRaw("/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 4, stream: true, stream_options: { include_usage: true } }, TextCompletionChunk);
    const n = tok.encode(PROMPT).length;
    expect(chunks.at(-1)).toMatchObject({ object: "text_completion", choices: [], usage: { prompt_tokens: n, completion_tokens: 4, total_tokens: n + 4 } });
  });

  test("without include_usage no chunk has a usage field", async () => {
    const { chunks } = await streamRaw("/v1/chat/completions", { model: MODEL, messages: USER, max_tokens: 3, stream: true, stream_options: { include_usage: false } }, ChatCompletionChunk);
    for (const c of chunks) expect(c).not.toHaveProperty("usage");
  });

  test("echo streams the prompt as the first text chunk", async () => {
    const { chunks } = await streamRaw("/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 3, temperature: 0, echo: true, stream: true }, TextCompletionChunk);
    expect(chunks[0].choices[0].text).toBe(PROMPT);
    const plain = await complete({ max_tokens: 3, temperature: 0, echo: true });
    expect(chunks.map((c) => c.choices[0].text).join("")).toBe(plain.choices[0].text);
  });
});

// ---- validation, limits for both families ----

const ENDPOINTS = [
  ["/v1/chat/completions", { model: MODEL, messages: USER }],
  ["/v1/completions", { model: MODEL, prompt: PROMPT }],
  ["/api/v0/chat/completions", { model: MODEL, messages: USER }],
  ["/api/v0/completions", { model: MODEL, prompt: PROMPT }],
] as const;

describe.each(ENDPOINTS)("%s validation", (path, base) => {
  const post = (body: Record<string, unknown>) => server.post(path, { ...base, max_tokens: 1, ...body });

  test.each([
    ["n", 2],
    ["n", 0],
    ["temperature", 2.5],
    ["temperature", -0.1],
    ["top_p", 1.5],
    ["top_p", -0.1],
    ["max_tokens", 0],
    ["max_tokens", 8193],
    ["max_completion_tokens", 0],
    ["max_completion_tokens", 8193],
    ["presence_penalty", 3],
    ["presence_penalty", -3],
    ["frequency_penalty", 3],
    ["frequency_penalty", -3],
    ["loops", 0],
    ["loops", 65],
    ["seed", -1],
  ])("%s = %p is a 400 naming the field", async (field, value) => {
    const res = await post({ [field]: value });
    expect(res.status).toBe(400);
    const body = await res.json();
    expectInvalidRequest(body, field);
    expect(body.error.message).toContain(`\`${field}\``);
    expect(body.error.message).toContain(`got ${value}`);
  });

  test.each([
    ["n", 1],
    ["temperature", 0],
    ["temperature", 2],
    ["top_p", 0],
    ["top_p", 1],
    ["max_tokens", 1],
    ["presence_penalty", 2],
    ["presence_penalty", -2],
    ["frequency_penalty", 2],
    ["frequency_penalty", -2],
    ["loops", 1],
    ["loops", 64],
    ["seed", 0],
    ["seed", Number.MAX_SAFE_INTEGER],
  ])("%s = %p at its bound is accepted", async (field, value) => {
    const res = await post({ [field]: value });
    expect(res.status).toBe(200);
  });

  test("max_tokens 8192 is in range: with SERVICE_MAX_SEQ_LEN 256 it fails the length check instead", async () => {
    const res = await post({ max_tokens: 8192 });
    expect(res.status).toBe(400);
    const body = await res.json();
    expectInvalidRequest(body, "max_tokens");
    expect(body.error.code).toBe("context_length_exceeded");
  });

  test("prompt + max_tokens over SERVICE_MAX_SEQ_LEN is a 400; at the limit it runs", async () => {
    const n = tok.encode(path.includes("chat") ? USER_RENDERED : PROMPT).length;
    const over = await post({ max_tokens: MAX_SEQ_LEN - n + 1 });
    expect(over.status).toBe(400);
    const body = (await over.json()) as ErrorBody;
    expect(body.error.code).toBe("context_length_exceeded");
    expect(body.error.message).toContain(String(MAX_SEQ_LEN));
    expect((await post({ max_tokens: MAX_SEQ_LEN - n, temperature: 0 })).status).toBe(200);
  });

  test("an over-length prompt is a 400", async () => {
    const long = "loop ".repeat(MAX_SEQ_LEN + 10);
    const res = path.includes("chat") ? await post({ messages: [{ role: "user", content: long }] }) : await post({ prompt: long });
    expect(res.status).toBe(400);
    expect(((await res.json()) as ErrorBody).error.code).toBe("context_length_exceeded");
  });

  test.each([
    ["an unknown type", { type: "xml" }, "response_format.type", "invalid_value"],
    ["json_schema without its object", { type: "json_schema" }, "response_format.json_schema", "invalid_value"],
    ["a schema with a keyword the engine cannot honour", { type: "json_schema", json_schema: { name: "x", schema: { type: "array", uniqueItems: true } } }, "response_format.json_schema.schema", "invalid_response_format"],
  ])("response_format with %s is a 400 naming the part at fault", async (_, value, param, code) => {
    const res = await post({ response_format: value, max_tokens: 4 });
    expect(res.status).toBe(400);
    const body = await res.json();
    expectInvalidRequest(body, param);
    expect(body.error.code).toBe(code);
  });

  test("response_format text, null, json_object and json_schema are accepted (docs/structured-output.md)", async () => {
    expect((await post({ response_format: { type: "text" } })).status).toBe(200);
    expect((await post({ response_format: null })).status).toBe(200);
    expect((await post({ response_format: { type: "json_object" }, max_tokens: 4 })).status).toBe(200);
    expect((await post({ response_format: { type: "json_schema", json_schema: { name: "x", schema: {} } }, max_tokens: 4 })).status).toBe(200);
  });

  // Each family's log-probability fields (values: test/http/logprobs.test.ts).
  if (path.includes("chat")) {
    test.each([
      ["top_logprobs without logprobs", { top_logprobs: 2 }, 400, "top_logprobs"],
      ["top_logprobs with logprobs false", { logprobs: false, top_logprobs: 0 }, 400, "top_logprobs"],
      ["top_logprobs 21", { logprobs: true, top_logprobs: 21 }, 400, "top_logprobs"],
      ["top_logprobs -1", { logprobs: true, top_logprobs: -1 }, 400, "top_logprobs"],
      ["numeric logprobs", { logprobs: 1 }, 422, "logprobs"],
      ["fractional top_logprobs", { logprobs: true, top_logprobs: 1.5 }, 422, "top_logprobs"],
    ])("%s is a %d naming the field", async (_, body, status, param) => {
      const res = await post(body);
      expect(res.status).toBe(status);
      expectInvalidRequest(await res.json(), param);
    });

    test("logprobs false/null, and true with top_logprobs 0..20 or null, are accepted", async () => {
      for (const body of [{ logprobs: false }, { logprobs: null, top_logprobs: null }, { logprobs: true }, { logprobs: true, top_logprobs: 20 }])
        expect((await post(body)).status).toBe(200);
    });
  } else {
    test.each([
      ["logprobs 6", { logprobs: 6 }, 400],
      ["logprobs -1", { logprobs: -1 }, 400],
      ["boolean logprobs", { logprobs: true }, 422],
    ])("%s is a %d naming the field", async (_, body, status) => {
      const res = await post(body);
      expect(res.status).toBe(status);
      expectInvalidRequest(await res.json(), "logprobs");
    });

    test("logprobs null and 0..5 are accepted", async () => {
      for (const logprobs of [null, 0, 5]) expect((await post({ logprobs })).status).toBe(200);
    });
  }

  test.each([
    ["missing model", { model: undefined }, "model"],
    ["numeric model", { model: 5 }, "model"],
    ["string max_tokens", { max_tokens: "8" }, "max_tokens"],
    ["fractional max_tokens", { max_tokens: 1.5 }, "max_tokens"],
    ["string temperature", { temperature: "hot" }, "temperature"],
    ["string stream", { stream: "yes" }, "stream"],
    ["numeric stop", { stop: 5 }, "stop"],
    ["fractional seed", { seed: 1.5 }, "seed"],
    ["boolean loops", { loops: true }, "loops"],
    ["string stream_options", { stream_options: "usage" }, "stream_options"],
  ])("%s is a 422", async (_, body, param) => {
    const res = await post(body);
    expect(res.status).toBe(422);
    expectInvalidRequest(await res.json(), param);
  });

  test("an empty stop string is a 400", async () => {
    const res = await post({ stop: [""] });
    expect(res.status).toBe(400);
    expectInvalidRequest(await res.json(), "stop[0]");
  });

  test.each([
    ["malformed JSON", '{"model": "x"', { "content-type": "application/json" }],
    ["empty body", "", { "content-type": "application/json" }],
    ["a form body", "model=x", { "content-type": "application/x-www-form-urlencoded" }],
  ])("%s is a 400 in the error shape, never a 500", async (_, raw, headers) => {
    const res = await server.post(path, raw, headers);
    expect(res.status).toBe(400);
    expectInvalidRequest(await res.json(), null);
  });
});

describe.each([["/v1"], ["/api/v0"]])("%s/chat/completions messages", (prefix) => {
  const post = (body: Record<string, unknown>) => server.post(`${prefix}/chat/completions`, { model: MODEL, max_tokens: 1, ...body });

  test("missing messages is a 422", async () => {
    const res = await post({});
    expect(res.status).toBe(422);
    const body = await res.json();
    expectInvalidRequest(body, "messages");
    expect(body.error.code).toBe("missing_required_parameter");
  });

  test.each([
    ["messages not an array", { messages: "hi" }, "messages"],
    ["a message without role", { messages: [{ content: "hi" }] }, "messages[0].role"],
    ["a message without content", { messages: [{ role: "user" }] }, "messages[0].content"],
    ["numeric content", { messages: [{ role: "user", content: 5 }] }, "messages[0].content"],
  ])("%s is a 422", async (_, body, param) => {
    const res = await post(body);
    expect(res.status).toBe(422);
    expectInvalidRequest(await res.json(), param);
  });

  // A role outside the allowed set is a value outside an enum: 400.
  test.each(["tool", "developer", "robot"])("role %p is a 400 listing the allowed roles", async (role) => {
    const res = await post({ messages: [{ role, content: "hi" }] });
    expect(res.status).toBe(400);
    const body = await res.json();
    expectInvalidRequest(body, "messages[0].role");
    expect(body.error.message).toContain('"system", "user", "assistant"');
  });

  test("an empty messages array is a 400", async () => {
    const res = await post({ messages: [] });
    expect(res.status).toBe(400);
    expectInvalidRequest(await res.json(), "messages");
  });
});

describe.each([["/v1"], ["/api/v0"]])("%s/completions prompt", (prefix) => {
  const post = (body: Record<string, unknown>) => server.post(`${prefix}/completions`, { model: MODEL, max_tokens: 1, ...body });

  test.each([
    ["missing prompt", {}, "prompt"],
    ["numeric prompt", { prompt: 5 }, "prompt"],
    ["nested arrays of mixed items", { prompt: [[1, "a"]] }, "prompt"],
  ])("%s is a 422", async (_, body, param) => {
    const res = await post(body);
    expect(res.status).toBe(422);
    expectInvalidRequest(await res.json(), param);
  });

  test.each([
    ["empty prompt", { prompt: "" }, "prompt"],
    ["empty prompt array", { prompt: [] }, "prompt"],
    ["empty first prompt", { prompt: [""] }, "prompt[0]"],
    ["token id beyond the vocabulary", { prompt: [1, 50257] }, "prompt[1]"],
  ])("%s is a 400", async (_, body, param) => {
    const res = await post(body);
    expect(res.status).toBe(400);
    expectInvalidRequest(await res.json(), param);
  });
});

// ---- cancellation ----

describe("client disconnect on the compat family", () => {
  // One request runs at a time: a generation that outlived its client would
  // hold up the next request for its whole length.
  const LONG = { model: MODEL, prompt: PROMPT, max_tokens: MAX_SEQ_LEN - 16, loops: 64, temperature: 0 };
  let fullMs: number;

  beforeAll(async () => {
    const t0 = performance.now();
    await complete({ ...LONG });
    fullMs = performance.now() - t0;
  });

  async function nextRequestMs(): Promise<number> {
    const t0 = performance.now();
    await complete({ max_tokens: 1 });
    return performance.now() - t0;
  }

  test("closing a chat stream cancels its generation", async () => {
    const res = await server.post("/v1/chat/completions", { ...LONG, prompt: undefined, messages: USER, stream: true });
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    await reader.read(); // the role chunk: the request is running
    await reader.cancel();
    expect(await nextRequestMs()).toBeLessThan(fullMs / 2);
  });

  test("abandoning a non-streaming completion cancels its generation", async () => {
    const abort = new AbortController();
    const pending = fetch(`${server.url}/v1/completions`, { method: "POST", body: JSON.stringify(LONG), signal: abort.signal }).catch(() => null);
    await Bun.sleep(fullMs / 10);
    abort.abort();
    await pending;
    expect(await nextRequestMs()).toBeLessThan(fullMs / 2);
  });
});
