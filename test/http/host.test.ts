// Routing must not depend on the Host header: the router once read the path
// at a fixed offset of the URL Bun builds from the Host, so a Host shorter
// than 4 characters ("api", "x:1", "a.b") sent every route to 404. Raw TCP
// requests, because fetch sets its own Host.
import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { portOf, rawRequest, requestText } from "../helpers/raw_http.ts";
import { startServer, type TestServer } from "../helpers/server.ts";

setDefaultTimeout(60_000);

let server: TestServer;
let port: number;

beforeAll(async () => {
  // Every name below is allowed, so only routing decides the answer (the loopback Host guard is tested on its own).
  server = await startServer({ env: { SERVICE_ALLOWED_HOSTS: "*" } });
  port = portOf(server.url);
});

afterAll(async () => {
  await server.stop();
});

const HOSTS = ["api", "x:1", "[::1]:8000", "a.b", "llm", "abcd", "localhost", "127.0.0.1:8000", "loopserve.example.com:443"];

describe("every route answers whatever the Host header", () => {
  for (const host of HOSTS) {
    test(`Host: ${host}`, async () => {
      const health = await rawRequest(port, requestText("GET", "/healthz", { Host: host }));
      expect(health.status).toBe(200);
      expect(health.body).toBe("ok\n");

      for (const path of ["/v1/models", "/api/v0/models"]) {
        const models = await rawRequest(port, requestText("GET", path, { Host: host }));
        expect(models.status).toBe(200);
        expect(JSON.parse(models.body).object).toBe("list");
      }

      const body = JSON.stringify({ prompt: "Hello", max_tokens: 2 });
      const native = await rawRequest(port, requestText("POST", "/generate", { Host: host, "Content-Type": "application/json" }, body));
      expect(native.status).toBe(200);
      expect(JSON.parse(native.body).tokens).toHaveLength(2);

      const ext = JSON.stringify({ model: "m", prompt: "Hello", max_tokens: 2, temperature: 0 });
      const completion = await rawRequest(port, requestText("POST", "/api/v0/completions?x=1", { Host: host }, ext));
      expect(completion.status).toBe(200);
      expect(JSON.parse(completion.body).object).toBe("text_completion");

      // A path with a query string and percent-encoding reaches the model route.
      const one = await rawRequest(port, requestText("GET", "/v1/models/nope%2Fmodel?q=1", { Host: host }));
      expect(one.status).toBe(404);
      expect(JSON.parse(one.body).error.message).toContain('model "nope/model" does not exist');

      const missing = await rawRequest(port, requestText("GET", "/no/such/route?q=1", { Host: host }));
      expect(missing.status).toBe(404);
      expect(JSON.parse(missing.body).error).toMatchObject({ message: "no route for GET /no/such/route", code: "not_found" });
    });
  }

  test("no Host at all (HTTP/1.0): routed by path", async () => {
    const health = await rawRequest(port, "GET /healthz HTTP/1.0\r\n\r\n");
    expect(health.status).toBe(200);
    const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "Hi" }], max_tokens: 2 });
    const chat = await rawRequest(port, `POST /api/v0/chat/completions HTTP/1.0\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    expect(chat.status).toBe(200);
    expect(JSON.parse(chat.body).object).toBe("chat.completion");
    const missing = await rawRequest(port, "GET /api/v0/nothing HTTP/1.0\r\n\r\n");
    expect(missing.status).toBe(404);
    expect(JSON.parse(missing.body).error.message).toBe("no route for GET /api/v0/nothing");
  });

  test("a Host that is not a host name (a/b): routed by path", async () => {
    const health = await rawRequest(port, requestText("GET", "/healthz", { Host: "a/b" }));
    expect(health.status).toBe(200);
  });
});

describe("the Host check decides first (docs/security.md)", () => {
  test("on the default loopback address, Host `api` gets 403 host_not_allowed; listed in SERVICE_ALLOWED_HOSTS, it is served", async () => {
    const guarded = await startServer();
    const listed = await startServer({ env: { SERVICE_ALLOWED_HOSTS: "api" } });
    try {
      const refused = await rawRequest(portOf(guarded.url), requestText("GET", "/healthz", { Host: "api" }));
      expect(refused.status).toBe(403);
      expect(JSON.parse(refused.body).error.code).toBe("host_not_allowed");
      const served = await rawRequest(portOf(listed.url), requestText("GET", "/healthz", { Host: "api" }));
      expect(served.status).toBe(200);
      expect(served.body).toBe("ok\n");
    } finally {
      await guarded.stop();
      await listed.stop();
    }
  });
});
