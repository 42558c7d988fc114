// One log line per request, written when its response has ended: at once
// for a whole body, after the last event for a stream, or when the client
// goes away first (outcome "cancelled").
import { log } from "../log.ts";
import type { RequestContext } from "./request_context.ts";

const isStream = (response: Response) =>
  response.body !== null && (response.headers.get("content-type") ?? "").startsWith("text/event-stream");

/**
 * Marks the response with the request id and logs the request once the
 * response has ended. A stream's body is passed through chunk by chunk, as
 * it is produced, so the end (or the client's cancel) is seen.
 */
export function logWhenDone(response: Response, request: Request, path: string, context: RequestContext, startedAt: number): Response {
  response.headers.set("x-request-id", context.id);
  let logged = false;
  const finish = (cancelled: boolean) => {
    if (logged) return;
    logged = true;
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
  };
  if (!isStream(response)) {
    finish(false);
    return response;
  }

  const reader = (response.body as ReadableStream<Uint8Array>).getReader();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const { done, value } = await reader.read();
        if (!done) return controller.enqueue(value);
        controller.close();
        finish(false);
      } catch (e) {
        finish(false);
        controller.error(e);
      }
    },
    cancel(reason) {
      finish(true);
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers });
}
