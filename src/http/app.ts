// The HTTP application: every route family on one Elysia app, with one body
// parser and one error mapping (src/http/errors.ts) shared by all of them.
// No FFI here: the engine arrives through deps as a GenerationEngine.
import { Elysia } from "elysia";
import { jsonBodyParser } from "./body.ts";
import { compatRoutes } from "./compat.ts";
import { errorResponse } from "./errors.ts";
import { extendedRoutes } from "./extended.ts";
import type { AppDeps } from "./generation.ts";
import { nativeRoutes } from "./native.ts";
import { opsRoutes } from "./ops.ts";
import { playgroundRoutes } from "./playground.ts";
import { speculativeRoutes } from "./speculative.ts";

export function createApp(deps: AppDeps) {
  // standardHostname false: the router finds the path after "http://" and the
  // host, whatever the host's length (src/http/request_url.ts). precompile:
  // every route's handler is compiled at start, not by the first request to
  // it, which would hold up every other client meanwhile (tens of ms).
  return new Elysia({ handler: { standardHostname: false }, precompile: true })
    .onParse(
      jsonBodyParser({
        maxBytes: deps.config.maxBodyBytes,
        stallMs: deps.config.bodyTimeoutMs,
        onStall: () => deps.metrics.bodyTimeouts.inc(),
      }),
    )
    .onError(errorResponse)
    .use(opsRoutes(deps))
    .use(playgroundRoutes())
    .use(nativeRoutes(deps))
    .use(speculativeRoutes(deps))
    .use(compatRoutes(deps))
    .use(extendedRoutes(deps));
}
