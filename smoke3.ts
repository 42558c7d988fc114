import { startServer } from "./test/helpers/server.ts";
import { formatModelPath } from "./test/helpers/format_model.ts";
const srv = await startServer({ modelPath: await formatModelPath() });
const schema = { type: "object", properties: { name: { type: "string" }, age: { type: "integer", minimum: 0, maximum: 150 }, tags: { type: "array", items: { type: "string" }, maxItems: 3 } }, required: ["name", "age", "tags"], additionalProperties: false };
for (const temperature of [0, 1]) {
  const t0 = performance.now();
  const r = await fetch(srv.url + "/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }], temperature, seed: 3, max_tokens: 200, response_format: { type: "json_schema", json_schema: { name: "p", schema, strict: true } } }) });
  const j: any = await r.json();
  console.log(r.status, performance.now() - t0, JSON.stringify(j.choices?.[0] ?? j));
}
const r2 = await fetch(srv.url + "/generate", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: "x", grammar: 'root ::= "yes" | "no"', max_tokens: 10 }) });
console.log(r2.status, await r2.text());
const r3 = await fetch(srv.url + "/generate", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: "x", response_format: { type: "json_schema", json_schema: { schema: { type: "array", uniqueItems: true } } }, max_tokens: 10 }) });
console.log(r3.status, await r3.text());
const r4 = await fetch(srv.url + "/generate/speculative", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: "x", response_format: { type: "json_object" }, max_tokens: 100, draft_loops: 1, verify_loops: 2 }) });
console.log(r4.status, await r4.text());
await srv.stop();
