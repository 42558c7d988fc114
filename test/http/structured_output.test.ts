// Structured output against a real server (docs/structured-output.md): the
// openai client's chat.completions.parse with a Zod schema; json_object;
// an EBNF grammar on the native and extended routes; honest ends (a
// complete value ends with "stop" and no trailing text, a cut one says
// "length"); the masked distribution in logprobs; exactness: the same
// outputs whatever shares the batch, pipelined or not, and greedy
// speculative decoding (chain and tree) equal to plain; and bad input: a
// 400 naming the error and its place, a pathological schema refused in
// bounded time while the server keeps serving.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { formatModelPath } from "../helpers/format_model.ts";
import { startServer, type TestServer } from "../helpers/server.ts";

const Person = z.object({
  name: z.string(),
  age: z.number().int().min(0).max(150),
  email: z.string().nullable(),
  tags: z.array(z.string()).max(3),
  role: z.enum(["admin", "user", "guest"]),
});

const PERSON_SCHEMA = {
  type: "object",
  properties: { name: { type: "string" }, age: { type: "integer", minimum: 0, maximum: 150 }, tags: { type: "array", items: { type: "string" }, maxItems: 3 } },
  required: ["name", "age", "tags"],
  additionalProperties: false,
};
const personFormat = { type: "json_schema", json_schema: { name: "person", schema: PERSON_SCHEMA, strict: true } };

interface Native {
  tokens: number[];
  text: string;
  finish_reason: string;
  logprobs?: { token: string; logprob: number; top_logprobs: { token: string; logprob: number }[] }[];
  error?: { message: string; param: string; code: string };
}

let server: TestServer;
let pipelined: TestServer;
let client: OpenAI;

beforeAll(async () => {
  const modelPath = await formatModelPath();
  [server, pipelined] = await Promise.all([
    startServer({ modelPath, env: { SERVICE_FORMAT_COMPILE_MS: "1500" } }),
    startServer({ modelPath, env: { SERVICE_PIPELINE_STEPS: "1" } }),
  ]);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "sk-not-checked", maxRetries: 0 });
}, 60_000);
afterAll(() => Promise.all([server?.stop(), pipelined?.stop()]));

