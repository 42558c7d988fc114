// `loopserve bench`: prefill and decode tokens/s of this build on a model
// file (or a generated benchmark-shape model), at each requested thread count.
import { withProgress } from "../../progress.ts";
import { measureEngine } from "./engine.ts";
import { benchModel } from "./models.ts";
import { printTable } from "./table.ts";

const USAGE = `usage: loopserve bench [--model FILE] [--threads 1,2] [--loops N] [--prefill N] [--decode N]

Measures prefill and decode tokens/s of the CPU kernels. Without --model, a
synthetic model of the benchmark shape (dim 768, 12 heads, ffn 2048, vocab
50257, loops 8) is generated once into the temporary directory.`;

export async function runBench(argv: string[]): Promise<number> {
  const opts: Record<string, string> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "-h" || arg === "--help") {
      console.log(USAGE);
      return 0;
    }
    const m = /^--(model|threads|loops|prefill|decode)(?:=(.*))?$/.exec(arg);
    const value = m?.[2] ?? argv[i + 1];
    if (!m || value === undefined) {
      console.error(`loopserve bench: bad argument '${arg}'\n${USAGE}`);
      return 2;
    }
    if (m[2] === undefined) i++;
    opts[m[1]] = value;
  }
  const int = (name: string, fallback: number) => {
    const v = Number(opts[name] ?? fallback);
    if (!Number.isInteger(v) || v < 1) throw new Error(`--${name} must be a positive integer, got '${opts[name]}'`);
    return v;
  };
  try {
    const threads = (opts.threads ?? "1,2").split(",").map((t) => {
      const n = Number(t);
      if (!Number.isInteger(n) || n < 1) throw new Error(`--threads takes positive integers, got '${opts.threads}'`);
      return n;
    });
    const loops = int("loops", 8);
    const path = opts.model ?? (await benchModel());
    const prefillTokens = int("prefill", 512);
    const decodeTokens = int("decode", 64);
    const rows = withProgress("bench", process.stderr, (onProgress) =>
      measureEngine(path, { threads, loops, prefillTokens, decodeTokens, onProgress }),
    );
    printTable(`engine on ${path}`, rows);
    return 0;
  } catch (e) {
    console.error(`loopserve bench: ${(e as Error).message}`);
    return 1;
  }
}
