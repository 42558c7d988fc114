// The Kneser-Ney baseline of the quality bench: a proper distribution at
// every order and history, backing off where a history was never seen, and
// using the longer context where it was.
import { describe, expect, test } from "bun:test";
import { KneserNey } from "../../bench/kneser_ney.ts";

const V = 50257;
/** 2,000 ids spread over the whole GPT-2 range, so n-gram keys use every bit they have. */
const IDS = Array.from({ length: 2000 }, (_, i) => Math.min(V - 1, i * 25 + 7));

/** A seeded text in which the next id mostly depends on the two before it, else is drawn with a long tail of rare ids. */
function corpus(length: number): Uint16Array {
  let state = 12345;
  const rand = () => (state = (Math.imul(state, 1103515245) + 12345) >>> 0) / 2 ** 32;
  const out = new Uint16Array(length);
  let a = 0;
  let b = 1;
  for (let i = 0; i < length; i++) {
    const next = rand() < 0.6 ? (a * 7 + b * 3) % 50 : Math.floor(IDS.length * rand() ** 3);
    out[i] = IDS[next];
    [a, b] = [b, next];
  }
  return out;
}

const TEXT = corpus(20_000);

function total(kn: KneserNey, history: number[]): number {
  let s = 0;
  for (let w = 0; w < V; w++) s += kn.probability(history, w);
  return s;
}

describe("KneserNey", () => {
  test.each([1, 2, 3])("order %i: probabilities over the vocabulary sum to 1 for seen, unseen and short histories", (order) => {
    const kn = new KneserNey(TEXT, order, V);
    const seen = Array.from(TEXT.subarray(100, 102));
    for (const history of [seen, [V - 1, V - 2], [seen[1]], []]) expect(total(kn, history)).toBeCloseTo(1, 9);
  });

  test("a token never seen in training still gets probability above zero", () => {
    const kn = new KneserNey(TEXT, 3, V);
    expect(kn.probability(Array.from(TEXT.subarray(0, 2)), 3)).toBeGreaterThan(0);
  });

  test("an unseen history backs off: the trigram's estimate is the bigram level's for the last token", () => {
    const kn = new KneserNey(TEXT, 3, V);
    const w = TEXT[51];
    expect(kn.probability([V - 1, TEXT[50]], w)).toBe(kn.probability([TEXT[50]], w));
  });

  test("the longer context pays: the trigram predicts its own training text better than the bigram", () => {
    const nll = (order: number) => {
      const kn = new KneserNey(TEXT, order, V);
      let s = 0;
      for (let i = 2; i < TEXT.length; i++) s -= Math.log(kn.probability(TEXT.subarray(i - 2, i), TEXT[i]));
      return s / (TEXT.length - 2);
    };
    expect(nll(3)).toBeLessThan(nll(2) - 0.5);
  });

  test("an order outside 1..3 or a text too small for the discounts is refused with the reason", () => {
    expect(() => new KneserNey(TEXT, 4, V)).toThrow("order must be 1 to 3, got 4");
    expect(() => new KneserNey(TEXT, 0, V)).toThrow("order must be 1 to 3");
    expect(() => new KneserNey(Uint16Array.of(1, 2, 3, 4), 2, V)).toThrow("seen once, twice and three times");
  });
});
