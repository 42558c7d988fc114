// The optional API key (SERVICE_API_KEY / SERVICE_API_KEY_FILE). When set,
// every API route — /v1/* (models included, as vLLM's --api-key does: a
// model id here is the server's file path), /api/* and /generate* — needs
// `Authorization: Bearer <key>`, else 401 in OpenAI's shape (code
// invalid_api_key, so the official client raises AuthenticationError).
// /healthz stays open for probes and load balancers; /metrics too, unless
// SERVICE_API_KEY_PROTECT_METRICS=1. CORS preflights never carry the key and
// are answered before this check (browser_guard.ts).
import { createHash, timingSafeEqual } from "node:crypto";
import type { Config } from "../config.ts";
import { type HttpError, unauthorized } from "./errors.ts";

const digest = (s: string) => createHash("sha256").update(s).digest();

// Matched on the decoded path, ignoring case and repeated slashes, so that
// no spelling a router might still map to a route gets past the check.
function loosePath(path: string): string {
  try {
    return decodeURIComponent(path).toLowerCase();
  } catch {
    return path.toLowerCase();
  }
}

const API_PATH = /^\/+(v1|api|generate)/;
const METRICS_PATH = /^\/+metrics/;

type KeyVerdict = "held" | "missing" | "wrong";

/** What the request carries of the configured key (which must be set). */
function keyVerdict(request: Request, expected: Buffer): KeyVerdict {
  const header = request.headers.get("authorization");
  if (header === null) return "missing";
  const bearer = /^bearer[ \t]+(\S+)[ \t]*$/i.exec(header);
  return bearer !== null && timingSafeEqual(digest(bearer[1]), expected) ? "held" : "wrong";
}

/** A check of the request's key: the 401 to answer, or null to go on. Without a key configured it passes everything. */
export function apiKeyCheck(config: Config): (request: Request, path: string) => HttpError | null {
  const key = config.apiKey;
  if (key === null) return () => null;
  // Equal-length digests: the comparison takes the same time whatever the guess.
  const expected = digest(key);
  return (request, path) => {
    const p = loosePath(path);
    if (!API_PATH.test(p) && !(config.apiKeyProtectsMetrics && METRICS_PATH.test(p))) return null;
    const verdict = keyVerdict(request, expected);
    if (verdict === "missing") return unauthorized("missing API key: send it as the header `Authorization: Bearer <key>`");
    if (verdict === "wrong") return unauthorized("invalid API key");
    return null;
  };
}

/**
 * Whether a request on an open route (/healthz) may see what only key
 * holders see, such as the server's file paths: true when no key is
 * configured (the model list shows the path to everyone then) or the request
 * carries the key.
 */
export function apiKeyHolder(config: Config): (request: Request) => boolean {
  const key = config.apiKey;
  if (key === null) return () => true;
  const expected = digest(key);
  return (request) => keyVerdict(request, expected) === "held";
}
