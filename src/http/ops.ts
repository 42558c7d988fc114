// Operational endpoints: GET /healthz and GET /metrics (docs/http.md#ops).
import { Elysia } from "elysia";
import { apiKeyHolder } from "./api_key.ts";
import { type AppDeps, requireEngine } from "./generation.ts";
import type { HealthText } from "../wire/responses.ts";

export function opsRoutes(deps: AppDeps) {
  const holdsKey = apiKeyHolder(deps.config);
  return new Elysia().get("/healthz", ({ request }) => {
    // 503 (model not loaded / shutting down) in the common error shape, with
    // the reason; the load error's file paths only for API key holders.
    requireEngine(deps, holdsKey(request) ? "full" : "public");
    const ok: HealthText = "ok\n";
    return new Response(ok, { headers: { "content-type": "text/plain; charset=utf-8" } });
  }).get("/metrics", async () => {
    const body = await deps.metrics.metricsText();
    return new Response(body, { headers: { "content-type": deps.metrics.contentType } });
  });
}
