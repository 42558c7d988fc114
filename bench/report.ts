// The benchmarks' rows as JSON under bench/results/, so runs can be compared
// (the text tables come from src/cli/bench/table.ts).
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

export function writeJson(name: string, data: unknown): string {
  const dir = join(import.meta.dir, "results");
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${name}.json`);
  writeFileSync(file, `${JSON.stringify(data, null, 2)}\n`);
  return file;
}
