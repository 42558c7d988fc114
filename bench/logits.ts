// Distribution arithmetic on rows of logits, in float64: what the quality
// figures of the quant, kv and quality sections are made of. The
// log-sum-exp is the service's own (src/engine/logprobs.ts).
import { logSumExp } from "../src/engine/logprobs.ts";
import { argmax } from "../test/reference/forward.ts";

export { logSumExp };

/** KL(softmax(p) || softmax(q)), given each row's logSumExp. */
export function klDivergence(p: Float32Array, lseP: number, q: Float32Array, lseQ: number): number {
  let k = 0;
  for (let i = 0; i < p.length; i++) {
    const a = p[i] - lseP;
    k += Math.exp(a) * (a - (q[i] - lseQ));
  }
  return k;
}

/** Row t of a [T, V] logits buffer (a view, no copy). */
export const row = (l: Float32Array, t: number, V: number) => l.subarray(t * V, (t + 1) * V);

/** A [T, V] logits buffer with each row's logSumExp (a base for Tally.add). */
export function withLse(logits: Float32Array, T: number, V: number): { logits: Float32Array; lse: Float64Array } {
  const lse = new Float64Array(T);
  for (let t = 0; t < T; t++) lse[t] = logSumExp(row(logits, t, V));
  return { logits, lse };
}

/** Sums over predicted positions: negative log-likelihood, KL to a base, top-1 agreement. */
export class Tally {
  nll = 0;
  kl = 0;
  agree = 0;
  n = 0;

  get perplexity(): number {
    return Math.exp(this.nll / this.n);
  }

  get meanKl(): number {
    return this.kl / this.n;
  }

  get top1(): number {
    return this.agree / this.n;
  }

  /**
   * Adds positions first..T-2 of `text` (predicting text[first+1..T-1]);
   * row k of `logits` (and of the base) is position first + k. With a base,
   * KL(base || this) and top-1 agreement against it.
   */
  add(logits: Float32Array, text: Int32Array, V: number, base: { logits: Float32Array; lse: Float64Array } | null, first = 0): void {
    for (let t = first; t + 1 < text.length; t++) {
      const r = row(logits, t - first, V);
      const lse = logSumExp(r);
      this.nll += lse - r[text[t + 1]];
      if (base) {
        const b = row(base.logits, t - first, V);
        this.kl += klDivergence(b, base.lse[t - first], r, lse);
        if (argmax(r) === argmax(b)) this.agree++;
      }
      this.n++;
    }
  }
}
