// Build: regenerates the TypeScript ABI constants from kernels/loopserve.h,
// compiles the kernels into build/libloopserve.so (and
// build/libloopserve_cuda.so when nvcc is present), then, unless --lib is
// given, compiles the CLI into the single executable dist/loopserve.
//
// The folders of kernels/ say which file goes into which library:
//   kernels/*        the ABI (loopserve.h, testing.h) and the code both
//                    libraries share: in both;
//   kernels/cpu/**   the CPU backend, its instruction-set folders under it:
//                    libloopserve.so;
//   kernels/cuda/*   the CUDA backend: libloopserve_cuda.so.
// Every kernel build passes -I kernels/: a file names a header beside it by
// its name, any other by its path under kernels/ ("internal.h",
// "cpu/ops.h").
//
//   bun build.ts          library + executable
//   bun build.ts --lib    library only (what the tests need)
//   bun build.ts --asan   library instrumented with AddressSanitizer (build/asan/)
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { basename, dirname, join, relative } from "node:path";

const root = import.meta.dir;
const kernelDir = join(root, "kernels");
const args = new Set(process.argv.slice(2));
const asan = args.has("--asan");
const buildDir = join(root, "build", asan ? "asan" : "");
const objDir = join(buildDir, "obj");

// Per-folder flags: only the files of kernels/cpu/avx2/ and kernels/cpu/avx512/
// may use those instructions; the library picks one path at load time
// (runtime dispatch), and kernels/cpu/portable/ and the shared files are
// built for the baseline CPU.
const ISA_FLAGS: Record<string, string[]> = {
  avx2: ["-mavx2", "-mfma", "-mf16c"],
  avx512: ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mf16c", "-mfma"],
};

export function simdFlags(file: string): string[] {
  return ISA_FLAGS[basename(dirname(file))] ?? [];
}

// The quantized matmul kernels and what they link against, for the
// programs that run them alone (bench gemm), relative to kernels/.
export const QUANT_KERNEL_SOURCES = [
  "cpu/portable/quant_portable.c", "cpu/quant_pack.c", "cpu/avx2/quant_avx2.c", "cpu/avx512/quant_avx512.c", "util.c",
];

/** The files directly in kernels/ with this extension: what both libraries share. */
function sharedKernelFiles(ext: string): string[] {
  return readdirSync(kernelDir).filter((f) => f.endsWith(ext));
}

/** The files of a backend's folder (cpu, cuda) and the folders under it with this extension, relative to kernels/. */
function backendKernelFiles(backend: string, ext: string): string[] {
  const dir = join(kernelDir, backend);
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, encoding: "utf8" }).filter((f) => f.endsWith(ext)).map((f) => join(backend, f));
}

/** The files the CPU library is built from with this extension (the shared ones and the CPU backend's), relative to kernels/. */
function cpuKernelFiles(ext: string): string[] {
  return [...sharedKernelFiles(ext), ...backendKernelFiles("cpu", ext)];
}

/** Every header a CPU kernel source may include. */
export function cpuKernelHeaders(): string[] {
  return cpuKernelFiles(".h").map((f) => join(kernelDir, f));
}

/**
 * The CPU library's C sources, relative to kernels/, in the order they are
 * linked: by file name (unique across the folders, see kernelObject), not
 * path, so that which folder a file sits in does not change the library.
 */
export function cpuKernelSources(): string[] {
  return cpuKernelFiles(".c").sort(byFileName);
}

function byFileName(a: string, b: string): number {
  return basename(a) < basename(b) ? -1 : 1;
}

