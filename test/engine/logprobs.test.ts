// The one log-softmax (src/engine/logprobs.ts) on hand-made rows: values
// against a direct computation, the order and count of the alternatives
// (ties to the lower id, as the greedy sampler breaks them), NaN read as
// -inf, and the floor that keeps a zero probability a JSON number.
import { describe, expect, test } from "bun:test";
import { LOGPROB_FLOOR, logSumExp, tokenLogprob, topIds } from "../../src/engine/logprobs.ts";

const row = (...v: number[]) => Float32Array.from(v);

describe("log-softmax of a logits row", () => {
  test("values equal log(exp(l) / sum(exp)) and do not overflow for large logits", () => {
    const r = row(1, 2, 3, 0.5);
    const z = [1, 2, 3, 0.5].reduce((a, l) => a + Math.exp(l), 0);
    for (let id = 0; id < 4; id++) expect(tokenLogprob(r, id, 0).logprob).toBeCloseTo(Math.log(Math.exp(r[id]) / z), 12);
    const big = row(1000, 999, 998);
    expect(logSumExp(big)).toBeCloseTo(1000 + Math.log(1 + Math.exp(-1) + Math.exp(-2)), 9);
    expect(tokenLogprob(big, 0, 0).logprob).toBeCloseTo(-Math.log(1 + Math.exp(-1) + Math.exp(-2)), 9);
  });

  test("alternatives: the k likeliest, best first, ties to the lower id, at most the row's length", () => {
    const r = row(0.5, 2, 2, -1, 3, 2);
    expect(topIds(r, 4)).toEqual([4, 1, 2, 5]);
    expect(topIds(r, 0)).toEqual([]);
    expect(topIds(r, 10)).toEqual([4, 1, 2, 5, 0, 3]);
    const e = tokenLogprob(r, 3, 2);
    expect(e.id).toBe(3);
    expect(e.top.map((t) => t.id)).toEqual([4, 1]);
    expect(e.top[0].logprob).toBe(tokenLogprob(r, 4, 0).logprob); // the same computation, the same number
  });

  test("a NaN logit counts as -inf: left out of the sum, ranked last, reported at the floor", () => {
    const r = row(1, Number.NaN, 2);
    expect(logSumExp(r)).toBeCloseTo(Math.log(Math.exp(1) + Math.exp(2)), 12);
    expect(topIds(r, 3)).toEqual([2, 0, 1]);
    expect(tokenLogprob(r, 1, 0).logprob).toBe(LOGPROB_FLOOR);
    expect(tokenLogprob(row(0, Number.NEGATIVE_INFINITY), 1, 0).logprob).toBe(LOGPROB_FLOOR);
  });
});
