// What the kernel test files share: the library of this checkout, the SIMD
// paths this CPU can run, and the loops that feed a session and compare its
// logits (against the reference, or bit for bit across call splits).
import { expect } from "bun:test";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { type KvCacheSettings, NativeModel, type NativeSession } from "../../src/engine/binding.ts";
import type { SimdChoice } from "../../src/engine/types.ts";

const ROOT = resolve(import.meta.dir, "../..");
export const LIB = join(ROOT, "build", "libloopserve.so");
export const ALL_PATHS: SimdChoice[] = ["portable", "avx2", "avx512"];

/** Builds the library when missing (a bare `bun test`); `npm test` builds it first. */
export function ensureLibrary(): void {
  if (existsSync(LIB)) return;
  const r = Bun.spawnSync([process.execPath, "build.ts", "--lib"], { cwd: ROOT, stdout: "inherit", stderr: "inherit" });
  if (r.exitCode !== 0) throw new Error("bun build.ts --lib failed");
}

/** The SIMD paths this CPU runs; the others must refuse, naming the missing feature. */
export function supportedPaths(probeModel: string): SimdChoice[] {
  ensureLibrary();
  const paths: SimdChoice[] = [];
  for (const simd of ALL_PATHS) {
    try {
      NativeModel.load(LIB, probeModel, 1, simd).close();
      paths.push(simd);
    } catch (e) {
      expect(String((e as Error).message)).toMatch(/requested but the CPU lacks/);
    }
  }
  expect(paths).toContain("portable");
  return paths;
}

/** A deterministic prompt of n ids below vocab. */
export function tokensFor(vocab: number, n: number, salt = 0): number[] {
  return Array.from({ length: n }, (_, i) => (i * 37 + 5 + salt * 11) % vocab);
}

/** max|c - r| / max|r| */
export function relErr(c: ArrayLike<number>, r: ArrayLike<number>): number {
  let d = 0;
  let m = 0;
  for (let i = 0; i < r.length; i++) {
    d = Math.max(d, Math.abs(c[i] - r[i]));
    m = Math.max(m, Math.abs(r[i]));
  }
  return d / m;
}

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
