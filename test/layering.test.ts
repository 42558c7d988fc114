// The layering the source tree keeps, checked on its import graph (type-only
// imports included: they couple the layers just the same):
// - product code (src/) never imports the benchmarks or the tests;
// - the engine knows nothing of the scheduler (the scheduler states what it
//   needs from an engine; the engine satisfies it);
// - the HTTP layer reaches neither the FFI binding nor the kernel library
//   loader, not even through another module: it sees engine types and errors;
// - no import cycle in src/, neither between files nor between folders (a
//   folder of src/ is one layer: two folders never import each other, even
//   through a third), and no #include cycle in kernels/;
// - no call cycle between the C files of kernels/: a file calls functions
//   defined only in the files below it (runtime.c at the bottom, then the
//   sessions, the forward pass, the step and batch entry points above);
// - no #include points back up the folders of kernels/: a file includes
//   only files of its own folder and of the folders around it, so the
//   shared code (kernels/*) includes no backend file, the CPU and CUDA
//   backends (kernels/cpu/, kernels/cuda/) include none of each other's,
//   and an instruction-set folder of the CPU backend none of another's;
// - no #include points back up the order of the files: a module (a .c and
//   the .h of its name) uses another by including its header or calling its
//   functions, and no module uses itself through others. So a file never
//   includes the header of a file that calls it, nor one that brings its
//   own header back in.
import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { cpuKernelSources } from "../build.ts";

const ROOT = resolve(import.meta.dir, "..");

type Graph = Map<string, string[]>;

