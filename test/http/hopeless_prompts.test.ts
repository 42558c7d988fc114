// Prompts that can never fit, and prompts that take long to tokenize
// (docs/limits.md): the byte cap lets through texts of up to
// SERVICE_MAX_SEQ_LEN x 128 bytes, which may hold 60 times more tokens than
// the context. A text whose bytes alone, or the fewest tokens its bytes could
// make, leave no room for max_tokens is refused before any encoding; the
// rest is encoded in time linear in its length (256 KiB of GPT-2's longest
// token used to cost a minute of CPU); a client that goes away stops its
// encode, whose CPU is free again at once; and a long text takes only one of
// the two workers, so ordinary prompts keep being served.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { readFileSync } from "node:fs";
import { ErrorBody, GenerateResponse } from "../../src/wire/responses.ts";
import { expectErrorShape, jsonBody } from "../helpers/http.ts";
import { waitFor } from "../helpers/scheduling.ts";
import { serverForTests, type TestServer } from "../helpers/server.ts";

setDefaultTimeout(120_000);

const MAX_SEQ_LEN = 2048;
/** 256 KiB of emoji: within the byte cap (2048 x 128 bytes), 131072 tokens. */
const EMOJI = "😀".repeat(65_536);
/** 256 KiB of GPT-2's longest token (128 bytes): exactly 2048 tokens, no room for max_tokens. */
const LONGEST = "ÃÂ".repeat(32 * 2048);
/** Over 2048 characters, so a worker encodes it; about 600 tokens. */
const PROSE = "In the beginning God created the heaven and the earth. ".repeat(50);

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
  test("256 KiB of the longest token with max_tokens 1: 400 at once, naming max_tokens", async () => {
    const { value, ms } = await timed(generate(LONGEST));
    expect(ms).toBeLessThan(250); // the target is 50 ms; generous for a loaded machine (it took 2 minutes)
    const body = await jsonBody(value, ErrorBody, 400);
    expect(body.error).toMatchObject({ code: "context_length_exceeded", param: "max_tokens" });
    expect(body.error.message).toBe(`prompt (at least 2048 tokens) plus \`max_tokens\` (1) is more than the maximum sequence length ${MAX_SEQ_LEN}`);
  });

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

/** CPU seconds the process `pid` has used (user and system). */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime: fields 14 and 15, in clock ticks
}

describe("a slow prompt that fits", () => {
  // A context of 65536 tokens lets in 8 MiB of text; two million characters of the longest token fit (32768 tokens) and take seconds to encode.
  const big = serverForTests({ env: { SERVICE_MAX_SEQ_LEN: "65536", SERVICE_MAX_BODY_BYTES: String(32 * 2 ** 20) } });
  const SLOW = "ÃÂ".repeat(1 << 20);
  const post = (server: TestServer, prompt: string, signal?: AbortSignal) =>
    fetch(`${server.url}/generate`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: 1 }), signal });

  test("four cancels in a row: each encode stops, and the server's CPU is idle within a second of the last", async () => {
    for (const res of await Promise.all([post(big, PROSE), post(big, PROSE)])) expect(res.status).toBe(200); // both workers up
    for (let k = 0; k < 4; k++) {
      const abort = new AbortController();
      const slow = post(big, SLOW, abort.signal).catch((e: Error) => e);
      await Bun.sleep(400); // its bound is computed and its encode under way
      abort.abort();
      expect(await slow).toBeInstanceOf(Error);
    }
    await waitFor("four 499 lines", () => (big.output().match(/request .*path=\/generate status=499 /g) ?? []).length === 4);
    await Bun.sleep(250);
    const before = cpuSeconds(big.pid);
    await Bun.sleep(1000);
    // An encode left running would burn a core for seconds (four of them: both cores).
    expect(cpuSeconds(big.pid) - before).toBeLessThan(0.2);
    // And the server serves.
    expect((await jsonBody(await post(big, PROSE), GenerateResponse)).tokens).toHaveLength(1);
  });

  test("it holds one worker only: an ordinary long prompt is served meanwhile, and it is served in turn", async () => {
    const slow = post(big, SLOW);
    await Bun.sleep(400);
    const prose = await timed(post(big, PROSE));
    expect(prose.value.status).toBe(200);
    expect(prose.ms).toBeLessThan(1000);
    expect((await jsonBody(await slow, GenerateResponse)).stats.prompt_tokens).toBe(1 << 15);
  });
});
