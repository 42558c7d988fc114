// What every request goes through before the routes, on its raw headers
// (no router involved, so no path or Host quirk of the router can skip it):
// a request id and a log line (access_log.ts), the browser checks
// (browser_guard.ts), the API key (api_key.ts), then the app.
import type { Config } from "../config.ts";
import { logWhenDone } from "./access_log.ts";
import { apiKeyCheck } from "./api_key.ts";
import { browserGuard } from "./browser_guard.ts";
import { toHttpError } from "./errors.ts";
import { type RequestContext, requestId, requestPath, runInRequestContext, StreamEnd } from "./request_context.ts";

export type Handler = (request: Request) => Response | Promise<Response>;

function declaresBody(request: Request): boolean {
  const length = request.headers.get("content-length");
  return (length !== null && length !== "0") || request.headers.has("transfer-encoding");
}

/** Wraps the app's handler into the server's fetch handler; `halt` aborts when the server stops without waiting. */
export function frontDoor(config: Config, app: Handler, halt?: AbortSignal): (request: Request) => Promise<Response> {
  const guard = browserGuard(config);
  const checkKey = apiKeyCheck(config);

  async function answer(request: Request, path: string): Promise<Response> {
    const verdict = guard(request);
    if (verdict.kind === "refused") return verdict.error.toResponse();
    if (verdict.kind === "preflight") return verdict.response;
    const denied = checkKey(request, path);
    let response: Response;
    if (denied !== null) {
      response = denied.toResponse();
      response.headers.set("www-authenticate", 'Bearer realm="loopserve"');
    } else {
      try {
        response = await app(request);
      } catch (e) {
        // The app maps its own errors; anything escaping it is a bug, logged once.
        response = toHttpError("UNKNOWN", e, request).toResponse();
      }
    }
    // CORS headers on every answer to an allowed browser origin, 401s included, so its page can read why.
    for (const [name, value] of Object.entries(verdict.headers)) response.headers.set(name, value);
    // A body nothing read (a GET that sent one, a refusal before the body):
    // the connection would wait for all of it, however slowly it comes, before
    // the next request. Closing it after the answer frees it at once.
    if (declaresBody(request) && !request.bodyUsed) response.headers.set("connection", "close");
    return response;
  }

  return (request) => {
    const startedAt = performance.now();
    const context: RequestContext = {
      id: requestId(request),
      promptTokens: 0,
      completionTokens: 0,
      signal: request.signal,
      halt,
      streamEnd: new StreamEnd(),
    };
    return runInRequestContext(context, async () => {
      const path = requestPath(request);
      return logWhenDone(await answer(request, path), request, path, context, startedAt);
    });
  };
}
