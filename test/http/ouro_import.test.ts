// A looped model as people publish it, served end to end: a random-weight
// checkpoint in Hugging Face's Ouro layout (bf16 shards, config.json and
// generation_config.json, its own byte-level BPE and ChatML template with a
// default system turn; a Thinking variant) is imported with `model
// import-hf` and served by a real server process. Its greedy tokens equal
// the float64 reference's on the imported file, at fixed depth and with the
// learned early exit (the steps each token ran too); the official `openai`
// client talks to it unchanged; exit_threshold, stats.mean_steps,
// service_exit_steps and model_info work; misuse is a clear 400. Chat
// prompts are the model's template rendered; <|im_end|>, an end id only
// generation_config.json names, ends text completions too; a Thinking
// model's reasoning comes back in reasoning_content.
import { describe, expect, test } from "bun:test";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import OpenAI from "openai";
import { FIXTURE_IDS, FIXTURE_SYSTEM_TURN, fixtureTokenizerJson, type HfFixtureOptions, writeHfFixture } from "../helpers/hf_fixture.ts";
import { importHfCheckpoint } from "../../src/model/import_hf.ts";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { type ExitPlan, type ExitPolicy, GREEDY } from "../../src/engine/types.ts";
import { withModel } from "../helpers/kernels.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";
import { waitFor } from "../helpers/scheduling.ts";
import { serverForTests } from "../helpers/server.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { argmax, ReferenceModel } from "../reference/forward.ts";

const STEPS = 4;
const EOS = [0, 2]; // <|endoftext|>, <|im_end|>: the fixture tokenizer's end ids

/** A checkpoint of the Ouro layout written and imported; the imported file's path. */
function importedOuro(name: string, options: Partial<HfFixtureOptions> = {}): string {
  const dir = join(testTempDir(), name);
  mkdirSync(dir, { recursive: true });
  writeHfFixture(dir, { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 128, vocabSize: 512, nLayers: 3, totalUtSteps: STEPS, seed: 9, shards: 2, ...options });
  const out = join(testTempDir(), `${name}.safetensors`);
  importHfCheckpoint(dir, out);
  return out;
}

const MODEL_PATH = importedOuro("ouro-hf");
const server = serverForTests({ modelPath: MODEL_PATH, env: { SERVICE_MAX_SEQ_LEN: "256" } });

/** The reference's greedy tokens (and steps) after `prompt`, stopping at an end id as the server does. */
function referenceGreedy(prompt: number[], n: number, exit?: ExitPlan): { tokens: number[]; steps: number[] } {
  const s = ReferenceModel.load(MODEL_PATH).session(STEPS);
  for (const t of prompt.slice(0, -1)) s.feed(t);
  let logits = s.feed(prompt[prompt.length - 1], exit);
  const out = { tokens: [] as number[], steps: [] as number[] };
  while (out.tokens.length < n) {
    const t = argmax(logits);
    if (EOS.includes(t)) break;
    out.tokens.push(t);
    out.steps.push(s.lastSteps);
    logits = s.feed(t, exit);
  }
  return out;
}

const PROMPT = [300, 17, 42, 99, 250, 7, 13];

