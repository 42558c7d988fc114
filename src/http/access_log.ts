// One log line per request, written when its response has ended: at once
// for a whole body, after the last event for a stream, or when the client
// goes away first (outcome "cancelled").
import { log } from "../log.ts";
import type { RequestContext } from "./request_context.ts";

const isStream = (response: Response) =>
  response.body !== null && (response.headers.get("content-type") ?? "").startsWith("text/event-stream");

/**
 * Marks the response with the request id and logs the request once the
 * response has ended: a stream tells its end through the request context
 * (sse.ts), so its body reaches the client unwrapped.
 */
export function logWhenDone(response: Response, request: Request, path: string, context: RequestContext, startedAt: number): Response {
  response.headers.set("x-request-id", context.id);
  const finish = (cancelled: boolean) =>
    log.request({
      request_id: context.id,
      method: request.method,
      path,
      status: response.status,
      prompt_tokens: context.promptTokens,
      completion_tokens: context.completionTokens,
      ms: Math.round((performance.now() - startedAt) * 10) / 10,
      outcome: cancelled || request.signal.aborted ? "cancelled" : "complete",
    });
  if (isStream(response)) context.streamEnd.onEnd(finish);
  else finish(false);
  return response;
}