async function post(s: TestServer, path: string, body: object): Promise<{ status: number; body: Native }> {
  const res = await fetch(`${s.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Native };
}

describe("the openai client's structured outputs", () => {
  test("chat.completions.parse with a Zod schema returns a parsed object that satisfies it", async () => {
    for (const temperature of [0, 1]) {
      const r = await client.chat.completions.parse({
        model: "tiny",
        messages: [{ role: "user", content: "Describe a person." }],
        response_format: zodResponseFormat(Person, "person"),
        temperature,
        seed: 5,
        max_tokens: 400,
      });
      const choice = r.choices[0];
      expect(choice.finish_reason).toBe("stop");
      expect(choice.message.parsed).not.toBeNull();
      expect(Person.parse(choice.message.parsed)).toEqual(choice.message.parsed as z.infer<typeof Person>);
      expect(JSON.parse(choice.message.content as string)).toEqual(choice.message.parsed);
    }
  });

  test("json_object gives a JSON object", async () => {
    const r = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "JSON please" }], response_format: { type: "json_object" }, temperature: 1, seed: 3, max_tokens: 400 });
    expect(r.choices[0].finish_reason).toBe("stop");
    const value = JSON.parse(r.choices[0].message.content as string);
    expect(typeof value === "object" && value !== null && !Array.isArray(value)).toBe(true);
  });

  test("text completions take response_format too, streamed or not, with the same text", async () => {
    const whole = await client.completions.create({ model: "tiny", prompt: "Data:", max_tokens: 300, temperature: 0, response_format: personFormat } as OpenAI.CompletionCreateParamsNonStreaming);
    let streamed = "";
    const stream = await client.completions.create({ model: "tiny", prompt: "Data:", max_tokens: 300, temperature: 0, stream: true, response_format: personFormat } as OpenAI.CompletionCreateParamsStreaming);
    for await (const chunk of stream) streamed += chunk.choices[0]?.text ?? "";
    expect(whole.choices[0].finish_reason).toBe("stop");
    expect(streamed).toBe(whole.choices[0].text);
    expect(Object.keys(JSON.parse(streamed))).toEqual(["name", "age", "tags"]);
  });
});

describe("honest ends", () => {
  test("a complete value ends the generation: stop, no end token, no trailing text", async () => {
    const { body } = await post(server, "/generate", { prompt: "x", max_tokens: 300, response_format: personFormat });
    expect(body.finish_reason).toBe("stop");
    expect(body.text).toBe(body.text.trim());
    expect(() => JSON.parse(body.text)).not.toThrow();
    expect(body.tokens).not.toContain(50256);
  });

  test("a value cut by max_tokens says length", async () => {
    const { body } = await post(server, "/generate", { prompt: "x", max_tokens: 3, response_format: personFormat });
    expect(body.finish_reason).toBe("length");
    expect(body.tokens).toHaveLength(3);
    expect(() => JSON.parse(body.text)).toThrow();
  });

  test("an EBNF grammar on /generate and on /api/v0: the output is one of its sentences", async () => {
    const grammar = 'root ::= "yes" | "no" | "maybe, " ("sometimes" | "never")';
    for (const temperature of [0, 1]) {
      const { body } = await post(server, "/generate", { prompt: "x", grammar, temperature, sample_seed: 4, max_tokens: 20 });
      expect(body.finish_reason).toBe("stop");
      expect(["yes", "no", "maybe, sometimes", "maybe, never"]).toContain(body.text);
    }
    const res = await fetch(`${server.url}/api/v0/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", prompt: "x", grammar, max_tokens: 20, temperature: 0 }),
    });
    const ext = (await res.json()) as { choices: { text: string; finish_reason: string }[] };
    expect(["yes", "no", "maybe, sometimes", "maybe, never"]).toContain(ext.choices[0].text);
  });

  test("logprobs report the masked distribution: the alternatives are tokens the format allows, holding its mass", async () => {
    const grammar = 'root ::= ("a" | "b" | "c")+ "."';
    const { body } = await post(server, "/generate", { prompt: "x", grammar, max_tokens: 12, temperature: 1, sample_seed: 9, logprobs: 5 });
    expect(body.logprobs?.length).toBeGreaterThan(0);
    for (const entry of body.logprobs ?? []) {
      for (const t of entry.top_logprobs) expect(t.token).toMatch(/^[abc]*\.?$/);
      // Unmasked, this model gives letters a tiny share (it favours JSON's punctuation); masked, they hold it all.
      expect(Math.exp(entry.top_logprobs[0].logprob)).toBeGreaterThan(0.05);
      expect(entry.top_logprobs.reduce((a, t) => a + Math.exp(t.logprob), 0)).toBeLessThanOrEqual(1 + 1e-9);
    }
  });
});

describe("exactness", () => {
  const requests = [0, 1, 2, 3, 4, 5].map((i) => ({ prompt: `Item ${i}:`, max_tokens: 200, temperature: i % 2, sample_seed: i, response_format: personFormat }));

  test("concurrent requests, pipelined or not, give each what it gets alone", async () => {
    const alone: string[] = [];
    for (const r of requests) alone.push((await post(server, "/generate", r)).body.text);
    const together = await Promise.all(requests.map((r) => post(server, "/generate", r)));
    const piped = await Promise.all(requests.map((r) => post(pipelined, "/generate", r)));
    expect(together.map((r) => r.body.text)).toEqual(alone);
    expect(piped.map((r) => r.body.text)).toEqual(alone);
    for (const text of alone) expect(() => JSON.parse(text)).not.toThrow();
  });

  test("greedy speculative decoding, chain and tree, gives plain decoding's output", async () => {
    const base = { prompt: "Describe:", max_tokens: 200, response_format: personFormat };
    const plain = await post(server, "/generate", { ...base, loops: 2 });
    const chain = await post(server, "/generate/speculative", { ...base, draft_loops: 1, verify_loops: 2, draft_ahead: 4 });
    const tree = await post(server, "/generate/tree_speculative", { ...base, draft_loops: 1, verify_loops: 2, draft_ahead: 4, K_branches: 3 });
    expect(plain.body.finish_reason).toBe("stop");
    expect(chain.body.tokens).toEqual(plain.body.tokens);
    expect(tree.body.tokens).toEqual(plain.body.tokens);
    expect(chain.body.finish_reason).toBe("stop");
  });

  test("sampled speculative decoding stays inside the format", async () => {
    for (const seed of [1, 2, 3]) {
      const { body } = await post(server, "/generate/speculative", { prompt: "x", max_tokens: 300, temperature: 1, sample_seed: seed, draft_loops: 1, verify_loops: 2, response_format: personFormat });
      expect(body.finish_reason).toBe("stop");
      expect(Object.keys(JSON.parse(body.text))).toEqual(["name", "age", "tags"]);
    }
  });
});

