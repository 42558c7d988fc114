// The published looped families served end to end: a Huginn-0125-layout and
// a Nanbeige4.2-layout random checkpoint (config.json, bf16 shards, their
// tokenizer files and chat templates) imported with `model import-hf` and
// served by real server processes. Greedy tokens equal the float64
// reference's on the imported file at every tested depth, with Huginn's
// zero-shot exits (KL, entropy; both cache policies) and the steps each
// token ran; the bounded cache (cache_steps) equals the kernels running
// alone; the official `openai` client chats through each model's template
// (Nanbeige's through its SentencePiece-style tokenizer, the prompt's ids
// those the library gives) and completes text; model_info names the family; misuse is a 400 naming
// the field. (test/torch/families.test.ts holds the same imports to the
// families' published code.)
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import OpenAI from "openai";
import { type ExitPlan, GREEDY } from "../../src/engine/types.ts";
import { tokenLogprob } from "../../src/engine/logprobs.ts";
import { importHfCheckpoint } from "../../src/model/import_hf.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { type HfFixtureOptions, tokenIdsOf, writeHfFixture } from "../helpers/hf_fixture.ts";
import { withModel } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";
import { serverForTests, type TestServer } from "../helpers/server.ts";
import { argmax, ReferenceModel } from "../reference/forward.ts";

const PROMPT = [300, 17, 42, 99, 250, 7, 13];
const MAX_TOKENS = 12;

/** Huginn-0125's structure at a small width: 2 prelude, 4 core, 2 coda layers; 8 steps by default here (32 as published). */
const HUGINN: HfFixtureOptions = { arch: "huginn", dim: 64, nHeads: 4, ffnDim: 128, vocabSize: 512, nLayers: 4, nPrelude: 2, nCoda: 2, totalUtSteps: 8, seed: 21, shards: 2 };
/** Nanbeige4.2's: GQA, head_dim wider than dim / heads, 3 layers run twice by default. */
const NANBEIGE: HfFixtureOptions = { arch: "nanbeige", dim: 64, nHeads: 4, nKvHeads: 2, headDim: 32, ffnDim: 128, vocabSize: 512, nLayers: 3, totalUtSteps: 2, seed: 21, shards: 2 };

function imported(name: string, o: HfFixtureOptions): string {
  const dir = join(testTempDir(), `${name}-hf`);
  writeHfFixture(dir, o);
  const out = join(testTempDir(), `${name}-imported.safetensors`);
  importHfCheckpoint(dir, out);
  return out;
}

/** The reference's greedy tokens (and steps) after `prompt`, the first at full depth, the rest exiting by `exit`; stopping at an end id as the server does. */
function referenceGreedy(path: string, ends: number[], loops: number, exit?: ExitPlan) {
  const s = ReferenceModel.load(path).session(loops);
  for (const t of PROMPT.slice(0, -1)) s.feed(t);
  let logits = s.feed(PROMPT[PROMPT.length - 1]);
  const out = { tokens: [] as number[], steps: [] as number[] };
  while (out.tokens.length < MAX_TOKENS) {
    const t = argmax(logits);
    if (ends.includes(t)) break;
    out.tokens.push(t);
    out.steps.push(s.lastSteps);
    logits = s.feed(t, exit);
  }
  return out;
}

/**
 * A chat through the official client is the model's own template rendered (`rendered`, as transformers'
 * apply_chat_template writes it for one user turn), counted as the prompt, and the reply is what /generate
 * continues from exactly those ids.
 */
async function expectChatThroughTemplate(server: TestServer, path: string, model: string, rendered: string): Promise<void> {
  const tokenizer = await Tokenizer.fromSpec({ kind: "bpe", json: readSafetensors(path).metadata.tokenizer_json });
  const ids = tokenizer.encode(rendered);
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused" });
  const chat = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi there" }], max_tokens: 8, temperature: 0 });
  expect(chat.choices[0].message.role).toBe("assistant");
  expect(chat.usage?.prompt_tokens).toBe(ids.length);
  const gen = await (await server.post("/generate", { prompt: ids, max_tokens: 8, temperature: 0 })).json();
  expect(chat.choices[0].message.content).toBe(gen.text);
  expect(chat.usage?.completion_tokens).toBe(gen.tokens.length);
}

