// Key/value cache modes through a real server process (docs/kv-cache.md):
// the switches select the mode, model_info.kv_cache_mode reports
// it, the server generates in it (chain speculation equal to plain greedy
// decoding), tree speculation is refused with a 400 naming the constraint,
// and a mode the model cannot run is reported at the start.
import { describe, expect, test } from "bun:test";
import { ErrorBody, ExtendedModelList, ExtendedTextCompletion, GenerateResponse, SpeculativeResponse } from "../../src/wire/responses.ts";
import { jsonBody } from "../helpers/http.ts";
import { tinyModelPath } from "../helpers/models.ts";
import { serverForTests, startServer } from "../helpers/server.ts";

const PROMPT = "The looped transformer said";

describe("a server started with SERVICE_KV_INT8=1", () => {
  const server = serverForTests({ env: { SERVICE_KV_INT8: "1", SERVICE_MAX_SEQ_LEN: "256" } });


  test("reports kv_cache_mode int8 in model_info and on its startup line", async () => {
    const models = await jsonBody(await fetch(`${server.url}/api/v0/models`), ExtendedModelList);
    expect(models.data[0].model_info?.kv_cache_mode).toBe("int8");
    const done = await jsonBody(
      await server.post("/api/v0/completions", { model: "m", prompt: PROMPT, max_tokens: 8, temperature: 0 }),
      ExtendedTextCompletion,
    );
    expect(done.model_info?.kv_cache_mode).toBe("int8");
    expect(done.usage.completion_tokens).toBe(8);
    expect(server.output()).toContain("kv int8");
  });

  test("generates; speculative greedy output equals plain greedy output", async () => {
    const plain = await jsonBody(await server.post("/generate", { prompt: PROMPT, max_tokens: 24, loops: 4 }), GenerateResponse);
    expect(plain.tokens.length).toBe(24);
    for (const cache_window of [0, 6]) {
      const base = await jsonBody(await server.post("/generate", { prompt: PROMPT, max_tokens: 24, loops: 4, cache_window }), GenerateResponse);
      const spec = await jsonBody(
        await server.post("/generate/speculative", { prompt: PROMPT, max_tokens: 24, verify_loops: 4, draft_loops: 2, draft_ahead: 4, cache_window }),
        SpeculativeResponse,
      );
      expect(spec.tokens).toEqual(base.tokens);
    }
  });

  test("tree_speculative is refused with a 400 that names the fp16-cache constraint", async () => {
    const res = await server.post("/generate/tree_speculative", { prompt: PROMPT, max_tokens: 8, verify_loops: 4, K_branches: 2 });
    const e = await jsonBody(res, ErrorBody, 400);
    expect(e.error.message).toContain("fp16 key/value cache");
    expect(e.error.message).toContain("int8");
  });
});

describe("H mode switches", () => {
  test("SERVICE_KV_INT4=1 with SERVICE_KV_H_MODE=1 and SERVICE_H_MODE_FP16_ATTN_QKV=1 serves kv_cache_mode int4-h", async () => {
    const server = await startServer({ env: { SERVICE_KV_INT4: "1", SERVICE_KV_H_MODE: "1", SERVICE_H_MODE_FP16_ATTN_QKV: "1" } });
    try {
      const done = await jsonBody(
        await server.post("/api/v0/completions", { model: "m", prompt: PROMPT, max_tokens: 6, temperature: 0 }),
        ExtendedTextCompletion,
      );
      expect(done.model_info?.kv_cache_mode).toBe("int4-h");
      expect(done.usage.completion_tokens).toBe(6);
    } finally {
      await server.stop();
    }
  });

  test("an H mode on a model whose head_dim is not a power of two: the start says why and generation answers 503", async () => {
    // dim 40 over 4 heads: head_dim 10
    const modelPath = tinyModelPath({ dim: 40, nHeads: 4, nKvHeads: 4, ffnDim: 64 });
    const server = await startServer({ modelPath, env: { SERVICE_KV_H_MODE: "1" } });
    try {
      expect(server.output()).toMatch(/kv_cache_mode fp16-h .*power-of-two head_dim; this model's head_dim is 10/);
      const e = await jsonBody(await server.post("/generate", { prompt: PROMPT, max_tokens: 4 }), ErrorBody, 503);
      expect(e.error.message).toContain("power-of-two head_dim");
    } finally {
      await server.stop();
    }
  });

  test("conflicting switches stop the start with a clear message", async () => {
    await expect(startServer({ env: { SERVICE_KV_INT4: "1", SERVICE_KV_INT8: "1" } })).rejects.toThrow(/conflict/);
  });
});
