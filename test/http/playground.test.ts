// GET / serves the web playground (src/http/playground.ts): one
// self-contained page whose Content-Security-Policy admits exactly its own
// inline script and style and requests to its own origin. The page driven
// in a browser: test/playground/browser.test.ts.
import { describe, expect, test } from "bun:test";
import { ErrorBody } from "../../src/wire/responses.ts";
import { jsonBody } from "../helpers/http.ts";
import { serverForTests } from "../helpers/server.ts";

const server = serverForTests();

const sha256 = (text: string) => `'sha256-${new Bun.CryptoHasher("sha256").update(text).digest("base64")}'`;

describe("GET /", () => {
  test("an HTML page with its script and style inline, nothing loaded from anywhere", async () => {
    const r = await fetch(`${server.url}/`);
    expect(r.status).toBe(200);
    expect(r.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(r.headers.get("x-content-type-options")).toBe("nosniff");
    const html = await r.text();
    expect(html).toStartWith("<!doctype html>");
    expect(html).toContain("<title>loopserve playground</title>");
    // No external script, stylesheet, image or link target; the only href is the empty data: icon.
    expect(html).not.toMatch(/<script[^>]*\ssrc=/i);
    expect(html).not.toMatch(/<link[^>]*rel="stylesheet"/i);
    expect([...html.matchAll(/\shref="([^"]*)"/g)].map((m) => m[1])).toEqual(["data:,"]);
    expect(html).not.toMatch(/https?:\/\//);
    // The markers were replaced by the real thing.
    expect(html).not.toContain("<!-- main.ts -->");
    expect(html).not.toContain("<!-- style.css -->");
  });

  test("the Content-Security-Policy allows exactly the inline script and style, and this origin", async () => {
    const r = await fetch(`${server.url}/`);
    const html = await r.text();
    const script = /<script type="module">([\s\S]*)<\/script>/.exec(html)?.[1] ?? "";
    const style = /<style>([\s\S]*)<\/style>/.exec(html)?.[1] ?? "";
    expect(script.length).toBeGreaterThan(1000);
    expect(style.length).toBeGreaterThan(1000);
    const csp = Object.fromEntries(
      (r.headers.get("content-security-policy") ?? "").split("; ").map((d) => {
        const [name, ...sources] = d.split(" ");
        return [name, sources.join(" ")];
      }),
    );
    expect(csp).toEqual({
      "default-src": "'none'",
      "script-src": sha256(script),
      "style-src": sha256(style),
      "connect-src": "'self'",
      "img-src": "data:",
      "base-uri": "'none'",
      "form-action": "'none'",
      "frame-ancestors": "'none'",
    });
  });

  test("the page's requests are relative to it: it works behind a path prefix and never names another origin", async () => {
    const html = await (await fetch(`${server.url}/`)).text();
    const script = /<script type="module">([\s\S]*)<\/script>/.exec(html)?.[1] ?? "";
    for (const path of ["api/v0/models", "api/v0/chat/completions", "api/v0/completions", "generate", "metrics", "healthz"])
      expect(script).toContain(`"${path}"`);
    expect(script).not.toMatch(/["'`]\/(api\/|v1\/|(generate|metrics|healthz)["'`])/);
  });

  test("other methods on / and unknown paths still get the error shape", async () => {
    const post = await server.post("/", { prompt: "x" });
    expect((await jsonBody(post, ErrorBody, 404)).error.type).toBe("not_found_error");
    const missing = await fetch(`${server.url}/index.html`);
    expect(missing.status).toBe(404);
  });
});
