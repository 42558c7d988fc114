// Interpolated modified Kneser-Ney n-gram model (Chen & Goodman, 1998): the
// strongest counting baseline, the one a trained language model has to beat.
//
// The top order counts n-grams as they occur; each lower order counts, for
// an n-gram, the distinct tokens seen before it (its continuation count), so
// a word that follows many contexts gets more back-off mass than one that
// is frequent after a single context. Every order subtracts one of three
// discounts (counts 1, 2, 3+) estimated from its counts of counts and hands
// the freed mass to the next lower order; the lowest order interpolates
// with the uniform distribution, so no token has probability zero.
// Nothing is tuned on the evaluated text.

/** Token ids are below 2^16 (GPT-2's 50,257): an n-gram of up to 3 tokens is an exact number key. */
const BASE = 65536;
const MAX_ORDER = 3;

/** Per history: the sum of its counts, and how many words follow it with count 1, 2 and 3+. */
interface HistoryStats {
  total: number;
  n1: number;
  n2: number;
  n3: number;
}

/** One order: counts of n-grams by key, their histories' sums, and the three discounts. */
interface Level {
  counts: Map<number, number>;
  histories: Map<number, HistoryStats>;
  discounts: [number, number, number];
}

/** Chen & Goodman's estimates from the counts of counts n1..n4 (Y = n1 / (n1 + 2 n2)). */
function discountsOf(counts: Map<number, number>): [number, number, number] {
  const n = [0, 0, 0, 0, 0];
  for (const c of counts.values()) if (c <= 4) n[c]++;
  if (n[1] === 0 || n[2] === 0 || n[3] === 0) throw new Error("Kneser-Ney discounts need n-grams seen once, twice and three times");
  const y = n[1] / (n[1] + 2 * n[2]);
  return [1 - (2 * y * n[2]) / n[1], 2 - (3 * y * n[3]) / n[2], 3 - (4 * y * n[4]) / n[3]];
}

function levelOf(counts: Map<number, number>, order: number): Level {
  const histories = new Map<number, HistoryStats>();
  const span = BASE ** (order - 1);
  for (const [key, c] of counts) {
    const h = Math.floor(key / BASE) % span;
    let s = histories.get(h);
    if (!s) histories.set(h, (s = { total: 0, n1: 0, n2: 0, n3: 0 }));
    s.total += c;
    if (c === 1) s.n1++;
    else if (c === 2) s.n2++;
    else s.n3++;
  }
  return { counts, histories, discounts: discountsOf(counts) };
}

export class KneserNey {
  /** levels[n - 1]: the order-n counts. */
  private readonly levels: Level[];

  /** Counts `tokens` (one running text) up to `order` (1 to 3) over a vocabulary of `vocabSize` ids. */
  constructor(
    tokens: ArrayLike<number>,
    readonly order: number,
    readonly vocabSize: number,
  ) {
    if (!Number.isInteger(order) || order < 1 || order > MAX_ORDER) throw new Error(`order must be 1 to ${MAX_ORDER}, got ${order}`);
    const top = new Map<number, number>();
    for (let i = order - 1; i < tokens.length; i++) {
      let key = 0;
      for (let j = i - order + 1; j <= i; j++) key = key * BASE + tokens[j];
      top.set(key, (top.get(key) ?? 0) + 1);
    }
    const levels = [levelOf(top, order)];
    // Order n's continuation count of an n-gram: the distinct (n+1)-grams that end with it.
    for (let n = order - 1; n >= 1; n--) {
      const cont = new Map<number, number>();
      const span = BASE ** n;
      for (const key of levels[0].counts.keys()) {
        const suffix = key % span;
        cont.set(suffix, (cont.get(suffix) ?? 0) + 1);
      }
      levels.unshift(levelOf(cont, n));
    }
    this.levels = levels;
  }

  /** P(word | the up to order-1 tokens of `history`, oldest first); a shorter history backs off to the orders it fills. */
  probability(history: ArrayLike<number>, word: number): number {
    let p = 1 / this.vocabSize;
    const usable = Math.min(history.length, this.order - 1);
    for (let n = 1; n <= usable + 1; n++) {
      const level = this.levels[n - 1];
      let h = 0;
      for (let j = history.length - (n - 1); j < history.length; j++) h = h * BASE + history[j];
      const stats = level.histories.get(h);
      if (!stats) continue; // an unseen history: the lower order's estimate as it is
      const c = level.counts.get(h * BASE + word) ?? 0;
      const [d1, d2, d3] = level.discounts;
      const discounted = c === 0 ? 0 : c - (c === 1 ? d1 : c === 2 ? d2 : d3);
      const backoff = (d1 * stats.n1 + d2 * stats.n2 + d3 * stats.n3) / stats.total;
      p = discounted / stats.total + backoff * p;
    }
    return p;
  }
}

/** Perplexity of a Kneser-Ney model of `order` counted on `train`, over the model's predicted positions. */
export function kneserNeyPerplexity(train: Uint16Array, evalTexts: Int32Array[], V: number, order: number): number {
  const kn = new KneserNey(train, order, V);
  let nll = 0;
  let n = 0;
  for (const t of evalTexts)
    for (let i = 1; i < t.length; i++) {
      // At a text's start the history is shorter than order - 1: the model backs off, as the looped model sees less context there too.
      nll -= Math.log(kn.probability(t.subarray(Math.max(0, i - order + 1), i), t[i]));
      n++;
    }
  return Math.exp(nll / n);
}
