// Requests as a batched step sees them, shared by the CPU and CUDA batch
// tests: a varied plan of prompts, depths, windows and sampling; each
// request run alone (the reference) and all of them through ls_batch_step,
// joining at different calls, prompts fed in chunks beside decode rows.
import { expect } from "bun:test";
import { type BatchRow, type KvCacheSettings, maskWords, type NativeModel, type NativeSession, type RowMask } from "../../src/engine/binding.ts";
import { type ExitPlan, GREEDY, type SamplingParams } from "../../src/engine/types.ts";
import { expectBitIdentical, tokensFor } from "./kernels.ts";

/** One request as the batch sees it. */
export interface Plan {
  prompt: number[];
  loops: number;
  window: number;
  kv: KvCacheSettings;
  sampling: SamplingParams;
  maxTokens: number;
  chunk: number; // prompt tokens per call
  arrives: number; // the call it joins at
  exit?: ExitPlan; // learned early exit of each sampled token (a model with an exit gate)
  mask?: MaskRule; // a token mask on every draw (structured output)
}

/** The token mask of the draw after the generated tokens so far. */
export type MaskRule = (vocab: number, generated: readonly number[]) => Uint32Array;

/** A stand-in for a grammar: about one token in `every` allowed, which ones depending on every token generated before. */
export function hashMask(every: number): MaskRule {
  return (vocab, generated) => {
    const mask = new Uint32Array(maskWords(vocab));
    const h = generated.reduce((a, t) => (a * 31 + t + 7) % 1_000_003, 17);
    for (let t = 0; t < vocab; t++) if ((t * 2_654_435_761 + h * 97) % 4_294_967_291 % every === 0) mask[t >>> 5] |= 1 << (t & 31);
    return mask;
  };
}

/** A batch row's mask from a rule, over the tokens generated so far. */
export function ruleMask(rule: MaskRule, vocab: number, generated: readonly number[]): RowMask {
  return {
    fill: (out) => out.set(rule(vocab, generated)),
    successor: (token) => ruleMask(rule, vocab, [...generated, token]),
  };
}

/** True when the mask allows token t. */
export const allows = (mask: Uint32Array, t: number): boolean => ((mask[t >>> 5] >>> (t & 31)) & 1) === 1;

/** A masked draw's logits: -inf exactly where the mask allows nothing. */
export function expectMaskedLogits(logits: Float32Array, mask: Uint32Array, what: string): void {
  const wrong = [...logits.keys()].filter((t) => (logits[t] === Number.NEGATIVE_INFINITY) === allows(mask, t));
  expect(wrong.slice(0, 5), `${what}: ids whose logit disagrees with the mask`).toEqual([]);
}


/** A varied mix over a vocabulary of `vocab`: prompt lengths 1..150, depths 1..6, windows, cache modes, greedy and seeded sampling. */
export function plans(vocab: number, count: number, salt: number, kvModes: KvCacheSettings[]): Plan[] {
  return Array.from({ length: count }, (_, i) => {
    const r = (k: number) => (i * 7919 + salt * 104729 + k * 31) % 9973;
    const sampled = i % 3 === 1;
    return {
      prompt: tokensFor(vocab, 1 + (r(1) % 150), i + salt),
      loops: 1 + (r(2) % 6),
      window: i % 4 === 3 ? 8 + (r(3) % 20) : 0,
      kv: kvModes[i % kvModes.length],
      sampling: sampled
        ? { temperature: 0.7 + (r(4) % 5) / 10, topK: r(5) % 3 === 0 ? 0 : 40, topP: r(6) % 2 === 0 ? 1 : 0.9, repetitionPenalty: i % 2 ? 1.2 : 1, seed: r(7) }
        : { ...GREEDY, repetitionPenalty: i % 5 === 0 ? 1.3 : 1 },
      maxTokens: 3 + (r(8) % 8),
      chunk: [1, 7, 64, 100, 200][r(9) % 5],
      arrives: r(10) % 6,
    };
  });
}

export interface Trace {
  tokens: number[];
  logits: Float32Array[]; // the logits each sampled token was drawn from
  steps: number[]; // the steps each sampled token's position ran (ls_session_last_steps)
}

