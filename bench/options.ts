// The benchmarks' command lines, read one way: unknown options refused,
// --help listing each option with its default, counts checked to be positive
// whole numbers (a clear message and exit status 2 otherwise).
import { basename } from "node:path";
import { type ParseArgsOptionsConfig, parseArgs } from "node:util";

/** The options most benchmarks take: kernel threads, and the rounds whose median is reported. */
export const THREADS_AND_ROUNDS = {
  threads: { type: "string", default: "2" },
  rounds: { type: "string", default: "3" },
} as const;

/** This run's options as `options` describes them; with --help, their list, and exit. */
export function benchOptions<const T extends ParseArgsOptionsConfig>(options: T) {
  const argv = process.argv.slice(2);
  if (argv.includes("--help") || argv.includes("-h")) {
    console.log(`usage: bun bench/${basename(process.argv[1] ?? "")} [options] (the file's header says what each measures)`);
    for (const [name, o] of Object.entries(options))
      console.log(`  --${name}${o.type === "string" ? " VALUE" : ""}${o.default === undefined ? "" : `  (default ${o.default})`}`);
    process.exit(0);
  }
  try {
    return parseArgs({ args: argv, options, strict: true }).values;
  } catch (e) {
    return refuse((e as Error).message);
  }
}

/** --name's value as a positive whole number. */
export function positiveInt(name: string, raw: string): number {
  const n = Number(raw.trim());
  return Number.isSafeInteger(n) && n >= 1 ? n : refuse(`--${name} must be a positive integer, got ${raw}`);
}

/** --name's value as a comma-separated list of positive whole numbers ("1,8,64"). */
export function positiveInts(name: string, raw: string): number[] {
  return raw.split(",").map((x) => positiveInt(name, x));
}

function refuse(message: string): never {
  console.error(message);
  process.exit(2);
}
