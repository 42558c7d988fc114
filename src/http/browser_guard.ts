// Keeps web pages a user visits from using the server (docs/security.md).
// Request bodies are JSON whatever their Content-Type (body.ts), so a page
// can POST text/plain to http://127.0.0.1:8000 without a CORS preflight;
// and a page on a name the attacker re-points at 127.0.0.1 (DNS rebinding)
// is "same-origin" to the browser and could read the replies. Two checks,
// on the raw headers, before any routing:
//
// - Host (DNS rebinding, as Ollama does): bound to a loopback address, only
//   loopback names (localhost, *.localhost, 127.0.0.0/8, [::1], any port)
//   and SERVICE_ALLOWED_HOSTS are served; bound elsewhere, any Host unless
//   SERVICE_ALLOWED_HOSTS is set. No Host at all is served: browsers always
//   send one, HTTP/1.0 probes (the systemd readiness check) do not.
// - Origin (sent by browsers on cross-origin requests and on every POST):
//   served when it is the server's own origin (its host:port is the request's
//   Host, e.g. a page served by this server) or listed in
//   SERVICE_ALLOWED_ORIGINS ("*" = any). Requests without Origin (curl, SDKs,
//   servers) are not browser requests and pass.
//
// An allowed Origin gets CORS headers: Access-Control-Allow-Origin echoes it
// (never "*", so the answer is the same with or without credentials), and a
// preflight (OPTIONS with Access-Control-Request-Method) is answered 204 with
// the methods, the requested headers and a 10-minute cache. No
// Access-Control-Allow-Credentials: the API takes a bearer key, not cookies.
import type { Config } from "../config.ts";
import { forbidden, type HttpError } from "./errors.ts";
import { hostMatches, isLoopbackName, normalizeOrigin, parseHost } from "../origins.ts";

export type GuardVerdict =
  | { kind: "refused"; error: HttpError }
  | { kind: "preflight"; response: Response }
  /** Go on; `headers` (CORS, for an allowed Origin) go on the response. */
  | { kind: "allowed"; headers: Record<string, string> };

const PREFLIGHT_MAX_AGE_S = 600;

function defaultPort(scheme: string): string {
  return scheme === "https:" ? "443" : "80";
}

/** Whether an origin (normalized) is the one the request was sent to: same host name and port. */
function isOwnOrigin(origin: string, hostHeader: string | null): boolean {
  const host = hostHeader === null ? null : parseHost(hostHeader);
  if (host === null) return false;
  const url = new URL(origin);
  const scheme = url.protocol;
  return url.hostname === host.name && (url.port || defaultPort(scheme)) === (host.port ?? defaultPort(scheme));
}

export function browserGuard(config: Config): (request: Request) => GuardVerdict {
  const anyHost = config.allowedHosts.includes("*");
  const checkHost = !anyHost && (isLoopbackName(config.host) || config.allowedHosts.length > 0);
  const anyOrigin = config.allowedOrigins.includes("*");
  const origins = new Set(config.allowedOrigins);

  const hostAllowed = (header: string | null): boolean => {
    if (header === null || header.trim() === "") return true;
    const host = parseHost(header);
    return host !== null && (isLoopbackName(host.name) || config.allowedHosts.some((p) => hostMatches(p, host.name)));
  };

  const originAllowed = (origin: string, hostHeader: string | null): boolean => {
    if (anyOrigin) return true;
    const normalized = normalizeOrigin(origin);
    return normalized !== null && (origins.has(normalized) || isOwnOrigin(normalized, hostHeader));
  };

  return (request) => {
    const hostHeader = request.headers.get("host");
    if (checkHost && !hostAllowed(hostHeader))
      return {
        kind: "refused",
        error: forbidden(
          `Host ${JSON.stringify(hostHeader)} is not served: a server bound to a loopback address answers only ` +
            "localhost names unless the name is listed in SERVICE_ALLOWED_HOSTS (protection against DNS rebinding)",
          "host_not_allowed",
        ),
      };

    const origin = request.headers.get("origin");
    if (origin === null) return { kind: "allowed", headers: {} };
    if (!originAllowed(origin, hostHeader))
      return {
        kind: "refused",
        error: forbidden(
          `requests from origin ${JSON.stringify(origin)} are not allowed: browsers may call this server only from its ` +
            "own pages or from an origin listed in SERVICE_ALLOWED_ORIGINS",
          "origin_not_allowed",
        ),
      };

    const headers: Record<string, string> = {
      "access-control-allow-origin": origin,
      "access-control-expose-headers": "x-request-id",
      vary: "Origin",
    };
    if (request.method !== "OPTIONS" || !request.headers.has("access-control-request-method"))
      return { kind: "allowed", headers };
    const requested = request.headers.get("access-control-request-headers");
    const preflight: Record<string, string> = {
      ...headers,
      "access-control-allow-methods": "GET, POST, OPTIONS",
      "access-control-max-age": String(PREFLIGHT_MAX_AGE_S),
      ...(requested ? { "access-control-allow-headers": requested } : {}),
    };
    return { kind: "preflight", response: new Response(null, { status: 204, headers: preflight }) };
  };
}
