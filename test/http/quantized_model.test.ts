// The shipped trained model quantized by `model quantize` and served: it is
// tied, so its int6 head is its embedding too and the file is smaller than
// the fp16 source; the server loads it and decodes exactly the tokens the
// TypeScript reference computes from the same file (the embedding read from
// the head's rows), through the native and the OpenAI-shaped API.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { statSync } from "node:fs";
import { join } from "node:path";
import OpenAI from "openai";
import { GenerateResponse } from "../../src/wire/responses.ts";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import { TRAINED_MODEL_PATH } from "../../src/model/trained.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { jsonBody } from "../helpers/http.ts";
import { testTempDir } from "../helpers/models.ts";
import { serverForTests } from "../helpers/server.ts";
import { ReferenceModel } from "../reference/forward.ts";

// Quantizing the trained model takes 10-20 s on a busy machine.
setDefaultTimeout(120_000);

const QUANTIZED = join(testTempDir(), "kjv-looped-256-int4.safetensors");
const PROMPT = "The LORD is my shepherd;";
const LOOPS = 4;
let promptTokens: number[] = [];

const server = serverForTests(() => {
  quantizeModelFile(TRAINED_MODEL_PATH, QUANTIZED, { quant: "int4" });
  return { modelPath: QUANTIZED, env: { SERVICE_MAX_SEQ_LEN: "512" }, requireModel: true };
});

beforeAll(async () => {
  const tokenizer = await Tokenizer.load();
  promptTokens = tokenizer.encode(PROMPT);
  tokenizer.close();
});

describe("the trained model quantized to int4", () => {
  test("is smaller than its fp16 source: the head is the embedding too", () => {
    const config = ReferenceModel.load(QUANTIZED).config;
    expect(config).toMatchObject({ quant: "int4", headQuant: "int6", embeddingFromHead: true });
    expect(statSync(QUANTIZED).size).toBeLessThan(statSync(TRAINED_MODEL_PATH).size / 2);
  });

  test("greedy tokens from /generate and /v1/completions are the reference's", async () => {
    const want = ReferenceModel.load(QUANTIZED).greedy(promptTokens, 8, LOOPS);
    const native = await jsonBody(await server.post("/generate", { prompt: PROMPT, max_tokens: 8, temperature: 0, loops: LOOPS }), GenerateResponse);
    expect(native.tokens).toEqual(want);

    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused" });
    const r = await client.completions.create({ model: "kjv", prompt: PROMPT, max_tokens: 8, temperature: 0, loops: LOOPS } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(r.choices[0].text).toBe(native.text);
    expect(r.usage?.completion_tokens).toBe(8);
  });
});
