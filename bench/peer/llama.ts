// llama.cpp for bench/peer.ts: built from the source bundle the
// node-llama-cpp package ships (never from its prebuilt binaries, never
// through its JavaScript generation loop, which adds ~10 ms a token), once,
// into a cache outside the repository. The package is this directory's own
// dependency (bench/peer/package.json), installed here on first use, so the
// project's install never carries its hundreds of megabytes of binaries.
import { existsSync, mkdirSync, readFileSync, statSync, unlinkSync } from "node:fs";
import { homedir } from "node:os";
import { basename, join } from "node:path";
import { exportGguf } from "../../src/model/gguf.ts";
import { withProgress } from "../../src/progress.ts";
import { CORES, median, PeerBenchError, requireTool, run } from "./system.ts";

const PEER_PACKAGE = import.meta.dir;
export const BUNDLE = join(PEER_PACKAGE, "node_modules", "node-llama-cpp", "llama", "gitRelease.bundle");

/**
 * Installs bench/peer's pinned node-llama-cpp (its lock file, no scripts, no
 * optional prebuilt binaries: only the source bundle is used) when the bundle
 * is missing; a no-op afterwards.
 */
export function ensureLlamaBundle(): void {
  if (existsSync(BUNDLE)) return;
  requireTool("npm", "install Node.js and npm (Debian: apt-get install npm)");
  console.error(
    `bench:peer: installing node-llama-cpp (llama.cpp's source bundle) into ${join(PEER_PACKAGE, "node_modules")}, once (about 60 MB)`,
  );
  run(["npm", "ci", "--prefix", PEER_PACKAGE, "--omit=optional", "--ignore-scripts", "--no-audit", "--no-fund"], {
    stderrToTerminal: true,
  });
  if (!existsSync(BUNDLE)) {
    throw new PeerBenchError(`npm ci --prefix ${PEER_PACKAGE} finished, but ${BUNDLE} is missing`);
  }
}

/** Where llama.cpp builds, exported models and probe binaries live (never the repo). */
export function cacheDir(): string {
  const dir =
    process.env.LOOPSERVE_PEER_CACHE ??
    join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "loopserve-peer");
  mkdirSync(dir, { recursive: true });
  return dir;
}

export interface LlamaTools {
  bench: string;
  quantize: string;
  server: string;
  perplexity: string;
  greedy: string;
  /** llama.cpp's release tag as node-llama-cpp records it, and the commit. */
  version: string;
}

/** build-llama.sh for a variant: the directory of its executables, and llama.cpp's tag and commit. */
function buildLlama(variant: "cpu" | "cuda"): { bin: string; version: string } {
  ensureLlamaBundle();
  const hint = "Debian: apt-get install git cmake build-essential";
  for (const t of ["git", "cmake", "c++", "cc"]) requireTool(t, hint);
  const script = join(import.meta.dir, "build-llama.sh");
  const r = run(["bash", script, BUNDLE, cacheDir(), variant], { stderrToTerminal: true });
  const bin = r.stdout.trim().split("\n").pop() ?? "";
  let tag = "?";
  try {
    tag = JSON.parse(readFileSync(join(BUNDLE, "..", "llama.cpp.info.json"), "utf8")).tag;
  } catch {
    // informational only
  }
  const commit = bin.match(/llama-([0-9a-f]{12})-/)?.[1] ?? "?";
  return { bin, version: `${tag} (${commit})` };
}

/** llama-server built with the CUDA backend for this host's GPU (first time: minutes), and its version. */
export function llamaServerCuda(): { server: string; version: string } {
  const { bin, version } = buildLlama("cuda");
  const server = join(bin, "llama-server");
  if (!existsSync(server)) throw new PeerBenchError(`build-llama.sh reported ${bin}, but ${server} is missing`);
  return { server, version: `${version} CUDA` };
}

/** Builds (first time: 5-10 minutes on 2 cores) or finds the cached llama.cpp tools. */
export function llamaTools(): LlamaTools {
  const { bin, version } = buildLlama("cpu");
  const tools = {
    bench: join(bin, "llama-bench"),
    quantize: join(bin, "llama-quantize"),
    server: join(bin, "llama-server"),
    perplexity: join(bin, "llama-perplexity"),
    greedy: join(bin, "llama-greedy"),
  };
  for (const p of Object.values(tools)) {
    if (!existsSync(p)) throw new PeerBenchError(`build-llama.sh reported ${bin}, but ${p} is missing`);
  }
  return { ...tools, version };
}

/** True when `out` exists and is newer than every input. */
export function fresh(out: string, ...inputs: string[]): boolean {
  if (!existsSync(out)) return false;
  const t = statSync(out).mtimeMs;
  return inputs.every((i) => statSync(i).mtimeMs <= t);
}

/** llama-quantize IN OUT TYPE (cached by modification time). */
/** loopserve's weight formats and the llama.cpp types compared with them. */
export type Format = "fp16" | "int4" | "int2";
export const LLAMA_TYPE: Record<Format, string> = { fp16: "F16", int4: "Q4_0", int2: "Q2_K" };

/** The F16 GGUF of a loopserve fp16 model at a loop depth, exported once into the cache. */
export function ggufF16(fp16: string, loops: number): string {
  const dir = join(cacheDir(), "models");
  mkdirSync(dir, { recursive: true });
  const f16 = join(dir, `${basename(fp16, ".safetensors")}-L${loops}-F16.gguf`);
  if (!fresh(f16, fp16, join(import.meta.dir, "..", "..", "src", "model", "gguf.ts"))) {
    withProgress(`exporting ${f16} (once; reused afterwards)`, process.stderr, (onProgress) => exportGguf(fp16, f16, { loops, onProgress }));
  }
  return f16;
}

