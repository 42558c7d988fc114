// Request body limits (docs/limits.md): SERVICE_MAX_BODY_BYTES answered with
// a 413 in the error shape, whether the size is declared (Content-Length) or
// only found while reading (chunked); JSON nested deeper than 64 levels is a
// 400 naming the limit, checked before parsing (it used to overflow the
// stack: a 500). What Bun answers itself (431, 505) keeps its status and the
// server keeps serving.
import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { MAX_JSON_DEPTH } from "../../src/http/body.ts";
import { portOf, rawRequest, requestText } from "../helpers/raw_http.ts";
import { expectErrorShape } from "../helpers/http.ts";
import { startServer, type TestServer } from "../helpers/server.ts";

setDefaultTimeout(60_000);

const LIMIT = 65536;
let server: TestServer;
let port: number;

beforeAll(async () => {
  // 512 tokens of at most 128 bytes: the longest prompt fits the limit exactly.
  server = await startServer({ env: { SERVICE_MAX_BODY_BYTES: String(LIMIT), SERVICE_MAX_SEQ_LEN: "512" } });
  port = portOf(server.url);
});

afterAll(async () => {
  await server.stop();
});

/** A body of exactly `bytes` bytes for `path`, padded with an ignored field. */
function bodyOfSize(path: string, bytes: number): string {
  const base = path === "/v1/chat/completions" || path === "/api/v0/chat/completions"
    ? { model: "m", messages: [{ role: "user", content: "Hi" }], max_tokens: 1 }
    : path.startsWith("/generate")
      ? { prompt: "Hi", max_tokens: 1 }
      : { model: "m", prompt: "Hi", max_tokens: 1 };
  const empty = JSON.stringify({ ...base, pad: "" });
  return JSON.stringify({ ...base, pad: "x".repeat(bytes - empty.length) });
}

async function expectHealthy(): Promise<void> {
  expect((await fetch(`${server.url}/healthz`)).status).toBe(200);
}

const ROUTES = ["/generate", "/generate/speculative", "/v1/completions", "/v1/chat/completions", "/api/v0/completions", "/api/v0/chat/completions"];

describe("SERVICE_MAX_BODY_BYTES", () => {
  for (const path of ROUTES) {
    test(`${path}: a body of the limit is served, one byte more is a 413 in the error shape`, async () => {
      const ok = await server.post(path, bodyOfSize(path, LIMIT));
      expect(ok.status).toBe(200);
      const over = await server.post(path, bodyOfSize(path, LIMIT + 1));
      expect(over.status).toBe(413);
      const body = await over.json();
      expectErrorShape(body);
      expect(body.error).toMatchObject({
        type: "invalid_request_error",
        code: "request_too_large",
        message: `request body is ${LIMIT + 1} bytes, more than the limit of ${LIMIT} bytes (SERVICE_MAX_BODY_BYTES)`,
      });
    });
  }

  test("a chunked body (no Content-Length) is refused once it passes the limit", async () => {
    const chunk = "x".repeat(1000);
    const chunks = Array.from({ length: 70 }, () => `${chunk.length.toString(16)}\r\n${chunk}\r\n`).join("");
    const res = await rawRequest(
      port,
      `POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${chunks}0\r\n\r\n`,
    );
    expect(res.status).toBe(413);
    const body = JSON.parse(res.body);
    expectErrorShape(body);
    expect(body.error.code).toBe("request_too_large");
    expect(body.error.message).toMatch(/^request body passed \d+ bytes, more than the limit of 65536 bytes/);
    await expectHealthy();
  });

  test("a huge declared Content-Length is refused without waiting for the body", async () => {
    const res = await rawRequest(port, "POST /generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 99999999999\r\nConnection: close\r\n\r\n{", 5_000).catch(
      // The server may keep the connection open for the unsent body: the head is what counts.
      (e: Error) => e,
    );
    const text = res instanceof Error ? res.message : JSON.stringify(res);
    expect(text).toContain("413");
    expect(text).toContain("request_too_large");
    await expectHealthy();
  });
});

/** `{"prompt": "Hi", "a": [[[...]]]}` with the array nested `depth` deep (the object is one more level). */
function nested(depth: number): string {
  return `{"prompt":"Hi","max_tokens":1,"a":${"[".repeat(depth)}${"]".repeat(depth)}}`;
}

describe("JSON nesting", () => {
  test(`${MAX_JSON_DEPTH} levels are accepted`, async () => {
    const res = await server.post("/generate", nested(MAX_JSON_DEPTH - 1));
    expect(res.status).toBe(200);
  });

  test("one level more is a 400 naming the limit, on every family", async () => {
    for (const path of ["/generate", "/v1/completions", "/api/v0/chat/completions"]) {
      const res = await server.post(path, nested(MAX_JSON_DEPTH));
      expect(res.status).toBe(400);
      const body = await res.json();
      expectErrorShape(body);
      expect(body.error).toMatchObject({ code: "json_too_deep", type: "invalid_request_error" });
      expect(body.error.message).toContain(`more than ${MAX_JSON_DEPTH} levels deep`);
    }
  });

  test("deep nesting that used to overflow the stack is a 400, and the server keeps serving", async () => {
    for (const depth of [5_000, 30_000]) {
      const res = await server.post("/generate", `{"prompt":${"[".repeat(depth)}1${"]".repeat(depth)}}`);
      expect(res.status).toBe(400);
      const body = await res.json();
      expectErrorShape(body);
      expect(body.error.code).toBe("json_too_deep");
    }
    await expectHealthy();
  });

  test("brackets inside strings do not count", async () => {
    const res = await server.post("/generate", { prompt: "[[[[".repeat(40) + "{{{{".repeat(40), max_tokens: 1 });
    expect(res.status).toBe(200);
  });
});

describe("a body limit below the longest prompt", () => {
  test("is started with a warning naming both settings", async () => {
    const s = await startServer({ env: { SERVICE_MAX_BODY_BYTES: "65536", SERVICE_MAX_SEQ_LEN: "1024" } });
    try {
      expect(s.output()).toContain(
        "warning: SERVICE_MAX_BODY_BYTES=65536 is below the longest prompt SERVICE_MAX_SEQ_LEN=1024 admits (131072 bytes of text)",
      );
    } finally {
      await s.stop();
    }
    expect(server.output()).not.toContain("warning: SERVICE_MAX_BODY_BYTES");
  });
});

describe("errors Bun answers itself (docs/limits.md)", () => {
  test("headers over Bun's limit: 431 with no body; the server keeps serving", async () => {
    const res = await rawRequest(port, requestText("GET", "/healthz", { Host: "localhost", "X-Big": "a".repeat(20_000) }));
    expect(res.status).toBe(431);
    await expectHealthy();
  });

  test("an HTTP version other than 1.x: 505; the server keeps serving", async () => {
    const res = await rawRequest(port, "GET /healthz HTTP/2.5\r\nHost: localhost\r\n\r\n");
    expect(res.status).toBe(505);
    await expectHealthy();
  });
});
