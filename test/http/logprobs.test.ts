// Log-probabilities through every family against the trained model
// (models/kjv-looped-256.safetensors), checked against the kernels' own
// logits: this file loads the model through the FFI binding, forwards the
// same tokens and log-softmaxes the rows itself (in float64). Covers chat
// and text completions, streamed and not, echo scoring as
// lm-evaluation-harness asks for it, top-alternative order and count, the
// raw (untransformed) distribution of sampled requests, the speculative
// modes' verifier distribution, the native knob, and the openai client.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import type { TSchema } from "@sinclair/typebox";
import { NativeModel } from "../../src/engine/binding.ts";
import {
  ChatCompletion,
  ChatCompletionChunk,
  type ChatLogprobs,
  type CompletionLogprobs,
  ErrorBody,
  ExtendedChatCompletion,
  ExtendedTextCompletion,
  GenerateResponse,
  GenerateStreamEvent,
  SpeculativeResponse,
  TextCompletion,
  TextCompletionChunk,
} from "../../src/wire/responses.ts";
import { TRAINED_MODEL_PATH } from "../../src/model/trained.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { jsonBody, sseEvents } from "../helpers/http.ts";
import { ensureLibrary, LIB } from "../helpers/kernels.ts";
import { startServer, type TestServer } from "../helpers/server.ts";
import { logSoftmax } from "../reference/forward.ts";

const TOLERANCE = 1e-4;
const LOOPS = 8; // the trained model's default_loops
const MODEL = "kjv";
const PROMPT = "And God said unto Moses, I AM THAT I AM: and he said,";
const MESSAGES = [{ role: "user", content: "Who made the heaven and the earth?" }];
const RENDERED = "User: Who made the heaven and the earth?\nAssistant:";

let server: TestServer;
let model: NativeModel;
let tok: Tokenizer;

beforeAll(async () => {
  ensureLibrary();
  tok = await Tokenizer.load();
  model = NativeModel.load(LIB, TRAINED_MODEL_PATH, 1, "auto");
  server = await startServer({ modelPath: TRAINED_MODEL_PATH, env: { SERVICE_MAX_SEQ_LEN: "512" } });
});

afterAll(async () => {
  await server?.stop();
  model?.close();
});

// ---- the reference: the kernels' logits, log-softmaxed here ----

/** log-softmax of every row of forward(tokens) at `loops`: row i is the distribution of token i + 1. */
function referenceRows(tokens: number[], loops = LOOPS): Float64Array[] {
  const vocab = model.info.vocabSize;
  const session = model.newSession(tokens.length, loops, 0);
  try {
    const logits = new Float32Array(tokens.length * vocab);
    session.forward(Int32Array.from(tokens), loops, logits, tokens.length);
    return tokens.map((_, i) => {
      return logSoftmax(logits.subarray(i * vocab, (i + 1) * vocab));
    });
  } finally {
    session.close();
  }
}

/** The k most likely ids of a log-softmaxed row: by value, ties to the lower id. */
function topK(row: Float64Array, k: number): number[] {
  return Array.from(row.keys())
    .sort((a, b) => row[b] - row[a] || a - b)
    .slice(0, k);
}

const text = (id: number) => tok.decode([id]);
let byBytes: Map<string, number> | null = null;
/** The id whose bytes these are (GPT-2 tokens' byte strings are distinct). */
function idOfBytes(b: number[]): number {
  if (!byBytes) {
    byBytes = new Map();
    for (let id = 0; id < tok.vocabSize; id++) byBytes.set(tok.tokenBytes(id).join(","), id);
  }
  const id = byBytes.get(b.join(","));
  if (id === undefined) throw new Error(`no token has the bytes ${b}`);
  return id;
}
const bytes = (id: number) => Array.from(tok.tokenBytes(id));
const near = (got: number, want: number) => expect(Math.abs(got - want)).toBeLessThan(TOLERANCE);

/** Greedy decoding of n tokens by the reference itself (argmax, lowest id on ties). */
function greedy(prompt: number[], n: number, loops = LOOPS): number[] {
  const out: number[] = [];
  while (out.length < n) out.push(topK(referenceRows([...prompt, ...out], loops).at(-1) as Float64Array, 1)[0]);
  return out;
}

