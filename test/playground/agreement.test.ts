// Token-by-token agreement in the depth explorer (src/playground/agreement.ts).
import { describe, expect, test } from "bun:test";
import { agreement } from "../../src/playground/agreement.ts";

describe("agreement", () => {
  test("identical replies agree everywhere", () => {
    expect(agreement([5, 6, 7], [5, 6, 7])).toEqual({ same: [true, true, true], matched: 3, compared: 3, firstDivergence: null });
  });

  test("position by position: a divergence is counted where it happens, later matches still count", () => {
    expect(agreement([5, 9, 7, 8], [5, 6, 7, 8])).toEqual({ same: [true, false, true, true], matched: 3, compared: 4, firstDivergence: 1 });
  });

  test("a shorter reply disagrees on the tokens it lacks; a longer one on its extra tokens", () => {
    expect(agreement([5, 6], [5, 6, 7, 8])).toEqual({ same: [true, true], matched: 2, compared: 4, firstDivergence: 2 });
    expect(agreement([5, 6, 7], [5, 6])).toEqual({ same: [true, true, false], matched: 2, compared: 3, firstDivergence: 2 });
  });

  test("empty replies", () => {
    expect(agreement([], [])).toEqual({ same: [], matched: 0, compared: 0, firstDivergence: null });
    expect(agreement([], [1]).firstDivergence).toBe(0);
  });
});
