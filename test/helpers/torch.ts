// Runs the PyTorch package (torch/loopserve_torch) from tests: Debian's
// interpreter, which holds python3-torch and python3-numpy (a `python3`
// earlier on PATH may be another one without them).
import { resolve } from "node:path";

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
