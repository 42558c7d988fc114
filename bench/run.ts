// `bun run bench`: every benchmark section, printed as tables and written as JSON.
import { measureBinary } from "./binary.ts";
import { measureEngine, measureReferenceRatio } from "./engine.ts";
import { benchModel } from "./models.ts";
import { printTable, writeJson } from "./report.ts";

const path = await benchModel();
const engine = measureEngine(path, { threads: [1, 2], loops: 8, prefillTokens: 512, decodeTokens: 64 });
printTable("fp16 engine, dim 768, 12 heads, ffn 2048, vocab 50257, loops 8", engine);
const reference = measureReferenceRatio(path, 8, 4);
printTable("C kernels vs TypeScript reference (same file, same prompt)", [reference]);
const binary = await measureBinary();
printTable("single executable", binary);
console.log(`\nwrote ${writeJson("bench", { engine, reference, binary })}`);
