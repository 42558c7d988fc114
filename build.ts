// Build: compiles kernels/ into build/libloopserve.so (and kernels/cuda/ into
// build/libloopserve_cuda.so when nvcc is present), then, unless --lib is
// given, compiles the CLI into the single executable dist/loopserve.
//
//   bun build.ts          library + executable
//   bun build.ts --lib    library only (what the tests need)
//   bun build.ts --asan   library instrumented with AddressSanitizer (build/asan/)
import { existsSync, mkdirSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";

const root = import.meta.dir;
const kernelDir = join(root, "kernels");
const args = new Set(process.argv.slice(2));
const asan = args.has("--asan");
const buildDir = join(root, "build", asan ? "asan" : "");
const objDir = join(buildDir, "obj");

// Per-file flags: only the *_avx2.c / *_avx512.c translation units may use
// those instructions; the library picks one at load time (runtime dispatch).
export function simdFlags(file: string): string[] {
  if (file.endsWith("_avx512.c"))
    return ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mf16c", "-mfma"];
  if (file.endsWith("_avx2.c")) return ["-mavx2", "-mfma", "-mf16c"];
  return [];
}

const baseFlags = asan
  ? ["-std=c11", "-O1", "-g", "-fPIC", "-pthread", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
  : ["-std=c11", "-O2", "-fPIC", "-pthread", "-Wall", "-Wextra"];

function newer(src: string[], out: string): boolean {
  if (!existsSync(out)) return true;
  const t = statSync(out).mtimeMs;
  return src.some((f) => statSync(f).mtimeMs > t);
}

async function run(cmd: string[]): Promise<void> {
  const p = Bun.spawn(cmd, { stdout: "inherit", stderr: "inherit" });
  if ((await p.exited) !== 0) throw new Error(`build step failed: ${cmd.join(" ")}`);
}

async function buildCpuLibrary(): Promise<string> {
  mkdirSync(objDir, { recursive: true });
  const headers = readdirSync(kernelDir).filter((f) => f.endsWith(".h")).map((f) => join(kernelDir, f));
  const sources = readdirSync(kernelDir).filter((f) => f.endsWith(".c")).sort();
  const objects: string[] = [];
  const jobs: Promise<void>[] = [];
  for (const file of sources) {
    const src = join(kernelDir, file);
    const obj = join(objDir, file.replace(/\.c$/, ".o"));
    objects.push(obj);
    if (newer([src, ...headers], obj)) jobs.push(run(["gcc", ...baseFlags, ...simdFlags(file), "-c", src, "-o", obj]));
  }
  await Promise.all(jobs);
  const lib = join(buildDir, "libloopserve.so");
  if (newer(objects, lib)) {
    const sanitize = asan ? ["-fsanitize=address,undefined"] : [];
    await run(["gcc", "-shared", "-pthread", ...sanitize, "-Wl,-z,nodelete", "-o", lib, ...objects, "-lm"]);
  }
  return lib;
}

async function buildCudaLibrary(): Promise<string | null> {
  const cudaDir = join(kernelDir, "cuda");
  if (!existsSync(cudaDir)) return null;
  if (!Bun.which("nvcc")) {
    console.log("nvcc not found: skipping the CUDA library (the CPU library serves everywhere)");
    return null;
  }
  const sources = readdirSync(cudaDir).filter((f) => f.endsWith(".cu")).map((f) => join(cudaDir, f));
  if (sources.length === 0) return null;
  const lib = join(buildDir, "libloopserve_cuda.so");
  const headers = readdirSync(cudaDir).filter((f) => f.endsWith(".h")).map((f) => join(cudaDir, f));
  if (newer([...sources, ...headers], lib)) {
    await run([
      "nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", "-I", kernelDir,
      "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
      "-gencode", "arch=compute_90,code=compute_90", "-o", lib, ...sources,
    ]);
  }
  return lib;
}

async function buildExecutable(): Promise<void> {
  mkdirSync(join(root, "dist"), { recursive: true });
  await run([
    process.execPath, "build", "--compile", "--minify-syntax", "--target=bun-linux-x64-baseline",
    join(root, "src", "cli.ts"), "--outfile", join(root, "dist", "loopserve"),
  ]);
}

if (import.meta.main) {
  const lib = await buildCpuLibrary();
  console.log(`built ${lib}`);
  if (!asan) {
    const cuda = await buildCudaLibrary();
    if (cuda) console.log(`built ${cuda}`);
  }
  if (!args.has("--lib") && !asan) {
    await buildExecutable();
    console.log("built dist/loopserve");
  }
}
