// Log-probabilities from a row of raw logits: the one log-softmax of the
// service (response logprobs) and of the benchmarks' quality figures.
// Computed in float64 with the row's maximum subtracted first, so no exp
// overflows; a NaN logit counts as -inf, as the sampler reads it.

/** Most alternatives a request may ask for per token (OpenAI's top_logprobs bound). */
export const MAX_TOP_LOGPROBS = 20;

/**
 * Floor of a reported log-probability: a token whose logit is -inf or NaN
 * has probability 0, whose log JSON cannot carry. Finite logits never reach
 * it (float32 logits differ by far less than 9999 nats in practice).
 */
export const LOGPROB_FLOOR = -9999;

export interface TopLogprob {
  id: number;
  logprob: number;
}

/** One token's log-probability and the most likely tokens at its position, best first. */
export interface TokenLogprob {
  id: number;
  logprob: number;
  top: TopLogprob[];
}

/** log(sum(exp(row))), NaN entries left out. */
export function logSumExp(row: Float32Array): number {
  let mx = -Infinity;
  for (let i = 0; i < row.length; i++) if (row[i] > mx) mx = row[i];
  if (mx === -Infinity || mx === Infinity) return mx;
  let z = 0;
  for (let i = 0; i < row.length; i++) if (row[i] === row[i]) z += Math.exp(row[i] - mx);
  return mx + Math.log(z);
}

const logprobOf = (logit: number, lse: number): number => {
  const lp = logit - lse;
  return lp > LOGPROB_FLOOR ? lp : LOGPROB_FLOOR; // also NaN -> the floor
};

/**
 * The `k` most likely ids of a row, best first; ties go to the lower id, as
 * the greedy sampler breaks them, so a greedy token is always the first.
 */
export function topIds(row: Float32Array, k: number): number[] {
  const n = Math.min(k, row.length);
  const best: number[] = [];
  if (n <= 0) return best;
  const value = (id: number) => (row[id] === row[id] ? row[id] : -Infinity);
  for (let id = 0; id < row.length; id++) {
    const v = value(id);
    // Ids arrive in increasing order: an equal value never displaces an earlier id.
    if (best.length === n && !(v > value(best[n - 1]))) continue;
    let at = best.length < n ? best.length : n - 1;
    if (best.length < n) best.push(id);
    while (at > 0 && v > value(best[at - 1])) {
      best[at] = best[at - 1];
      at--;
    }
    best[at] = id;
  }
  return best;
}

/**
 * Token `id`'s log-probability under log-softmax(row), with the `top` most
 * likely tokens'. Tokens of probability 0 (a -inf logit: masked by a
 * structured output's format) are never among the alternatives.
 */
export function tokenLogprob(row: Float32Array, id: number, top: number): TokenLogprob {
  const lse = logSumExp(row);
  return {
    id,
    logprob: logprobOf(row[id], lse),
    top: topIds(row, top)
      .filter((t) => row[t] > Number.NEGATIVE_INFINITY)
      .map((t) => ({ id: t, logprob: logprobOf(row[t], lse) })),
  };
}
