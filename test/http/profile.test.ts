// SERVICE_PROFILE=1: after each request the server prints where the kernel
// time went, op by op, on stderr; without it nothing is printed.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { startServer, type TestServer } from "../helpers/server.ts";

let profiled: TestServer;
let plain: TestServer;
beforeAll(async () => {
  [profiled, plain] = await Promise.all([startServer({ env: { SERVICE_PROFILE: "1" } }), startServer()]);
});
afterAll(async () => {
  await Promise.all([profiled?.stop(), plain?.stop()]);
});

const PROMPT = { prompt: "Where does the time go?", max_tokens: 6, loops: 3 };

async function untilOutput(s: TestServer, pattern: RegExp): Promise<string> {
  for (let i = 0; i < 100 && !pattern.test(s.output()); i++) await Bun.sleep(20);
  return s.output();
}

test("SERVICE_PROFILE=1 prints a per-op table with every op after a request", async () => {
  expect((await profiled.post("/generate", PROMPT)).status).toBe(200);
  const out = await untilOutput(profiled, /sampling/);
  expect(out).toMatch(/generate: \d+ prompt \+ 6 generated tokens, loops 3: total [\d.]+ ms/);
  for (const op of ["embed", "rmsnorm", "qkv", "rope\\+attention", "wo", "ffn gate/up", "ffn down", "head", "sampling"])
    expect(out).toMatch(new RegExp(`\\n  ${op} +[\\d.]+ ms +[\\d.]+%`));
});

test("without SERVICE_PROFILE no table is printed", async () => {
  expect((await plain.post("/generate", PROMPT)).status).toBe(200);
  await Bun.sleep(100);
  expect(plain.output()).not.toMatch(/total [\d.]+ ms/);
});
