// The official `openai` npm client, unchanged, pointed at {base}/v1 of a real
// server: every call it
// makes succeeds, its streams parse, and a greedy stream says exactly what
// the same greedy non-streamed request says.
import { beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { TINY } from "../helpers/models.ts";
import { serverForTests } from "../helpers/server.ts";

const MODEL = "loopserve-tiny";
const PROMPT = "The looped transformer said";
const MESSAGES: OpenAI.Chat.ChatCompletionMessageParam[] = [
  { role: "system", content: "You are terse." },
  { role: "user", content: PROMPT },
];
const RENDERED = `System: You are terse.\nUser: ${PROMPT}\nAssistant:`;

const server = serverForTests({ env: { SERVICE_MAX_SEQ_LEN: "512" } });
let client: OpenAI;
let tok: Tokenizer;

beforeAll(async () => {
  tok = await Tokenizer.load();
  // Any API key: the service ignores it without SERVICE_API_KEY. No retries, so a failure shows at once.
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "sk-not-checked", maxRetries: 0 });
});

describe("the openai client against /v1", () => {
  test("models.list and models.retrieve", async () => {
    const models = [];
    for await (const m of client.models.list()) models.push(m);
    expect(models).toHaveLength(1);
    expect(models[0].object).toBe("model");
    expect(models[0].id).toEndWith(".safetensors");
    expect(models[0].owned_by).toBe("loopserve");
    const one = await client.models.retrieve(models[0].id);
    expect(one).toMatchObject({ id: models[0].id, object: "model", created: models[0].created, owned_by: "loopserve" });
    // The extra fields come through the client untouched: the request limit and the default depth.
    const extra = models[0] as OpenAI.Models.Model & { max_model_len: number; default_loops: number };
    expect(extra.max_model_len).toBe(512);
    expect(extra.default_loops).toBe(TINY.loops);
    expect(one).toMatchObject({ max_model_len: 512, default_loops: TINY.loops });
  });

  test("chat.completions.create, plain", async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: MESSAGES, max_tokens: 16, temperature: 0 });
    expect(r.id).toMatch(/^chatcmpl-[0-9a-f]+$/);
    expect(r.object).toBe("chat.completion");
    expect(r.model).toBe(MODEL);
    expect(r.choices).toHaveLength(1);
    expect(r.choices[0].message.role).toBe("assistant");
    expect(typeof r.choices[0].message.content).toBe("string");
    expect(r.choices[0].finish_reason).toBe("length");
    expect(r.usage).toEqual({ prompt_tokens: tok.encode(RENDERED).length, completion_tokens: 16, total_tokens: tok.encode(RENDERED).length + 16 });
  });

  test("chat.completions.create, streaming: the iterated deltas equal the plain content", async () => {
    const req = { model: MODEL, messages: MESSAGES, max_tokens: 24, temperature: 0 };
    const plain = await client.chat.completions.create(req);
    const stream = await client.chat.completions.create({ ...req, stream: true });
    let content = "";
    const roles: string[] = [];
    const finishes: (string | null)[] = [];
    let id: string | null = null;
    for await (const chunk of stream) {
      expect(chunk.object).toBe("chat.completion.chunk");
      expect(chunk.model).toBe(MODEL);
      id ??= chunk.id;
      expect(chunk.id).toBe(id);
      const choice = chunk.choices[0];
      if (choice.delta.role) roles.push(choice.delta.role);
      content += choice.delta.content ?? "";
      finishes.push(choice.finish_reason);
    }
    expect(roles).toEqual(["assistant"]);
    expect(content).toBe(plain.choices[0].message.content as string);
    expect(finishes.at(-1)).toBe(plain.choices[0].finish_reason);
    expect(finishes.slice(0, -1).every((f) => f === null)).toBe(true);
  });

  test("chat.completions.stream helper: the accumulated completion equals the plain one", async () => {
    const req = { model: MODEL, messages: MESSAGES, max_tokens: 12, temperature: 0 };
    const plain = await client.chat.completions.create(req);
    const final = await client.chat.completions.stream(req).finalChatCompletion();
    expect(final.choices[0].message.content).toBe(plain.choices[0].message.content);
    expect(final.choices[0].finish_reason).toBe(plain.choices[0].finish_reason);
  });

  test("stream_options.include_usage: the last chunk carries the usage, with no choices", async () => {
    const req = { model: MODEL, messages: MESSAGES, max_tokens: 8, temperature: 0 };
    const plain = await client.chat.completions.create(req);
    const chunks = [];
    for await (const c of await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } })) chunks.push(c);
    const last = chunks.at(-1);
    expect(last?.choices).toEqual([]);
    expect(last?.usage).toEqual(plain.usage);
  });

  test("completions.create, plain and streaming, agree", async () => {
    const req = { model: MODEL, prompt: PROMPT, max_tokens: 20, temperature: 0 };
    const plain = await client.completions.create(req);
    expect(plain.id).toMatch(/^cmpl-[0-9a-f]+$/);
    expect(plain.object).toBe("text_completion");
    expect(plain.choices[0].index).toBe(0);
    expect(plain.usage?.prompt_tokens).toBe(tok.encode(PROMPT).length);
    let text = "";
    let finish: string | null = null;
    for await (const chunk of await client.completions.create({ ...req, stream: true })) {
      expect(chunk.object).toBe("text_completion");
      text += chunk.choices[0].text;
      finish = chunk.choices[0].finish_reason;
    }
    expect(text).toBe(plain.choices[0].text);
    expect(finish).toBe(plain.choices[0].finish_reason);
  });

  test("sampled requests with a seed agree between plain and streaming", async () => {
    const req = { model: MODEL, messages: MESSAGES, max_tokens: 20, temperature: 1.1, top_p: 0.9, seed: 1234 };
    const plain = await client.chat.completions.create(req);
    let content = "";
    for await (const c of await client.chat.completions.create({ ...req, stream: true })) content += c.choices[0]?.delta.content ?? "";
    expect(content).toBe(plain.choices[0].message.content as string);
  });

  test("newer request fields: max_completion_tokens, stop, penalties, user, text content parts", async () => {
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: [
        { role: "system", content: [{ type: "text", text: "You are terse." }] },
        { role: "user", content: [{ type: "text", text: PROMPT }] },
      ],
      max_completion_tokens: 5,
      stop: ["\u0001never"],
      presence_penalty: 0.5,
      frequency_penalty: 0.5,
      user: "someone",
      tool_choice: "none",
      response_format: { type: "text" },
    });
    expect(r.usage?.completion_tokens).toBe(5);
    // Text parts read exactly as the same texts given as strings.
    expect(r.usage?.prompt_tokens).toBe(tok.encode(RENDERED).length);
  });

  test("an image part and a schema the engine cannot honour are refused as typed errors naming the parameter", async () => {
    const image = await client.chat.completions
      .create({ model: MODEL, messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "data:," } }] }] })
      .catch((e) => e);
    expect(image).toBeInstanceOf(OpenAI.BadRequestError);
    expect(image.param).toBe("messages[0].content[0].type");
    expect(image.message).toContain("image_url");
    const schema = { type: "object", properties: { when: { type: "string", format: "date-time" } } };
    const json = await client.chat.completions
      .create({ model: MODEL, messages: MESSAGES, response_format: { type: "json_schema", json_schema: { name: "x", schema } } })
      .catch((e) => e);
    expect(json).toBeInstanceOf(OpenAI.BadRequestError);
    expect(json.param).toBe("response_format.json_schema.schema");
    expect(json.message).toContain("date-time");
    const both = await client.chat.completions.create({ model: MODEL, messages: MESSAGES, max_tokens: 3, max_completion_tokens: 4 }).catch((e) => e);
    expect(both).toBeInstanceOf(OpenAI.BadRequestError);
    expect(both.param).toBe("max_completion_tokens");
  });

  test("a refused request surfaces as the client's typed error with param and code", async () => {
    const err = await client.chat.completions.create({ model: MODEL, messages: MESSAGES, n: 2 }).catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.status).toBe(400);
    expect(err.param).toBe("n");
    const lp = await client.chat.completions.create({ model: MODEL, messages: MESSAGES, top_logprobs: 2 }).catch((e) => e);
    expect(lp).toBeInstanceOf(OpenAI.BadRequestError);
    expect(lp.param).toBe("top_logprobs");
    expect(lp.message).toContain("logprobs");
    const missing = await client.chat.completions
      .create({ model: MODEL } as unknown as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming)
      .catch((e) => e);
    expect(missing).toBeInstanceOf(OpenAI.UnprocessableEntityError);
    expect(missing.param).toBe("messages");
  });
});

describe("the openai client against /api/v0", () => {
  test("the extended family is a superset: the client works and the sections come along", async () => {
    const v0 = new OpenAI({ baseURL: `${server.url}/api/v0`, apiKey: "ignored", maxRetries: 0 });
    const r = (await v0.chat.completions.create({
      model: MODEL,
      messages: MESSAGES,
      max_tokens: 4,
      temperature: 0,
      // Extended knobs pass through the client as extra body fields.
      ...({ loops: 2, priority: 3 } as object),
    })) as OpenAI.Chat.ChatCompletion & { stats: { loops_used: number; mode: string } };
    expect(r.choices[0].message.role).toBe("assistant");
    expect(r.stats).toMatchObject({ mode: "generate", loops_used: 2, completion_tokens: 4 });
    let content = "";
    for await (const c of await v0.chat.completions.create({ model: MODEL, messages: MESSAGES, max_tokens: 4, temperature: 0, stream: true, ...({ loops: 2 } as object) }))
      content += c.choices[0]?.delta.content ?? "";
    expect(content).toBe(r.choices[0].message.content as string);
  });
});
