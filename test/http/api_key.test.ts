// The optional API key on a real server (src/http/api_key.ts): the official
// `openai` client works with the key and raises AuthenticationError with a
// wrong one; every API route of every family needs the key, however its
// path is spelled; /healthz and /metrics stay open unless
// SERVICE_API_KEY_PROTECT_METRICS=1; a bad key setting stops the start.
import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { expectErrorShape } from "../helpers/http.ts";
import { metric, PROMPT } from "../helpers/scheduling.ts";
import { serverForTests, startServer } from "../helpers/server.ts";

setDefaultTimeout(60_000);

const KEY = "sk-loopserve-test-0123456789";
const MODEL = "loopserve-tiny";
const MESSAGES: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "user", content: "Hello" }];
const dir = mkdtempSync(join(tmpdir(), "loopserve-key-"));
const keyFile = join(dir, "api-key");
writeFileSync(keyFile, `${KEY}\n`);

async function expect401(res: Response): Promise<void> {
  const text = await res.text();
  if (res.status !== 401) throw new Error(`expected 401, got ${res.status}: ${text}`);
  const body = JSON.parse(text);
  expectErrorShape(body);
  expect(body.error.code).toBe("invalid_api_key");
  expect(res.headers.get("www-authenticate")).toStartWith("Bearer");
}

describe("SERVICE_API_KEY_FILE set", () => {
  const s = serverForTests({ env: { SERVICE_API_KEY_FILE: keyFile, SERVICE_MAX_SEQ_LEN: "512" } });
  const bearer = (key: string) => ({ "content-type": "application/json", authorization: `Bearer ${key}` });


  test("the openai client with the key: models, chat (plain and streamed), completions", async () => {
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: KEY, maxRetries: 0 });
    const models = [];
    for await (const m of client.models.list()) models.push(m);
    expect(models).toHaveLength(1);
    const chat = await client.chat.completions.create({ model: MODEL, messages: MESSAGES, max_tokens: 4, temperature: 0 });
    expect(chat.usage?.completion_tokens).toBe(4);
    let streamed = "";
    for await (const c of await client.chat.completions.create({ model: MODEL, messages: MESSAGES, max_tokens: 4, temperature: 0, stream: true }))
      streamed += c.choices[0]?.delta.content ?? "";
    expect(streamed).toBe(chat.choices[0].message.content as string);
    const text = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 3 });
    expect(text.usage?.completion_tokens).toBe(3);
    const v0 = new OpenAI({ baseURL: `${s.url}/api/v0`, apiKey: KEY, maxRetries: 0 });
    expect((await v0.chat.completions.create({ model: MODEL, messages: MESSAGES, max_tokens: 2 })).choices).toHaveLength(1);
  });

  test("the openai client with a wrong key: AuthenticationError, and nothing is generated", async () => {
    const submitted = await metric(s, "service_requests_submitted_total");
    for (const apiKey of ["sk-wrong", `${KEY}x`, KEY.slice(0, -1)]) {
      const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey, maxRetries: 0 });
      const err = await client.chat.completions.create({ model: MODEL, messages: MESSAGES, max_tokens: 2 }).catch((e) => e);
      expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
      expect(err.status).toBe(401);
      expect(err.code).toBe("invalid_api_key");
      const listing = await client.models.list().catch((e) => e);
      expect(listing).toBeInstanceOf(OpenAI.AuthenticationError);
    }
    expect(await metric(s, "service_requests_submitted_total")).toBe(submitted);
  });

  test("every API route of every family needs the key", async () => {
    const generate = { prompt: PROMPT, max_tokens: 2, temperature: 0 };
    const chat = { model: MODEL, messages: MESSAGES, max_tokens: 2 };
    const routes: [string, unknown][] = [
      ["/generate", generate],
      ["/generate/speculative", generate],
      ["/generate/tree_speculative", generate],
      ["/v1/chat/completions", chat],
      ["/v1/completions", { model: MODEL, prompt: PROMPT, max_tokens: 2 }],
      ["/api/v0/chat/completions", chat],
      ["/api/v0/completions", { model: MODEL, prompt: PROMPT, max_tokens: 2 }],
    ];
    for (const [path, body] of routes) {
      await expect401(await s.post(path, body));
      await expect401(await s.post(path, body, bearer("nope")));
      expect((await s.post(path, body, bearer(KEY))).status).toBe(200);
    }
    for (const path of ["/v1/models", "/api/v0/models"]) {
      await expect401(await fetch(`${s.url}${path}`));
      expect((await fetch(`${s.url}${path}`, { headers: bearer(KEY) })).status).toBe(200);
    }
  });

  test("the Authorization header: scheme case-insensitive, nothing else accepted", async () => {
    const models = (authorization: string) => fetch(`${s.url}/v1/models`, { headers: { authorization } });
    expect((await models(`bearer ${KEY}`)).status).toBe(200);
    expect((await models(`Bearer   ${KEY}  `)).status).toBe(200);
    for (const header of [KEY, `Basic ${btoa(`user:${KEY}`)}`, `Bearer ${KEY} extra`, "Bearer", `Token ${KEY}`]) await expect401(await models(header));
  });

  test("other spellings of an API path (case, repeated slashes, percent-encoding) never get past the check", async () => {
    for (const path of ["/V1/models", "//v1/models", "/%76%31/models", "/v1%2Fmodels", "/Generate", "/API/v0/models"])
      await expect401(await fetch(`${s.url}${path}`));
  });

  test("/healthz and /metrics stay open for probes and scrapers", async () => {
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    expect((await fetch(`${s.url}/metrics`)).status).toBe(200);
  });

  test("a browser page allowed to call the server can read the 401, and its preflight needs no key", async () => {
    const own = `http://127.0.0.1:${new URL(s.url).port}`;
    const res = await s.post("/v1/chat/completions", { model: MODEL, messages: MESSAGES }, { "content-type": "application/json", origin: own });
    expect(res.headers.get("access-control-allow-origin")).toBe(own);
    await expect401(res);
    const preflight = await fetch(`${s.url}/v1/chat/completions`, {
      method: "OPTIONS",
      headers: { origin: own, "access-control-request-method": "POST", "access-control-request-headers": "authorization, content-type" },
    });
    expect(preflight.status).toBe(204);
    expect(preflight.headers.get("access-control-allow-headers")).toBe("authorization, content-type");
  });
});

