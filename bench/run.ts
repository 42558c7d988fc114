// `bun run bench`: every benchmark section, printed as tables and written as
// JSON (bench/results/bench.json). Sections can be picked by name:
//   bun bench/run.ts engine gemm quant kv quality speculative binary
// Figures are quoted as ratios measured side by side in one run: the
// machines are shared and absolute tokens/s move from run to run.
import { measureEngine } from "../src/cli/bench/engine.ts";
import { benchModel } from "../src/cli/bench/models.ts";
import { printTable, type Row } from "../src/cli/bench/table.ts";
import { measureBinary } from "./binary.ts";
import { measureReferenceRatio } from "./engine.ts";
import { measureGemm } from "./gemm.ts";
import { measureKv } from "./kv.ts";
import { measureQuality, QUALITY_TITLES } from "./quality.ts";
import { measureQuant } from "./quant.ts";
import { writeJson } from "./report.ts";
import { measureSpeculative } from "./speculative.ts";

const sections: Record<string, () => Promise<[string, Row[]][]>> = {
  engine: async () => {
    const path = await benchModel();
    return [
      [
        "fp16 engine, dim 768, 12 heads, ffn 2048, vocab 50257, loops 8",
        measureEngine(path, { threads: [1, 2], loops: 8, prefillTokens: 512, decodeTokens: 64 }),
      ],
      ["C kernels vs TypeScript reference (same file, same prompt)", [measureReferenceRatio(path, 8, 4)]],
    ];
  },
  gemm: async () => {
    const g = await measureGemm();
    return [
      ["quantized matmul kernels alone (one thread, group 32, the trained model's shapes): % of the VNNI peak", g.block],
      ["the output head's formats alone (one thread, group 32): time, bytes read per second, % of the VNNI peak", g.head],
    ];
  },
  quant: async () => [["weight formats (2 threads, loops 8): speed, size, quality vs fp16", await measureQuant()]],
  kv: async () => [["KV cache modes × weight formats (2 threads, loops 8): speed, KV bytes, quality vs the fp16 cache", await measureKv({ weights: ["fp16", "int4"] })]],
  quality: async () => {
    const t = await measureQuality();
    return [
      [QUALITY_TITLES.depth, t.depth],
      [QUALITY_TITLES.variants, t.variants],
      [QUALITY_TITLES.generation, t.generation],
      [QUALITY_TITLES.speculative, t.speculative],
    ];
  },
  speculative: async () => [["self-speculative decoding vs plain generate (2 threads, greedy)", await measureSpeculative()]],
  binary: async () => [["single executable", await measureBinary()]],
};

const wanted = process.argv.slice(2);
const unknown = wanted.filter((w) => !(w in sections));
if (unknown.length > 0) {
  console.error(`unknown section(s) ${unknown.join(", ")}; choose from ${Object.keys(sections).join(", ")}`);
  process.exit(2);
}
const results: Record<string, Row[]> = {};
for (const name of wanted.length > 0 ? wanted : Object.keys(sections)) {
  for (const [title, rows] of await sections[name]()) {
    printTable(title, rows);
    results[title] = rows;
  }
}
console.log(`\nwrote ${writeJson("bench", results)}`);
