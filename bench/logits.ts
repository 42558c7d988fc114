// Distribution arithmetic on rows of logits, in float64: what the quality
// figures of the quant, kv and quality sections are made of.

/** log(sum(exp(row))). */
export function logSumExp(row: Float32Array): number {
  let mx = -Infinity;
  for (let i = 0; i < row.length; i++) if (row[i] > mx) mx = row[i];
  let z = 0;
  for (let i = 0; i < row.length; i++) z += Math.exp(row[i] - mx);
  return mx + Math.log(z);
}

/** KL(softmax(p) || softmax(q)), given each row's logSumExp. */
export function klDivergence(p: Float32Array, lseP: number, q: Float32Array, lseQ: number): number {
  let k = 0;
  for (let i = 0; i < p.length; i++) {
    const a = p[i] - lseP;
    k += Math.exp(a) * (a - (q[i] - lseQ));
  }
  return k;
}
