// Server-sent-event framing shared by every endpoint family (docs/http.md#streaming):
// one `data:` line per event, a blank line after it, `data: [DONE]` last.
// A client that goes away aborts the signal handed to the producer, so the
// engine stops at its next step.
//
// The body is a direct stream (Bun): each event string goes to the
// connection as written, with no queue, chunk objects or encoder between,
// since at many streams every token's event is on the serving path
// (docs/serving-overhead.md).
import { toHttpError, unavailable } from "./errors.ts";
import { currentRequest } from "./request_context.ts";

export const SSE_DONE = "data: [DONE]\n\n";

export function sseEvent(data: unknown): string {
  return `data: ${JSON.stringify(data)}\n\n`;
}

/** Error raised after the stream started: an error event (same mapping as a response), then [DONE]. */
function sseErrorEvent(error: unknown, request: Request): string {
  return sseEvent(toHttpError("STREAM", error, request).body());
}

export type SseSend = (event: string) => void;

/**
 * A text/event-stream response whose events come from `produce`. The stream
 * always ends with [DONE]: after the last event, or after an error event when
 * `produce` throws or the server halts (a second SIGTERM: 503 shutting_down).
 * The signal aborts when the client disconnects or the server halts.
 */
export function sseResponse(request: Request, produce: (send: SseSend, signal: AbortSignal) => Promise<void>): Response {
  const abort = new AbortController();
  const onClientGone = () => abort.abort();
  request.signal.addEventListener("abort", onClientGone, { once: true });
  const context = currentRequest();
  const halt = context?.halt;
  let direct: ReadableStreamDirectController | null = null;
  let open = true;
  const send: SseSend = (event) => {
    if (open && direct) direct.write(event);
  };
  const end = (cancelled: boolean) => {
    send(SSE_DONE);
    if (open) {
      open = false;
      direct?.close();
    }
    context?.streamEnd.end(cancelled);
  };
  const onHalt = () => {
    send(sseErrorEvent(unavailable("the server is shutting down", "shutting_down"), request));
    end(false);
    abort.abort(); // the engine drops the generation at its next step
  };

  const source: Bun.DirectUnderlyingSource = {
    type: "direct",
    async pull(controller) {
      direct = controller;
      if (halt?.aborted) return onHalt();
      halt?.addEventListener("abort", onHalt, { once: true });
      try {
        await produce(send, abort.signal);
      } catch (e) {
        send(sseErrorEvent(e, request));
      } finally {
        request.signal.removeEventListener("abort", onClientGone);
        halt?.removeEventListener("abort", onHalt);
        end(request.signal.aborted);
      }
    },
    cancel() {
      open = false;
      abort.abort();
      context?.streamEnd.end(true);
    },
  };

  // The DOM library's ReadableStream type does not know Bun's direct sources.
  return new Response(new ReadableStream(source as unknown as UnderlyingDefaultSource<Uint8Array>), {
    headers: {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      "x-accel-buffering": "no",
    },
  });
}

/**
 * Like sseResponse, but the stream is opened only once the request has left
 * the scheduler's queue: a request refused while queued (shutdown) still gets
 * a plain 503 instead of a 200 stream. Events produced before the stream
 * opens are held and sent first.
 */
export async function sseAfterAdmission(
  request: Request,
  start: (send: SseSend, signal: AbortSignal) => { started: Promise<void>; done: Promise<void> },
): Promise<Response> {
  const abort = new AbortController();
  const onClientGone = () => abort.abort();
  request.signal.addEventListener("abort", onClientGone, { once: true });
  const held: string[] = [];
  let emit: SseSend = (event) => held.push(event);
  let run: { started: Promise<void>; done: Promise<void> } | undefined;
  try {
    run = start((event) => emit(event), abort.signal);
    await run.started;
  } catch (e) {
    request.signal.removeEventListener("abort", onClientGone);
    run?.done.catch(() => undefined); // refused: the same error, already answered as a 503
    throw e;
  }
  const admitted = run;
  return sseResponse(request, async (send, signal) => {
    signal.addEventListener("abort", onClientGone, { once: true });
    for (const event of held) send(event);
    emit = send;
    await admitted.done;
  });
}
