// `bun bench/structured.ts`: what structured output costs
// (docs/structured-output.md#cost).
//
//   bun bench/structured.ts [--model FILE] [--rows 1,64] [--tokens 24] [--rounds 3]
//                           [--threads 2] [--pipelined] [--compile-only]
//
// Compile: every schema of the committed JSONSchemaBench subset
// (test/grammar/jsonschemabench.json) the server accepts, compiled by the
// grammar engine on this thread (what a new schema blocks the event loop
// for) and through the server's FormatCompiler (a worker's bounded compile
// first, then this thread's: a first request's wait), then asked again
// (cached); medians and the 90th percentile.
//
// Decode: N requests together through the engine (one batched step per
// token), without a format and with a JSON Schema, in alternating rounds;
// tokens per second of each and their ratio. The model is the dim-2048 shape
// (`loopserve model new --dim 2048 --heads 16 --kv-heads 4 --ffn 5632
// --loops 8`, GPT-2's vocabulary) unless --model names a file.
import { join } from "node:path";
import { benchModel, promptOf } from "../src/cli/bench/models.ts";
import { median, printTable, type Row } from "../src/cli/bench/table.ts";
import { Engine } from "../src/engine/engine.ts";
import { GREEDY, type GenerateRequest, type OutputFormat } from "../src/engine/types.ts";
import { GrammarEngine } from "../src/grammar/engine.ts";
import { FormatCompiler } from "../src/grammar/formats.ts";
import { grammarVocabulary } from "../src/grammar/vocabulary.ts";
import { Tokenizer } from "../src/tokenizer/tokenizer.ts";
import suite from "../test/grammar/jsonschemabench.json" with { type: "json" };
import { benchOptions, positiveInt, positiveInts, THREADS_AND_ROUNDS } from "./options.ts";
import { writeJson } from "./report.ts";

const values = benchOptions({
  model: { type: "string" },
  rows: { type: "string", default: "1,64" },
  tokens: { type: "string", default: "24" },
  ...THREADS_AND_ROUNDS,
  pipelined: { type: "boolean", default: false },
  "compile-only": { type: "boolean", default: false },
});
const [tokens, rounds, threads] = (["tokens", "rounds", "threads"] as const).map((name) => positiveInt(name, values[name]));
const EOT = 50256;
const PROMPT = 32;

/**
 * A record-like schema whose first field cannot be complete within the
 * benchmark's tokens (minLength), so both runs decode the same number of
 * tokens a request: a value completed early would end its request and
 * shrink the batch, which is no cost of the masks.
 */
const SCHEMA = {
  type: "object",
  properties: {
    title: { type: "string", minLength: 1000 },
    year: { type: "integer", minimum: 0 },
    tags: { type: "array", items: { type: "string" } },
    authors: { type: "array", items: { type: "object", properties: { name: { type: "string" }, id: { type: "integer", minimum: 0 } }, required: ["name", "id"] } },
  },
  required: ["title", "year", "tags", "authors"],
};

const q = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))];

const tokenizer = await Tokenizer.load();
const accepted = (suite.schemas as { outcome: string; schema: unknown; file: string }[]).filter((c) => c.outcome === "accepted");

// ---- compile ----
const direct: number[] = [];
const grammar = await GrammarEngine.create(grammarVocabulary(tokenizer, [EOT]), 50257, [EOT]);
for (const c of accepted) {
  const t0 = performance.now();
  (await grammar.compile({ kind: "json_schema", schema: JSON.stringify(c.schema), strict: true })).dispose();
  direct.push(performance.now() - t0);
}
const compiler = await FormatCompiler.create(tokenizer, 50257, [EOT], { compileMs: 10_000, cacheSize: 1024 });
const first: number[] = [];
const cached: number[] = [];
for (const c of accepted) {
  const request = { kind: "json_schema", schema: c.schema, strict: true } as const;
  let t0 = performance.now();
  await compiler.format(request);
  first.push(performance.now() - t0);
  t0 = performance.now();
  await compiler.format(request);
  cached.push(performance.now() - t0);
}
const compileRows: Row[] = [
  { what: "compile on the event loop (engine)", schemas: direct.length, "median ms": median(direct).toFixed(1), "p90 ms": q(direct, 0.9).toFixed(1) },
  { what: "first request (worker, then engine)", schemas: first.length, "median ms": median(first).toFixed(1), "p90 ms": q(first, 0.9).toFixed(1) },
  { what: "cached", schemas: cached.length, "median ms": median(cached).toFixed(3), "p90 ms": q(cached, 0.9).toFixed(3) },
];
printTable("schema compile, JSONSchemaBench subset (GPT-2 vocabulary)", compileRows);

// ---- decode ----
const decodeRows: Row[] = [];
if (!values["compile-only"]) {
  const modelPath = values.model ?? (await benchModel({ dim: 2048, nHeads: 16, nKvHeads: 4, ffnDim: 5632, loops: 8, vocabSize: 50257 }));
  const engine = Engine.load({ modelPath, threads, simd: "auto", buildDir: join(import.meta.dir, "..", "build"), pipelineSteps: values.pipelined, prefillChunk: 256 });
  const vocab = engine.info.vocabSize;
  const format: OutputFormat = await compiler.format({ kind: "json_schema", schema: SCHEMA, strict: true });
  const request = (i: number, withFormat: boolean): GenerateRequest => ({
    promptTokens: Array.from(promptOf(PROMPT + i, vocab).subarray(i)),
    maxTokens: tokens,
    loops: 8,
    sampling: GREEDY,
    stopTokenIds: [EOT],
    cacheWindow: 0,
    ...(withFormat ? { format } : {}),
  });
  /** Decode tokens per second of n requests together: from the moment every one has its first token. */
  const perRequest: Record<string, number[]> = { free: [], schema: [] };
  const run = async (n: number, withFormat: boolean): Promise<number> => {
    let firstAt = 0;
    let started = 0;
    let decoded = 0;
    const results = await Promise.all(
      Array.from({ length: n }, (_, i) => {
        let first = true;
        return engine.generate(request(i, withFormat), () => {
          if (first) {
            first = false;
            if (++started === n) firstAt = performance.now();
          } else if (firstAt > 0) decoded++;
        });
      }),
    );
    perRequest[withFormat ? "schema" : "free"].push(...results.map((r) => r.tokens.length));
    return decoded / ((performance.now() - firstAt) / 1000);
  };
  for (const n of positiveInts("rows", values.rows)) {
    const plain: number[] = [];
    const masked: number[] = [];
    for (let r = 0; r < rounds; r++) {
      plain.push(await run(n, false));
      masked.push(await run(n, true));
    }
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
    decodeRows.push({
      rows: n,
      "tok/s free": median(plain).toFixed(2),
      "tok/s with schema": median(masked).toFixed(2),
      ratio: (median(masked) / median(plain)).toFixed(3),
      "tokens a request (free / schema)": `${mean(perRequest.free).toFixed(1)} / ${mean(perRequest.schema).toFixed(1)}`,
    });
    perRequest.free = [];
    perRequest.schema = [];
  }
  engine.close();
  printTable(`decode, dim 2048, loops 8, ${tokens} tokens a request, ${threads} threads${values.pipelined ? ", pipelined steps" : ""}`, decodeRows);
}
compiler.close();
tokenizer.close();
writeJson("structured", { compile: compileRows, decode: decodeRows, pipelined: values.pipelined, threads, tokens });