function newSession(m: NativeModel, p: Plan): NativeSession {
  return m.newSession(p.prompt.length + p.maxTokens, p.loops, p.window, p.kv);
}

/** The reference: the request alone, one ls_session_step per token (a masked one: a batch of one row). */
function solo(m: NativeModel, p: Plan): Trace {
  const s = newSession(m, p);
  const trace: Trace = { tokens: [], logits: [], steps: [] };
  const vocab = m.info.vocabSize;
  try {
    let feed = Int32Array.from(p.prompt);
    while (trace.tokens.length < p.maxTokens) {
      const logits = new Float32Array(vocab);
      const mask = p.mask && ruleMask(p.mask, vocab, trace.tokens);
      const t = mask
        ? m.batchStep([{ session: s, tokens: feed, loops: p.loops, sampling: p.sampling, logitsOut: logits, exit: p.exit, mask }])[0]
        : s.step(feed, p.loops, p.sampling, logits, p.exit);
      trace.tokens.push(t);
      trace.logits.push(logits);
      trace.steps.push(s.lastSteps);
      feed = Int32Array.of(t);
    }
  } finally {
    s.close();
  }
  return trace;
}

/** Every request through ls_batch_step: each call takes a prompt chunk or the next token of every request that has arrived. */
function batched(m: NativeModel, ps: Plan[]): Trace[] {
  const sessions = ps.map((p) => newSession(m, p));
  const traces: Trace[] = ps.map(() => ({ tokens: [], logits: [], steps: [] }));
  const fed = ps.map(() => 0); // prompt tokens fed so far
  try {
    for (let call = 0; traces.some((t, i) => t.tokens.length < ps[i].maxTokens); call++) {
      const rows: BatchRow[] = [];
      const who: number[] = [];
      ps.forEach((p, i) => {
        if (call < p.arrives || traces[i].tokens.length >= p.maxTokens) return;
        const inPrompt = fed[i] < p.prompt.length;
        const tokens = inPrompt ? p.prompt.slice(fed[i], fed[i] + p.chunk) : [traces[i].tokens.at(-1) as number];
        if (inPrompt) fed[i] += tokens.length;
        const samples = fed[i] === p.prompt.length;
        rows.push({
          session: sessions[i],
          tokens: Int32Array.from(tokens),
          loops: p.loops,
          sampling: samples ? p.sampling : null,
          logitsOut: samples ? new Float32Array(m.info.vocabSize) : null,
          exit: samples ? p.exit : undefined,
          mask: samples && p.mask ? ruleMask(p.mask, m.info.vocabSize, traces[i].tokens) : undefined,
        });
        who.push(i);
      });
      if (rows.length === 0) continue;
      const out = m.batchStep(rows);
      rows.forEach((r, k) => {
        if (!r.sampling) return expect(out[k]).toBe(0);
        traces[who[k]].tokens.push(out[k]);
        traces[who[k]].logits.push(r.logitsOut as Float32Array);
        traces[who[k]].steps.push(r.session.lastSteps);
      });
    }
  } finally {
    for (const s of sessions) s.close();
  }
  return traces;
}

/**
 * Runs ps together through ls_batch_step and each alone: tokens and steps
 * run equal, logits bit for bit; a masked request's tokens are ones its
 * mask allows and its logits are masked. Returns the batched traces.
 */
export function expectSameAsSolo(m: NativeModel, ps: Plan[], what: string): Trace[] {
  const together = batched(m, ps);
  ps.forEach((p, i) => {
    const alone = solo(m, p);
    expect(together[i].tokens, `${what}: request ${i} tokens`).toEqual(alone.tokens);
    expect(together[i].steps, `${what}: request ${i} steps`).toEqual(alone.steps);
    expectBitIdentical(together[i].logits, alone.logits, `${what}: request ${i}`);
    const rule = p.mask;
    if (!rule) return;
    together[i].tokens.forEach((t, k) => {
      const mask = rule(m.info.vocabSize, together[i].tokens.slice(0, k));
      expect(allows(mask, t), `${what}: request ${i} token ${k} is allowed`).toBe(true);
      expectMaskedLogits(together[i].logits[k], mask, `${what}: request ${i} token ${k}`);
    });
  });
  return together;
}