function filesUnder(dir: string, ext: RegExp): string[] {
  return readdirSync(join(ROOT, dir), { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && ext.test(e.name))
    .map((e) => relative(ROOT, join(e.parentPath, e.name)))
    .sort();
}

// `import … from "x"` / `export … from "x"` (over several lines too),
// `import "x"` and `import("x")`.
const TS_IMPORT = /^\s*(?:import|export)\b[^;"'`]*?\bfrom\s*["']([^"']+)["']|^\s*import\s*["']([^"']+)["']|\bimport\s*\(\s*["']([^"']+)["']\s*\)/gm;

/** The repository paths a TypeScript source imports (relative specifiers only: packages are not layers). */
function tsImports(file: string, source: string): string[] {
  const out: string[] = [];
  for (const m of source.matchAll(TS_IMPORT)) {
    const spec = m[1] ?? m[2] ?? m[3];
    if (spec.startsWith(".")) out.push(relative(ROOT, resolve(ROOT, dirname(file), spec)));
  }
  return out;
}

function tsGraph(dir: string): Graph {
  return new Map(filesUnder(dir, /\.ts$/).map((f) => [f, tsImports(f, readFileSync(join(ROOT, f), "utf8"))]));
}

/**
 * kernels/: `#include "x"` resolved as the compiler does, next to the
 * including file first, else under dir itself (every kernel build's -I).
 */
function includeGraph(dir: string): Graph {
  const graph: Graph = new Map();
  const resolveInclude = (file: string, name: string) => {
    const beside = relative(ROOT, resolve(ROOT, dirname(file), name));
    return existsSync(join(ROOT, beside)) ? beside : join(dir, name);
  };
  for (const f of filesUnder(dir, /\.(c|h|cu|cuh)$/)) {
    const src = readFileSync(join(ROOT, f), "utf8");
    graph.set(f, [...src.matchAll(/^\s*#\s*include\s*"([^"]+)"/gm)].map((m) => resolveInclude(f, m[1])));
  }
  return graph;
}

/** C source without comments, string and character literals (whose text could read as a call). */
function cCode(source: string): string {
  return source
    .replace(/\/\*[\s\S]*?\*\//g, " ")
    .replace(/\/\/.*$/gm, "")
    .replace(/"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'/g, '""');
}

// A function definition at file scope: at the start of a line, not static
// (a static function cannot be called from another file), its parameter
// list (over several lines too) followed by the opening brace.
const C_DEFINITION = /^(?!static\b)[A-Za-z_][\w \t*]*?\b(\w+)\s*\([^;{}]*\)\s*\{/gm;

/** Which C file calls a function another file defines: file -> the files whose functions it calls. */
function cCallGraph(sources: Map<string, string>): Graph {
  const code = new Map([...sources].map(([file, text]) => [file, cCode(text)]));
  const definedIn = new Map<string, string>();
  for (const [file, text] of code) for (const m of text.matchAll(C_DEFINITION)) definedIn.set(m[1], file);
  const graph: Graph = new Map();
  for (const [file, text] of code) {
    const callees = new Set<string>();
    for (const m of text.matchAll(/\b(\w+)\s*\(/g)) {
      const home = definedIn.get(m[1]);
      if (home !== undefined && home !== file) callees.add(home);
    }
    graph.set(file, [...callees].sort());
  }
  return graph;
}

/**
 * The includes of a file outside its own folder and the folders around it
 * (kernels/cpu/avx2/x.c may include from kernels/cpu/avx2/, kernels/cpu/
 * and kernels/), each as "file -> included".
 */
function includesAcrossFolders(graph: Graph): string[] {
  const out: string[] = [];
  for (const [file, deps] of graph)
    for (const dep of deps) {
      const from = dirname(file);
      const to = dirname(dep);
      if (to !== from && !from.startsWith(`${to}/`)) out.push(`${file} -> ${dep}`);
    }
  return out;
}

/**
 * The modules of kernels/ and which others each uses: a .c and the .h of
 * the same name are one module (a header with no .c of its name is a module
 * of its own), and a module uses another by including its header or by
 * calling a function its .c defines.
 */
function moduleGraph(includes: Graph, calls: Graph): Graph {
  const moduleOf = (file: string) => file.replace(/\.(c|h|cu|cuh)$/, "");
  const modules: Graph = new Map();
  for (const [file, deps] of [...includes, ...calls]) {
    const from = moduleOf(file);
    const to = new Set([...(modules.get(from) ?? []), ...deps.map(moduleOf)]);
    to.delete(from);
    modules.set(from, [...to].sort());
  }
  return modules;
}

/** Every cycle found by a depth-first walk, each as the path that closes it. */
function cycles(graph: Graph): string[][] {
  const found: string[][] = [];
  const state = new Map<string, "open" | "done">();
  const stack: string[] = [];
  const visit = (node: string) => {
    state.set(node, "open");
    stack.push(node);
    for (const next of graph.get(node) ?? []) {
      if (!graph.has(next)) continue;
      if (state.get(next) === "open") found.push([...stack.slice(stack.indexOf(next)), next]);
      else if (!state.has(next)) visit(next);
    }
    stack.pop();
    state.set(node, "done");
  };
  for (const node of graph.keys()) if (!state.has(node)) visit(node);
  return found;
}

/** The import chain from `from` to the first file `bad` accepts, or null. */
function reaches(graph: Graph, from: string, bad: (f: string) => boolean): string[] | null {
  const seen = new Set([from]);
  const queue: string[][] = [[from]];
  while (queue.length > 0) {
    const path = queue.shift() as string[];
    for (const next of graph.get(path.at(-1) as string) ?? []) {
      if (bad(next)) return [...path, next];
      if (seen.has(next)) continue;
      seen.add(next);
      queue.push([...path, next]);
    }
  }
  return null;
}

/**
 * The graph between the layers of a tree: each folder directly under its
 * root stands for every file below it, and each file at the root for itself.
 */
function folderGraph(graph: Graph, root: string): Graph {
  const layer = (file: string) => {
    const parts = relative(root, file).split("/");
    return parts.length > 1 ? join(root, parts[0]) : file;
  };
  const folders: Graph = new Map();
  for (const [file, deps] of graph) {
    const from = layer(file);
    const to = new Set([...(folders.get(from) ?? []), ...deps.filter((d) => graph.has(d)).map(layer)]);
    to.delete(from);
    folders.set(from, [...to].sort());
  }
  return folders;
}

const src = tsGraph("src");
const edges = [...src].flatMap(([file, deps]) => deps.map((dep) => `${file} -> ${dep}`));
const kernels = includeGraph("kernels");
const cpuSources = cpuKernelSources().map((f) => join("kernels", f));
const calls = cCallGraph(new Map(cpuSources.map((f) => [f, readFileSync(join(ROOT, f), "utf8")])));

describe("the import reader", () => {
  test("sees single-line, multi-line, re-export, side-effect and dynamic imports, and no packages", () => {
    const source = [
      'import { a } from "./a.ts";',
      "import {",
      "  type B,",
      "  c,",
      '} from "../b.ts";',
      'import type { D } from "./d.ts";',
      'export { e } from "./e.ts";',
      'import "./f.ts";',
      'const g = await import("./g.ts");',
      'import { Elysia } from "elysia";',
      '// a comment saying from "./h.ts" is no import',
    ].join("\n");
    expect(tsImports("src/x/y.ts", source)).toEqual(["src/x/a.ts", "src/b.ts", "src/x/d.ts", "src/x/e.ts", "src/x/f.ts", "src/x/g.ts"]);
  });

  test("finds the edges the server is wired with", () => {
    expect(edges).toContain("src/http/app.ts -> src/http/compat.ts");
    expect(edges).toContain("src/cli/serve.ts -> src/engine/engine.ts");
    expect(edges).toContain("src/cli/main.ts -> src/cli/serve.ts");
  });
});

describe("layers", () => {
  test("no product file imports the benchmarks or the tests", () => {
    expect(edges.filter((e) => / -> (bench|test)\//.test(e))).toEqual([]);
  });

  test("src/engine imports nothing from src/scheduler", () => {
    expect(edges.filter((e) => /^src\/engine\/.* -> src\/scheduler\//.test(e))).toEqual([]);
  });

  test("src/http reaches neither the FFI binding nor the kernel library loader, directly or through another module", () => {
    const forbidden = new Set(["src/engine/binding.ts", "src/engine/library.ts"]);
    const chains = [...src.keys()]
      .filter((f) => f.startsWith("src/http/"))
      .map((f) => reaches(src, f, (dep) => forbidden.has(dep)))
      .filter((chain) => chain !== null)
      .map((chain) => chain.join(" -> "));
    expect(chains).toEqual([]);
  });

  test("no import cycle in src/", () => {
    expect(cycles(src).map((c) => c.join(" -> "))).toEqual([]);
  });

  test("no import cycle between the folders of src/", () => {
    const folders = folderGraph(src, "src");
    expect(folders.get("src/http")).toContain("src/engine");
    expect(cycles(folders).map((c) => c.join(" -> "))).toEqual([]);
  });

  test("every #include in kernels/ names a file of kernels/", () => {
    const missing = [...kernels].flatMap(([file, deps]) => deps.filter((d) => !kernels.has(d)).map((d) => `${file} -> ${d}`));
    expect(missing).toEqual([]);
  });

  test("no #include cycle in kernels/", () => {
    expect(kernels.get("kernels/cpu/avx2/ops_avx2.c")).toContain("kernels/cpu/ops_simd.h");
    expect(kernels.get("kernels/cuda/cuda_internal.h")).toContain("kernels/internal.h");
    expect(cycles(kernels).map((c) => c.join(" -> "))).toEqual([]);
  });

  test("no call cycle between the C files of kernels/", () => {
    expect(calls.get("kernels/cpu/forward.c")).toContain("kernels/cpu/runtime.c");
    expect(calls.get("kernels/cpu/step.c")).toEqual(expect.arrayContaining(["kernels/cpu/forward.c", "kernels/cpu/batch.c"]));
    expect(cycles(calls).map((c) => c.join(" -> "))).toEqual([]);
  });

  test("a file of kernels/ includes only from its folder and the folders around it: shared code no backend, no backend the other, no instruction-set folder another", () => {
    expect(kernels.get("kernels/cpu/avx2/quant_avx2.c")).toEqual(expect.arrayContaining(["kernels/cpu/quant_pack.h"]));
    expect(kernels.get("kernels/cpu/portable/quant_portable.c")).toContain("kernels/quant.h");
    expect(includesAcrossFolders(kernels)).toEqual([]);
  });

  test("no module of kernels/ uses itself through others: no #include points back up the order of the files", () => {
    const modules = moduleGraph(kernels, calls);
    expect(modules.get("kernels/cpu/forward")).toEqual(expect.arrayContaining(["kernels/cpu/attention", "kernels/cpu/session"]));
    expect(cycles(modules).map((c) => c.join(" -> "))).toEqual([]);
  });

  test("the C call reader sees multi-line definitions and ignores static functions, comments and strings", () => {
    const sources = new Map([
      ["a.c", 'int32_t a_run(int x,\n              int y) {\n    return b_help(x) + quiet(y);\n}\nstatic int quiet(int y) { return y; }\n'],
      ["b.c", 'int b_help(int x) {\n    /* a_run(x) */ puts("a_run(1)");\n    return c_leaf(x);\n}\n'],
      ["c.c", "int c_leaf(int x) { return x; }\nvoid c_back(void) { a_run(1, 2); }\nstatic int quiet(int y) { return -y; }\n"],
    ]);
    const calls = cCallGraph(sources);
    expect(calls).toEqual(
      new Map([
        ["a.c", ["b.c"]],
        ["b.c", ["c.c"]],
        ["c.c", ["a.c"]],
      ]),
    );
    expect(cycles(calls)).toEqual([["a.c", "b.c", "c.c", "a.c"]]);
  });

  test("the cycle and reach checks catch what they look for", () => {
    const g: Graph = new Map([
      ["a", ["b"]],
      ["b", ["c"]],
      ["c", ["a", "d"]],
      ["d", []],
    ]);
    expect(cycles(g)).toEqual([["a", "b", "c", "a"]]);
    expect(reaches(g, "a", (f) => f === "d")).toEqual(["a", "b", "c", "d"]);
    expect(reaches(new Map([["d", []]]), "d", (f) => f === "a")).toBeNull();
  });

  test("the folder check accepts the folders around a file and catches shared code including a backend, a backend the other, a folder another beside or below it", () => {
    const includes: Graph = new Map([
      ["kernels/cpu/avx2/a.c", ["kernels/cpu/avx2/a.h", "kernels/cpu/ops.h", "kernels/internal.h", "kernels/cpu/avx512/b.h"]],
      ["kernels/cpu/session.h", ["kernels/internal.h", "kernels/cpu/avx2/a.h"]],
      ["kernels/cuda/c.cu", ["kernels/internal.h", "kernels/cpu/session.h"]],
      ["kernels/model.c", ["kernels/internal.h", "kernels/cpu/session.h", "kernels/cuda/c.h"]],
    ]);
    expect(includesAcrossFolders(includes)).toEqual([
      "kernels/cpu/avx2/a.c -> kernels/cpu/avx512/b.h",
      "kernels/cpu/session.h -> kernels/cpu/avx2/a.h",
      "kernels/cuda/c.cu -> kernels/cpu/session.h",
      "kernels/model.c -> kernels/cpu/session.h",
      "kernels/model.c -> kernels/cuda/c.h",
    ]);
  });

  test("the module graph sees an include against the calls and a header that brings its includer's own header back", () => {
    // forward.c calls attention.c, whose file includes forward.h: a cycle of
    // modules that neither the include nor the call graph has alone.
    const againstCalls = moduleGraph(
      new Map([
        ["a/forward.c", ["a/forward.h"]],
        ["a/forward.h", []],
        ["a/attention.c", ["a/forward.h"]],
      ]),
      new Map([["a/forward.c", ["a/attention.c"]]]),
    );
    expect(cycles(againstCalls)).toEqual([["a/forward", "a/attention", "a/forward"]]);
    // kvcache.c includes session.h, which includes kvcache.h.
    const ownHeaderBack = moduleGraph(
      new Map([
        ["a/kvcache.c", ["a/kvcache.h", "a/session.h"]],
        ["a/session.h", ["a/kvcache.h"]],
        ["a/kvcache.h", []],
      ]),
      new Map(),
    );
    expect(cycles(ownHeaderBack)).toEqual([["a/kvcache", "a/session", "a/kvcache"]]);
    // A header of plain definitions below both is no cycle.
    const stateBelow = moduleGraph(
      new Map([
        ["a/kvcache.c", ["a/kvcache.h", "a/session_state.h"]],
        ["a/session.h", ["a/session_state.h"]],
        ["a/session.c", ["a/session.h", "a/kvcache.h"]],
      ]),
      new Map([["a/session.c", ["a/kvcache.c"]]]),
    );
    expect(cycles(stateBelow)).toEqual([]);
  });

  test("the folder graph joins a folder's files into one node and sees a cycle no file-level edge closes", () => {
    const files: Graph = new Map([
      ["src/a/x.ts", ["src/b/y.ts"]],
      ["src/b/y.ts", []],
      ["src/b/z.ts", ["src/a/w.ts", "src/top.ts"]],
      ["src/a/w.ts", []],
      ["src/top.ts", []],
    ]);
    expect(cycles(files)).toEqual([]);
    const folders = folderGraph(files, "src");
    expect(folders).toEqual(
      new Map([
        ["src/a", ["src/b"]],
        ["src/b", ["src/a", "src/top.ts"]],
        ["src/top.ts", []],
      ]),
    );
    expect(cycles(folders)).toEqual([["src/a", "src/b", "src/a"]]);
  });
});