/** Each route's response body, and its stream events (src/wire/responses.ts). */
const BODY: Record<string, TSchema> = {
  "/v1/chat/completions": ChatCompletion,
  "/v1/completions": TextCompletion,
  "/api/v0/chat/completions": ExtendedChatCompletion,
  "/api/v0/completions": ExtendedTextCompletion,
  "/generate": GenerateResponse,
  "/generate/speculative": SpeculativeResponse,
  "/generate/tree_speculative": SpeculativeResponse,
};
const EVENT: Record<string, TSchema> = {
  "/v1/chat/completions": ChatCompletionChunk,
  "/v1/completions": TextCompletionChunk,
  "/generate": GenerateStreamEvent,
};

/** A 200 body, checked against its route's schema (the checks below then read it freely). */
async function post(path: string, body: unknown): Promise<any> {
  return jsonBody(await server.post(path, body), BODY[path]);
}

/** The chunks of a streamed response, each checked against its schema; [DONE] checked and dropped. */
async function stream(path: string, body: unknown): Promise<any[]> {
  const res = await server.post(path, { ...(body as object), stream: true });
  expect(res.status).toBe(200);
  return sseEvents(await res.text(), EVENT[path]);
}

type ChatEntry = ChatLogprobs["content"][number];

/** Chat entries for `ids` generated after `prompt`: texts, bytes, values and the top alternatives. */
function expectChatEntries(entries: ChatEntry[], prompt: number[], ids: number[], k: number, loops = LOOPS) {
  const rows = referenceRows([...prompt, ...ids], loops);
  expect(entries).toHaveLength(ids.length);
  entries.forEach((e, i) => {
    const row = rows[prompt.length - 1 + i];
    expect(e.token).toBe(text(ids[i]));
    expect(e.bytes).toEqual(bytes(ids[i]));
    near(e.logprob, row[ids[i]]);
    const top = topK(row, k);
    expect(e.top_logprobs.map((t) => t.bytes)).toEqual(top.map(bytes));
    expect(e.top_logprobs.map((t) => t.token)).toEqual(top.map(text));
    e.top_logprobs.forEach((t, j) => near(t.logprob, row[top[j]]));
  });
}

// ---- chat completions ----

