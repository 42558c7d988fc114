// The text statistics behind the quality bench's description of generated text.
import { describe, expect, test } from "bun:test";
import { repeatedNgramShare, unknownWordShare, wordsOf } from "../../bench/text_stats.ts";

describe("repeatedNgramShare", () => {
  test("a text of distinct n-grams repeats none; a loop repeats all but its first period", () => {
    expect(repeatedNgramShare([1, 2, 3, 4, 5, 6], 4)).toBe(0);
    // period 3 over 12 tokens: 9 four-grams, the first 3 new, the other 6 seen before
    expect(repeatedNgramShare([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3], 4)).toBeCloseTo(6 / 9, 12);
  });

  test("n-grams are compared whole: ids that concatenate alike stay apart", () => {
    expect(repeatedNgramShare([1, 12, 11, 2], 2)).toBe(0);
  });

  test("a text shorter than n has no n-grams", () => {
    expect(repeatedNgramShare([1, 2], 4)).toBe(0);
  });
});

describe("unknownWordShare", () => {
  const vocabulary = new Set(wordsOf("And God said, Let there be light: and there was light."));

  test("counts the words outside the vocabulary, case and punctuation aside", () => {
    expect(unknownWordShare("And there was LIGHT!", vocabulary)).toBe(0);
    expect(unknownWordShare("and haonde sorrowheth light", vocabulary)).toBe(0.5);
  });

  test("a text without words has none unknown", () => {
    expect(unknownWordShare(" 3:16 ", vocabulary)).toBe(0);
  });
});
