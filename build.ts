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

// C11, and no multiply and add fused into an FMA unless the code asks: the
// quantized kernels' results are defined as separate operations (quant.h),
// the same on every path. (-std=c11 implies it; stated so it stays.)
export const C_FLAGS = ["-std=c11", "-ffp-contract=off"];

const baseFlags = asan
  ? [...C_FLAGS, "-O1", "-g", "-fPIC", "-pthread", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
  : [...C_FLAGS, "-O2", "-fPIC", "-pthread", "-Wall", "-Wextra"];

export function newer(src: string[], out: string): boolean {
  if (!existsSync(out)) return true;
  const t = statSync(out).mtimeMs;
  return src.some((f) => statSync(f).mtimeMs > t);
}

export async function run(cmd: string[]): Promise<void> {
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

// The CUDA library implements the same ABI (kernels/loopserve.h) plus
// ls_cuda_device_count. Loading is not duplicated: the CPU library's loader
// (the descriptor checks of model.c), utilities and sampler objects are linked in,
// and kernels/cuda/*.cu provide the runtime, sessions and forward pass.
// util.c is compiled once more with ls_simd_name renamed, so the CUDA
// library's own ls_simd_name can also name the "cuda" path.
const CUDA_HOST_SOURCES = ["model.c", "sample.c"];
const CUDA_ARCH = [
  "-gencode", "arch=compute_80,code=sm_80",
  "-gencode", "arch=compute_90,code=sm_90",
  "-gencode", "arch=compute_90,code=compute_90", // PTX: JIT-compiled for newer GPUs
];

async function buildCudaLibrary(): Promise<string | null> {
  const cudaDir = join(kernelDir, "cuda");
  if (!existsSync(cudaDir)) return null;
  const sources = readdirSync(cudaDir).filter((f) => f.endsWith(".cu")).sort();
  if (sources.length === 0) return null;
  const nvcc = Bun.which("nvcc") ?? (existsSync("/usr/local/cuda/bin/nvcc") ? "/usr/local/cuda/bin/nvcc" : null);
  if (!nvcc) {
    console.log("nvcc not found: skipping libloopserve_cuda.so (the CPU library serves everywhere)");
    return null;
  }
  const cudaObj = join(objDir, "cuda");
  mkdirSync(cudaObj, { recursive: true });
  const headers = [
    ...readdirSync(kernelDir).filter((f) => f.endsWith(".h")).map((f) => join(kernelDir, f)),
    ...readdirSync(cudaDir).filter((f) => f.endsWith(".h") || f.endsWith(".cuh")).map((f) => join(cudaDir, f)),
  ];
  const objects: string[] = [];
  const jobs: Promise<void>[] = [];
  for (const file of sources) {
    const src = join(cudaDir, file);
    const obj = join(cudaObj, file.replace(/\.cu$/, ".o"));
    objects.push(obj);
    if (newer([src, ...headers], obj))
      jobs.push(run([nvcc, "-O3", "-std=c++17", "-Xcompiler", "-fPIC,-Wall", "-I", kernelDir, ...CUDA_ARCH, "-c", src, "-o", obj]));
  }
  const util = join(cudaObj, "util.o");
  if (newer([join(kernelDir, "util.c"), ...headers], util))
    jobs.push(run(["gcc", ...baseFlags, "-Dls_simd_name=ls_cpu_simd_name", "-c", join(kernelDir, "util.c"), "-o", util]));
  await Promise.all(jobs);
  // The CPU build above has just compiled these with -fPIC.
  const host = CUDA_HOST_SOURCES.map((f) => join(objDir, f.replace(/\.c$/, ".o")));
  const lib = join(buildDir, "libloopserve_cuda.so");
  if (newer([...objects, util, ...host], lib)) {
    // cudart (nvcc's default), libstdc++ and libgcc are linked statically, so
    // the library needs only libc and, to find a GPU, the driver; a host
    // without either still loads it and gets ls_cuda_device_count() == 0.
    // nodelete as for the CPU library (cudart's exit handlers outlive an unload);
    // -z defs: should a linked host file come to need a CPU-only one, the
    // link fails here instead of dlopen failing on a GPU host.
    await run([
      nvcc, "-shared", ...CUDA_ARCH, "-Xcompiler", "-static-libstdc++,-static-libgcc", "-Xlinker", "-z,nodelete,-z,defs",
      "-o", lib, ...objects, util, ...host, "-lm",
    ]);
  }
  return lib;
}

async function buildExecutable(extraLibraries: string[]): Promise<void> {
  mkdirSync(join(root, "dist"), { recursive: true });
  // The libraries are extra entry points: Bun embeds them as files, listed in
  // Bun.embeddedFiles under their own names (--asset-naming), which is where
  // src/engine/library.ts finds them. The tokenizer's WASM and ranks are
  // embedded through src/tokenizer.ts's imports; its pool's worker is an
  // entry point of its own, and --root src puts it beside the main module,
  // where src/tokenizer_pool.ts's URL for it points.
  await run([
    process.execPath, "build", "--compile", "--minify-syntax", "--target=bun-linux-x64-baseline",
    "--asset-naming=[name].[ext]", "--root", join(root, "src"),
    join(root, "src", "cli.ts"), join(root, "src", "tokenizer_worker.ts"), ...extraLibraries,
    "--outfile", join(root, "dist", "loopserve"),
  ]);
}

if (import.meta.main) {
  const lib = await buildCpuLibrary();
  console.log(`built ${lib}`);
  let cuda: string | null = null;
  if (!asan) {
    cuda = await buildCudaLibrary();
    if (cuda) console.log(`built ${cuda}`);
  }
  if (!args.has("--lib") && !asan) {
    await buildExecutable(cuda ? [lib, cuda] : [lib]);
    console.log("built dist/loopserve");
  }
}
