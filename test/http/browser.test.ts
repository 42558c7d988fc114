// Browser protection seen from a real browser (headless Chromium driven by
// puppeteer-core): what a web page the user visits can and cannot do to a
// loopserve on 127.0.0.1. Pages come from two small servers on other ports
// (an attacker's and an allowed app's) and from a name mapped to 127.0.0.1
// inside the browser (--host-resolver-rules), which is what a DNS-rebinding
// attack achieves. The server requires an API key, so the allowed page also
// shows a key crossing CORS (Authorization needs a preflight).
import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync } from "node:fs";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { metric, PROMPT } from "../helpers/scheduling.ts";
import { startServer, type TestServer } from "../helpers/server.ts";

setDefaultTimeout(90_000);

const chromium = Bun.which("chromium") ?? ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p)) ?? null;
const skipReason = chromium ? null : "chromium is not installed (.ci/system-deps.sh installs the Debian package)";
if (skipReason) console.warn(`skipping browser tests: ${skipReason}`);

const KEY = "sk-browser-test";
const REBIND = "rebind.test";
const GENERATE = JSON.stringify({ prompt: PROMPT, max_tokens: 2, temperature: 0 });

/** A server for one static page (its origin is http://127.0.0.1:<port>). */
function pageServer() {
  return Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch: () => new Response("<!doctype html><title>page</title><p>a web page", { headers: { "content-type": "text/html" } }),
  });
}

interface FetchOutcome {
  status?: number;
  body?: string;
  requestId?: string | null;
  failed?: string;
}

/** Runs fetch(url, init) inside the page, as the page's own script would. */
function fetchFrom(page: Page, url: string, init: { method?: string; mode?: string; headers?: Record<string, string>; body?: string }): Promise<FetchOutcome> {
  return page.evaluate(
    async (url, init) => {
      try {
        const res = await fetch(url, init as RequestInit);
        return { status: res.status, body: await res.text(), requestId: res.headers.get("x-request-id") };
      } catch (e) {
        return { failed: String(e) };
      }
    },
    url,
    init,
  );
}

describe.skipIf(skipReason !== null)("a real browser against a loopback server", () => {
  let s: TestServer;
  let browser: Browser;
  let evil: ReturnType<typeof pageServer>;
  let app: ReturnType<typeof pageServer>;
  let port = "";

  beforeAll(async () => {
    evil = pageServer();
    app = pageServer();
    s = await startServer({ env: { SERVICE_API_KEY: KEY, SERVICE_ALLOWED_ORIGINS: `http://127.0.0.1:${app.port}` } });
    port = new URL(s.url).port;
    browser = await puppeteer.launch({
      executablePath: chromium as string,
      headless: true,
      args: ["--no-sandbox", "--disable-gpu", `--host-resolver-rules=MAP ${REBIND} 127.0.0.1`],
    });
  });

  afterAll(async () => {
    await browser?.close();
    await s?.stop();
    evil?.stop(true);
    app?.stop(true);
  });

  async function open(url: string): Promise<Page> {
    const page = await browser.newPage();
    await page.goto(url);
    return page;
  }

  test("an unrelated page cannot start a generation, not even with a 'simple' text/plain POST", async () => {
    const submitted = await metric(s, "service_requests_submitted_total");
    const page = await open(`http://127.0.0.1:${evil.port}/`);
    // No preflight for this one: the browser sends it, the server must refuse it.
    const blind = await fetchFrom(page, `${s.url}/generate`, { method: "POST", mode: "no-cors", headers: { "content-type": "text/plain" }, body: GENERATE });
    expect(blind.status).toBe(0); // opaque: the page learns nothing
    const readable = await fetchFrom(page, `${s.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "Hi" }], max_tokens: 2 }),
    });
    expect(readable.failed).toMatch(/Failed to fetch/);
    await page.close();
    expect(await metric(s, "service_requests_submitted_total")).toBe(submitted);
    expect(s.output()).toMatch(new RegExp(`method=POST path=/generate status=403 .*`));
  });

  test("DNS rebinding: a page whose name now resolves to 127.0.0.1 is same-origin to the browser, and the server refuses its Host", async () => {
    const submitted = await metric(s, "service_requests_submitted_total");
    const page = await open(`http://${REBIND}:${port}/healthz`);
    const res = await fetchFrom(page, "/generate", { method: "POST", headers: { "content-type": "text/plain", authorization: `Bearer ${KEY}` }, body: GENERATE });
    expect(res.status).toBe(403);
    expect(JSON.parse(res.body as string).error.code).toBe("host_not_allowed");
    await page.close();
    expect(await metric(s, "service_requests_submitted_total")).toBe(submitted);
  });

  test("a page served by the server itself (as the web playground is) may call it", async () => {
    const page = await open(`http://localhost:${port}/healthz`);
    const res = await fetchFrom(page, "/generate", { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` }, body: GENERATE });
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body as string).tokens).toHaveLength(2);
    await page.close();
  });

  test("an origin in SERVICE_ALLOWED_ORIGINS calls it cross-origin with its key (preflight, then the request), and reads a 401 without it", async () => {
    const page = await open(`http://127.0.0.1:${app.port}/`);
    const chat = JSON.stringify({ model: "m", messages: [{ role: "user", content: "Hi" }], max_tokens: 2 });
    const ok = await fetchFrom(page, `${s.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${KEY}`, "x-stainless-lang": "js" },
      body: chat,
    });
    expect(ok.status).toBe(200);
    expect(JSON.parse(ok.body as string).object).toBe("chat.completion");
    expect(ok.requestId).toMatch(/^[0-9a-f]{32}$/); // exposed to the page
    const denied = await fetchFrom(page, `${s.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: chat });
    expect(denied.status).toBe(401);
    expect(JSON.parse(denied.body as string).error.code).toBe("invalid_api_key");
    await page.close();
  });
});
