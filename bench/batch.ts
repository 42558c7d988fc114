// `bun bench/batch.ts`: what one ls_batch_step call is worth against the
// same sessions stepped in turn, on any kernel library of this ABI: N
// sessions, each holding its own prompt, decode one token per step,
// greedy, either as one batched call of N rows or as N ls_session_step
// calls. The two modes alternate within each round; the table gives
// medians of the rounds and their ratio.
//
//   bun bench/batch.ts [--lib build/libloopserve_cuda.so] [--threads 2]
//                      [--rows 1,8,16,64] [--loops 8] [--steps 32] [--rounds 3]
//                      [--dim 768 | --model FILE]
//
// The model is the benchmark shape (src/cli/bench/models.ts) unless --dim names
// another width (heads of 64, ffn 8/3 of dim, GPT-2 vocabulary) or --model
// a model file (a quantized one, say).
import { kernelLibrary } from "../src/cli/bench/engine.ts";
import { benchModel, promptOf } from "../src/cli/bench/models.ts";
import { median, printTable, type Row } from "../src/cli/bench/table.ts";
import { type BatchRow, NativeModel, type NativeSession } from "../src/engine/binding.ts";
import { GREEDY } from "../src/engine/types.ts";
import { benchOptions, positiveInt, positiveInts, THREADS_AND_ROUNDS } from "./options.ts";
import { writeJson } from "./report.ts";

const PROMPT = 64;

const values = benchOptions({
  lib: { type: "string" },
  ...THREADS_AND_ROUNDS,
  rows: { type: "string", default: "1,8,16,64" },
  loops: { type: "string", default: "8" },
  steps: { type: "string", default: "32" },
  dim: { type: "string" },
  model: { type: "string" },
});
const lib = values.lib ?? kernelLibrary();
const [threads, loops, steps, rounds] = (["threads", "loops", "steps", "rounds"] as const).map((name) => positiveInt(name, values[name]));
const dim = values.dim ? positiveInt("dim", values.dim) : undefined;
const modelPath = values.model ?? (await benchModel(dim ? { dim, nHeads: dim / 64, nKvHeads: dim / 64, ffnDim: Math.round((dim * 8) / 3 / 64) * 64 } : {}));

const model = NativeModel.load(lib, modelPath, threads, "auto");

/** n sessions, each prefilled with its own prompt; returns them and their next input tokens. */
function prefilled(n: number): { sessions: NativeSession[]; next: Int32Array } {
  const sessions: NativeSession[] = [];
  const next = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    const s = model.newSession(PROMPT + steps + 1, loops, 0);
    const prompt = promptOf(PROMPT + i, model.info.vocabSize).subarray(i);
    next[i] = s.step(prompt, loops, GREEDY);
    sessions.push(s);
  }
  return { sessions, next };
}

/** Seconds for `steps` decode steps of n sessions, batched or in turn; also the tokens drawn, to compare. */
function decode(n: number, batched: boolean): { seconds: number; tokens: number[] } {
  const { sessions, next } = prefilled(n);
  const tokens: number[] = [];
  const t0 = performance.now();
  for (let k = 0; k < steps; k++) {
    if (batched) {
      const rows: BatchRow[] = sessions.map((session, i) => ({ session, tokens: next.subarray(i, i + 1), loops, sampling: GREEDY }));
      next.set(model.batchStep(rows));
    } else {
      sessions.forEach((s, i) => {
        next[i] = s.step(next.subarray(i, i + 1), loops, GREEDY);
      });
    }
    tokens.push(...next);
  }
  const seconds = (performance.now() - t0) / 1000;
  for (const s of sessions) s.close();
  return { seconds, tokens };
}

const table: Row[] = [];
for (const n of positiveInts("rows", values.rows)) {
  const times: Record<"batched" | "turns", number[]> = { batched: [], turns: [] };
  decode(n, true); // warm-up: scratch, caches, clocks
  for (let r = 0; r < rounds; r++) {
    // which mode goes first alternates: whatever the first run of a pair pays, both pay
    const first = decode(n, r % 2 === 0);
    const second = decode(n, r % 2 !== 0);
    const [a, b] = r % 2 === 0 ? [first, second] : [second, first];
    if (a.tokens.join() !== b.tokens.join()) throw new Error(`${n} rows: the batched tokens differ from the tokens stepped in turn`);
    times.batched.push(a.seconds);
    times.turns.push(b.seconds);
  }
  const tokens = n * steps;
  const batched = tokens / median(times.batched);
  const turns = tokens / median(times.turns);
  table.push({ rows: n, "batched tok/s": batched, "in turn tok/s": turns, "batched x": batched / turns });
}
const title = `decode, ${model.info.simd} x${model.info.threads}, ${model.info.quant} dim ${model.info.dim}, loops ${loops}, ${steps} steps after a ${PROMPT}-token prompt`;
printTable(title, table);
console.log(`\nwrote ${writeJson("batch", { library: lib, title, rows: table })}`);
model.close();
