// The shipped trained model (models/kjv-looped-256.safetensors) served for
// real: greedy continuations of Bible-style prompts are English in the
// King James Bible's words, through the native API and the OpenAI-shaped
// one, at the default depth and at a shallow one (judged against the
// training text's words, so these need the KJV text); and self-speculative
// decoding on it gives exactly the plain output.
import { beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ChatCompletion, GenerateResponse, SpeculativeResponse } from "../../src/wire/responses.ts";
import { TRAINED_MODEL_PATH } from "../../src/model/trained.ts";
import { jsonBody } from "../helpers/http.ts";
import { testTempDir } from "../helpers/models.ts";
import { serverForTests } from "../helpers/server.ts";
import { KJV_TEXT, skipReason } from "../helpers/system_packages.ts";
import { runTorchModule } from "../helpers/torch.ts";

const PROMPTS = ["And God said unto Moses,", "The LORD is my shepherd;", "And it came to pass, when the king"];

/** Lower-case words of a text. */
const words = (text: string) => text.toLowerCase().match(/[a-z]+/g) ?? [];

const server = serverForTests({ modelPath: TRAINED_MODEL_PATH, env: { SERVICE_MAX_SEQ_LEN: "512" } });
let vocabulary: Set<string>;

async function generate(body: Record<string, unknown>, path = "/generate"): Promise<{ text: string; tokens: number[] }> {
  const schema = path === "/generate" ? GenerateResponse : SpeculativeResponse;
  const { text, tokens } = await jsonBody(await server.post(path, { max_tokens: 32, temperature: 0, ...body }), schema);
  return { text, tokens };
}

/** Share of the words of `text` that the training text uses. */
function knownShare(text: string): number {
  const w = words(text);
  expect(w.length).toBeGreaterThanOrEqual(10);
  return w.filter((x) => vocabulary.has(x)).length / w.length;
}

describe.skipIf(skipReason(KJV_TEXT) !== null)("the trained demo model writes the training text's vocabulary", () => {
  beforeAll(() => {
    const dir = join(testTempDir(), "kjv-words");
    runTorchModule("data", [dir]);
    vocabulary = new Set(words(readFileSync(join(dir, "train.txt"), "utf8")));
  });

  test("greedy continuations at the default depth use the words of the training text", async () => {
    for (const prompt of PROMPTS) {
      const { text } = await generate({ prompt });
      console.log(`${prompt} →${text}`);
      expect(knownShare(text)).toBeGreaterThanOrEqual(0.95);
    }
  });

  test("a shallow depth (loops 2) still writes English", async () => {
    const { text } = await generate({ prompt: PROMPTS[0], loops: 2 });
    expect(knownShare(text)).toBeGreaterThanOrEqual(0.9);
  });

  test("chat completions answer in English", async () => {
    const r = await server.post("/v1/chat/completions", {
      model: "kjv",
      messages: [{ role: "user", content: "Who made the heaven and the earth?" }],
      max_tokens: 32,
      temperature: 0,
    });
    const j = await jsonBody(r, ChatCompletion);
    expect(knownShare(j.choices[0].message.content)).toBeGreaterThanOrEqual(0.9);
  });
});

describe("the trained demo model", () => {
  test("self-speculative greedy decoding gives the plain output token for token", async () => {
    const plain = await generate({ prompt: PROMPTS[1], loops: 8, max_tokens: 48 });
    for (const draft_loops of [1, 2, 4]) {
      const spec = await generate({ prompt: PROMPTS[1], draft_loops, verify_loops: 8, max_tokens: 48 }, "/generate/speculative");
      expect(spec.tokens).toEqual(plain.tokens);
    }
  });
});
