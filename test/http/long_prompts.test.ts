// Long prompts (docs/limits.md). BPE used to cost the square of a run
// without spaces (64 KB of emoji: about 1 s, 1 MB: minutes), on the event
// loop, freezing /healthz, every other client and SIGTERM.
// Now a text longer than SERVICE_MAX_SEQ_LEN tokens of the longest GPT-2
// token (128 bytes) could hold is refused unread, on every family, and a
// long text is tokenized on a worker thread with the same ids.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { ErrorBody, GenerateResponse, TextCompletion } from "../../src/wire/responses.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { expectErrorShape, jsonBody } from "../helpers/http.ts";
import { serverForTests, startServer } from "../helpers/server.ts";

setDefaultTimeout(120_000);

const MAX_SEQ_LEN = 512;
const LONGEST_TOKEN = "ÃÂ".repeat(32); // GPT-2 token 35496: 128 bytes, the longest
const LIMIT_BYTES = MAX_SEQ_LEN * 128;
/** 1 MB without a space. */
const HUGE = "😀".repeat(262_144);
/** 511 tokens of 128 bytes: just under the byte limit, fits the context with max_tokens 1, in one run without spaces. */
const JUST_UNDER = LONGEST_TOKEN.repeat(MAX_SEQ_LEN - 1);

const server = serverForTests({ env: { SERVICE_MAX_SEQ_LEN: String(MAX_SEQ_LEN) } });
let tokenizer: Tokenizer;

beforeAll(async () => {
  tokenizer = await Tokenizer.load();
});

const chat = (content: string) => ({ model: "m", messages: [{ role: "user", content }], max_tokens: 1 });
const completion = (prompt: string | string[]) => ({ model: "m", prompt, max_tokens: 1 });

async function expectTooLong(res: Response, param: string, bytes: number): Promise<void> {
  expect(res.status).toBe(400);
  const body = await res.json();
  expectErrorShape(body);
  expect(body.error).toMatchObject({ type: "invalid_request_error", code: "context_length_exceeded", param });
  expect(body.error.message).toBe(
    `\`${param}\` is ${bytes} bytes of text, more than the maximum sequence length ${MAX_SEQ_LEN} could hold ` +
      `(${MAX_SEQ_LEN} tokens of at most 128 bytes: ${LIMIT_BYTES} bytes)`,
  );
}

describe("a prompt longer than the context could hold is refused before tokenization", () => {
  const bytes = Buffer.byteLength(HUGE);
  const cases: [string, unknown, string, number][] = [
    ["/generate", { prompt: HUGE, max_tokens: 1 }, "prompt", bytes],
    ["/generate/speculative", { prompt: HUGE, max_tokens: 1 }, "prompt", bytes],
    ["/generate/tree_speculative", { prompt: HUGE, max_tokens: 1, K_branches: 2 }, "prompt", bytes],
    ["/v1/completions", completion(HUGE), "prompt", bytes],
    ["/v1/completions", completion([HUGE, "ignored"]), "prompt[0]", bytes],
    // Chat: the rendered prompt ("User: ...\nAssistant:") is what is measured.
    ["/v1/chat/completions", chat(HUGE), "messages", bytes + "User: \nAssistant:".length],
    ["/api/v0/completions", { ...completion(HUGE), mode: "speculative" }, "prompt", bytes],
    ["/api/v0/chat/completions", chat(HUGE), "messages", bytes + "User: \nAssistant:".length],
  ];
  for (const [path, body, param, size] of cases)
    test(`${path} (${param}): 400 context_length_exceeded`, async () => {
      await expectTooLong(await server.post(path, body), param, size);
    });

  test("one byte over the limit is refused, the limit itself is tokenized", async () => {
    const over = `${LONGEST_TOKEN.repeat(MAX_SEQ_LEN - 1)}${"a".repeat(129)}`;
    expect(Buffer.byteLength(over)).toBe(LIMIT_BYTES + 1);
    await expectTooLong(await server.post("/generate", { prompt: over, max_tokens: 1 }), "prompt", LIMIT_BYTES + 1);
    // At the limit: not refused by its bytes, but its 512 tokens leave no room for max_tokens, which is the field named.
    const at = LONGEST_TOKEN.repeat(MAX_SEQ_LEN);
    const refused = await jsonBody(await server.post("/generate", { prompt: at, max_tokens: 1 }), ErrorBody, 400);
    expect(refused.error).toMatchObject({ code: "context_length_exceeded", param: "max_tokens" });
    expect(refused.error.message).toBe(`prompt (at least 512 tokens) plus \`max_tokens\` (1) is more than the maximum sequence length ${MAX_SEQ_LEN}`);
  });

  test("/healthz answers alongside a 1 MB prompt; the server keeps serving", async () => {
    const big = server.post("/generate", { prompt: HUGE, max_tokens: 1 });
    const health = await fetch(`${server.url}/healthz`);
    expect(health.status).toBe(200);
    await expectTooLong(await big, "prompt", bytes);
    expect((await server.post("/generate", { prompt: "Hello", max_tokens: 2 })).status).toBe(200);
  });
});

