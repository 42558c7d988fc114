// Operational endpoints: GET /healthz and GET /metrics (docs/http.md#ops).
import { Elysia } from "elysia";
import { type AppDeps, requireEngine } from "./generation.ts";
import type { HealthText } from "../wire/responses.ts";

export function opsRoutes(deps: AppDeps) {
  return new Elysia().get("/healthz", () => {
    // 503 (model not loaded / shutting down) in the common error shape, with the reason.
    requireEngine(deps);
    const ok: HealthText = "ok\n";
    return new Response(ok, { headers: { "content-type": "text/plain; charset=utf-8" } });
  }).get("/metrics", async () => {
    const body = await deps.metrics.metricsText();
    return new Response(body, { headers: { "content-type": deps.metrics.contentType } });
  });
}
