// What the server knows of the HTTP request it is handling, wherever in the
// handler it is asked: its id (for log lines and the x-request-id response
// header) and the token counts its log line reports. The context follows
// the request through every await (AsyncLocalStorage), so the generation
// code records tokens without each endpoint family passing it along.
import { AsyncLocalStorage } from "node:async_hooks";

export interface RequestContext {
  readonly id: string;
  promptTokens: number;
  completionTokens: number;
  /** The client's: aborted when it goes away, so work for it can stop. */
  readonly signal?: AbortSignal;
  /** Aborted when the server stops without waiting (a second SIGTERM): open streams end with an error event. */
  readonly halt?: AbortSignal;
  /** A streamed body's end: the stream tells it, the access log hears it. */
  readonly streamEnd: StreamEnd;
}

/** The end of a streamed response body, told by the stream and heard by one listener, in either order. */
export class StreamEnd {
  private cancelled: boolean | null = null;
  private listener: ((cancelled: boolean) => void) | null = null;

  /** The body ended; `cancelled`: the client went away first. Only the first call counts. */
  end(cancelled: boolean): void {
    if (this.cancelled !== null) return;
    this.cancelled = cancelled;
    this.listener?.(cancelled);
  }

  /** Calls `fn` once the body has ended: at once when it already has. */
  onEnd(fn: (cancelled: boolean) => void): void {
    if (this.cancelled !== null) fn(this.cancelled);
    else this.listener = fn;
  }
}

const storage = new AsyncLocalStorage<RequestContext>();

// A client's (or nginx's $request_id) id is kept when it is a plain token,
// so one id follows a request through the proxy and the server logs.
const CLIENT_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** The request's X-Request-Id when it is a plain token, else a fresh random id. */
export function requestId(request: Request): string {
  const given = request.headers.get("x-request-id");
  return given !== null && CLIENT_ID.test(given) ? given : crypto.randomUUID().replaceAll("-", "");
}

export function runInRequestContext<T>(context: RequestContext, fn: () => T): T {
  return storage.run(context, fn);
}

/** The context of the request being handled; undefined outside one (in-process use of the app). */
export function currentRequest(): RequestContext | undefined {
  return storage.getStore();
}

/**
 * The request's path without the query. Read from request.url as Bun built
 * it ("http://host/path", or just "/path" when the Host header is missing or
 * unusable), without a URL parser that would throw on the latter.
 */
export function requestPath(request: Request): string {
  const url = request.url;
  const start = url.startsWith("/") ? 0 : url.indexOf("/", url.indexOf("//") + 2);
  if (start < 0) return "/";
  const end = url.slice(start).search(/[?#]/);
  return end < 0 ? url.slice(start) : url.slice(start, start + end);
}
