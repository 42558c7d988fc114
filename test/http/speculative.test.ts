// POST /generate/speculative and /generate/tree_speculative against a real
// server process (docs/speculative.md): greedy output equals
// /generate at loops = verify_loops, the response's stats, every range and
// combination rule, the /metrics counters, and no trace left behind.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config.ts";
import type { GenerateResult } from "../../src/engine/types.ts";
import type { GenerationEngine } from "../../src/http/generation.ts";
import { type ErrorBody, GenerateResponse, SpeculativeResponse } from "../../src/wire/responses.ts";
import { tinyModelPath } from "../helpers/models.ts";
import { jsonBody } from "../helpers/http.ts";
import { inProcessApp, serverForTests, startServer, TINY_MODEL_INFO, type TestServer } from "../helpers/server.ts";

const MAX_SEQ_LEN = 256;
// Untied, with small residual updates: shallow loops mostly agree with deep ones.
const MODEL = { seed: 41, residualScale: 0.05, loops: 8 };
const ENV = { SERVICE_MAX_SEQ_LEN: String(MAX_SEQ_LEN), SERVICE_PREFIX_POOL_CAPACITY: "8" };

const server = serverForTests(() => ({ modelPath: tinyModelPath(MODEL), env: ENV }));


/** A speculative endpoint's answer, checked against its schema. */
const call = async (path: string, body: Record<string, unknown>, on: TestServer = server) => jsonBody(await on.post(path, body), SpeculativeResponse);

/** POST /generate, the plain decoding a speculative answer must equal. */
const generate = async (body: Record<string, unknown>, on: TestServer = server) => jsonBody(await on.post("/generate", body), GenerateResponse);

async function refused(path: string, body: Record<string, unknown>, status: number, on: TestServer = server): Promise<ErrorBody> {
  const res = await on.post(path, body);
  const json = (await res.json()) as ErrorBody;
  expect(res.status, JSON.stringify(json)).toBe(status);
  expect(typeof json.error.message).toBe("string");
  return json;
}

const PROMPT = [464, 3290, 318, 257, 922, 1110, 11, 290];

const TEXT_PROMPT = "The looped transformer said";

describe("greedy speculative output equals /generate at loops = verify_loops", () => {
  const cases: Record<string, unknown>[] = [
    { draft_loops: 2, verify_loops: 8, draft_ahead: 4 },
    { draft_loops: 1, verify_loops: 6, draft_ahead: 16, max_tokens: 37 },
    { draft_loops: 3, verify_loops: 3, draft_ahead: 1 },
    { draft_loops: 2, verify_loops: 5, draft_ahead: 6, cache_window: 9, max_tokens: 90 },
    { draft_loops: 1, verify_loops: 4, draft_ahead: 5, repetition_penalty: 1.3 },
    { draft_loops: 2, verify_loops: 8, draft_ahead: 8, stop: [] as number[] }, // stop filled in below
    // drafts deeper than their verifier (slower, still exact)
    { draft_loops: 8, verify_loops: 3, draft_ahead: 4 },
    { draft_loops: 32, verify_loops: 1, draft_ahead: 3, max_tokens: 20 },
    { draft_loops: 6, verify_loops: 2, draft_ahead: 5, cache_window: 9, max_tokens: 90 },
  ];
  for (const [i, knobs] of cases.entries()) {
    for (const path of ["/generate/speculative", "/generate/tree_speculative"]) {
      const K = path.endsWith("tree_speculative") ? (i % 4) + 2 : undefined;
      test(`${path} ${JSON.stringify(knobs)}${K ? ` K_branches ${K}` : ""}`, async () => {
        const { draft_loops, verify_loops, draft_ahead, ...common } = knobs as Record<string, unknown>;
        const base: Record<string, unknown> = { prompt: PROMPT, max_tokens: 30, ...common };
        if (Array.isArray(base.stop)) {
          // a stop id that first appears mid-output
          const free = await generate({ ...base, stop: null, loops: verify_loops });
          base.stop = [free.tokens[9]];
        }
        const plain = await generate({ ...base, loops: verify_loops });
        const spec = await call(path, { ...base, draft_loops, verify_loops, draft_ahead, ...(K ? { K_branches: K } : {}) });
        expect(spec.tokens).toEqual(plain.tokens);
        expect(spec.text).toBe(plain.text);
        expect(spec.finish_reason).toBe(plain.finish_reason);
      });
    }
  }

  test("a text prompt, stop strings and default knobs work as on /generate", async () => {
    const plain = await generate({ prompt: TEXT_PROMPT, max_tokens: 24, loops: 8 });
    const spec = await call("/generate/speculative", { prompt: TEXT_PROMPT, max_tokens: 24 });
    expect(spec.tokens).toEqual(plain.tokens);
    const stop = plain.text.slice(5, 9);
    const a = await generate({ prompt: TEXT_PROMPT, max_tokens: 24, loops: 8, stop });
    const b = await call("/generate/tree_speculative", { prompt: TEXT_PROMPT, max_tokens: 24, stop, K_branches: 3 });
    expect(b.text).toBe(a.text);
    expect(b.finish_reason).toBe(a.finish_reason);
  });
});

