// What a reader notices first in generated text, as numbers: how much of
// it repeats itself, and how many of its words the training text never
// used (made-up words). The quality bench reports both for the model's
// output beside the same figures for held-out text.

/** Share of the token n-grams of `tokens` that already occurred earlier in `tokens`. */
export function repeatedNgramShare(tokens: ArrayLike<number>, n: number): number {
  const seen = new Set<string>();
  let repeated = 0;
  let total = 0;
  for (let i = 0; i + n <= tokens.length; i++) {
    const key = Array.prototype.slice.call(tokens, i, i + n).join(",");
    if (seen.has(key)) repeated++;
    else seen.add(key);
    total++;
  }
  return total === 0 ? 0 : repeated / total;
}

/** Lower-case words (letter runs) of a text. */
export const wordsOf = (text: string): string[] => text.toLowerCase().match(/[a-z]+/g) ?? [];

/** Share of the words of `text` that are not in `vocabulary`. */
export function unknownWordShare(text: string, vocabulary: ReadonlySet<string>): number {
  const words = wordsOf(text);
  return words.length === 0 ? 0 : words.filter((w) => !vocabulary.has(w)).length / words.length;
}