describe("a long prompt is tokenized off the event loop", () => {
  test("/healthz answers beside a just-under-the-limit prompt; then it is served", async () => {
    expect(Buffer.byteLength(JUST_UNDER)).toBeLessThanOrEqual(LIMIT_BYTES);
    const big = server.post("/generate", { prompt: JUST_UNDER, max_tokens: 1 });
    const t0 = performance.now();
    const health = await fetch(`${server.url}/healthz`);
    const healthMs = performance.now() - t0;
    expect(health.status).toBe(200);
    expect(healthMs).toBeLessThan(1_000); // generous: a few ms when the loop is free
    const out = await jsonBody(await big, GenerateResponse);
    expect(out.stats.prompt_tokens).toBe(MAX_SEQ_LEN - 1);
    expect(out.tokens).toHaveLength(1);
  });

  test("the worker's ids are tiktoken's: a long text prompt and its ids give the same generation", async () => {
    const text = `${"In the beginning God created the heaven and the earth. ".repeat(20)}${"😀".repeat(50)}${LONGEST_TOKEN.repeat(20)}`;
    expect(text.length).toBeGreaterThan(2048); // past the inline limit: a worker encodes it
    const ids = tokenizer.encode(text);
    expect(ids.length).toBeLessThan(MAX_SEQ_LEN - 8);
    const fromText = await jsonBody(await server.post("/generate", { prompt: text, max_tokens: 8 }), GenerateResponse);
    const fromIds = await jsonBody(await server.post("/generate", { prompt: ids, max_tokens: 8 }), GenerateResponse);
    expect(fromText.stats.prompt_tokens).toBe(ids.length);
    expect(fromText.tokens).toEqual(fromIds.tokens);
    // And through the OpenAI family: the same prompt length.
    const v1 = await jsonBody(await server.post("/v1/completions", { ...completion(text), max_tokens: 1 }), TextCompletion);
    expect(v1.usage.prompt_tokens).toBe(ids.length);
  });
});

describe("SIGTERM while a prompt is being tokenized", () => {
  test("is honoured at once: the request gets 503 shutting_down and the process exits 0", async () => {
    // 32768 longest tokens (4 MiB of text, a context of 65536): seconds of encoding, far longer than the shutdown may take.
    const s = await startServer({ env: { SERVICE_MAX_SEQ_LEN: "65536", SERVICE_MAX_BODY_BYTES: String(32 * 2 ** 20) } });
    try {
      const big = s.post("/generate", { prompt: LONGEST_TOKEN.repeat(32768), max_tokens: 1 });
      await Bun.sleep(400);
      expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
      const t0 = performance.now();
      const exited = s.stop();
      const res = await big;
      expect(res.status).toBe(503);
      const body = await res.json();
      expectErrorShape(body);
      expect(body.error.code).toBe("shutting_down");
      expect(await exited).toBe(0);
      expect(performance.now() - t0).toBeLessThan(1500); // the tokenization alone takes seconds more
    } finally {
      await s.stop();
    }
  });
});
