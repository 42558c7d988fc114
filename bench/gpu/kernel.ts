// The kernel-level GPU grid of `bench:serve -- --gpu`: loopserve's batched
// decode through ls_batch_step on the CUDA library (bench/batch.ts), and
// bench/gpu/torch_decode.py's peers of the same block (a PyTorch decode
// captured as one CUDA graph, transformers eager, a device copy for the
// bandwidth). The validation run (bench/gpu/validate.sh) measures the same
// decode through its C driver.
import { readFileSync } from "node:fs";
import { join } from "node:path";

/** Runs a command from the repository root and returns its output (the caller logs and decides on failures). */
export type Shell = (cmd: string[], opts?: { allowFail?: boolean }) => string;

const ROOT = join(import.meta.dir, "..", "..");

/** loopserve's greedy decode of `rows` sessions at `loops`, tokens/s (median of 3 rounds of 64 steps). */
export function kernelDecode(sh: Shell, lib: string, model: string, loops: number, rows: number): number {
  sh([process.execPath, "bench/batch.ts", "--lib", lib, "--model", model, "--loops", String(loops), "--rows", String(rows), "--steps", "64", "--rounds", "3"]);
  const res = JSON.parse(readFileSync(join(ROOT, "bench", "results", "batch.json"), "utf8"));
  return Number(res.rows[0]["batched tok/s"]);
}

export interface PeerCell {
  engine: string;
  loops: number;
  rows: number;
  tok_s: number;
}

/** torch_decode.py on one model: its decode cells, and the copy probe's GB/s (0 when not asked). */
export function torchPeers(sh: Shell, model: string, loops: number, rows: string, which: string): { cells: PeerCell[]; copyGbS: number } {
  const out = sh(["python3", "bench/gpu/torch_decode.py", model, "--loops", String(loops), "--rows", rows, "--peers", which], { allowFail: true });
  const cells: PeerCell[] = [];
  let copyGbS = 0;
  for (const line of out.split("\n")) {
    if (!line.startsWith("{")) continue;
    const r = JSON.parse(line);
    if (r.engine === "device copy") copyGbS = r.gb_s;
    else if (r.tok_s) cells.push({ engine: r.engine, loops: r.loops, rows: r.rows, tok_s: r.tok_s });
  }
  return { cells, copyGbS };
}