const HUGINN_PATH = imported("huginn", HUGINN);
const NANBEIGE_PATH = imported("nanbeige", NANBEIGE);
// the ends the import wrote: <|end_text|>, <|begin_text|>, <|end_turn|> (vocab - 31, - 32, - 28); Nanbeige's <|im_end|>
const HUGINN_ENDS = [481, 480, 484];
const NANBEIGE_ENDS = [512 - 43];

describe("an imported Huginn-0125-layout checkpoint, served", () => {
  const server = serverForTests({ modelPath: HUGINN_PATH, env: { SERVICE_MAX_SEQ_LEN: "256" } });

  test("/generate: greedy tokens equal the reference's at steps 1, 4 and 8, and with the zero-shot exits (steps reported)", async () => {
    for (const loops of [1, 4, 8]) {
      const body = await (await server.post("/generate", { prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 0, loops })).json();
      const want = referenceGreedy(HUGINN_PATH, HUGINN_ENDS, loops).tokens;
      expect(want.length).toBe(MAX_TOKENS); // no end id cut the comparison short
      expect(body.tokens, `loops ${loops}`).toEqual(want);
    }
    let exited = false;
    for (const policy of ["exact", "copy"] as const) {
      for (const [rule, threshold] of [["kl", 0.01], ["entropy", 0.01]] as const) {
        const res = await server.post("/generate", { prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 0, exit_rule: rule, exit_threshold: threshold, exit_policy: policy });
        expect(res.status).toBe(200);
        const body = await res.json();
        const want = referenceGreedy(HUGINN_PATH, HUGINN_ENDS, 8, { rule, threshold, policy });
        expect(body.tokens, `${rule} < ${threshold}, ${policy}`).toEqual(want.tokens);
        expect(body.stats.mean_steps).toBeCloseTo(want.steps.reduce((a, b) => a + b, 0) / want.steps.length, 9);
        exited ||= want.steps.some((s) => s < 8);
      }
    }
    expect(exited).toBe(true);
  }, 60_000);

  test("cache_steps: the tokens and log-probabilities of the kernels alone with the same shared steps, fixed depth and with copy-policy exits", async () => {
    /** The kernels alone: greedy tokens and each one's log-probability, with `cacheSteps` shared steps. */
    const alone = (cacheSteps: number, exit?: ExitPlan) =>
      withModel(HUGINN_PATH, 1, "auto", (m) => {
        const s = m.newSession(PROMPT.length + MAX_TOKENS, 8, 0, { mode: "fp16", cacheSteps });
        const out = { tokens: [] as number[], logprobs: [] as number[] };
        const logits = new Float32Array(m.info.vocabSize);
        let feed = Int32Array.from(PROMPT);
        while (out.tokens.length < MAX_TOKENS) {
          const t = s.step(feed, 8, GREEDY, logits, out.tokens.length === 0 ? undefined : exit);
          if (HUGINN_ENDS.includes(t)) break;
          out.tokens.push(t);
          out.logprobs.push(tokenLogprob(logits, t, 0).logprob);
          feed = Int32Array.of(t);
        }
        s.close();
        return out;
      });
    for (const exit of [undefined, { rule: "kl", threshold: 0.01, policy: "copy" } as const]) {
      const res = await server.post("/generate", {
        prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 0, cache_steps: 2, logprobs: 0,
        ...(exit ? { exit_rule: exit.rule, exit_threshold: exit.threshold, exit_policy: exit.policy } : {}),
      });
      expect(res.status).toBe(200);
      const body = await res.json();
      const want = alone(2, exit);
      expect(body.tokens).toEqual(want.tokens);
      const got: number[] = body.logprobs.map((l: { logprob: number }) => l.logprob);
      got.forEach((l, i) => expect(l).toBeCloseTo(want.logprobs[i], 6));
      // and not what every step's own cache gives (the shared steps were used)
      const unshared = alone(0, exit);
      expect(Math.max(...got.map((l, i) => Math.abs(l - unshared.logprobs[i])))).toBeGreaterThan(1e-4);
    }
  }, 60_000);

  test("the official openai client: chat through the model's own template (its headers and <|end_turn|>), text completions; model_info names the family", async () => {
    await expectChatThroughTemplate(server, HUGINN_PATH, "huginn", "<|begin_text|><|begin_header|>user<|end_header|>\n\nHi there<|end_turn|><|begin_header|>Huginn<|end_header|>\n\n");
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused" });
    const text = await client.completions.create({ model: "huginn", prompt: "In the beginning", max_tokens: 6, temperature: 0 });
    expect(["stop", "length"]).toContain(text.choices[0].finish_reason);
    const info = (await (await server.post("/api/v0/completions", { model: "huginn", prompt: "a", max_tokens: 1 })).json()).model_info;
    expect(info).toMatchObject({ family: "huginn", n_layers: 4, exit_gate: false, exit_threshold: null, default_loops: 8 });
  }, 60_000);

  test("misuse is a 400 naming the field", async () => {
    const cases: [Record<string, unknown>, string, RegExp][] = [
      [{ exit_threshold: 0.5 }, "exit_threshold", /has none .*"kl" or "entropy"/],
      [{ exit_rule: "kl" }, "exit_threshold", /needs an `exit_threshold`/],
      [{ exit_rule: "cosine", exit_threshold: 0.1 }, "exit_rule", /./],
      [{ cache_steps: 8 }, "cache_steps", /less than the steps run \(8\)/],
      [{ cache_steps: 2, exit_rule: "kl", exit_threshold: 0.1 }, "cache_steps", /exact exit policy/],
      [{ cache_steps: 2, cache_window: 4 }, "cache_steps", /cache_window/],
      [{ exit_rule: "entropy", exit_threshold: 0.1, cache_window: 4 }, "cache_window", /exact exit policy/],
    ];
    for (const [fields, param, message] of cases) {
      const res = await server.post("/generate", { prompt: PROMPT, max_tokens: 2, ...fields });
      expect(res.status, JSON.stringify(fields)).toBe(400);
      const error = (await res.json()).error;
      expect(error.param).toBe(param);
      expect(error.message).toMatch(message);
    }
    const spec = await server.post("/generate/speculative", { prompt: PROMPT, max_tokens: 2, verify_loops: 4, draft_loops: 1, cache_steps: 2 });
    expect(spec.status).toBe(400);
    expect((await spec.json()).error.param).toBe("cache_steps");
  }, 60_000);
});

