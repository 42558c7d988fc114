// ls_batch_step (kernels/batch.c): many sessions advanced by one call, each
// row's logits and token bit-identical to the same session stepped alone,
// whatever else shares the call: prompts fed in chunks beside decode rows,
// rows of different loop depths, windows, cache modes and sampling, rows
// joining and leaving between calls; on every SIMD path, with 1 and 2
// threads, fp16 and int4 weights. Bad rows are refused before any session
// changes.
import { beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { LS_BATCH_MAX_ROWS, LS_ERR_ARG, LS_ERR_FULL, LS_ERR_STATE } from "../../src/engine/abi.generated.ts";
import { type BatchRow, type KvCacheSettings, NativeError, type NativeModel, type NativeSession, type StepSampling } from "../../src/engine/binding.ts";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import { ensureLibrary, expectBitIdentical, supportedPaths, tokensFor, withModel } from "../helpers/kernels.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";

const VOCAB = 512;
const SHAPE = { vocabSize: VOCAB, loops: 6, seed: 3 };

/** One request as the batch sees it. */
interface Plan {
  prompt: number[];
  loops: number;
  window: number;
  kv: KvCacheSettings;
  sampling: StepSampling;
  maxTokens: number;
  chunk: number; // prompt tokens per call
  arrives: number; // the call it joins at
}

const GREEDY: StepSampling = { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1, seed: 0 };

/** A varied mix: prompt lengths 1..150, depths 1..6, windows, cache modes, greedy and seeded sampling. */
function plans(count: number, salt: number, kvModes: KvCacheSettings[]): Plan[] {
  return Array.from({ length: count }, (_, i) => {
    const r = (k: number) => (i * 7919 + salt * 104729 + k * 31) % 9973;
    const sampled = i % 3 === 1;
    return {
      prompt: tokensFor(VOCAB, 1 + (r(1) % 150), i + salt),
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

interface Trace {
  tokens: number[];
  logits: Float32Array[]; // the logits each sampled token was drawn from
}

function newSession(m: NativeModel, p: Plan): NativeSession {
  return m.newSession(p.prompt.length + p.maxTokens, p.loops, p.window, p.kv);
}

/** The reference: the request alone, one ls_session_step per token. */
function solo(m: NativeModel, p: Plan): Trace {
  const s = newSession(m, p);
  const trace: Trace = { tokens: [], logits: [] };
  try {
    let feed = Int32Array.from(p.prompt);
    while (trace.tokens.length < p.maxTokens) {
      const logits = new Float32Array(VOCAB);
      const { temperature, topK, topP, repetitionPenalty, seed } = p.sampling;
      const t = s.step(feed, p.loops, temperature, topK, topP, repetitionPenalty, seed, logits);
      trace.tokens.push(t);
      trace.logits.push(logits);
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
  const traces: Trace[] = ps.map(() => ({ tokens: [], logits: [] }));
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
        rows.push({ session: sessions[i], tokens: Int32Array.from(tokens), loops: p.loops, sampling: samples ? p.sampling : null, logitsOut: samples ? new Float32Array(VOCAB) : null });
        who.push(i);
      });
      if (rows.length === 0) continue;
      const out = m.batchStep(rows);
      rows.forEach((r, k) => {
        if (!r.sampling) return expect(out[k]).toBe(0);
        traces[who[k]].tokens.push(out[k]);
        traces[who[k]].logits.push(r.logitsOut as Float32Array);
      });
    }
  } finally {
    for (const s of sessions) s.close();
  }
  return traces;
}

function expectSameAsSolo(m: NativeModel, ps: Plan[], what: string): void {
  const together = batched(m, ps);
  ps.forEach((p, i) => {
    const alone = solo(m, p);
    expect(together[i].tokens, `${what}: request ${i} tokens`).toEqual(alone.tokens);
    expectBitIdentical(together[i].logits, alone.logits, `${what}: request ${i}`);
  });
}

beforeAll(ensureLibrary);

describe("a batched step gives every row what it gets alone", () => {
  const FP16: KvCacheSettings = { mode: "fp16" };
  test("16 mixed requests, fp16 weights and cache, every SIMD path, 1 and 2 threads", () => {
    const path = tinyModelPath(SHAPE);
    for (const simd of supportedPaths(path))
      for (const threads of [1, 2]) withModel(path, threads, simd, (m) => expectSameAsSolo(m, plans(16, 1, [FP16]), `${simd} x${threads}`));
  }, 120_000);

  test("int4 weights, and sessions of every cache mode sharing one call", () => {
    const int4 = join(testTempDir(), "batch-int4.safetensors");
    quantizeModelFile(tinyModelPath(SHAPE), int4, { quant: "int4", head: "int8", groupSize: 32 });
    const modes: KvCacheSettings[] = [FP16, { mode: "int8" }, { mode: "int4" }, { mode: "fp16-h" }, { mode: "int8-h", fp16AttnQkv: true }, { mode: "int4-h" }];
    for (const threads of [1, 2]) withModel(int4, threads, "auto", (m) => expectSameAsSolo(m, plans(18, 2, modes), `int4 x${threads}`));
    withModel(tinyModelPath(SHAPE), 2, "auto", (m) => expectSameAsSolo(m, plans(12, 3, modes), "fp16 weights, mixed caches"));
  }, 120_000);

  test("more rows than one block (LS_CHUNK) and a prompt longer than several blocks", () => {
    withModel(tinyModelPath(SHAPE), 2, "auto", (m) => {
      const many = plans(70, 4, [{ mode: "fp16" }]).map((p, i) => ({ ...p, arrives: 0, chunk: i === 5 ? 400 : 1, prompt: i === 5 ? tokensFor(VOCAB, 300, 9) : p.prompt.slice(0, 3) }));
      expectSameAsSolo(m, many, "70 rows");
    });
  }, 120_000);
});

describe("bad rows are refused and nothing changes", () => {
  function expectRefused(m: NativeModel, rows: BatchRow[], code: number, badRow: number): void {
    const before = rows.map((r) => r.session.pos);
    let err: unknown;
    try {
      m.batchStep(rows);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(NativeError);
    expect((err as NativeError).code).toBe(code);
    expect((err as NativeError).message).toContain(`row ${badRow}:`);
    expect(rows.map((r) => r.session.pos)).toEqual(before);
  }

  test("a token outside the vocabulary, too many loops, a full session, a session twice, bad sampling", () => {
    withModel(tinyModelPath(SHAPE), 2, "auto", (m) => {
      const a = m.newSession(8, 2, 0);
      const b = m.newSession(4, 6, 0);
      const row = (session: NativeSession, tokens: number[], over: Partial<BatchRow> = {}): BatchRow => ({ session, tokens: Int32Array.from(tokens), loops: 2, sampling: GREEDY, ...over });
      try {
        expectRefused(m, [row(a, [1, 2]), row(b, [VOCAB])], LS_ERR_ARG, 1);
        expectRefused(m, [row(a, [1]), row(b, [1], { loops: 7 })], LS_ERR_ARG, 1);
        expectRefused(m, [row(a, [1]), row(b, [1, 2, 3, 4, 5])], LS_ERR_FULL, 1);
        expectRefused(m, [row(a, [1]), row(a, [2])], LS_ERR_ARG, 1);
        expectRefused(m, [row(a, [1], { sampling: { ...GREEDY, topP: 2 } })], LS_ERR_ARG, 0);
        // loops beyond what the session's caches hold at its position
        m.batchStep([row(b, [1, 2], { loops: 2 })]);
        expectRefused(m, [row(b, [3], { loops: 3 })], LS_ERR_STATE, 0);
        // a forward-only row ignores its sampling fields, and samples nothing
        expect(m.batchStep([row(a, [1, 2, 3], { sampling: null })])[0]).toBe(0);
        expect(a.pos).toBe(3);
        expect(() => m.batchStep([])).toThrow(NativeError);
        expect(() => m.batchStep(Array.from({ length: LS_BATCH_MAX_ROWS + 1 }, () => row(a, [1])))).toThrow(/1 to 256 rows/);
      } finally {
        a.close();
        b.close();
      }
    });
  });
});