describe("response", () => {
  test("stats carry mode, loops_used = verify_loops and the acceptance figures; stream=true is ignored", async () => {
    const res = await server.post("/generate/speculative", { prompt: PROMPT, max_tokens: 20, verify_loops: 6, draft_loops: 2, stream: true, loops: 3 });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toStartWith("application/json");
    const body = await jsonBody(res, SpeculativeResponse);
    expect(body.tokens).toHaveLength(20);
    expect(body.finish_reason).toBe("length");
    const s = body.stats;
    expect(s.mode).toBe("speculative");
    expect(s.loops_used).toBe(6);
    expect(s.completion_tokens).toBe(20);
    expect(s.prompt_tokens).toBe(PROMPT.length);
    expect(s.wall_ms).toBeGreaterThan(0);
    expect(s.tokens_per_second).toBeGreaterThan(0);
    expect(Number.isInteger(s.draft_tokens) && Number.isInteger(s.accepted_tokens)).toBe(true);
    expect(s.accepted_tokens).toBeLessThanOrEqual(s.draft_tokens);
    // 19 tokens came from cycles (the first from the prefill), each cycle
    // giving its accepted drafts plus one of the verifier's own.
    expect(s.accepted_per_cycle).toBeGreaterThan(1);
    expect(s.accepted_per_cycle).toBeLessThanOrEqual(5);

    const tree = await call("/generate/tree_speculative", { prompt: PROMPT, max_tokens: 20, K_branches: 4, verify_loops: 7 });
    expect(tree.stats.mode).toBe("tree_speculative");
    expect(tree.stats.loops_used).toBe(7);
  });

  test("K_branches = 1 gives /generate/speculative's tokens and counts", async () => {
    for (const knobs of [
      { draft_loops: 1, verify_loops: 8, draft_ahead: 4 },
      { draft_loops: 3, verify_loops: 5, draft_ahead: 11, cache_window: 4 },
    ]) {
      const chain = await call("/generate/speculative", { prompt: PROMPT, max_tokens: 40, ...knobs });
      const tree = await call("/generate/tree_speculative", { prompt: PROMPT, max_tokens: 40, ...knobs, K_branches: 1 });
      expect(tree.tokens).toEqual(chain.tokens);
      expect(tree.stats.accepted_tokens).toBe(chain.stats.accepted_tokens);
      expect(tree.stats.draft_tokens).toBe(chain.stats.draft_tokens);
      expect(tree.stats.accepted_per_cycle).toBe(chain.stats.accepted_per_cycle);
    }
  });

  test("sampling (temperature > 0) is served speculatively and is deterministic per sample_seed", async () => {
    const body = { prompt: PROMPT, max_tokens: 25, temperature: 0.9, top_k: 40, sample_seed: 7 };
    const a = await call("/generate/speculative", body);
    const b = await call("/generate/speculative", body);
    expect(a.tokens).toEqual(b.tokens);
    expect(a.tokens).toHaveLength(25);
  });
});