describe("chat completions: logprobs true + top_logprobs", () => {
  const prompt = () => tok.encode(RENDERED);

  test("each generated token's log-probability and its top alternatives, best first, equal the kernels' log-softmax", async () => {
    const r = await post("/v1/chat/completions", { model: MODEL, messages: MESSAGES, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 5 });
    const ids = greedy(prompt(), 10);
    expect(r.choices[0].message.content).toBe(tok.decode(ids));
    const content = r.choices[0].logprobs.content as ChatEntry[];
    expectChatEntries(content, prompt(), ids, 5);
    for (const e of content) {
      expect(e.top_logprobs).toHaveLength(5);
      // Greedy: the token is the first alternative, with the very same value.
      expect(e.top_logprobs[0]).toEqual({ token: e.token, logprob: e.logprob, bytes: e.bytes });
      for (let j = 1; j < 5; j++) expect(e.top_logprobs[j].logprob).toBeLessThanOrEqual(e.top_logprobs[j - 1].logprob);
    }
    expect(r.choices[0].logprobs.refusal).toBeNull();
  });

  test("top_logprobs 0 (or unset) gives empty alternatives; 20 gives twenty", async () => {
    for (const [extra, count] of [[{}, 0], [{ top_logprobs: 0 }, 0], [{ top_logprobs: 20 }, 20]] as const) {
      const r = await post("/v1/chat/completions", { model: MODEL, messages: MESSAGES, max_tokens: 3, temperature: 0, logprobs: true, ...extra });
      const content = r.choices[0].logprobs.content as ChatEntry[];
      expect(content).toHaveLength(3);
      for (const e of content) expect(e.top_logprobs).toHaveLength(count);
      if (count === 20) expectChatEntries(content, prompt(), greedy(prompt(), 3), 20);
    }
  });

  test("streamed: each chunk carries the entries of the tokens it adds, and together they are the whole response's", async () => {
    const body = { model: MODEL, messages: MESSAGES, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3 };
    const whole = await post("/v1/chat/completions", body);
    const chunks = await stream("/v1/chat/completions", body);
    const carried = chunks.filter((c) => c.choices[0].logprobs !== null);
    expect(carried.length).toBeGreaterThan(1);
    for (const c of carried) {
      // The chunk's text is exactly its tokens' text (this model writes ASCII here).
      const own = (c.choices[0].logprobs.content as ChatEntry[]).map((e) => e.token).join("");
      expect(c.choices[0].delta.content ?? "").toBe(own);
    }
    expect(carried.flatMap((c) => c.choices[0].logprobs.content)).toEqual(whole.choices[0].logprobs.content);
    expect(chunks[0].choices[0]).toEqual({ index: 0, delta: { role: "assistant" }, logprobs: null, finish_reason: null });
  });

  test("a sampled request reports the raw distribution: temperature, top_p and penalties change the tokens, not the values", async () => {
    const r = await post("/v1/chat/completions", {
      model: MODEL,
      messages: MESSAGES,
      max_tokens: 12,
      temperature: 1.7,
      top_p: 0.8,
      presence_penalty: 1.5,
      seed: 5,
      logprobs: true,
      top_logprobs: 2,
    });
    const content = r.choices[0].logprobs.content as ChatEntry[];
    // The ids behind the entries: a sampled token need not be the likeliest, so look them up by bytes.
    const ids = content.map((e) => idOfBytes(e.bytes));
    expect(tok.decode(ids)).toBe(r.choices[0].message.content);
    expectChatEntries(content, prompt(), ids, 2);
    // High temperature: some sampled token is not the likeliest one.
    expect(content.some((e) => e.token !== e.top_logprobs[0].token)).toBe(true);
  });

  test("/api/v0 at another depth and in the speculative modes: the verifier's distribution at that depth", async () => {
    const ids = greedy(prompt(), 8, 5);
    for (const mode of ["generate", "speculative", "tree_speculative"]) {
      const depth = mode === "generate" ? { loops: 5 } : { verify_loops: 5, draft_loops: 2, K_branches: 3 };
      const r = await post("/api/v0/chat/completions", { model: MODEL, messages: MESSAGES, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 4, mode, ...depth });
      expect(r.stats).toMatchObject({ mode, loops_used: 5 });
      expectChatEntries(r.choices[0].logprobs.content, prompt(), ids, 4, 5);
    }
  });
});

// ---- text completions ----

/** Completion logprobs of `ids` (scored[i]: token i has a logprob) against the reference rows of `all`. */
function expectCompletionEntries(lp: CompletionLogprobs, all: number[], from: number, k: number, choiceText: string, offset0 = 0) {
  const rows = referenceRows(all);
  const ids = all.slice(from);
  expect(lp.tokens).toEqual(ids.map(text));
  let offset = offset0;
  ids.forEach((id, i) => {
    const at = from + i;
    expect(lp.text_offset[i]).toBe(offset);
    expect(choiceText.slice(offset, offset + text(id).length)).toBe(text(id));
    offset += text(id).length;
    if (at === 0) {
      expect(lp.token_logprobs[i]).toBeNull();
      expect(lp.top_logprobs[i]).toBeNull();
      return;
    }
    const row = rows[at - 1];
    near(lp.token_logprobs[i] as number, row[id]);
    // The k likeliest by text, plus the token itself when it is not among them.
    const top = topK(row, k);
    const keys = [...new Set([...top, id].map(text))];
    const dict = lp.top_logprobs[i] as Record<string, number>;
    expect(Object.keys(dict).sort()).toEqual(keys.sort());
    for (const t of [...top, id]) near(dict[text(t)], row[t]);
  });
}

