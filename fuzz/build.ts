// Build of the libFuzzer targets: fuzz/<target>.c linked with every kernel
// source, compiled by clang with libFuzzer, AddressSanitizer and
// UndefinedBehaviorSanitizer (any UB report aborts, so libFuzzer keeps it as
// a crash). The kernels get the library's own flags (build.ts: C_FLAGS and
// the per-file SIMD flags) plus LS_LOAD_TO_HEAP, which makes the loader read
// a model into an exactly-sized heap buffer so ASan sees reads past its end.
//
//   bun fuzz/build.ts     build/fuzz/<target> and its seed corpus build/fuzz/seeds/<target>/
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { C_FLAGS, cpuKernelHeaders, cpuKernelSources, kernelObject, newer, run, simdFlags } from "../build.ts";
import { writeSeedCorpus } from "./corpus.ts";

const ROOT = resolve(import.meta.dir, "..");
const KERNELS = join(ROOT, "kernels");
export const FUZZ_BUILD = join(ROOT, "build", "fuzz");

/** Every libFuzzer target, as fuzz/<name>.c. */
export const TARGETS = ["model_load"] as const;
export type FuzzTarget = (typeof TARGETS)[number];

const SANITIZE = "-fsanitize=address,undefined";
const FLAGS = [...C_FLAGS, "-g", "-pthread", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all", "-DLS_LOAD_TO_HEAP"];

/**
 * -O1 as usual for fuzzing, except the SIMD files: under both sanitizers
 * clang 14 spends minutes optimising quant_avx512.c, and a model the fuzzer
 * makes is so small that their speed does not matter.
 */
const optimisation = (file: string) => (simdFlags(file).length > 0 ? "-O0" : "-O1");

/**
 * Null when clang can build a libFuzzer binary here, else why not (clang
 * missing, or its libFuzzer runtime: Debian's libclang-rt-14-dev).
 */
export async function libFuzzerMissing(): Promise<string | null> {
  if (Bun.which("clang") === null) return "clang is not installed (Debian: apt-get install clang libclang-rt-14-dev)";
  mkdirSync(FUZZ_BUILD, { recursive: true });
  const probe = join(FUZZ_BUILD, "probe.c");
  writeFileSync(probe, "#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n");
  const p = Bun.spawn(["clang", "-fsanitize=fuzzer,address,undefined", probe, "-o", join(FUZZ_BUILD, "probe")], { stdout: "pipe", stderr: "pipe" });
  const [code, err] = await Promise.all([p.exited, new Response(p.stderr).text()]);
  if (code === 0) return null;
  return `clang cannot link a libFuzzer binary (Debian: apt-get install libclang-rt-14-dev): ${err.trim().split("\n").slice(-2).join(" ")}`;
}

/** The kernels compiled with coverage and sanitizers (once; rebuilt when a source or header changes). */
async function kernelObjects(): Promise<string[]> {
  const objDir = join(FUZZ_BUILD, "obj");
  mkdirSync(objDir, { recursive: true });
  const headers = cpuKernelHeaders();
  const sources = cpuKernelSources();
  const objects = sources.map((f) => kernelObject(objDir, f));
  await Promise.all(
    sources.map((f, i) => {
      const src = join(KERNELS, f);
      if (!newer([src, ...headers], objects[i])) return;
      const flags = [optimisation(f), "-fsanitize=fuzzer-no-link", SANITIZE, ...simdFlags(f), "-I", KERNELS];
      return run(["clang", ...FLAGS, ...flags, "-c", src, "-o", objects[i]]);
    }),
  );
  return objects;
}

/** Builds build/fuzz/<target> (libFuzzer main); resolves to its path. */
export async function buildFuzzTarget(target: FuzzTarget): Promise<string> {
  const objects = await kernelObjects();
  const src = join(import.meta.dir, `${target}.c`);
  const exe = join(FUZZ_BUILD, target);
  if (newer([src, ...objects], exe)) {
    await run(["clang", ...FLAGS, "-O1", "-fsanitize=fuzzer", SANITIZE, "-I", KERNELS, src, ...objects, "-lm", "-o", exe]);
  }
  return exe;
}

const SEED_WRITERS: Record<FuzzTarget, (dir: string) => unknown> = { model_load: writeSeedCorpus };

/** The seed corpus of a target, written (afresh) under build/fuzz/seeds/<target>/. */
export function seedCorpus(target: FuzzTarget): string {
  const dir = join(FUZZ_BUILD, "seeds", target);
  SEED_WRITERS[target](dir);
  return dir;
}

/** The libFuzzer dictionary of a target (fuzz/<target>.dict), if it has one. */
export function dictionary(target: FuzzTarget): string | null {
  const path = join(import.meta.dir, `${target}.dict`);
  return existsSync(path) ? path : null;
}

if (import.meta.main) {
  const missing = await libFuzzerMissing();
  if (missing !== null) {
    console.error(missing);
    process.exit(1);
  }
  for (const target of TARGETS) {
    console.log(`built ${await buildFuzzTarget(target)}`);
    console.log(`seeds in ${seedCorpus(target)}`);
  }
}