describe("validation", () => {
  const P = "/generate/speculative";
  const T = "/generate/tree_speculative";

  test("every knob's range is a 400 naming the field", async () => {
    // Each field with the values just outside its range.
    const bad: [string, string, number[]][] = [
      [P, "draft_loops", [0, 33]],
      [P, "verify_loops", [0, 65]],
      [P, "draft_ahead", [0, 17]],
      [T, "K_branches", [0, 17]],
      [P, "max_tokens", [8193]],
      [P, "temperature", [2.5]],
      [P, "top_k", [1001]],
      [P, "repetition_penalty", [0.4]],
      [T, "cache_window", [-1]],
    ];
    for (const [path, param, values] of bad)
      for (const value of values) {
        const e = await refused(path, { prompt: PROMPT, [param]: value }, 400);
        expect(e.error.param, `${path} ${param} ${value}`).toBe(param);
      }
  });

  test("combinations: draft_loops > verify_loops is served; K_branches * draft_ahead > 64 and a sampled tree are not", async () => {
    const deeper = await call(P, { prompt: PROMPT, draft_loops: 9, verify_loops: 8, max_tokens: 10 });
    expect(deeper.stats.loops_used).toBe(8);
    await call(T, { prompt: PROMPT, draft_loops: 5, verify_loops: 4, max_tokens: 10 });

    const wide = await refused(T, { prompt: PROMPT, K_branches: 5, draft_ahead: 13 }, 400);
    expect(wide.error.message).toContain("64");
    await call(T, { prompt: PROMPT, K_branches: 16, draft_ahead: 4, max_tokens: 10 }); // exactly 64 is fine
    await call(T, { prompt: PROMPT, K_branches: 4, draft_ahead: 16, max_tokens: 10 });

    const sampled = await refused(T, { prompt: PROMPT, temperature: 0.7, K_branches: 2 }, 400);
    expect(sampled.error.param).toBe("temperature");
    expect(sampled.error.message).toContain("greedy");
  });

  test("wrong types and a missing prompt are 422; prompt + max_tokens over the limit is 400", async () => {
    await refused(P, { prompt: PROMPT, draft_loops: "two" }, 422);
    await refused(T, { prompt: PROMPT, K_branches: 1.5 }, 422);
    await refused(P, { max_tokens: 5 }, 422);
    const long = await refused(T, { prompt: PROMPT, max_tokens: MAX_SEQ_LEN }, 400);
    expect(long.error.code).toBe("context_length_exceeded");
  });

  test("a compressed key/value cache refuses tree speculation with a 400 that says why; the chain still runs", async () => {
    // The HTTP checks alone: the app in-process with that configuration and an
    // engine that answers every admitted request with one token (test/http/
    // kv.test.ts runs a real server with a compressed cache).
    const engine: GenerationEngine = {
      info: TINY_MODEL_INFO,
      enqueue: (req, _opts, sink) => {
        sink(7);
        const result: GenerateResult = { tokens: [7], finishReason: "length", promptTokens: req.promptTokens.length, wallMs: 1, firstTokenMs: 1 };
        return { started: Promise.resolve(), result: Promise.resolve(result) };
      },
    };
    const { post } = await inProcessApp(engine, { ...loadConfig({}), kvCacheMode: "int8" });
    const res = await post(T, { prompt: PROMPT, K_branches: 2 });
    expect(res.status).toBe(400);
    const e = (await res.json()) as ErrorBody;
    expect(e.error.message).toContain("fp16 key/value cache");
    expect(e.error.message).toContain("int8");
    expect((await post(P, { prompt: PROMPT, max_tokens: 1 })).status).toBe(200);
  });
});

describe("metrics and cache hygiene", () => {
  async function counters(): Promise<{ draft: number; accepted: number }> {
    const text = await (await fetch(`${server.url}/metrics`)).text();
    const value = (name: string) => Number(new RegExp(`^${name} ([0-9.e+]+)$`, "m").exec(text)?.[1] ?? Number.NaN);
    return { draft: value("service_spec_draft_tokens_total"), accepted: value("service_spec_accepted_tokens_total") };
  }

  test("service_spec_*_tokens_total count every speculative request's draft and accepted tokens", async () => {
    const before = await counters();
    const a = await call("/generate/speculative", { prompt: PROMPT, max_tokens: 30, draft_ahead: 6 });
    const b = await call("/generate/tree_speculative", { prompt: PROMPT, max_tokens: 30, K_branches: 3 });
    await generate({ prompt: PROMPT, max_tokens: 10 });
    const after = await counters();
    expect(after.draft - before.draft).toBe(a.stats.draft_tokens + b.stats.draft_tokens);
    expect(after.accepted - before.accepted).toBe(a.stats.accepted_tokens + b.stats.accepted_tokens);
    expect(after.accepted - before.accepted).toBeGreaterThan(0);
  });

  test("after speculative requests, plain requests give what a fresh process gives (prefix pool included)", async () => {
    const prompt = [...PROMPT, 13, 383];
    // Speculative requests on this prompt (which the prefix pool captures), then plain ones.
    await call("/generate/tree_speculative", { prompt, max_tokens: 40, K_branches: 8, draft_ahead: 8, draft_loops: 1 });
    await call("/generate/speculative", { prompt, max_tokens: 40, draft_ahead: 16, temperature: 1, sample_seed: 3 });
    const probes = [
      { prompt, max_tokens: 30, loops: 8 },
      { prompt: [...prompt, 318], max_tokens: 30, loops: 8 },
      { prompt, max_tokens: 30, loops: 8, temperature: 0.8, sample_seed: 5 },
    ];
    const here = await Promise.all(probes.map((p) => generate(p)));
    const fresh = await startServer({ modelPath: tinyModelPath(MODEL), env: ENV });
    try {
      for (const [i, p] of probes.entries()) expect(here[i].tokens).toEqual((await generate(p, fresh)).tokens);
    } finally {
      await fresh.stop();
    }
  });
});
