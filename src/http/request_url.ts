// Routing needs an absolute request URL. Bun gives request.url as
// "http://<Host header><target>", or as the bare target ("/healthz") when the
// request has no usable Host (HTTP/1.0 without one, or a Host such as "a/b").
// Elysia's router reads the path at a fixed offset of request.url: by default
// 11 characters in ("http://a.bc"), so every Host shorter than 4 characters
// ("api", "x:1", "a.b") sent every route to 404; createApp sets that offset
// to 7, just past "http://", which is right for any host. A bare target is
// given the server's own origin, the address the request reached, so the
// router and every handler's `new URL(request.url)` see a whole URL.
export function withAbsoluteUrl(request: Request, origin: string): Request {
  if (!request.url.startsWith("/")) return request;
  // The copy keeps method, headers, body and the abort signal of the original.
  return new Request(origin + request.url, request);
}
