// Distribution arithmetic on rows of logits, in float64: what the quality
// figures of the quant, kv and quality sections are made of. The
// log-sum-exp is the service's own (src/engine/logprobs.ts).
import { logSumExp } from "../src/engine/logprobs.ts";

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
