// Prompts that can never fit (docs/limits.md): the byte cap lets through
// texts of up to SERVICE_MAX_SEQ_LEN x 128 bytes, which may hold 60 times
// more tokens than the context, and their byte-pair encoding used to cost
// half a minute of a tokenizer worker each. Now the fewest tokens a text's
// bytes could make refuses it at once, a long text is encoded in chunks
// until it passes the limit, a client that goes away cancels its encode,
// and a text with a long run without spaces takes only one of the two
// workers, so ordinary prompts keep being served.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { ErrorBody, GenerateResponse } from "../../src/wire/responses.ts";
import { expectErrorShape, jsonBody } from "../helpers/http.ts";
import { waitFor } from "../helpers/scheduling.ts";
import { serverForTests } from "../helpers/server.ts";

setDefaultTimeout(120_000);

const MAX_SEQ_LEN = 2048;
/** 256 KiB of emoji: within the byte cap (2048 x 128 bytes), 131072 tokens. */
const EMOJI = "😀".repeat(65_536);
/** Over 2048 characters, so a worker encodes it; about 600 tokens. */
const PROSE = "In the beginning God created the heaven and the earth. ".repeat(50);
/** 2000 of the longest token in one run without spaces: it fits, and its BPE takes half a minute. */
const SLOW_FIT = "ÃÂ".repeat(32 * 2000);
/** One run of 8000 letters: a heavy text (2000 tokens) whose BPE takes a fraction of a second. */
const LETTERS = "a".repeat(8000);

const s = serverForTests({ env: { SERVICE_MAX_SEQ_LEN: String(MAX_SEQ_LEN) } });

const generate = (prompt: string, signal?: AbortSignal) =>
  fetch(`${s.url}/generate`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: 1 }),
    signal,
  });

async function timed<T>(p: Promise<T>): Promise<{ value: T; ms: number }> {
  const t0 = performance.now();
  const value = await p;
  return { value, ms: performance.now() - t0 };
}

beforeAll(async () => {
  expect(Buffer.byteLength(EMOJI)).toBe(MAX_SEQ_LEN * 128);
  // The workers start on the first long prompt (each loads its tables once): two at once, one for each.
  for (const res of await Promise.all([generate(PROSE), generate(PROSE)])) expect(res.status).toBe(200);
});

describe("a prompt that can never fit", () => {
  test("256 KiB of emoji is refused within 1 s, naming how many tokens it has at least; /healthz and other prompts proceed meanwhile", async () => {
    const hopeless = [timed(generate(EMOJI)), timed(generate(EMOJI))];
    const prose = timed(generate(PROSE));
    const health = await timed(fetch(`${s.url}/healthz`));
    expect(health.value.status).toBe(200);
    for (const { value, ms } of await Promise.all(hopeless)) {
      expect(ms).toBeLessThan(1000);
      const body = await jsonBody(value, ErrorBody, 400);
      expectErrorShape(body);
      expect(body.error).toMatchObject({ code: "context_length_exceeded", param: "prompt" });
      expect(body.error.message).toBe(`\`prompt\` is at least 131072 tokens, more than the maximum sequence length ${MAX_SEQ_LEN}`);
    }
    const served = await prose;
    expect(served.ms).toBeLessThan(1000);
    expect((await jsonBody(served.value, GenerateResponse)).tokens).toHaveLength(1);
  });

  test("the same on the OpenAI family, for a chat's rendered prompt", async () => {
    const { value, ms } = await timed(
      fetch(`${s.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        // 8 emoji fewer, so that the rendered "User: ...\nAssistant:" stays within the byte cap.
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: EMOJI.slice(0, -16) }], max_tokens: 1 }),
      }),
    );
    expect(ms).toBeLessThan(1000);
    const body = await jsonBody(value, ErrorBody, 400);
    expect(body.error).toMatchObject({ code: "context_length_exceeded", param: "messages" });
    expect(body.error.message).toStartWith("`messages` is at least 131");
  });

  test("prose far over the context is refused without being encoded", async () => {
    const long = PROSE.repeat(20); // about 12 000 tokens
    const { value, ms } = await timed(generate(long));
    expect(ms).toBeLessThan(1000);
    const body = await jsonBody(value, ErrorBody, 400);
    expect(body.error.code).toBe("context_length_exceeded");
    expect(body.error.message).toMatch(/^`prompt` is at least \d+ tokens, more than the maximum sequence length 2048$/);
  });
});

describe("a slow prompt that fits", () => {
  test("holds one worker only: an ordinary long prompt is served meanwhile; when its client goes away, its encode stops and the next heavy text runs at once", async () => {
    const abort = new AbortController();
    const slow = generate(SLOW_FIT, abort.signal).catch((e: Error) => e);
    await Bun.sleep(300); // its encode is under way

    const prose = await timed(generate(PROSE));
    expect(prose.value.status).toBe(200);
    expect(prose.ms).toBeLessThan(1000);

    abort.abort();
    expect(await slow).toBeInstanceOf(Error);
    // The server saw the client go: its request ends as 499 in the log.
    await waitFor("the 499 line", () => /request .*path=\/generate status=499 /.test(s.output()));
    // Heavy texts take one worker at a time: had the abandoned encode gone on
    // (about 30 s of BPE), this one would wait for it.
    const letters = await timed(generate(LETTERS));
    expect((await jsonBody(letters.value, GenerateResponse)).stats.prompt_tokens).toBe(2000);
    expect(letters.ms).toBeLessThan(5000);
  });
});
