// Saved fuzz findings: every input that once crashed, hung or broke a
// property is kept under fuzz/regressions/<kind>/ (committed), and
// test/fuzz/regressions.test.ts replays all of them on every test run.
//
//   model_load/  libFuzzer inputs (a model descriptor, then a model file:
//                fuzz/model_load.c) that crashed the library's loader
//                (crash-*, leak-*, timeout-*, oom-*)
//   validator/   model files from the TypeScript validator's property fuzzer
//   requests/    HTTP requests (JSON: method, path, content type, body text)
import { createHash } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";

export const REGRESSIONS_DIR = join(import.meta.dir, "regressions");

export type RegressionKind = "model_load" | "validator" | "requests";

const dirOf = (kind: RegressionKind) => join(REGRESSIONS_DIR, kind);

/** Every saved input of a kind (README.md files excepted), sorted. */
export function regressionFiles(kind: RegressionKind): string[] {
  const dir = dirOf(kind);
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => f !== "README.md" && !f.startsWith("."))
    .sort()
    .map((f) => join(dir, f));
}

/** Saves an input under a name derived from its content (saving it twice keeps one file); returns the path. */
export function saveRegression(kind: RegressionKind, content: Uint8Array | string, extension: string): string {
  const dir = dirOf(kind);
  mkdirSync(dir, { recursive: true });
  const hash = createHash("sha1").update(content).digest("hex").slice(0, 16);
  const path = join(dir, `${hash}${extension}`);
  writeFileSync(path, content);
  return path;
}

/** Copies libFuzzer artifacts (keeping their names: crash-<sha1>, ...) into a kind's directory; returns the copies. */
export function keepArtifacts(kind: RegressionKind, artifacts: string[]): string[] {
  if (artifacts.length === 0) return [];
  const dir = dirOf(kind);
  mkdirSync(dir, { recursive: true });
  return artifacts.map((a) => {
    const path = join(dir, basename(a));
    copyFileSync(a, path);
    return path;
  });
}
