// A number the kernels share is written down once: every LS_ macro is
// defined in one file of kernels/ (kernels/loopserve.h for the ABI's
// constants, which build.ts also hands to TypeScript), so a second copy
// cannot drift from the first.
import { expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";

const ROOT = resolve(import.meta.dir, "../..");

/** name -> the files that #define it, over C/CUDA sources. */
function macroHomes(files: Map<string, string>): Map<string, string[]> {
  const homes = new Map<string, string[]>();
  for (const [file, text] of files)
    for (const name of new Set([...text.matchAll(/^\s*#\s*define\s+(LS_\w+)/gm)].map((m) => m[1])))
      homes.set(name, [...(homes.get(name) ?? []), file]);
  return homes;
}

const kernelSources = new Map(
  readdirSync(join(ROOT, "kernels"), { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && /\.(c|h|cu|cuh)$/.test(e.name))
    .map((e) => {
      const path = join(e.parentPath, e.name);
      return [relative(ROOT, path), readFileSync(path, "utf8")] as const;
    }),
);

test("every LS_ macro is defined in one file of kernels/", () => {
  const homes = macroHomes(kernelSources);
  expect(homes.get("LS_QUANT_GROUP_MAX")).toEqual(["kernels/loopserve.h"]);
  expect(homes.get("LS_L2_BLOCK_BYTES")).toHaveLength(1);
  expect([...homes].filter(([, files]) => files.length > 1)).toEqual([]);
});

test("the reader counts a file once however often it defines a name, and sees an indented #define", () => {
  const homes = macroHomes(
    new Map([
      ["a.h", "#define LS_X 1\n#ifdef Y\n#  define LS_X 2\n#endif\n#define OTHER 3\n"],
      ["b.c", "  #define LS_X 1\n// #define LS_Z 4 is a comment\n"],
    ]),
  );
  expect(homes).toEqual(new Map([["LS_X", ["a.h", "b.c"]]]));
});
