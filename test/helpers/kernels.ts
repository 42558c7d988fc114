// What the kernel test files share: the library of this checkout, the SIMD
// paths this CPU can run (the one way every test finds them), and the loops
// that feed a session and compare its logits (against the reference, or bit
// for bit across call splits).
import { expect } from "bun:test";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { type KvCacheSettings, NativeModel, type NativeSession } from "../../src/engine/binding.ts";
import { SIMD_CHOICES, type SimdChoice } from "../../src/engine/types.ts";

const ROOT = resolve(import.meta.dir, "../..");
/** This checkout's build directory (an Engine's buildDir). */
export const BUILD_DIR = join(ROOT, "build");
export const LIB = join(BUILD_DIR, "libloopserve.so");
/** Every SIMD path the CPU kernels have ("auto" picks one of them). */
export const ALL_PATHS = SIMD_CHOICES.filter((simd) => simd !== "auto");

/** Builds the library when missing (a bare `bun test`); `npm test` builds it first. */
export function ensureLibrary(): void {
  if (existsSync(LIB)) return;
  const r = Bun.spawnSync([process.execPath, "build.ts", "--lib"], { cwd: ROOT, stdout: "inherit", stderr: "inherit" });
  if (r.exitCode !== 0) throw new Error("bun build.ts --lib failed");
}

/**
 * The SIMD paths `load` succeeds on (it returns null, or the refusal's text):
 * a path this CPU cannot run must be refused naming the missing feature, and
 * the portable path always runs. `load` may be any loader of a model file:
 * this library's (supportedPaths) or a sanitizer driver's.
 */
export function pathsWhere(load: (simd: SimdChoice) => string | null): SimdChoice[] {
  const paths: SimdChoice[] = [];
  for (const simd of ALL_PATHS) {
    const refusal = load(simd);
    if (refusal === null) paths.push(simd);
    else expect(refusal).toMatch(/requested but the CPU lacks/);
  }
  expect(paths).toContain("portable");
  return paths;
}

/** The SIMD paths this CPU runs, as this checkout's library loads `probeModel`. */
export function supportedPaths(probeModel: string): SimdChoice[] {
  ensureLibrary();
  return pathsWhere((simd) => {
    try {
      NativeModel.load(LIB, probeModel, 1, simd).close();
      return null;
    } catch (e) {
      return String((e as Error).message);
    }
  });
}

/** A deterministic prompt of n ids below vocab. */
export function tokensFor(vocab: number, n: number, salt = 0): number[] {
  return Array.from({ length: n }, (_, i) => (i * 37 + 5 + salt * 11) % vocab);
}

/** max|c - r| / max|r| (the reference module's, shared with the benchmarks). */
export { relErr } from "../reference/forward.ts";

export function withModel<T>(path: string, threads: number, simd: SimdChoice, fn: (m: NativeModel) => T): T {
  const m = NativeModel.load(LIB, path, threads, simd);
  try {
    return fn(m);
  } finally {
    m.close();
  }
}

export function withSession<T>(
  m: NativeModel,
  maxSeq: number,
  loops: number,
  window: number,
  fn: (s: NativeSession) => T,
  kv?: KvCacheSettings,
): T {
  const s = m.newSession(maxSeq, loops, window, kv);
  try {
    return fn(s);
  } finally {
    s.close();
  }
}

/** Every token's logits, the tokens fed in calls of the given sizes (cycled). */
export function feedInCalls(s: NativeSession, tokens: number[], loops: number, sizes: number[], vocab: number): Float32Array[] {
  const out: Float32Array[] = [];
  for (let i = 0, k = 0; i < tokens.length; ) {
    const n = Math.min(sizes[k++ % sizes.length], tokens.length - i);
    const buf = new Float32Array(n * vocab);
    s.forward(Int32Array.from(tokens.slice(i, i + n)), loops, buf, n);
    for (let t = 0; t < n; t++) out.push(buf.slice(t * vocab, (t + 1) * vocab));
    i += n;
  }
  return out;
}

export function expectBitIdentical(a: Float32Array[], b: Float32Array[], what: string): void {
  expect(a.length).toBe(b.length);
  for (let t = 0; t < a.length; t++) {
    const ua = new Uint32Array(a[t].buffer, a[t].byteOffset, a[t].length);
    const ub = new Uint32Array(b[t].buffer, b[t].byteOffset, b[t].length);
    if (ua.length !== ub.length) throw new Error(`${what}: logits of token ${t} differ in length`);
    for (let i = 0; i < ua.length; i++) if (ua[i] !== ub[i]) throw new Error(`${what}: logits of token ${t} differ`);
  }
}
