// The kernels under AddressSanitizer + UndefinedBehaviorSanitizer, for the
// test files that drive them through small C programs in test/c/. Every
// kernel source is compiled once per test process (with the per-file SIMD
// flags of build.ts) and linked with each driver that asks for it.
//
// LS_LOAD_TO_HEAP makes the loader read a model file into an exactly-sized
// heap buffer instead of mapping it: ASan does not track mapped pages, so
// only then is a read past the end of the file reported.
import { existsSync, mkdtempSync, readdirSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import { C_FLAGS, cpuKernelSources, kernelObject, simdFlags } from "../../build.ts";
import { testTempDir } from "./models.ts";

const ROOT = resolve(import.meta.dir, "../..");
const KERNELS = join(ROOT, "kernels");
const FLAGS = [...C_FLAGS, "-O1", "-g", "-pthread", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-DLS_LOAD_TO_HEAP"];

export const SANITIZER_ENV = {
  ...process.env,
  ASAN_OPTIONS: "detect_leaks=1:abort_on_error=0",
  UBSAN_OPTIONS: "halt_on_error=1:print_stacktrace=1",
};
export const SANITIZER_REPORT = /ERROR: (AddressSanitizer|LeakSanitizer)|runtime error|SUMMARY: \w+Sanitizer/;

/** How long the first caller of sanitizedDriver / sanitizedProgram in a
 * process may wait: it compiles every kernel source under the sanitizers,
 * and on two cores quant_avx512.c alone takes about 4 minutes at -O1. A
 * hook cut short kills the compiler, and every sanitized test after it in
 * the process fails with it. */
export const SANITIZED_BUILD_MS = 600_000;

async function compile(args: string[]): Promise<void> {
  const p = Bun.spawn(args, { stdout: "pipe", stderr: "pipe" });
  const [code, err] = await Promise.all([p.exited, new Response(p.stderr).text()]);
  if (code !== 0) throw new Error(`${args.join(" ")}\n${err}`);
}

let kernelObjects: Promise<{ dir: string; objects: string[] }> | null = null;

function sanitizedKernels(): Promise<{ dir: string; objects: string[] }> {
  kernelObjects ??= (async () => {
    const dir = mkdtempSync(join(testTempDir(), "sanitized-"));
    const sources = cpuKernelSources();
    const objects = sources.map((f) => kernelObject(dir, f));
    await Promise.all(
      sources.map((f, i) => compile(["gcc", ...FLAGS, ...simdFlags(f), "-I", KERNELS, "-c", join(KERNELS, f), "-o", objects[i]])),
    );
    return { dir, objects };
  })();
  return kernelObjects;
}

const drivers = new Map<string, Promise<string>>();

/**
 * Builds (once per process) the driver test/c/<name>.c, or the one split
 * into the files of test/c/<name>/, linked with the sanitized kernels;
 * resolves to the executable.
 */
export function sanitizedDriver(name: string): Promise<string> {
  const dir = join(ROOT, "test", "c", name);
  const sources = existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith(".c")).sort().map((f) => join(dir, f)) : [`${dir}.c`];
  return sanitizedProgram(name, sources);
}

/** Builds (once per process) the C sources linked with the sanitized kernels into an executable called name. */
export function sanitizedProgram(name: string, sources: string[]): Promise<string> {
  let exe = drivers.get(name);
  if (!exe) {
    exe = (async () => {
      const { dir, objects } = await sanitizedKernels();
      const out = join(dir, basename(name));
      await compile(["gcc", ...FLAGS, "-I", KERNELS, "-o", out, ...sources, ...objects, "-lm"]);
      return out;
    })();
    drivers.set(name, exe);
  }
  return exe;
}

export interface SanitizedRun {
  code: number;
  stdout: string;
  stderr: string;
}

/** Builds test/c/<name>.c with the given kernel sources under ThreadSanitizer
 * (a race is reported on stderr, and the program then exits non-zero). */
export async function threadSanitizedDriver(name: string, kernelSources: string[]): Promise<string> {
  const out = join(mkdtempSync(join(testTempDir(), "tsan-")), name);
  const sources = [join(ROOT, "test", "c", `${name}.c`), ...kernelSources.map((f) => join(KERNELS, f))];
  await compile(["gcc", ...C_FLAGS, "-O1", "-g", "-pthread", "-fsanitize=thread", "-I", KERNELS, "-o", out, ...sources]);
  return out;
}

/** Runs a sanitized driver; a sanitizer report is always a test failure. */
export function runSanitized(exe: string, args: string[]): SanitizedRun {
  const r = Bun.spawnSync([exe, ...args], { env: SANITIZER_ENV, stdout: "pipe", stderr: "pipe" });
  const out = { code: r.exitCode ?? -1, stdout: r.stdout.toString(), stderr: r.stderr.toString() };
  if (SANITIZER_REPORT.test(out.stderr)) throw new Error(`sanitizer report from ${basename(exe)} ${args.join(" ")}:\n${out.stderr}`);
  return out;
}