describe("an imported Ouro-layout checkpoint, served", () => {
  test("/generate: greedy tokens equal the reference's at fixed depth and under early exit (every step, select; or copies), with the steps it reports", async () => {
    let exited = false;
    // null: no early exit; 1: every step, the fixed-depth path; 0: every token after its first step.
    const cases: { exit: number | null; policy: ExitPolicy }[] = [
      ...[null, 1, 0, 0.4, 0.5, 0.7].map((exit) => ({ exit, policy: "exact" as const })),
      { exit: 0.4, policy: "copy" },
    ];
    for (const { exit, policy } of cases) {
      const res = await server.post("/generate", { prompt: PROMPT, max_tokens: 16, temperature: 0, loops: STEPS, exit_threshold: exit, exit_policy: policy });
      expect(res.status).toBe(200);
      const body = await res.json();
      const fixed = exit === null || exit === 1;
      const want = referenceGreedy(PROMPT, 16, fixed ? undefined : { threshold: exit, policy });
      expect(body.tokens, `exit_threshold ${exit}, ${policy}`).toEqual(want.tokens);
      if (fixed) expect(body.stats.mean_steps).toBeUndefined();
      else if (want.steps.length > 0) expect(body.stats.mean_steps).toBeCloseTo(want.steps.reduce((a, b) => a + b, 0) / want.steps.length, 9);
      exited ||= want.steps.some((s) => s < STEPS);
    }
    expect(exited).toBe(true); // the gate stopped some token early: the exits were exercised
  }, 60_000);

  test("the official openai client: chat (ChatML) and text completions", async () => {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused" });
    const chat = await client.chat.completions.create({ model: "ouro", messages: [{ role: "user", content: "Hi there" }], max_tokens: 8, temperature: 0 });
    expect(chat.choices[0].message.role).toBe("assistant");
    expect(typeof chat.choices[0].message.content).toBe("string");
    expect(chat.usage?.prompt_tokens).toBeGreaterThan(4); // the ChatML markers are in the prompt
    const text = await client.completions.create({ model: "ouro", prompt: "In the beginning", max_tokens: 6, temperature: 0 });
    expect(["stop", "length"]).toContain(text.choices[0].finish_reason);
  }, 60_000);

  test("model_info names the stack and the gate; exit_threshold in a speculative mode is a 400 naming the field", async () => {
    const res = await server.post("/api/v0/completions", { model: "ouro", prompt: "a", max_tokens: 2, exit_threshold: 0.5 });
    expect(res.status).toBe(200);
    const body = await res.json();
    expect(body.model_info).toMatchObject({ n_layers: 3, exit_gate: true, exit_threshold: null, default_loops: STEPS });
    expect(typeof body.stats.mean_steps).toBe("number");
    const spec = await server.post("/api/v0/completions", { model: "ouro", prompt: "a", max_tokens: 2, mode: "speculative", exit_threshold: 0.5 });
    expect(spec.status).toBe(400);
    expect((await spec.json()).error.param).toBe("exit_threshold");
    const native = await server.post("/generate/speculative", { prompt: PROMPT, max_tokens: 2, exit_threshold: 0.5 });
    expect(native.status).toBe(400);
    expect((await native.json()).error.param).toBe("exit_threshold");
    const bad = await server.post("/generate", { prompt: PROMPT, exit_threshold: 1.5 });
    expect(bad.status).toBe(400);
    const policy = await server.post("/generate", { prompt: PROMPT, exit_threshold: 0.5, exit_policy: "fast" });
    expect(policy.status).toBe(400);
    expect((await policy.json()).error.param).toBe("exit_policy");
    for (const exit_policy of ["exact", "copy"])
      expect((await server.post("/generate", { prompt: PROMPT, max_tokens: 2, exit_threshold: 0.5, exit_policy })).status).toBe(200);
    // the exact policy computes skipped steps late, from rows a window drops: refused together, naming the window
    const windowed = await server.post("/generate", { prompt: PROMPT, max_tokens: 2, exit_threshold: 0.5, cache_window: 4 });
    expect(windowed.status).toBe(400);
    expect((await windowed.json()).error.param).toBe("cache_window");
    expect((await server.post("/generate", { prompt: PROMPT, max_tokens: 2, exit_threshold: 0.5, exit_policy: "copy", cache_window: 4 })).status).toBe(200);
  }, 60_000);

  test("int4 of the imported model keeps its tokenizer and runs, exits included", () => {
    const int4 = join(testTempDir(), "ouro-imported-int4.safetensors");
    quantizeModelFile(MODEL_PATH, int4, { quant: "int4", head: "int8", groupSize: 32 });
    const meta = readSafetensors(int4).metadata;
    expect(meta.tokenizer).toBe("bpe");
    expect(meta.tokenizer_json).toBe(readSafetensors(MODEL_PATH).metadata.tokenizer_json);
    withModel(int4, 1, "auto", (m) => {
      expect(m.info).toMatchObject({ quant: "int4", nLayers: 3, exitGate: true });
      const s = m.newSession(PROMPT.length + 4, STEPS, 0);
      const first = s.step(Int32Array.from(PROMPT), STEPS, GREEDY, null, { threshold: 0.5, policy: "exact" });
      expect(first).toBeGreaterThanOrEqual(0);
      expect(s.lastSteps).toBeGreaterThanOrEqual(1);
      s.close();
    });
  });

  test("/metrics: a histogram of the steps each early-exit token ran", async () => {
    await server.post("/generate", { prompt: PROMPT, max_tokens: 8, temperature: 0, exit_threshold: 0.5 });
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    const count = /^service_exit_steps_count (\d+)/m.exec(metrics);
    expect(Number(count?.[1])).toBeGreaterThan(0);
    expect(metrics).toContain(`service_exit_steps_bucket{le="${STEPS}"}`);
  }, 60_000);
});

