// Benchmark models are generated once and cached outside the repository.
import { existsSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { writeSyntheticModel, type SyntheticOptions } from "../../model/synthetic.ts";

/** The benchmark shape: dim 768, 12 heads, ffn 2048, GPT-2 vocab, loops 8. */
export const BENCH_SHAPE: SyntheticOptions = {
  dim: 768,
  nHeads: 12,
  nKvHeads: 12,
  ffnDim: 2048,
  vocabSize: 50257,
  loops: 8,
  seed: 7,
  maxSeqLen: 4096,
};

/** A deterministic prompt of n token ids, spread over the vocabulary. */
export function promptOf(n: number, vocab: number): Int32Array {
  return Int32Array.from({ length: n }, (_, i) => (i * 7919 + 13) % vocab);
}

export async function benchModel(opts: Partial<SyntheticOptions> = {}): Promise<string> {
  const o = { ...BENCH_SHAPE, ...opts };
  const dir = join(tmpdir(), "loopserve-bench");
  mkdirSync(dir, { recursive: true });
  const name = Object.entries(o)
    .map(([k, v]) => `${k}${v}`)
    .join("-");
  const path = join(dir, `${name}.safetensors`);
  if (!existsSync(path)) {
    console.error(`writing the benchmark model ${path} (once; reused afterwards)`);
    writeSyntheticModel(path, o);
  }
  return path;
}