describe("SERVICE_API_KEY with SERVICE_API_KEY_PROTECT_METRICS=1", () => {
  const s = serverForTests({ env: { SERVICE_API_KEY: KEY, SERVICE_API_KEY_PROTECT_METRICS: "1" } });

  test("/metrics needs the key; /healthz stays open", async () => {
    await expect401(await fetch(`${s.url}/metrics`));
    const scrape = await fetch(`${s.url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } });
    expect(scrape.status).toBe(200);
    expect(await scrape.text()).toContain("service_requests_submitted_total");
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
  });
});

describe("a bad key setting stops the start with a clear message (exit 2)", () => {
  const empty = join(dir, "empty");
  writeFileSync(empty, "\n");
  test.each<[string, Record<string, string>, RegExp]>([
    ["both variables", { SERVICE_API_KEY: KEY, SERVICE_API_KEY_FILE: keyFile }, /SERVICE_API_KEY and SERVICE_API_KEY_FILE are both set/],
    ["an empty key file", { SERVICE_API_KEY_FILE: empty }, /SERVICE_API_KEY_FILE .* is empty/],
    ["an empty key", { SERVICE_API_KEY: "" }, /SERVICE_API_KEY is empty/],
    ["a missing key file", { SERVICE_API_KEY_FILE: join(dir, "missing") }, /SERVICE_API_KEY_FILE: cannot read/],
  ])("%s", async (_, env, message) => {
    const err = await startServer({ env }).catch((e: Error) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toMatch(/exited with 2/);
    expect((err as Error).message).toMatch(message);
  });
});
