// bench:peer's command line: the options the header of bench/peer.ts lists,
// and their defaults, which depend on the model measured (--model).
import { BENCH_SHAPE } from "../../src/cli/bench/models.ts";
import type { SyntheticOptions } from "../../src/model/synthetic.ts";
import { type Format, LLAMA_TYPE } from "./llama.ts";
import { PeerBenchError } from "./system.ts";

/** A model bench:peer measures, and the grid it measures it on unless told otherwise. */
export interface PeerModel {
  shape: SyntheticOptions;
  /** What the tables call it. */
  label: string;
  /** Loops (a stack's steps) measured. */
  loops: number[];
  threads: number[];
  formats: Format[];
  prefill: number;
  decode: number;
  /** The side sections on the benchmark model (equivalence, speculative decoding): the default model only. */
  sideSections: boolean;
}

/**
 * bench: the benchmark model (dim 768), every section.
 * dim2048: a dim-2048 GQA block (16 heads over 4, ffn 5632, vocab 50257).
 * ouro: Ouro-1.4B's dimensions (24 layers of dim 2048, 16 heads, ffn 5632,
 * vocab 49152), pre-norm layers with no norm per step or exit gate (what
 * llama.cpp's Llama graph runs, so both engines run the same model), at 1 and
 * 4 steps. Real sizes take 64-token prefills, fewer decode steps, 2 threads.
 */
/** A real size: 2 threads, fp16 and int4, 64-token prefills, the side sections off. */
function realSize(shape: SyntheticOptions, label: string, loops: number[], decode: number): PeerModel {
  return { shape, label, loops, threads: [2], formats: ["fp16", "int4"], prefill: 64, decode, sideSections: false };
}

export const PEER_MODELS: Record<"bench" | "dim2048" | "ouro", PeerModel> = {
  bench: {
    shape: BENCH_SHAPE,
    label: "dim 768 (12 heads, ffn 2048, vocab 50257)",
    loops: [1, 4, 8, 16],
    threads: [1, 2],
    formats: ["fp16", "int4", "int2"],
    prefill: 512,
    decode: 128,
    sideSections: true,
  },
  dim2048: realSize(
    { ...BENCH_SHAPE, dim: 2048, nHeads: 16, nKvHeads: 4, ffnDim: 5632, seed: 1 },
    "dim 2048 (16 heads over 4 kv, ffn 5632, vocab 50257)",
    [1, 8],
    64,
  ),
  ouro: realSize(
    { ...BENCH_SHAPE, dim: 2048, nHeads: 16, nKvHeads: 16, ffnDim: 5632, vocabSize: 49152, nLayers: 24, loops: 4, seed: 1 },
    "Ouro-1.4B-shaped stack (24 layers of dim 2048, ffn 5632, vocab 49152)",
    [1, 4],
    32,
  ),
};
export type PeerModelName = keyof typeof PEER_MODELS;

export interface Options {
  model: PeerModelName;
  threads: number[];
  loops: number[];
  formats: Format[];
  repeats: number;
  rounds: number;
  prefill: number;
  decode: number;
  equivalence: boolean;
  speculative: boolean;
  quality: boolean;
  qualityChunks: number;
  specAhead: number[];
  wait: boolean;
  /** Extra attempts for a pair measured while others used > CONTENDED cores. */
  retries: number;
}

/** Other processes' CPU use (cores) above which a pair is measured again. */
export const CONTENDED = 0.25;

export function parseOptions(argv: string[]): Options {
  const mi = argv.indexOf("--model");
  const model = (mi >= 0 ? argv[mi + 1] : "bench") as PeerModelName;
  if (!(model in PEER_MODELS)) throw new PeerBenchError(`--model: unknown model "${model}" (${Object.keys(PEER_MODELS).join(", ")})`);
  const m = PEER_MODELS[model];
  const o: Options = {
    model,
    threads: m.threads,
    loops: m.loops,
    formats: m.formats,
    repeats: 2,
    rounds: m.sideSections ? 3 : 2,
    prefill: m.prefill,
    decode: m.decode,
    equivalence: m.sideSections,
    speculative: m.sideSections,
    quality: true,
    qualityChunks: 16,
    specAhead: [4, 8],
    wait: true,
    retries: 2,
  };
  const list = (v: string | undefined, name: string) => {
    const xs = (v ?? "").split(",").map(Number);
    if (xs.length === 0 || xs.some((x) => !Number.isInteger(x) || x < 1)) {
      throw new PeerBenchError(`${name} takes a comma-separated list of positive integers, got "${v}"`);
    }
    return xs;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--model") i++;
    else if (a === "--threads") o.threads = list(argv[++i], a);
    else if (a === "--loops") o.loops = list(argv[++i], a);
    else if (a === "--repeats") o.repeats = list(argv[++i], a)[0];
    else if (a === "--rounds") o.rounds = list(argv[++i], a)[0];
    else if (a === "--retries") o.retries = Number(argv[++i]);
    else if (a === "--prefill") o.prefill = list(argv[++i], a)[0];
    else if (a === "--decode") o.decode = list(argv[++i], a)[0];
    else if (a === "--formats") {
      const fs = (argv[++i] ?? "").split(",");
      for (const f of fs) if (!(f in LLAMA_TYPE)) throw new PeerBenchError(`--formats: unknown format "${f}" (fp16, int4, int2)`);
      o.formats = fs as Format[];
    } else if (a === "--no-equivalence") o.equivalence = false;
    else if (a === "--no-speculative") o.speculative = false;
    else if (a === "--no-quality") o.quality = false;
    else if (a === "--quality-chunks") o.qualityChunks = list(argv[++i], a)[0];
    else if (a === "--spec-ahead") o.specAhead = list(argv[++i], a);
    else if (a === "--no-wait") o.wait = false;
    else if (a === "--quick") {
      o.loops = [1, m.shape.loops]; // the model's own depth, where the targets are
      o.rounds = 2;
    } else throw new PeerBenchError(`unknown option ${a} (see the header of bench/peer.ts)`);
  }
  return o;
}