/**
 * The GGUF llama.cpp runs for a loopserve fp16 model at a loop depth (the
 * loops unrolled into layers, src/model/gguf.ts), in the llama.cpp type
 * matching `format`; exported and quantized once into the cache.
 */
export function ggufFor(tools: LlamaTools, fp16: string, loops: number, format: Format, log: (s: string) => void = () => {}): string {
  const f16 = ggufF16(fp16, loops);
  if (format === "fp16") return f16;
  const q = `${f16.slice(0, -"F16.gguf".length)}${LLAMA_TYPE[format]}.gguf`;
  if (!fresh(q, f16)) log(`llama-quantize ${q} (once; reused afterwards)`);
  llamaQuantize(tools, f16, q, LLAMA_TYPE[format], CORES);
  return q;
}

export function llamaQuantize(tools: LlamaTools, inGguf: string, outGguf: string, type: string, threads: number): void {
  if (fresh(outGguf, inGguf)) return;
  run([tools.quantize, inGguf, outGguf, type, String(threads)]);
}

/**
 * Weight repacking off, for a llama.cpp that crashes in its repacked (AMX,
 * interleaved Q4_0) kernels: every tensor in the plain CPU buffer. llama-bench
 * has no --no-repack; a tensor override to the CPU buffer type is the same.
 */
export const REPACK_OFF = { bench: ["-ot", ".*=CPU"], perplexity: ["--no-repack"] };

/** A llama.cpp figure and the way it was taken ("" by default, else e.g. "repack off"), or how every way failed. */
export type Survived<T> = { value: T; way: string } | { crashed: string };

/**
 * Runs each way in turn until one succeeds: a tool that crashes (or fails)
 * the default way becomes a marked cell instead of ending the benchmark.
 */
export function firstThatRuns<T>(what: string, ways: [string, () => T][], log: (s: string) => void): Survived<T> {
  const failures: string[] = [];
  for (const [way, go] of ways) {
    try {
      return { value: go(), way };
    } catch (e) {
      if (!(e instanceof PeerBenchError)) throw e;
      const how = /exited with (signal \w+|\d+)/.exec(e.message)?.[1] ?? e.message.split("\n")[0];
      failures.push(`${way || "default"}: ${how}`);
      log(`${what} failed (${way || "default"}: ${how})`);
    }
  }
  return { crashed: failures.join(", ") };
}

export interface LlamaBenchResult {
  tokS: number; // median of the repeats
  samples: number[];
  modelBytes: number;
  cpuS: number;
  wallS: number;
}

/** One llama-bench process running one test: pp (-p tokens -n 0) or tg (-p 0 -n tokens), -t T -r R, JSON output. */
export function llamaBench(
  tools: LlamaTools,
  gguf: string,
  o: { test: "pp" | "tg"; tokens: number; threads: number; repeats: number; extra?: string[] },
): LlamaBenchResult {
  const [p, n] = o.test === "pp" ? [o.tokens, 0] : [0, o.tokens];
  const r = run([
    tools.bench,
    "-m", gguf,
    "-p", String(p),
    "-n", String(n),
    "-t", String(o.threads),
    "-r", String(o.repeats),
    "-o", "json",
    ...(o.extra ?? []),
  ]);
  let rows: { n_prompt: number; n_gen: number; samples_ts: number[]; model_size: number }[];
  try {
    rows = JSON.parse(r.stdout);
  } catch {
    throw new PeerBenchError(`llama-bench printed no JSON for ${gguf}:\n${r.stdout.slice(0, 500)}\n${r.stderr.slice(-500)}`);
  }
  const row = rows.find((x) => x.n_prompt === p && x.n_gen === n);
  if (!row) throw new PeerBenchError(`llama-bench output lacks the ${o.test}${o.tokens} row for ${gguf}`);
  return { tokS: median(row.samples_ts), samples: row.samples_ts, modelBytes: row.model_size, cpuS: r.cpuS, wallS: r.wallS };
}

export interface GreedyResult {
  tokens: number[];
  /** n rows of vocab logits: row k is what token k was chosen from. */
  logits: Float32Array;
}

/** Greedy decoding through libllama on token ids (bench/peer/llama-greedy.cpp). */
export function llamaGreedy(tools: LlamaTools, gguf: string, prompt: number[], n: number, threads: number, vocab: number): GreedyResult {
  const logitsPath = join(cacheDir(), `greedy-${process.pid}.f32`);
  const r = run([tools.greedy, "-m", gguf, "-p", prompt.join(","), "-n", String(n), "-t", String(threads), "-o", logitsPath]);
  const m = /^tokens:((?: \d+)*)$/m.exec(r.stdout);
  if (!m) throw new PeerBenchError(`llama-greedy printed no tokens:\n${r.stdout.slice(0, 300)}`);
  const tokens = m[1].trim().split(" ").map(Number);
  const bytes = readFileSync(logitsPath);
  unlinkSync(logitsPath);
  const logits = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  if (tokens.length !== n || logits.length !== n * vocab) {
    throw new PeerBenchError(`llama-greedy: expected ${n} tokens and ${n * vocab} logits, got ${tokens.length} and ${logits.length}`);
  }
  return { tokens, logits: logits.slice() };
}
