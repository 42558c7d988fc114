// Structured output on real-world schemas: a committed subset of
// JSONSchemaBench (jsonschemabench.json names its source). Every schema the
// server accepts gives, greedy and sampled, output that completes
// ("stop"), parses and validates against the schema (Ajv, validator.ts);
// every other one is refused up front with a 400 that names what it cannot
// honour. Each schema's outcome is recorded in the file, so a schema newly
// refused (or newly accepted) is noticed.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { formatModelPath } from "../helpers/format_model.ts";
import { startServer, type TestServer } from "../helpers/server.ts";
import suite from "./jsonschemabench.json" with { type: "json" };
import { schemaErrors } from "./validator.ts";

interface Case {
  collection: string;
  file: string;
  outcome: "accepted" | "refused";
  schema: Record<string, unknown>;
}

const CASES = suite.schemas as Case[];
/** Greedy, then two sampled seeds. */
const DRAWS = [
  { temperature: 0, sample_seed: 0 },
  { temperature: 1, sample_seed: 1 },
  { temperature: 1, sample_seed: 2 },
];

let server: TestServer;
beforeAll(async () => {
  server = await startServer({ modelPath: await formatModelPath() });
}, 60_000);
afterAll(() => server?.stop());

async function generate(schema: Record<string, unknown>, draw: (typeof DRAWS)[number]) {
  const res = await fetch(`${server.url}/generate`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "Data:", max_tokens: 1024, ...draw, response_format: { type: "json_schema", json_schema: { name: "bench", schema, strict: true } } }),
  });
  return { status: res.status, body: (await res.json()) as { text: string; finish_reason: string; error?: { message: string; code: string; param: string } } };
}

test("the subset holds both outcomes in every collection it draws from", () => {
  const accepted = CASES.filter((c) => c.outcome === "accepted").length;
  expect(accepted).toBeGreaterThanOrEqual(40);
  expect(CASES.length - accepted).toBeGreaterThanOrEqual(10);
});

for (const collection of [...new Set(CASES.map((c) => c.collection))])
  describe(collection, () => {
    for (const c of CASES.filter((x) => x.collection === collection))
      test(`${c.file}: ${c.outcome === "accepted" ? "every output completes and validates" : "refused up front, naming why"}`, async () => {
        for (const draw of DRAWS) {
          const { status, body } = await generate(c.schema, draw);
          if (c.outcome === "refused") {
            expect(status).toBe(400);
            expect(body.error?.code).toBe("invalid_response_format");
            expect(body.error?.param).toBe("response_format.json_schema.schema");
            expect(body.error?.message).toMatch(/cannot be honoured: .+/);
            return; // refused before any draw
          }
          expect(status, JSON.stringify(body.error)).toBe(200);
          expect(body.finish_reason, `${JSON.stringify(draw)}: ${body.text.slice(0, 200)}`).toBe("stop");
          expect(schemaErrors(c.schema, JSON.parse(body.text)), `${JSON.stringify(draw)}: ${body.text.slice(0, 200)}`).toBeNull();
        }
      }, 60_000);
  });