describe("a model whose file names a default exit threshold", () => {
  const GATED = { vocabSize: 50257, loops: 4, seed: 3, nLayers: 2, sandwichNorm: true, stepNorm: true, exitGate: true, exitThreshold: 0.6 };
  const gated = serverForTests(() => ({ modelPath: tinyModelPath(GATED), env: { SERVICE_MAX_SEQ_LEN: "256", SERVICE_PREFIX_POOL_CAPACITY: "4" } }));

  test.each(["exact", "copy"] as const)("a pooled prefix under early exit (%s policy): reused, and the output equals a run alone", async (policy) => {
    const first = policy === "exact" ? [464, 3290, 318, 257, 922, 1110, 11, 290] : [464, 3290, 318, 257, 922, 1110, 11, 291];
    const longer = [...first, 3290, 318];
    const hits = async () => Number(/^service_prefix_pool_hits_total (\d+)/m.exec(await (await fetch(`${gated.url}/metrics`)).text())?.[1]);
    await gated.post("/generate", { prompt: first, max_tokens: 4, temperature: 0, loops: 4, exit_policy: policy });
    const before = await hits();
    const body = await (await gated.post("/generate", { prompt: longer, max_tokens: 12, temperature: 0, loops: 4, exit_policy: policy })).json();
    expect(await hits()).toBe(before + 1);
    const alone = withModel(tinyModelPath(GATED), 1, "auto", (m) => {
      const s = m.newSession(longer.length + 12, 4, 0);
      const out: number[] = [];
      let feed = Int32Array.from(longer);
      while (out.length < 12) {
        out.push(s.step(feed, 4, GREEDY, null, { threshold: 0.6, policy }));
        feed = Int32Array.of(out[out.length - 1]);
      }
      s.close();
      return out;
    });
    expect(body.tokens).toEqual(alone);
  }, 60_000);

  test("service_exit_steps counts the tokens of a request whose client left, as it counts a finished one's", async () => {
    const count = async () => Number(/^service_exit_steps_count (\d+)/m.exec(await (await fetch(`${gated.url}/metrics`)).text())?.[1] ?? 0);
    const before = await count();
    const abort = new AbortController();
    const res = await fetch(`${gated.url}/generate`, {
      method: "POST",
      body: JSON.stringify({ prompt: PROMPT, max_tokens: 200, temperature: 0, loops: 4, stream: true }),
      signal: abort.signal,
    });
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    let seen = "";
    for (let chunk = await reader.read(); !chunk.done && !seen.includes("[DONE]"); chunk = await reader.read()) {
      seen += new TextDecoder().decode(chunk.value);
      if ((seen.match(/"token_id"/g) ?? []).length >= 5) break;
    }
    const received = (seen.match(/"token_id"/g) ?? []).length;
    expect(received).toBeGreaterThan(0);
    abort.abort();
    await reader.cancel().catch(() => {});
    await waitFor("the cancelled request's steps", async () => (await count()) >= before + received);
  }, 60_000);

  test("plain generation exits by default; null and 1 ask for fixed depth; the speculative modes run fixed depths", async () => {
    const byDefault = await (await gated.post("/generate", { prompt: PROMPT, max_tokens: 8, temperature: 0, loops: 4 })).json();
    expect(typeof byDefault.stats.mean_steps).toBe("number");
    for (const exit_threshold of [null, 1]) {
      const fixed = await (await gated.post("/generate", { prompt: PROMPT, max_tokens: 8, temperature: 0, loops: 4, exit_threshold })).json();
      expect(fixed.stats.mean_steps).toBeUndefined();
    }
    const spec = await gated.post("/generate/speculative", { prompt: PROMPT, max_tokens: 8, temperature: 0, verify_loops: 4, draft_loops: 1 });
    expect(spec.status).toBe(200);
    const info = (await (await gated.post("/api/v0/completions", { model: "m", prompt: "a", max_tokens: 1 })).json()).model_info;
    expect(info).toMatchObject({ n_layers: 2, exit_gate: true, exit_threshold: 0.6 });
  }, 60_000);

  test("a request that names no depth gets the model's, on every route; /v1/models says which", async () => {
    const [entry] = (await (await fetch(`${gated.url}/v1/models`)).json()).data;
    expect(entry).toMatchObject({ default_loops: GATED.loops, exit_threshold: GATED.exitThreshold });
    const plain = await (await gated.post("/generate", { prompt: PROMPT, max_tokens: 4, temperature: 0 })).json();
    expect(plain.stats.loops_used).toBe(GATED.loops);
    expect(typeof plain.stats.mean_steps).toBe("number");
    const spec = await (await gated.post("/generate/speculative", { prompt: PROMPT, max_tokens: 4, temperature: 0, draft_loops: 1 })).json();
    expect(spec.stats.loops_used).toBe(GATED.loops);
    const extended = await (await gated.post("/api/v0/completions", { model: "m", prompt: "a", max_tokens: 4, temperature: 0, mode: "speculative" })).json();
    expect(extended.stats.loops_used).toBe(GATED.loops);
  }, 60_000);
});

