// Browser protection on a real server (src/http/browser_guard.ts): a request
// with an Origin that is neither the server's own nor listed gets 403 before
// anything runs, CORS headers and preflights for allowed origins, and the
// DNS-rebinding guard on the Host header (loopback binding: loopback names
// and SERVICE_ALLOWED_HOSTS only). test/http/browser.test.ts does the same
// from a real browser.
import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { connect } from "node:net";
import { expectErrorShape } from "../helpers/http.ts";
import { metric, PROMPT } from "../helpers/scheduling.ts";
import { serverForTests, startServer, type TestServer } from "../helpers/server.ts";

setDefaultTimeout(60_000);

const GENERATE = { prompt: PROMPT, max_tokens: 2, temperature: 0 };
const CHAT = { model: "m", messages: [{ role: "user", content: "Hi" }], max_tokens: 2 };

// What a page can send without a preflight: a "simple" POST.
const SIMPLE = { "content-type": "text/plain;charset=UTF-8" };

const portOf = (s: TestServer) => new URL(s.url).port;

async function expect403(res: Response, code: string): Promise<void> {
  const text = await res.text();
  if (res.status !== 403) throw new Error(`expected 403 ${code}, got ${res.status}: ${text}`);
  const body = JSON.parse(text);
  expectErrorShape(body);
  expect(body.error.code).toBe(code);
  expect(body.error.type).toBe("invalid_request_error");
  expect(res.headers.get("access-control-allow-origin")).toBeNull();
}

/** One raw HTTP exchange (for what fetch cannot send: no Host, two Hosts); returns the status line's code. */
function rawStatus(s: TestServer, request: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const socket = connect(Number(portOf(s)), "127.0.0.1", () => socket.write(request));
    let out = "";
    socket.on("data", (d) => {
      out += d.toString();
    });
    socket.on("error", reject);
    socket.on("close", () => resolve(Number(/^HTTP\/1\.[01] (\d{3})/.exec(out)?.[1] ?? -1)));
  });
}

describe("defaults: bound to 127.0.0.1, no allow-lists", () => {
  const s = serverForTests();

  test("clients that send no Origin (curl, SDKs) are served whatever the Content-Type", async () => {
    for (const type of ["application/json", "text/plain", "application/x-www-form-urlencoded"]) {
      const res = await s.post("/generate", GENERATE, { "content-type": type });
      expect(res.status).toBe(200);
      expect(res.headers.get("access-control-allow-origin")).toBeNull();
    }
  });

  test("a simple cross-origin POST from a web page gets 403 on every family, and nothing is generated", async () => {
    const submitted = await metric(s, "service_requests_submitted_total");
    const foreign = { ...SIMPLE, origin: "https://evil.example" };
    await expect403(await s.post("/generate", GENERATE, foreign), "origin_not_allowed");
    await expect403(await s.post("/generate/speculative", GENERATE, foreign), "origin_not_allowed");
    await expect403(await s.post("/v1/chat/completions", CHAT, foreign), "origin_not_allowed");
    await expect403(await s.post("/v1/completions", { model: "m", prompt: "Hi", max_tokens: 2 }, foreign), "origin_not_allowed");
    await expect403(await s.post("/api/v0/chat/completions", CHAT, foreign), "origin_not_allowed");
    // A foreign page on another port of the same machine is another origin too.
    await expect403(await s.post("/generate", GENERATE, { ...SIMPLE, origin: "http://127.0.0.1:1" }), "origin_not_allowed");
    await expect403(await s.post("/generate", GENERATE, { ...SIMPLE, origin: "null" }), "origin_not_allowed");
    await expect403(await fetch(`${s.url}/v1/models`, { headers: { origin: "https://evil.example" } }), "origin_not_allowed");
    expect(await metric(s, "service_requests_submitted_total")).toBe(submitted);
  });

  test("a preflight from a foreign origin is refused", async () => {
    const res = await fetch(`${s.url}/v1/chat/completions`, {
      method: "OPTIONS",
      headers: { origin: "https://evil.example", "access-control-request-method": "POST", "access-control-request-headers": "content-type" },
    });
    await expect403(res, "origin_not_allowed");
  });

  test("the server's own origin (a page it serves) is allowed, with CORS headers", async () => {
    const own = `http://127.0.0.1:${portOf(s)}`;
    const res = await s.post("/generate", GENERATE, { ...SIMPLE, origin: own });
    expect(res.status).toBe(200);
    expect(res.headers.get("access-control-allow-origin")).toBe(own);
    expect(res.headers.get("vary")).toBe("Origin");
    expect(res.headers.get("access-control-expose-headers")).toBe("x-request-id");
    // The same page reached as localhost: Origin and Host agree.
    const local = `http://localhost:${portOf(s)}`;
    const viaName = await s.post("/v1/chat/completions", CHAT, { "content-type": "application/json", origin: local, host: `localhost:${portOf(s)}` });
    expect(viaName.status).toBe(200);
    expect(viaName.headers.get("access-control-allow-origin")).toBe(local);
  });

  test("DNS rebinding: a page whose name now points at 127.0.0.1 is same-origin to the browser, but its Host is refused", async () => {
    const submitted = await metric(s, "service_requests_submitted_total");
    const rebound = `rebind.evil.example:${portOf(s)}`;
    await expect403(await s.post("/generate", GENERATE, { ...SIMPLE, host: rebound, origin: `http://${rebound}` }), "host_not_allowed");
    // Reading is refused too: GETs, the model list, health and metrics.
    for (const path of ["/v1/models", "/api/v0/models", "/healthz", "/metrics"])
      await expect403(await fetch(`${s.url}${path}`, { headers: { host: rebound } }), "host_not_allowed");
    expect(await metric(s, "service_requests_submitted_total")).toBe(submitted);
  });

  test("loopback names are served on any port: localhost, *.localhost, 127.0.0.0/8, [::1]", async () => {
    for (const host of ["localhost", "LOCALHOST:1", "localhost.", "app.localhost:9999", "127.0.0.1", "127.1.2.3:80", "[::1]", `[::1]:${portOf(s)}`]) {
      const res = await fetch(`${s.url}/healthz`, { headers: { host } });
      expect({ host, status: res.status }).toEqual({ host, status: 200 });
    }
    for (const host of ["localhost.evil.example", "127.0.0.1.evil.example", "10.0.0.1", "0.0.0.0", "2130706433"]) {
      const res = await fetch(`${s.url}/healthz`, { headers: { host } });
      expect({ host, status: res.status }).toEqual({ host, status: 403 });
    }
  });

  test("no Host at all (an HTTP/1.0 probe such as the systemd readiness check) is served; two Hosts are not", async () => {
    expect(await rawStatus(s, "GET /healthz HTTP/1.0\r\n\r\n")).toBe(200);
    expect(await rawStatus(s, "GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nConnection: close\r\n\r\n")).toBe(403);
  });
});

