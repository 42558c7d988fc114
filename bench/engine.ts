// The C kernels against the TypeScript reference on the same file, and the
// engine throughput table of the benchmark model (src/cli/bench/engine.ts).
import { kernelLibrary, measureEngine } from "../src/cli/bench/engine.ts";
import { benchModel, promptOf } from "../src/cli/bench/models.ts";
import { printTable, type Row } from "../src/cli/bench/table.ts";
import { NativeModel } from "../src/engine/binding.ts";
import { ReferenceModel } from "../test/reference/forward.ts";

/** C kernels (1 thread) vs the TypeScript reference on the same short prompt. */
export function measureReferenceRatio(modelPath: string, loops: number, tokens: number): Row {
  const prompt = promptOf(tokens, 50257);
  const ref = ReferenceModel.load(modelPath);
  let t = performance.now();
  ref.forward(Array.from(prompt), loops);
  const tsMs = performance.now() - t;
  const model = NativeModel.load(kernelLibrary(), modelPath, 1, "auto");
  const session = model.newSession(tokens, loops, 0);
  const logits = new Float32Array(tokens * model.info.vocabSize);
  t = performance.now();
  session.forward(prompt, loops, logits, tokens);
  const cMs = performance.now() - t;
  session.close();
  model.close();
  return { tokens, loops, "TS ref ms": tsMs, "C ms (1 thread)": cMs, "C speed-up": tsMs / cMs };
}

if (import.meta.main) {
  const path = await benchModel();
  const profile = process.argv.includes("--profile");
  const rows = measureEngine(path, { threads: [1, 2], loops: 8, prefillTokens: 512, decodeTokens: 64, profile });
  printTable("fp16 engine, dim 768, 12 heads, ffn 2048, vocab 50257, loops 8", rows);
  printTable("C kernels vs TypeScript reference", [measureReferenceRatio(path, 8, 4)]);
}
