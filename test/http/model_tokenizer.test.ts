// Every endpoint speaks the model's own tokenizer when its file carries one
// (docs/tokenizers.md): prompts are its ids (ChatML for chat), its end ids
// stop generation, its bos id starts text prompts, replies decode through it.
// The in-process tests run the real app around a stand-in engine; the
// server tests run a real process on a model file carrying the tokenizer.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config.ts";
import type { GenerateRequest } from "../../src/engine/types.ts";
import { renderChat } from "../../src/http/chat_template.ts";
import { modelChat } from "../../src/text/chat.ts";
import { GPT2_CONVENTIONS, type TextConventions, Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { tinyModelPath } from "../helpers/models.ts";
import { scriptedEngine } from "../helpers/scripted_engine.ts";
import { inProcessApp, serverForTests, startServer } from "../helpers/server.ts";
import { bpeMetadata, fixtureJson, withMetadata } from "../helpers/tokenizer_json.ts";

const CHATML: TextConventions = { ...GPT2_CONVENTIONS, eosIds: [0, 2], chatFormat: "chatml" };
const REPLY = "Hi 🐙 there, 12 fish.";

async function app(conventions: TextConventions = CHATML) {
  const tok = await Tokenizer.fromSpec({ kind: "bpe", json: fixtureJson("smol_style") }, conventions);
  const seen: GenerateRequest[] = [];
  // The reply, then <|im_end|> (a stop id: not emitted).
  const script = [...tok.encode(REPLY), 2, ...tok.encode(" never sent")];
  return { tok, seen, ...(await inProcessApp(scriptedEngine(script, seen), loadConfig({}), tok)) };
}

const MESSAGES = [
  { role: "system", content: "Be brief." },
  { role: "user", content: "Say hi, 2 times." },
];

describe("in process, around a stand-in engine", () => {
  test("chat: the prompt is the ChatML rendering's ids with the real special ids; <|im_end|> ends the reply", async () => {
    const { tok, seen, post } = await app();
    const res = await post("/v1/chat/completions", { model: "m", messages: MESSAGES, max_tokens: 64 });
    expect(res.status).toBe(200);
    const body = await res.json();
    expect(body.choices[0].message.content).toBe(REPLY);
    expect(body.choices[0].finish_reason).toBe("stop");
    const prompt = seen[0].promptTokens;
    expect(prompt).toEqual(tok.encode(renderChat(MESSAGES as never, modelChat(tok))));
    expect(prompt[0]).toBe(1);
    expect(prompt.slice(-1 - tok.encode("assistant\n").length)).toEqual([1, ...tok.encode("assistant\n")]);
    expect(seen[0].stopTokenIds).toEqual(expect.arrayContaining([0, 2]));
    expect(body.usage.prompt_tokens).toBe(prompt.length);
  });

  test("streamed chat deltas join to the reply, every character whole", async () => {
    const { post } = await app();
    const res = await post("/v1/chat/completions", { model: "m", messages: MESSAGES, max_tokens: 64, stream: true });
    const deltas = (await res.text())
      .split("\n")
      .filter((l) => l.startsWith("data: {"))
      .map((l) => JSON.parse(l.slice(6)).choices[0]?.delta?.content ?? "");
    for (const d of deltas) expect(d).not.toContain("\uFFFD");
    expect(deltas.join("")).toBe(REPLY);
  });

  test("the model's bos id starts text prompts, not pre-tokenized ones", async () => {
    const { tok, seen, post } = await app({ ...CHATML, bosId: 0 });
    expect((await post("/generate", { prompt: "Hello there", max_tokens: 4 })).status).toBe(200);
    expect(seen[0].promptTokens).toEqual([0, ...tok.encode("Hello there")]);
    expect((await post("/generate", { prompt: [5, 6, 7], max_tokens: 4 })).status).toBe(200);
    expect(seen[1].promptTokens).toEqual([5, 6, 7]);
  });

  test("a long text prompt is encoded by the worker pool with the model's tokenizer", async () => {
    const { tok, seen, post } = await app();
    const prompt = "Numbers 12345 and ünïcödé 🐙 <|im_start|> text. ".repeat(50);
    expect(prompt.length).toBeGreaterThan(2048);
    const res = await post("/v1/completions", { model: "m", prompt, max_tokens: 4 });
    expect({ status: res.status, body: res.status === 200 ? "" : await res.text() }).toEqual({ status: 200, body: "" });
    expect(seen[0].promptTokens).toEqual(tok.encode(prompt));
    tok.close();
  });
});

describe("a model file whose tokenizer is refused", () => {
  // The fixture has 2000 ids; this model's vocabulary 1000.
  const server = serverForTests(() => ({ modelPath: withMetadata(tinyModelPath({ vocabSize: 1000 }), bpeMetadata(), "bpe-small-vocab.safetensors") }));

  test("is not loaded: /healthz says why", async () => {
    const res = await fetch(`${server.url}/healthz`);
    expect(res.status).toBe(503);
    expect(await res.text()).toContain("outside the model's vocabulary [0, 1000)");
  });
});

// Needs the format-version-2 validator (src/model/format.ts accepting tokenizer "bpe").
describe("a real server on a model file carrying its tokenizer", () => {
  test("chat completions: prompt tokens are the ChatML ids; replies decode through the model's tokenizer", async () => {
    const path = withMetadata(tinyModelPath(), bpeMetadata(), "bpe-model.safetensors");
    const s = await startServer({ modelPath: path, requireModel: true });
    try {
      const tok = await Tokenizer.fromSpec({ kind: "bpe", json: fixtureJson("smol_style") }, CHATML);
      const res = await s.post("/v1/chat/completions", { model: "m", messages: MESSAGES, max_tokens: 8 });
      expect(res.status).toBe(200);
      const body = await res.json();
      expect(body.usage.prompt_tokens).toBe(tok.encode(renderChat(MESSAGES as never, modelChat(tok))).length);
      const gen = await (await s.post("/generate", { prompt: "Hello", max_tokens: 8 })).json();
      expect(gen.text).toBe(tok.decode(gen.tokens));
      for (const id of gen.tokens) expect([0, 2]).not.toContain(id);
    } finally {
      await s.stop();
    }
  });
});
