// Tiny synthetic models for tests, written once per process into a temp dir
// and cached by their options.

import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SyntheticOptions, writeSyntheticModel } from "../../src/model/synthetic.ts";

/** The default tiny shape: GQA (4 heads over 2 kv heads), the real GPT-2 vocabulary. */
export const TINY: SyntheticOptions = {
  dim: 64,
  nHeads: 4,
  nKvHeads: 2,
  ffnDim: 128,
  vocabSize: 50257,
  loops: 4,
  seed: 1,
};

let dir: string | null = null;
const cache = new Map<string, string>();
const PREFIX = "loopserve-test-";

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as { code?: string }).code === "EPERM";
  }
}

/**
 * `bun test` fires no "exit" event, so a process cannot reliably delete its
 * own directory: each one is named after its pid, and the next process
 * removes those whose process is gone.
 */
function removeStaleDirs(): void {
  for (const name of readdirSync(tmpdir())) {
    const m = name.startsWith(PREFIX) ? /^(\d+)-/.exec(name.slice(PREFIX.length)) : null;
    if (m === null || Number(m[1]) === process.pid || isAlive(Number(m[1]))) continue;
    rmSync(join(tmpdir(), name), { recursive: true, force: true });
  }
}

/** A temp directory private to this test process (created on first use). */
export function testTempDir(): string {
  if (dir === null) {
    removeStaleDirs();
    const d = mkdtempSync(join(tmpdir(), `${PREFIX}${process.pid}-`));
    dir = d;
    // Fires outside `bun test` (scripts, benchmarks); removeStaleDirs covers the rest.
    process.on("exit", () => rmSync(d, { recursive: true, force: true }));
  }
  return dir;
}

/**
 * Path of a synthetic model with TINY's options overridden by `overrides`;
 * written on the first request for those options, then reused.
 */
export function tinyModelPath(overrides: Partial<SyntheticOptions> = {}): string {
  const opts: SyntheticOptions = { ...TINY, ...overrides };
  // Canonical key: sorted keys, so {a, b} and {b, a} share a file.
  const key = JSON.stringify(Object.fromEntries(Object.entries(opts).sort(([a], [b]) => a.localeCompare(b))));
  let path = cache.get(key);
  if (path === undefined) {
    path = join(testTempDir(), `model-${cache.size}.safetensors`);
    writeSyntheticModel(path, opts);
    cache.set(key, path);
  }
  return path;
}