describe("an imported Nanbeige4.2-layout checkpoint, served", () => {
  const server = serverForTests({ modelPath: NANBEIGE_PATH, env: { SERVICE_MAX_SEQ_LEN: "256" } });

  test("/generate: greedy tokens equal the reference's at steps 1, 2 (its num_loops, the default) and 3", async () => {
    for (const loops of [1, 2, 3, undefined]) {
      const body = await (await server.post("/generate", { prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 0, loops })).json();
      const want = referenceGreedy(NANBEIGE_PATH, NANBEIGE_ENDS, loops ?? 2).tokens;
      expect(want.length).toBe(MAX_TOKENS);
      expect(body.tokens, `loops ${loops}`).toEqual(want);
    }
  }, 60_000);

  test("the official openai client: chat through its own ChatML template, text completions; model_info names the family", async () => {
    const rendered = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n";
    // its SentencePiece-style tokenizer, as the library encodes the template's text: no ▁ after an added token (prepend_scheme "first"), "\n" a byte token
    const json = readSafetensors(NANBEIGE_PATH).metadata.tokenizer_json;
    const chat = ["<|im_start|>", "u", "s", "er", "<0x0A>", "H", "i", "▁there", "<|im_end|>", "<0x0A>", "<|im_start|>", "a", "s", "s", "i", "s", "t", "an", "t", "<0x0A>"];
    expect((await Tokenizer.fromSpec({ kind: "bpe", json })).encode(rendered)).toEqual(tokenIdsOf(json, chat));
    await expectChatThroughTemplate(server, NANBEIGE_PATH, "nanbeige", rendered);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused" });
    const text = await client.completions.create({ model: "nanbeige", prompt: "In the beginning", max_tokens: 6, temperature: 0 });
    expect(["stop", "length"]).toContain(text.choices[0].finish_reason);
    const info = (await (await server.post("/api/v0/completions", { model: "nanbeige", prompt: "a", max_tokens: 1 })).json()).model_info;
    expect(info).toMatchObject({ family: "nanbeige", n_layers: 3, exit_gate: false, default_loops: 2 });
  }, 60_000);
});