describe("SERVICE_ALLOWED_ORIGINS and SERVICE_ALLOWED_HOSTS on a loopback server", () => {
  const s = serverForTests({ env: { SERVICE_ALLOWED_ORIGINS: "https://app.example.com, http://localhost:5173", SERVICE_ALLOWED_HOSTS: "api.example.com,*.lan.example" } });

  test("a listed origin is served with its origin echoed; others are refused", async () => {
    for (const origin of ["https://app.example.com", "http://localhost:5173"]) {
      const res = await s.post("/v1/chat/completions", CHAT, { "content-type": "application/json", origin });
      expect(res.status).toBe(200);
      expect(res.headers.get("access-control-allow-origin")).toBe(origin);
    }
    await expect403(await s.post("/v1/chat/completions", CHAT, { ...SIMPLE, origin: "https://app.example.com:8443" }), "origin_not_allowed");
    await expect403(await s.post("/v1/chat/completions", CHAT, { ...SIMPLE, origin: "http://app.example.com" }), "origin_not_allowed");
  });

  test("a preflight from a listed origin: 204 with the methods, the requested headers and a cache time", async () => {
    const res = await fetch(`${s.url}/v1/chat/completions`, {
      method: "OPTIONS",
      headers: {
        origin: "https://app.example.com",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os",
      },
    });
    expect(res.status).toBe(204);
    expect(res.headers.get("access-control-allow-origin")).toBe("https://app.example.com");
    expect(res.headers.get("access-control-allow-methods")).toBe("GET, POST, OPTIONS");
    expect(res.headers.get("access-control-allow-headers")).toBe("authorization, content-type, x-stainless-os");
    expect(res.headers.get("access-control-max-age")).toBe("600");
    expect(res.headers.get("access-control-allow-credentials")).toBeNull();
    expect(await res.text()).toBe("");
  });

  test("listed Host names are served (a wildcard covers subdomains only); loopback names still are", async () => {
    for (const host of ["api.example.com", "API.example.com:443", "gpu1.lan.example:8000", "localhost:1"]) {
      const res = await fetch(`${s.url}/healthz`, { headers: { host } });
      expect({ host, status: res.status }).toEqual({ host, status: 200 });
    }
    for (const host of ["lan.example", "example.com", "api.example.com.evil.example"])
      await expect403(await fetch(`${s.url}/healthz`, { headers: { host } }), "host_not_allowed");
  });

  test("behind a proxy that forwards the Host, a page of that name is the server's own origin", async () => {
    const res = await s.post("/generate", GENERATE, { ...SIMPLE, host: "api.example.com", origin: "https://api.example.com" });
    expect(res.status).toBe(200);
    const withPort = await s.post("/generate", GENERATE, { ...SIMPLE, host: "api.example.com:8080", origin: "http://api.example.com:8080" });
    expect(withPort.status).toBe(200);
    await expect403(await s.post("/generate", GENERATE, { ...SIMPLE, host: "api.example.com", origin: "http://api.example.com:8080" }), "origin_not_allowed");
  });
});

describe("bound to all interfaces", () => {
  let open: TestServer;
  let restricted: TestServer;
  beforeAll(async () => {
    [open, restricted] = await Promise.all([
      startServer({ env: { HOST: "0.0.0.0", SERVICE_ALLOWED_ORIGINS: "*" } }),
      startServer({ env: { HOST: "0.0.0.0", SERVICE_ALLOWED_HOSTS: "api.example.com" } }),
    ]);
  });
  afterAll(async () => {
    await Promise.all([open?.stop(), restricted?.stop()]);
  });

  test("no Host restriction unless SERVICE_ALLOWED_HOSTS is set; SERVICE_ALLOWED_ORIGINS=* lets every page in", async () => {
    const res = await open.post("/generate", GENERATE, { ...SIMPLE, host: "anything.example:1234", origin: "https://any.example" });
    expect(res.status).toBe(200);
    expect(res.headers.get("access-control-allow-origin")).toBe("https://any.example");
  });

  test("with SERVICE_ALLOWED_HOSTS, only those names and loopback names are served", async () => {
    expect((await fetch(`${restricted.url}/healthz`, { headers: { host: "api.example.com" } })).status).toBe(200);
    expect((await fetch(`${restricted.url}/healthz`)).status).toBe(200);
    await expect403(await fetch(`${restricted.url}/healthz`, { headers: { host: "other.example" } }), "host_not_allowed");
    // Origins are still checked: only the server's own.
    await expect403(await restricted.post("/generate", GENERATE, { ...SIMPLE, origin: "https://any.example" }), "origin_not_allowed");
  });
});
