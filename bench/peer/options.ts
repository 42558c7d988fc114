// bench:peer's command line: the options the header of bench/peer.ts lists,
// and their defaults.
import { type Format, LLAMA_TYPE } from "./llama.ts";
import { PeerBenchError } from "./system.ts";

export interface Options {
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
  const o: Options = {
    threads: [1, 2],
    loops: [1, 4, 8, 16],
    formats: ["fp16", "int4", "int2"],
    repeats: 2,
    rounds: 3,
    prefill: 512,
    decode: 128,
    equivalence: true,
    speculative: true,
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
    if (a === "--threads") o.threads = list(argv[++i], a);
    else if (a === "--loops") o.loops = list(argv[++i], a);
    else if (a === "--repeats") o.repeats = list(argv[++i], a)[0];
    else if (a === "--rounds") o.rounds = list(argv[++i], a)[0];
    else if (a === "--retries") o.retries = Number(argv[++i]);
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
      o.loops = [1, 8];
      o.rounds = 2;
    } else throw new PeerBenchError(`unknown option ${a} (see the header of bench/peer.ts)`);
  }
  return o;
}