/** A kernel source's object file in dir, named by the source's file name: the objects of every folder share dir. */
export function kernelObject(dir: string, source: string): string {
  return join(dir, basename(source).replace(/\.c$/, ".o"));
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
  const headers = cpuKernelHeaders();
  const objects: string[] = [];
  const jobs: Promise<void>[] = [];
  for (const file of cpuKernelSources()) {
    const src = join(kernelDir, file);
    const obj = kernelObject(objDir, file);
    objects.push(obj);
    if (newer([src, ...headers], obj))
      jobs.push(run(["gcc", ...baseFlags, ...simdFlags(file), "-I", kernelDir, "-c", src, "-o", obj]));
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
// kernels/cuda/loopserve_cuda.h. Loading is not duplicated: the shared
// sources (kernels/*.c: the loader's descriptor checks in model.c, the
// sampler, the pipeline thread, the utilities) are linked in as the CPU build
// compiled them, and kernels/cuda/*.cu provide the runtime, sessions and
// forward pass. bench/gpu/Makefile builds it, with the rules a bare GPU host
// uses (bench/gpu/validate.sh): its flags are written there once, and the
// build fails on any register spill in a kernel (ptxas -v).
export const GPU_MAKEFILE = join(root, "bench", "gpu", "Makefile");

async function buildCudaLibrary(): Promise<string | null> {
  if (backendKernelFiles("cuda", ".cu").length === 0) return null;
  const nvcc = Bun.which("nvcc") ?? (existsSync("/usr/local/cuda/bin/nvcc") ? "/usr/local/cuda/bin/nvcc" : null);
  if (!nvcc || !Bun.which("make")) {
    console.log(`${nvcc ? "make" : "nvcc"} not found: skipping libloopserve_cuda.so (the CPU library serves everywhere)`);
    return null;
  }
  // The CPU build above has just compiled the shared objects into build/obj/, where the Makefile finds them.
  await run(["make", "--no-print-directory", "-s", "-f", GPU_MAKEFILE, `-j${availableParallelism()}`, `BUILD=${buildDir}`, `NVCC=${nvcc}`, "cuda-lib"]);
  return join(buildDir, "libloopserve_cuda.so");
}

/**
 * The copy of a library the executable embeds: without its symbol table and
 * debug sections (the dynamic symbols the binding opens stay), under the
 * same file name, which is how the executable finds it.
 */
async function strippedForEmbedding(library: string): Promise<string> {
  const strip = Bun.which("strip");
  if (!strip) return library;
  const dir = join(buildDir, "embed");
  mkdirSync(dir, { recursive: true });
  const out = join(dir, basename(library));
  if (newer([library], out)) await run([strip, "--strip-unneeded", "-o", out, library]);
  return out;
}

async function buildExecutable(libraries: string[]): Promise<void> {
  mkdirSync(join(root, "dist"), { recursive: true });
  const extraLibraries = await Promise.all(libraries.map(strippedForEmbedding));
  // The libraries are extra entry points: Bun embeds them as files, listed in
  // Bun.embeddedFiles under their own names (--asset-naming), which is where
  // src/engine/library.ts finds them. The tokenizer's WASM and ranks are
  // embedded through src/tokenizer/tokenizer.ts's imports. Each worker thread's
  // module is an entry point of its own (the tokenizer pool's, the format
  // compiler's), and --root src puts it under its path below src/, where
  // src/worker_url.ts's URL for it points.
  await run([
    process.execPath, "build", "--compile", "--minify-syntax", "--minify-whitespace", "--target=bun-linux-x64-baseline",
    "--asset-naming=[name].[ext]", "--root", join(root, "src"),
    join(root, "src", "cli", "main.ts"), join(root, "src", "tokenizer", "worker.ts"), join(root, "src", "grammar", "compile_worker.ts"), ...extraLibraries,
    "--outfile", join(root, "dist", "loopserve"),
  ]);
}

// ---- ABI constants for TypeScript ----
//
// kernels/loopserve.h is the only copy of every number that crosses the
// C/TypeScript line: status codes, enums, limits, the X(ID, "name") lists
// (tensor slots, profile ops) and the layout of each parameter struct are
// read from it and written to src/abi/abi.generated.ts (and
// kernels/testing.h's test hooks to test/helpers/abi_testing.generated.ts).
// The generated files are committed, so `bun test`, tsc and
// `bun build --compile` see them without a build step; every build rewrites
// them when the header changed, and test/engine/abi_generated.test.ts checks
// that they are current and that the compiler agrees with every value and
// offset. The reader handles the header's own subset of C: #defines and
// enum members with plain literal values, X-macro lists, and typedef'd
// structs of fixed-width fields.

export const ABI_OUTPUTS = [
  { header: join(kernelDir, "loopserve.h"), out: join(root, "src", "abi", "abi.generated.ts") },
  { header: join(kernelDir, "testing.h"), out: join(root, "test", "helpers", "abi_testing.generated.ts") },
];

const SCALARS: Record<string, { size: number; ts: "i32" | "u32" | "f32" | "u64" | "f64" }> = {
  int32_t: { size: 4, ts: "i32" },
  uint32_t: { size: 4, ts: "u32" },
  float: { size: 4, ts: "f32" },
  uint64_t: { size: 8, ts: "u64" },
  double: { size: 8, ts: "f64" },
};
const LITERAL = /^\(?(-?(?:0x[0-9a-f]+|\d+(?:\.\d*)?(?:e[+-]?\d+)?))\)?$/i;

interface StructLayout {
  size: number;
  align: number;
  fields: Record<string, { offset: number; type: string; count: number }>;
}

/** The constants, X-macro lists and struct layouts of a header (see above). */
export function readAbi(text: string): { constants: Map<string, number>; lists: Map<string, string[]>; structs: Map<string, StructLayout> } {
  const src = text
    .replace(/\/\*[\s\S]*?\*\//g, " ")
    .replace(/\/\/.*$/gm, "")
    .replace(/\\\n/g, " ");
  const constants = new Map<string, number>();
  const lists = new Map<string, { id: string; name: string }[]>();
  const helpers = new Map<string, string>(); // X helper macro -> the prefix it pastes
  const literal = (name: string, v: string): number => {
    const m = LITERAL.exec(v.trim());
    if (!m) throw new Error(`${name}: ${v.trim()} is not a plain literal (kernels/loopserve.h keeps its numbers plain for build.ts)`);
    return Number(m[1]);
  };
  for (const line of src.split("\n")) {
    const d = /^\s*#define\s+(LS_\w+)(\([^)]*\))?\s*(.*)$/.exec(line);
    if (!d) continue;
    const [, name, args, body] = d;
    if (args === "(X)") {
      lists.set(name, [...body.matchAll(/X\((\w+),\s*"([^"]*)"\)/g)].map(([, id, n]) => ({ id, name: n })));
    } else if (args) {
      const h = /^(LS_\w+)##id,$/.exec(body.trim());
      if (h) helpers.set(name, h[1]);
    } else if (body.trim() !== "") {
      constants.set(name, literal(name, body));
    }
  }
  for (const [, body] of src.matchAll(/\benum\s*\{([^}]*)\}/g)) {
    let next = 0;
    for (const raw of body.replace(/^\s*#.*$/gm, "").split(/,|\n/)) {
      const item = raw.trim();
      if (item === "") continue;
      const x = /^(LS_\w+)\((\w+)\)$/.exec(item);
      if (x) {
        const entries = lists.get(x[1]);
        const prefix = helpers.get(x[2]);
        if (!entries || !prefix) throw new Error(`enum item ${item}: unknown X-macro list or helper`);
        for (const e of entries) constants.set(`${prefix}${e.id}`, next++);
        continue;
      }
      const m = /^(LS_\w+)(?:\s*=\s*(.+))?$/.exec(item);
      if (!m) throw new Error(`enum item ${item}: expected LS_NAME or LS_NAME = literal`);
      next = m[2] === undefined ? next : literal(m[1], m[2]);
      constants.set(m[1], next++);
    }
  }
  const structs = new Map<string, StructLayout>();
  for (const [, body, name] of src.matchAll(/typedef\s+struct\s*\{([^}]*)\}\s*(\w+)\s*;/g)) {
    const layout: StructLayout = { size: 0, align: 1, fields: {} };
    for (const decl of body.split(";").map((d) => d.trim()).filter(Boolean)) {
      const m = /^(\w+)\s+(.+)$/.exec(decl);
      const type = m?.[1] ?? "";
      const size = SCALARS[type]?.size ?? structs.get(type)?.size;
      const align = SCALARS[type]?.size ?? structs.get(type)?.align;
      if (!m || size === undefined || align === undefined) throw new Error(`struct ${name}: cannot lay out "${decl}"`);
      for (const one of m[2].split(",").map((f) => f.trim())) {
        const a = /^(\w+)(?:\[(\w+)\])?$/.exec(one);
        if (!a) throw new Error(`struct ${name}: cannot lay out field "${one}"`);
        const count = a[2] === undefined ? 1 : /^\d+$/.test(a[2]) ? Number(a[2]) : constants.get(a[2]);
        if (count === undefined) throw new Error(`struct ${name}: unknown array length ${a[2]}`);
        layout.size = Math.ceil(layout.size / align) * align;
        layout.fields[a[1]] = { offset: layout.size, type: SCALARS[type]?.ts ?? type, count };
        layout.size += size * count;
        layout.align = Math.max(layout.align, align);
      }
    }
    layout.size = Math.ceil(layout.size / layout.align) * layout.align;
    structs.set(name, layout);
  }
  return { constants, lists: new Map([...lists].map(([k, v]) => [k, v.map((e) => e.name)])), structs };
}

/** The TypeScript module of a header's ABI (readAbi), as text. */
export function abiModule(headerPath: string): string {
  const { constants, lists, structs } = readAbi(readFileSync(headerPath, "utf8"));
  const rel = relative(root, headerPath);
  const lines = [
    `// Generated by build.ts from ${rel}: do not edit (\`bun build.ts --lib\` rewrites it).`,
    "",
    ...[...constants].map(([name, v]) => `export const ${name} = ${v};`),
  ];
  for (const [name, names] of lists) lines.push("", `/** ${name}: the quoted names, in LS_* order. */`, `export const ${name} = ${JSON.stringify(names, null, 2)} as const;`);
  if (structs.size > 0) {
    lines.push("", "/** Byte layout of each struct: size, and each field's offset, type and element count. */", "export const LS_STRUCTS = {");
    for (const [name, l] of structs) {
      const fields = Object.entries(l.fields).map(([f, d]) => `${f}: { offset: ${d.offset}, type: "${d.type}", count: ${d.count} }`);
      lines.push(`  ${name}: { size: ${l.size}, fields: { ${fields.join(", ")} } },`);
    }
    lines.push("} as const;");
  }
  return `${lines.join("\n")}\n`;
}

/** Rewrites the generated ABI modules whose header changed. */
export function generateAbiModules(): void {
  for (const { header, out } of ABI_OUTPUTS) {
    const text = abiModule(header);
    if (!existsSync(out) || readFileSync(out, "utf8") !== text) {
      writeFileSync(out, text);
      console.log(`generated ${relative(root, out)}`);
    }
  }
}

if (import.meta.main) {
  generateAbiModules();
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
