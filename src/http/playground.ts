// GET /: the web playground (src/playground/), one self-contained page
// assembled at build time. Its Content-Security-Policy allows only its own
// inline script and style (by hash) and requests to this origin, so the
// page can neither load nor send anything elsewhere.
import { Elysia } from "elysia";
import { playgroundPage } from "../playground/bundle.ts" with { type: "macro" };

const PAGE = playgroundPage();

const CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  `script-src ${PAGE.scriptHash}`,
  `style-src ${PAGE.styleHash}`,
  "connect-src 'self'",
  "img-src data:",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join("; ");

const HEADERS = {
  "content-type": "text/html; charset=utf-8",
  "cache-control": "no-cache",
  "content-security-policy": CONTENT_SECURITY_POLICY,
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
};

export function playgroundRoutes() {
  return new Elysia().get("/", () => new Response(PAGE.html, { headers: HEADERS }));
}