describe("the published layout's chat: the model's template, its end ids, its reasoning", () => {
  const chatPrompt = (user: string, opening = "") => `${FIXTURE_SYSTEM_TURN}<|im_start|>user\n${user}<|im_end|>\n<|im_start|>assistant\n${opening}`;
  const tokenizer = (thinking = false) => Tokenizer.fromSpec({ kind: "bpe", json: fixtureTokenizerJson(thinking) });

  test("a chat prompt is the model's template rendered, its default system turn included and counted; the reply continues exactly those ids", async () => {
    const ids = (await tokenizer()).encode(chatPrompt("Hi there"));
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused" });
    const chat = await client.chat.completions.create({ model: "ouro", messages: [{ role: "user", content: "Hi there" }], max_tokens: 12, temperature: 0 });
    expect(chat.usage?.prompt_tokens).toBe(ids.length);
    const gen = await (await server.post("/generate", { prompt: ids, max_tokens: 12, temperature: 0 })).json();
    expect(chat.choices[0].message.content).toBe(gen.text);
    expect(chat.usage?.completion_tokens).toBe(gen.tokens.length);
    expect(chat.choices[0].message).not.toHaveProperty("reasoning_content"); // the model does not reason
  }, 60_000);

  describe("a model whose greedy reply is <|im_end|>", () => {
    const steered = importedOuro("ouro-steered", { seed: 5, steerTo: FIXTURE_IDS.imEnd });
    const steeredServer = serverForTests({ modelPath: steered, env: { SERVICE_MAX_SEQ_LEN: "256" } });

    test("a text completion stops at <|im_end|>, an end id only generation_config.json names", async () => {
      expect(readSafetensors(steered).metadata.eos_token_ids).toBe("0,2");
      const prompt = (await tokenizer()).encode("In the beginning");
      // The model's first token, as the reference computes it without stopping, is <|im_end|> by a wide margin.
      const s = ReferenceModel.load(steered).session(STEPS);
      for (const t of prompt.slice(0, -1)) s.feed(t);
      const logits = s.feed(prompt[prompt.length - 1]);
      const [best, second] = [...logits].sort((a, b) => b - a);
      expect({ first: argmax(logits), margin: best - second > 1 }).toEqual({ first: FIXTURE_IDS.imEnd, margin: true });
      const client = new OpenAI({ baseURL: `${steeredServer.url}/v1`, apiKey: "unused" });
      const text = await client.completions.create({ model: "ouro", prompt: "In the beginning", max_tokens: 8, temperature: 0 });
      expect({ text: text.choices[0].text, finish: text.choices[0].finish_reason, tokens: text.usage?.completion_tokens }).toEqual({ text: "", finish: "stop", tokens: 0 });
      const chat = await client.chat.completions.create({ model: "ouro", messages: [{ role: "user", content: "Hi" }], max_tokens: 8, temperature: 0 });
      expect({ content: chat.choices[0].message.content, finish: chat.choices[0].finish_reason }).toEqual({ content: "", finish: "stop" });
    }, 60_000);
  });

  describe("the Thinking variant", () => {
    const thinking = importedOuro("ouro-thinking", { thinking: true, vocabSize: 272 });
    const thinkingServer = serverForTests({ modelPath: thinking, env: { SERVICE_MAX_SEQ_LEN: "256" } });
    type Delta = OpenAI.Chat.ChatCompletionChunk.Choice.Delta & { reasoning_content?: string };
    type Message = OpenAI.Chat.ChatCompletionMessage & { reasoning_content?: string | null };

    test("the template opens the reasoning: the reply comes back in reasoning_content apart from the answer, whole and streamed; include_reasoning false leaves it out", async () => {
      const tok = await tokenizer(true);
      const ids = tok.encode(chatPrompt("Count to three", "<think>\n"));
      const gen = await (await thinkingServer.post("/generate", { prompt: ids, max_tokens: 16, temperature: 0 })).json();
      // What the reply means, read from its ids: reasoning up to </think>, the answer after it.
      const close = gen.tokens.indexOf(FIXTURE_IDS.thinkEnd);
      const want = close < 0 ? { reasoning: gen.text, content: "" } : { reasoning: tok.decode(gen.tokens.slice(0, close)), content: tok.decode(gen.tokens.slice(close + 1)) };
      expect(want.reasoning).not.toBe("");

      const client = new OpenAI({ baseURL: `${thinkingServer.url}/v1`, apiKey: "unused" });
      const request = { model: "ouro", messages: [{ role: "user" as const, content: "Count to three" }], max_tokens: 16, temperature: 0 };
      const whole = await client.chat.completions.create(request);
      expect(whole.usage?.prompt_tokens).toBe(ids.length);
      const message = whole.choices[0].message as Message;
      expect({ reasoning: message.reasoning_content, content: message.content }).toEqual(want);

      const got = { reasoning: "", content: "" };
      for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
        const delta = (chunk.choices[0]?.delta ?? {}) as Delta;
        got.reasoning += delta.reasoning_content ?? "";
        got.content += delta.content ?? "";
      }
      expect(got).toEqual(want);

      const without = { ...request, include_reasoning: false };
      const answer = (await client.chat.completions.create(without)).choices[0].message as Message;
      expect(answer).not.toHaveProperty("reasoning_content");
      expect(answer.content).toBe(want.content);
    }, 60_000);
  });
});
