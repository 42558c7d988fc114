import { describe, expect, test } from "bun:test";
import { LatencyPredictor } from "../../src/scheduler/predictor.ts";

describe("LatencyPredictor", () => {
  test("is unprimed (predicts 0) until both prefill and decode costs were seen", () => {
    const p = new LatencyPredictor();
    expect(p.primed).toBe(false);
    expect(p.cost({ prefillTokens: 100, maxTokens: 100, loops: 8 })).toBe(0);
    p.observe({ prefillTokens: 10, loops: 1, prefillMs: 10, decodeSteps: 0, decodeMs: 0 });
    expect(p.primed).toBe(false);
    p.observe({ prefillTokens: 0, loops: 1, prefillMs: 0, decodeSteps: 4, decodeMs: 8 });
    expect(p.primed).toBe(true);
  });

  test("costs scale with prompt tokens, generated tokens and loops", () => {
    const p = new LatencyPredictor();
    p.observe({ prefillTokens: 10, loops: 2, prefillMs: 20, decodeSteps: 5, decodeMs: 50 }); // 1 ms/token/loop prefill, 5 decode
    expect(p.rates).toEqual({ prefillMsPerTokenLoop: 1, decodeMsPerTokenLoop: 5 });
    expect(p.cost({ prefillTokens: 100, maxTokens: 11, loops: 4 })).toBe(100 * 4 * 1 + 10 * 4 * 5);
    // The running request's remainder: prefill done, 3 of 11 tokens out.
    expect(p.remaining({ prefillTokens: 100, maxTokens: 11, loops: 4 }, 999, 3)).toBe(8 * 4 * 5);
  });

  test("moving averages weight the newest sample by alpha", () => {
    const p = new LatencyPredictor(0.5);
    p.observe({ prefillTokens: 1, loops: 1, prefillMs: 10, decodeSteps: 1, decodeMs: 10 });
    p.observe({ prefillTokens: 1, loops: 1, prefillMs: 20, decodeSteps: 1, decodeMs: 30 });
    expect(p.rates).toEqual({ prefillMsPerTokenLoop: 15, decodeMsPerTokenLoop: 20 });
  });
});