describe("text completions: logprobs 0..5", () => {
  test("generated tokens: tokens, token_logprobs, top_logprobs and text_offset", async () => {
    const prompt = tok.encode(PROMPT);
    const r = await post("/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 10, temperature: 0, logprobs: 3 });
    const ids = greedy(prompt, 10);
    const lp = r.choices[0].logprobs as CompletionLogprobs;
    expectCompletionEntries(lp, [...prompt, ...ids], prompt.length, 3, r.choices[0].text);
    // Greedy: the token's value is the largest of its alternatives (how lm-evaluation-harness tells is_greedy).
    lp.token_logprobs.forEach((v, i) => expect(v).toBe(Math.max(...Object.values(lp.top_logprobs[i] as object))));
    for (const d of lp.top_logprobs) expect(Object.keys(d as object)).toHaveLength(3);
  });

  test("logprobs 0: each top_logprobs holds just the token itself", async () => {
    const r = await post("/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 4, temperature: 1, seed: 3, logprobs: 0 });
    const lp = r.choices[0].logprobs as CompletionLogprobs;
    lp.top_logprobs.forEach((d, i) => expect(d).toEqual({ [lp.tokens[i]]: lp.token_logprobs[i] as number }));
  });

  test("streamed: the chunks' sections concatenate to the whole response's", async () => {
    const body = { model: MODEL, prompt: PROMPT, max_tokens: 12, temperature: 0, logprobs: 2, echo: true };
    const whole = await post("/v1/completions", body);
    const chunks = await stream("/v1/completions", body);
    const parts = chunks.map((c) => c.choices[0].logprobs).filter((l) => l !== null) as CompletionLogprobs[];
    // The first chunk is the echoed prompt with the prompt's entries.
    expect(chunks[0].choices[0].text).toBe(PROMPT);
    expect(parts[0].tokens.join("")).toBe(PROMPT);
    const joined = Object.fromEntries(
      (["tokens", "token_logprobs", "top_logprobs", "text_offset"] as const).map((k) => [k, parts.flatMap((p) => p[k] as unknown[])]),
    );
    expect(joined).toEqual(whole.choices[0].logprobs);
    expect(chunks.map((c) => c.choices[0].text).join("")).toBe(whole.choices[0].text);
  });
});

describe("text and stops", () => {
  test("a character split over tokens: each token's text is U+FFFD, and text_offset counts code points", async () => {
    const prompt = "Moses 🦒 said unto";
    const r = await post("/v1/completions", { model: MODEL, prompt, echo: true, max_tokens: 0, logprobs: 0 });
    const lp = r.choices[0].logprobs as CompletionLogprobs;
    const ids = tok.encode(prompt);
    const emoji = ids.filter((id) => text(id).includes("\uFFFD"));
    expect(emoji.length).toBeGreaterThan(1); // the emoji's four bytes span several tokens
    expect(lp.tokens).toEqual(ids.map(text));
    const said = lp.tokens.indexOf(" said");
    expect(lp.text_offset[said]).toBe([..."Moses 🦒"].length); // 7 code points (8 UTF-16 units)
    for (let i = 1; i < said; i++) expect(lp.text_offset[i]).toBeLessThanOrEqual(6);
  });

  test("a stop string: every generated token keeps its entry, streamed or not", async () => {
    const full = await post("/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 16, temperature: 0 });
    const words = full.choices[0].text.trim().split(" ");
    const stop = ` ${words[2]}`;
    const body = { model: MODEL, prompt: PROMPT, max_tokens: 16, temperature: 0, stop, logprobs: 1 };
    const r = await post("/v1/completions", body);
    expect(r.choices[0].finish_reason).toBe("stop");
    expect(r.choices[0].text).not.toContain(stop);
    const lp = r.choices[0].logprobs as CompletionLogprobs;
    expect(lp.tokens).toHaveLength(r.usage.completion_tokens);
    expect(lp.tokens.join("")).toStartWith(r.choices[0].text);
    const chunks = await stream("/v1/completions", body);
    const parts = chunks.map((c) => c.choices[0].logprobs).filter((l) => l !== null) as CompletionLogprobs[];
    expect(parts.flatMap((p) => p.tokens)).toEqual(lp.tokens);
    expect(parts.flatMap((p) => p.token_logprobs)).toEqual(lp.token_logprobs);
  });
});

describe("echo scoring, as lm-evaluation-harness's local-completions asks for it", () => {
  // {echo: true, max_tokens: 1, logprobs: 1, temperature: 0}, prompt as token ids (one list per prompt).
  const CONTEXT = "And God said, Let there be light:";
  const CONTINUATION = " and there was light.";

  test.each([1, 0])("max_tokens %d: every prompt token after the first has its log-probability", async (maxTokens) => {
    const ids = tok.encode(CONTEXT + CONTINUATION);
    const r = await post("/v1/completions", { model: MODEL, prompt: [ids], echo: true, max_tokens: maxTokens, logprobs: 1, temperature: 0, seed: 1234 });
    const choice = r.choices[0];
    const lp = choice.logprobs as CompletionLogprobs;
    const generated = greedy(ids, maxTokens);
    expect(choice.finish_reason).toBe("length");
    expect(choice.text).toBe(tok.decode([...ids, ...generated]));
    expect(lp.token_logprobs).toHaveLength(ids.length + maxTokens);
    expect(lp.token_logprobs[0]).toBeNull();
    expect(lp.token_logprobs.slice(1).every((v) => typeof v === "number")).toBe(true);
    expectCompletionEntries(lp, [...ids, ...generated], 0, 1, choice.text);
    expect(r.usage).toEqual({ prompt_tokens: ids.length, completion_tokens: maxTokens, total_tokens: ids.length + maxTokens });

    // What the harness computes: the continuation's summed log-probability and whether it is the greedy one.
    const ctxlen = tok.encode(CONTEXT).length;
    const rows = referenceRows(ids);
    const scored = lp.token_logprobs.slice(ctxlen, ids.length) as number[];
    const expected = ids.slice(ctxlen).map((id, i) => rows[ctxlen + i - 1][id]);
    near(
      scored.reduce((a, b) => a + b, 0),
      expected.reduce((a, b) => a + b, 0),
    );
    const isGreedy = scored.every((v, i) => v === Math.max(...Object.values(lp.top_logprobs[ctxlen + i] as object)));
    expect(isGreedy).toBe(ids.slice(ctxlen).every((id, i) => topK(rows[ctxlen + i - 1], 1)[0] === id));
  });

  test("a text prompt is scored the same, and text_offset indexes the echoed text", async () => {
    const r = await post("/api/v0/completions", { model: MODEL, prompt: PROMPT, echo: true, max_tokens: 0, logprobs: 2 });
    const ids = tok.encode(PROMPT);
    expect(r.choices[0].text).toBe(PROMPT);
    expectCompletionEntries(r.choices[0].logprobs, ids, 0, 2, PROMPT);
  });

  test("a prompt longer than one scoring chunk (64 tokens) is scored at every position", async () => {
    const long = "And the earth was without form, and void; and darkness was upon the face of the deep. ".repeat(7);
    const ids = tok.encode(long);
    expect(ids.length).toBeGreaterThan(130);
    const r = await post("/v1/completions", { model: MODEL, prompt: ids, echo: true, max_tokens: 2, logprobs: 1, temperature: 0 });
    expectCompletionEntries(r.choices[0].logprobs, [...ids, ...greedy(ids, 2)], 0, 1, r.choices[0].text);
  });

  test("scoring never takes a pooled prefix (it needs every position's logits); a scored prompt is pooled for others", async () => {
    const prompt = `${PROMPT} Thus shalt thou say`;
    const body = { model: MODEL, prompt, echo: true, max_tokens: 3, logprobs: 1, temperature: 0 };
    const hits = async () => Number(/^service_prefix_pool_hits_total (\S+)$/m.exec(await (await fetch(`${server.url}/metrics`)).text())?.[1]);
    const before = await hits();
    const a = await post("/v1/completions", body);
    const b = await post("/v1/completions", body); // the prompt is pooled now
    expect(await hits()).toBe(before);
    expect(b.choices[0].logprobs).toEqual(a.choices[0].logprobs);
    const plain = await post("/v1/completions", { ...body, echo: false, logprobs: null });
    expect(await hits()).toBe(before + 1);
    expect(prompt + plain.choices[0].text).toBe(a.choices[0].text);
  });
});

// ---- native family ----

describe("native logprobs knob", () => {
  const ids = () => tok.encode(PROMPT);

  function expectNative(entries: any[], prompt: number[], tokens: number[], k: number) {
    const rows = referenceRows([...prompt, ...tokens]);
    expect(entries).toHaveLength(tokens.length);
    entries.forEach((e, i) => {
      const row = rows[prompt.length - 1 + i];
      expect(e.token_id).toBe(tokens[i]);
      expect(e.token).toBe(text(tokens[i]));
      near(e.logprob, row[tokens[i]]);
      const top = topK(row, k);
      expect(e.top_logprobs.map((t: { token_id: number }) => t.token_id)).toEqual(top);
      e.top_logprobs.forEach((t: { token: string; logprob: number }, j: number) => {
        expect(t.token).toBe(text(top[j]));
        near(t.logprob, row[top[j]]);
      });
    });
  }

  test("/generate: one entry per token; absent without the knob", async () => {
    const r = await post("/generate", { prompt: PROMPT, max_tokens: 8, logprobs: 4 });
    expectNative(r.logprobs, ids(), r.tokens, 4);
    expect(r.tokens).toEqual(greedy(ids(), 8));
    expect(await post("/generate", { prompt: PROMPT, max_tokens: 2 })).not.toHaveProperty("logprobs");
  });

  test("/generate sampled with top_k, top_p and a repetition penalty: the raw distribution", async () => {
    const r = await post("/generate", { prompt: PROMPT, max_tokens: 12, logprobs: 3, temperature: 1.5, top_k: 5, top_p: 0.9, repetition_penalty: 1.8, sample_seed: 9 });
    expectNative(r.logprobs, ids(), r.tokens, 3);
  });

  test("/generate streamed: each token event carries its one entry", async () => {
    const whole = await post("/generate", { prompt: PROMPT, max_tokens: 6, logprobs: 2 });
    const events = await stream("/generate", { prompt: PROMPT, max_tokens: 6, logprobs: 2 });
    const tokenEvents = events.filter((e) => e.token_id >= 0);
    for (const e of tokenEvents) expect(e.logprobs).toHaveLength(1);
    expect(tokenEvents.flatMap((e) => e.logprobs)).toEqual(whole.logprobs);
  });

  test("/generate/speculative and /generate/tree_speculative: the verifier's distribution, greedy and sampled", async () => {
    const plain = await post("/generate", { prompt: PROMPT, max_tokens: 16, logprobs: 3 });
    for (const path of ["/generate/speculative", "/generate/tree_speculative"]) {
      const r = await post(path, { prompt: PROMPT, max_tokens: 16, logprobs: 3, draft_loops: 2, verify_loops: LOOPS, K_branches: 4 });
      expect(r.tokens).toEqual(plain.tokens);
      expect(r.logprobs).toEqual(plain.logprobs); // batch invariance: the very same numbers
      expect(r.stats.draft_tokens).toBeGreaterThan(0);
    }
    const sampled = await post("/generate/speculative", { prompt: PROMPT, max_tokens: 16, logprobs: 3, temperature: 1, sample_seed: 4, draft_loops: 3 });
    expectNative(sampled.logprobs, ids(), sampled.tokens, 3);
  });

  test.each([
    ["/generate", 21],
    ["/generate", -1],
    ["/generate/speculative", 21],
  ])("%s with logprobs %d is a 400 naming it", async (path, logprobs) => {
    const res = await server.post(path, { prompt: PROMPT, logprobs });
    expect((await jsonBody(res, ErrorBody, 400)).error.param).toBe("logprobs");
  });
});

// ---- the official client ----

describe("the openai client reads the logprobs fields", () => {
  let client: OpenAI;
  beforeAll(() => {
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
  });

  test("chat.completions.create and the stream helper's accumulated completion", async () => {
    const req = { model: MODEL, messages: MESSAGES as OpenAI.Chat.ChatCompletionMessageParam[], max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2 };
    const r = await client.chat.completions.create(req);
    const content = r.choices[0].logprobs?.content ?? [];
    expectChatEntries(content as ChatEntry[], tok.encode(RENDERED), greedy(tok.encode(RENDERED), 6), 2);
    const final = await client.chat.completions.stream(req).finalChatCompletion();
    expect(final.choices[0].logprobs?.content).toEqual(content);
  });

  test("completions.create with echo and max_tokens 0 scores the prompt", async () => {
    const r = await client.completions.create({ model: MODEL, prompt: PROMPT, echo: true, max_tokens: 0, logprobs: 1, temperature: 0 });
    const lp = r.choices[0].logprobs;
    expect(lp?.token_logprobs?.[0]).toBeNull();
    expectCompletionEntries(lp as CompletionLogprobs, tok.encode(PROMPT), 0, 1, PROMPT);
  });
});
