// ls_batch_step (kernels/cpu/batch.c): many sessions advanced by one call, each
// row's logits and token bit-identical to the same session stepped alone,
// whatever else shares the call: prompts fed in chunks beside decode rows,
// rows of different loop depths, windows, cache modes and sampling, rows
// joining and leaving between calls; on every SIMD path, with 1 and 2
// threads, fp16 and int4 weights. Bad rows are refused before any session
// changes.
import { beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { LS_BATCH_MAX_ROWS, LS_ERR_ARG, LS_ERR_FULL, LS_ERR_STATE } from "../../src/abi/abi.generated.ts";
import { type BatchRow, type KvCacheSettings, NativeError, type NativeModel, type NativeSession } from "../../src/engine/binding.ts";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import { GREEDY } from "../../src/engine/types.ts";
import { expectSameAsSolo, plans } from "../helpers/batch.ts";
import { ensureLibrary, supportedPaths, tokensFor, withModel } from "../helpers/kernels.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";

const VOCAB = 512;
const SHAPE = { vocabSize: VOCAB, loops: 6, seed: 3 };

beforeAll(ensureLibrary);

describe("a batched step gives every row what it gets alone", () => {
  const FP16: KvCacheSettings = { mode: "fp16" };
  test("16 mixed requests, fp16 weights and cache, every SIMD path, 1 and 2 threads", () => {
    const path = tinyModelPath(SHAPE);
    for (const simd of supportedPaths(path))
      for (const threads of [1, 2]) withModel(path, threads, simd, (m) => expectSameAsSolo(m, plans(VOCAB, 16, 1, [FP16]), `${simd} x${threads}`));
  }, 120_000);

  test("int4 weights, and sessions of every cache mode sharing one call", () => {
    const int4 = join(testTempDir(), "batch-int4.safetensors");
    quantizeModelFile(tinyModelPath(SHAPE), int4, { quant: "int4", head: "int8", groupSize: 32 });
    const modes: KvCacheSettings[] = [FP16, { mode: "int8" }, { mode: "int4" }, { mode: "fp16-h" }, { mode: "int8-h", fp16AttnQkv: true }, { mode: "int4-h" }];
    for (const threads of [1, 2]) withModel(int4, threads, "auto", (m) => expectSameAsSolo(m, plans(VOCAB, 18, 2, modes), `int4 x${threads}`));
    withModel(tinyModelPath(SHAPE), 2, "auto", (m) => expectSameAsSolo(m, plans(VOCAB, 12, 3, modes), "fp16 weights, mixed caches"));
  }, 120_000);

  test("more rows than one block (LS_CHUNK) and a prompt longer than several blocks", () => {
    withModel(tinyModelPath(SHAPE), 2, "auto", (m) => {
      const many = plans(VOCAB, 70, 4, [{ mode: "fp16" }]).map((p, i) => ({ ...p, arrives: 0, chunk: i === 5 ? 400 : 1, prompt: i === 5 ? tokensFor(VOCAB, 300, 9) : p.prompt.slice(0, 3) }));
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
