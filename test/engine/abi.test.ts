// The C/TypeScript contract has one source, kernels/loopserve.h (and
// kernels/testing.h for test hooks): the generated modules must be what
// build.ts makes of the headers today, and every constant, list entry and
// struct offset in them must be what the C compiler makes of the same
// headers. The libraries answer the ABI's queries: status names, features.
import { beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { ABI_OUTPUTS, abiModule, readAbi } from "../../build.ts";
import * as abi from "../../src/abi/abi.generated.ts";
import { NativeModel, openKernelLibrary } from "../../src/engine/binding.ts";
import * as testing from "../helpers/abi_testing.generated.ts";
import { ensureLibrary, LIB } from "../helpers/kernels.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";

const ROOT = resolve(import.meta.dir, "../..");
const KERNELS = join(ROOT, "kernels");

describe("generated ABI modules", () => {
  test("are current: regenerating them from the headers gives the committed files", () => {
    for (const { header, out } of ABI_OUTPUTS) expect({ out, text: readFileSync(out, "utf8") }).toEqual({ out, text: abiModule(header) });
  });

  test("hold what the C compiler makes of the headers: every constant, list entry, struct size and offset", () => {
    const { constants, lists, structs } = readAbi(readFileSync(join(KERNELS, "loopserve.h"), "utf8"));
    const tests = readAbi(readFileSync(join(KERNELS, "testing.h"), "utf8")).constants;
    const body: string[] = [];
    for (const name of [...constants.keys(), ...tests.keys()]) body.push(`printf("%s %.17g\\n", "${name}", (double)(${name}));`);
    for (const name of lists.keys()) body.push(`#define P_(id, name) printf("${name} %s\\n", name);`, `${name}(P_)`, "#undef P_");
    for (const [name, layout] of structs) {
      body.push(`printf("${name} size %zu\\n", sizeof(${name}));`);
      for (const field of Object.keys(layout.fields)) body.push(`printf("${name} ${field} %zu\\n", offsetof(${name}, ${field}));`);
    }
    const src = join(testTempDir(), "abi_values.c");
    writeFileSync(src, `#include <stddef.h>\n#include <stdio.h>\n#include "testing.h"\nint main(void) {\n${body.join("\n")}\nreturn 0;\n}\n`);
    const exe = join(testTempDir(), "abi_values");
    const cc = Bun.spawnSync(["gcc", "-std=c11", "-Wall", "-Werror", "-I", KERNELS, src, "-o", exe], { stderr: "pipe" });
    expect(cc.stderr.toString()).toBe("");
    const printed = Bun.spawnSync([exe]).stdout.toString().trim().split("\n");

    const generated = abi as Record<string, unknown>;
    const want: string[] = [];
    for (const name of constants.keys()) want.push(`${name} ${generated[name]}`);
    for (const name of tests.keys()) want.push(`${name} ${(testing as Record<string, unknown>)[name]}`);
    for (const name of lists.keys()) for (const entry of generated[name] as string[]) want.push(`${name} ${entry}`);
    for (const [name, layout] of Object.entries(abi.LS_STRUCTS)) {
      want.push(`${name} size ${layout.size}`);
      for (const [field, f] of Object.entries(layout.fields)) want.push(`${name} ${field} ${f.offset}`);
    }
    // %.17g prints 1e12 as 1000000000000 and 1.0 as 1, as JavaScript does.
    expect(printed).toEqual(want);
    expect(Object.keys(abi.LS_STRUCTS)).toEqual([...structs.keys()]);
  });

  test("the reader refuses what it cannot represent instead of guessing", () => {
    expect(() => readAbi("#define LS_X (1 << 4)\n")).toThrow(/LS_X: \(1 << 4\) is not a plain literal/);
    expect(() => readAbi("enum { LS_A = LS_B };\n")).toThrow(/LS_A: LS_B is not a plain literal/);
    expect(() => readAbi("typedef struct { char *p; } ls_x;\n")).toThrow(/struct ls_x: cannot lay out/);
  });
});

describe("the libraries answer the ABI's queries", () => {
  beforeAll(() => ensureLibrary());

  test("ls_status_str names every status, and only those", () => {
    const lib = openKernelLibrary(LIB);
    const statuses = [abi.LS_OK, abi.LS_ERR_ARG, abi.LS_ERR_FULL, abi.LS_ERR_NOMEM, abi.LS_ERR_STATE, abi.LS_ERR_UNSUPPORTED];
    const names = statuses.map((s) => String(lib.ls_status_str(s)));
    expect(names).toEqual(["ok", "invalid argument", "session is full", "out of memory", "invalid session state", "not supported by this kernel library"]);
    expect(String(lib.ls_status_str(-6))).toBe("unknown status");
    expect(String(lib.ls_status_str(1))).toBe("unknown status");
  });

  test("the CPU library has every feature; the CUDA library, where built, opens with the same binding and reports its own", () => {
    expect(openKernelLibrary(LIB).ls_features()).toBe(
      abi.LS_FEATURE_SPECULATIVE | abi.LS_FEATURE_PROFILE | abi.LS_FEATURE_KV_COMPRESSED | abi.LS_FEATURE_STACKS | abi.LS_FEATURE_QUANTIZED | abi.LS_FEATURE_TOKEN_MASK | abi.LS_FEATURE_QUANTIZE | abi.LS_FEATURE_RECURRENT,
    );
    const cuda = join(ROOT, "build", "libloopserve_cuda.so");
    if (!existsSync(cuda)) return; // built only where nvcc is
    const lib = openKernelLibrary(cuda); // every ABI symbol resolves, or dlopen throws
    expect(lib.ls_abi_version()).toBe(abi.LS_ABI_VERSION);
    // quantized weights and stacks passed a validation run on a GPU (bench/gpu-runs/); the rest it lacks
    expect(lib.ls_features()).toBe(abi.LS_FEATURE_STACKS | abi.LS_FEATURE_QUANTIZED);
  });

  test("the CPU library has no device memory to report (the server's cache budget then comes from RAM)", () => {
    const m = NativeModel.load(LIB, tinyModelPath(), 1, "auto");
    try {
      expect(m.deviceMemory()).toBeNull();
    } finally {
      m.close();
    }
  });

  test("a library of another ABI version is refused by its version, even when it lacks this version's symbols", () => {
    const dir = testTempDir();
    const src = join(dir, "old_abi.c");
    const so = join(dir, "libold_abi.so");
    writeFileSync(src, `int ls_abi_version(void) { return ${abi.LS_ABI_VERSION - 1}; }\n`);
    const cc = Bun.spawnSync(["cc", "-shared", "-fPIC", "-o", so, src]);
    expect(cc.exitCode).toBe(0);
    expect(() => openKernelLibrary(so)).toThrow(`ABI version ${abi.LS_ABI_VERSION - 1}, expected ${abi.LS_ABI_VERSION}`);
  });
});
