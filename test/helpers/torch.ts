// Runs the PyTorch package (torch/loopserve_torch) from tests: Debian's
// interpreter, which holds python3-torch and python3-numpy (a `python3`
// earlier on PATH may be another one without them).
import { expect } from "bun:test";
import { resolve } from "node:path";
import { NativeModel } from "../../src/engine/binding.ts";
import { argmax } from "../reference/forward.ts";
import { LIB } from "./kernels.ts";

export const PYTHON = "/usr/bin/python3";
const TORCH_DIR = resolve(import.meta.dir, "../../torch");

/** Runs `python3 ...args` in torch/; returns stdout, throws with stderr on failure. */
export function runPython(args: string[]): string {
  const r = Bun.spawnSync([PYTHON, ...args], {
    cwd: TORCH_DIR,
    env: { ...process.env, OMP_NUM_THREADS: "1" },
    stdout: "pipe",
    stderr: "pipe",
  });
  if (r.exitCode !== 0) throw new Error(`python3 ${args.join(" ")} exited ${r.exitCode}:\n${r.stderr.toString()}`);
  return r.stdout.toString();
}

/** Runs `python3 -m <module> ...args` in torch/. */
export function runPythonModule(module: string, args: string[]): string {
  return runPython(["-m", module, ...args]);
}

/** Runs `python3 -m loopserve_torch.<module> ...args`. */
export function runTorchModule(module: string, args: string[]): string {
  return runPythonModule(`loopserve_torch.${module}`, args);
}

/** Per depth: logits of every prompt position and greedy continuation tokens. */
export type TorchDepthResult = { logits: number[][]; greedy: number[] };

export function torchLogits(model: string, tokens: number[], loops: number[], greedy: number): Record<string, TorchDepthResult> {
  return JSON.parse(
    runTorchModule("crosscheck", ["logits", model, "--tokens", tokens.join(","), "--loops", loops.join(","), "--greedy", String(greedy)]),
  );
}

/** Per depth with early exit (crosscheck logits --exit-threshold): also the exit
 * step (0-based) and the logits of the position that chose each greedy token,
 * and the closest any exit decision came to the threshold (null: none decided). */
export type TorchExitResult = TorchDepthResult & { exit_steps: number[]; greedy_logits: number[][]; margin: number | null };

export function torchExitLogits(model: string, tokens: number[], loops: number[], greedy: number, threshold: number): Record<string, TorchExitResult> {
  return JSON.parse(
    runTorchModule("crosscheck", [
      "logits", model, "--tokens", tokens.join(","), "--loops", loops.join(","), "--greedy", String(greedy), "--exit-threshold", String(threshold),
    ]),
  );
}

// ---- the kernels beside the PyTorch reference (test/torch/*equivalence*) ----

/** The equivalence tests' prompt: ids below 1000, the test models' vocabulary. */
export const EQUIVALENCE_PROMPT = [464, 7, 995, 318, 257, 133, 11, 290, 262, 6, 42, 0, 999, 13, 198, 50];

/** The kernels at a fixed depth: logits of every position of `prompt`, then `greedyTokens` greedy tokens, one forward at a time. */
export function kernelRun(path: string, loops: number, greedyTokens: number, prompt = EQUIVALENCE_PROMPT): { logits: Float32Array[]; greedy: number[] } {
  const m = NativeModel.load(LIB, path, 2, "auto");
  try {
    const vocab = m.info.vocabSize;
    const s = m.newSession(256, loops, 0);
    const all = new Float32Array(prompt.length * vocab);
    s.forward(Int32Array.from(prompt), loops, all, prompt.length);
    const logits = prompt.map((_, i) => all.slice(i * vocab, (i + 1) * vocab));
    const greedy: number[] = [];
    let last = logits[logits.length - 1];
    const out = new Float32Array(vocab);
    while (greedy.length < greedyTokens) {
      const next = argmax(last);
      greedy.push(next);
      s.forward(Int32Array.of(next), loops, out, 1);
      last = out;
    }
    s.close();
    return { logits, greedy };
  } finally {
    m.close();
  }
}

/** Kernel logits within 1e-3 of the PyTorch logits' spread (which must be real: above 1), position by position. */
export function expectClose(label: string, torch: number[][], kernels: Float32Array[]): void {
  let maxAbsDiff = 0;
  let sum = 0;
  let sumSq = 0;
  let n = 0;
  torch.forEach((row, p) => {
    expect(kernels[p].length).toBe(row.length);
    row.forEach((v, i) => {
      maxAbsDiff = Math.max(maxAbsDiff, Math.abs(v - kernels[p][i]));
      sum += v;
      sumSq += v * v;
      n++;
    });
  });
  const spread = Math.sqrt(sumSq / n - (sum / n) ** 2);
  console.log(`${label}: max |Δlogit| ${maxAbsDiff.toExponential(2)}, logit std ${spread.toFixed(2)}`);
  expect(spread).toBeGreaterThan(1);
  expect(maxAbsDiff).toBeLessThan(1e-3 * spread);
}