describe("bad input", () => {
  test.each([
    ["an unsupported keyword, with its place", { type: "object", properties: { a: { type: "array", items: { type: "string" }, uniqueItems: true } } }, /"uniqueItems".*#\/properties\/a\/uniqueItems/],
    ["a pattern the engine cannot write", { type: "string", pattern: "^a.c$" }, /pattern/],
    ["a reference to nothing", { $ref: "#/$defs/missing" }, /points to nothing/],
    ["a schema that is no object", [1, 2], /must be a JSON object/],
    ["a regular expression the engine cannot read", { type: "string", pattern: "(?<=a)b" }, /Lookbehind/],
  ])("%s is a 400 naming it", async (_, schema, message) => {
    const { status, body } = await post(server, "/generate", { prompt: "x", response_format: { type: "json_schema", json_schema: { name: "x", schema } } });
    expect(status).toBe(400);
    expect(body.error?.param).toBe("response_format.json_schema.schema");
    expect(body.error?.code).toBe("invalid_response_format");
    expect(body.error?.message).toMatch(message);
  });

  test("a grammar with an error is a 400 naming its line and column", async () => {
    const { status, body } = await post(server, "/generate", { prompt: "x", grammar: 'root ::= "a" missing' });
    expect(status).toBe(400);
    expect(body.error?.param).toBe("grammar");
    expect(body.error?.message).toMatch(/line 1, column \d+/);
  });

  test("response_format and grammar together are a 400", async () => {
    const { status, body } = await post(server, "/generate", { prompt: "x", grammar: 'root ::= "a"', response_format: personFormat });
    expect(status).toBe(400);
    expect(body.error?.param).toBe("grammar");
  });

  test("a pathological schema is refused within the compile bound, and the server keeps serving", async () => {
    // Many alternatives of long patterned strings: far more grammar than the bound (1.5 s here) allows.
    const branches = Array.from({ length: 400 }, (_, i) => ({ type: "string", pattern: `^[a-z]{${i + 5},${i + 90}}x[0-9]{3,60}$` }));
    const start = performance.now();
    const slow = post(server, "/generate", { prompt: "x", response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", properties: { a: { anyOf: branches } }, required: ["a"] } } } });
    // Meanwhile an ordinary request is answered.
    const meanwhile = await post(server, "/generate", { prompt: "x", max_tokens: 3 });
    expect(meanwhile.status).toBe(200);
    const refused = await slow;
    expect(refused.status).toBe(400);
    expect(refused.body.error?.message).toMatch(/took longer than 1500 ms/);
    expect(performance.now() - start).toBeLessThan(10_000);
    // The same schema again is refused at once (the refusal is kept), and formats still compile.
    const again = performance.now();
    expect((await post(server, "/generate", { prompt: "x", response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", properties: { a: { anyOf: branches } }, required: ["a"] } } } })).status).toBe(400);
    expect(performance.now() - again).toBeLessThan(500);
    expect((await post(server, "/generate", { prompt: "x", max_tokens: 50, grammar: 'root ::= "ok"' })).body.text).toBe("ok");
  });
});
