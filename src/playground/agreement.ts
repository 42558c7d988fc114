// Token-by-token agreement of one reply with the reference reply (the
// deepest loop depth in the depth explorer): position i agrees when both
// produced the same token id there.

export interface Agreement {
  /** Per position of `tokens`: true where the reference has the same id. */
  same: boolean[];
  /** Positions that agree. */
  matched: number;
  /** Positions compared: the longer of the two replies (a missing token disagrees). */
  compared: number;
  /** First position that disagrees, or null when the replies are identical. */
  firstDivergence: number | null;
}

export function agreement(tokens: readonly number[], reference: readonly number[]): Agreement {
  const same = tokens.map((id, i) => i < reference.length && id === reference[i]);
  const compared = Math.max(tokens.length, reference.length);
  let firstDivergence: number | null = null;
  for (let i = 0; i < compared; i++) {
    if (i >= tokens.length || !same[i]) {
      firstDivergence = i;
      break;
    }
  }
  return { same, matched: same.filter(Boolean).length, compared, firstDivergence };
}
