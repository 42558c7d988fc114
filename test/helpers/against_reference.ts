// The kernels held to the float64 reference: every position's logits, and
// greedy decoding traced token by token by both the same way, so the two
// traces compare entry by entry.
import { expect } from "bun:test";
import type { NativeModel, NativeSession } from "../../src/engine/binding.ts";
import { type ExitPlan, GREEDY } from "../../src/engine/types.ts";
import type { SyntheticOptions } from "../../src/model/synthetic.ts";
import { argmax, ReferenceModel, type ReferenceSession, relErr } from "../reference/forward.ts";
import { feedInCalls, withModel, withSession } from "./kernels.ts";
import { tinyModelPath } from "./models.ts";

/** The tiny model of `opts` loaded by the kernels (two threads, the best SIMD path) and by the reference. */
export function withModelAndReference<T>(opts: Partial<SyntheticOptions>, fn: (m: NativeModel, ref: ReferenceModel) => T): T {
  const path = tinyModelPath(opts);
  const ref = ReferenceModel.load(path);
  return withModel(path, 2, "auto", (m) => fn(m, ref));
}

/** Every position's logits at each depth within `tol` of the reference's, the tokens fed in calls of 1, 7 and 32. */
export function expectPositionsAsReference(m: NativeModel, ref: ReferenceModel, tokens: number[], depths: number[], tol: number): void {
  for (const loops of depths) {
    const got = withSession(m, tokens.length, loops, 0, (s) => feedInCalls(s, tokens, loops, [1, 7, 32], m.info.vocabSize));
    const rs = ref.session(loops);
    tokens.forEach((t, i) => expect(relErr(got[i], rs.feed(t)), `steps ${loops}, position ${i}`).toBeLessThan(tol));
  }
}

/** The tokens drawn, the logits each was drawn from, and the steps each ran. */
export interface GreedyTrace {
  tokens: number[];
  logits: Float32Array<ArrayBufferLike>[];
  steps: number[];
}

/** n tokens after the prompt from a fresh session, one step call per token; token i runs under exitFor(i). */
export function nativeGreedy(
  s: NativeSession,
  vocab: number,
  prompt: number[],
  loops: number,
  n: number,
  exitFor: (i: number) => ExitPlan | undefined,
): GreedyTrace {
  const out: GreedyTrace = { tokens: [], logits: [], steps: [] };
  let feed = prompt;
  while (out.tokens.length < n) {
    const logits = new Float32Array(vocab);
    const t = s.step(Int32Array.from(feed), loops, GREEDY, logits, exitFor(out.tokens.length));
    out.tokens.push(t);
    out.logits.push(logits);
    out.steps.push(s.lastSteps);
    feed = [t];
  }
  return out;
}

/** n tokens from the reference session whose last feed returned `logits`, each drawn token fed back under `exit`. */
export function referenceGreedy(s: ReferenceSession, logits: Float32Array<ArrayBufferLike>, n: number, exit?: ExitPlan): GreedyTrace {
  const out: GreedyTrace = { tokens: [], logits: [], steps: [] };
  while (out.tokens.length < n) {
    const t = argmax(logits);
    out.tokens.push(t);
    out.logits.push(logits);
    out.steps.push(s.lastSteps);
    if (out.tokens.length < n) logits = s.feed(t, exit);
  }
  return out;
}

/** The kernels' trace is the reference's: the same steps and tokens, each token's logits within `tol` (max|c - r| / max|r|). */
export function expectSameTrace(got: GreedyTrace, want: GreedyTrace, what: string, tol: number): void {
  expect(got.steps, what).toEqual(want.steps);
  expect(got.tokens, what).toEqual(want.tokens);
  got.logits.forEach((l, i) => expect(relErr(l, want.logits[i]), `${what}, token ${i}`).toBeLessThan(tol));
}
