// Runs the PyTorch package (torch/loopserve_torch) from tests: Debian's
// interpreter, which holds python3-torch and python3-numpy (a `python3`
// earlier on PATH may be another one without them).
import { expect } from "bun:test";
import { resolve } from "node:path";
import { NativeModel } from "../../src/engine/binding.ts";
import type { ExitPlan } from "../../src/engine/types.ts";
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

/** Per depth (`crosscheck logits`): PyTorch in float64 with K and V rounded
 * to fp16 as the cache holds them, decoding greedily token by token: the
 * logits of every prompt position, the greedy tokens, the logits that chose
 * each and their top-2 margins, and the rounding noise (the largest logit
 * change of all those positions when float32-sized nudges decide some of
 * the fp16 roundings of K and V the other way). */
export type TorchDepthResult = {
  logits: number[][];
  greedy: number[];
  greedy_logits: number[][];
  greedy_margins: number[];
  rounding_noise: number;
};

export function torchLogits(model: string, tokens: number[], loops: number[], greedy: number): Record<string, TorchDepthResult> {
  return JSON.parse(
    runTorchModule("crosscheck", ["logits", model, "--tokens", tokens.join(","), "--loops", loops.join(","), "--greedy", String(greedy)]),
  );
}

/** Per depth with early exit (crosscheck logits --exit-threshold --exit-policy): also the exit
 * step (0-based) of the position that chose each greedy token, and the closest
 * any exit decision came to the threshold (null: none decided). */
export type TorchExitResult = TorchDepthResult & { exit_steps: number[]; margin: number | null };

export function torchExitLogits(model: string, tokens: number[], loops: number[], greedy: number, exit: ExitPlan): Record<string, TorchExitResult> {
  return JSON.parse(
    runTorchModule("crosscheck", [
      "logits", model, "--tokens", tokens.join(","), "--loops", loops.join(","), "--greedy", String(greedy),
      "--exit-threshold", String(exit.threshold), "--exit-policy", exit.policy,
    ]),
  );
}

// ---- the kernels beside the PyTorch reference (test/torch/*equivalence*) ----
//
// Why the tolerance below: the kernels compute in float32 and hold K and V in
// fp16. Where a K or V value lies within float32 noise of the midpoint
// between two fp16 values, two float32 evaluations that sum in different
// orders (the kernels' SIMD paths, PyTorch's CPU kernels on another CPU)
// store neighbouring fp16 values, one fp16 ulp (some 10^4 float32 ulps)
// apart. That moves the later layers' values enough to flip more roundings,
// and in a deep stack the flips compound: two correct float32 evaluations of
// a model with sandwich and step norms come to differ by more than 1e-3 × the
// logits' spread after a few steps, and which roundings flip is chaotic, so
// PyTorch's own float32 run is no yardstick either (it may land nearer the
// exact values than the kernels, or much farther). So the reference is
// PyTorch in float64 (no summation-order noise, the same fp16 rounding
// points), and the noise is measured on it: the reference re-run with every
// K and V value nudged by a float32-sized relative ±1e-6 before rounding,
// several times (crosscheck.py). The kernels' logits must lie within the
// larger of 1e-3 × the spread and twice that noise: a bound that depends on
// the model, the prompt and the depth, not on the machine, as tight as
// before where flips do not compound, and far below what a wrong weight,
// norm or rotary angle does. Greedy tokens must be the reference's wherever
// its top-2 margin is clear of twice the bound; where it is not, the kernels
// may choose the runner-up, and the comparison ends there (the contexts
// differ).

/** The equivalence tests' prompt: ids below 1000, the test models' vocabulary. */
export const EQUIVALENCE_PROMPT = [464, 7, 995, 318, 257, 133, 11, 290, 262, 6, 42, 0, 999, 13, 198, 50];
/** Greedy tokens decoded after the prompt at each depth. */
export const EQUIVALENCE_GREEDY_TOKENS = 12;

/** What the kernels computed: the prompt's logits (when the run exposes them),
 * greedy tokens, the logits that chose each and, with early exit, its exit step. */
export type KernelRun = { logits?: Float32Array[]; greedy: number[]; greedyLogits: Float32Array[]; exitSteps?: number[] };

/** The kernels at a fixed depth: logits of every prompt position, then greedy tokens, one forward at a time. */
function kernelRun(path: string, loops: number): KernelRun {
  const prompt = EQUIVALENCE_PROMPT;
  const m = NativeModel.load(LIB, path, 2, "auto");
  try {
    const vocab = m.info.vocabSize;
    const s = m.newSession(256, loops, 0);
    const all = new Float32Array(prompt.length * vocab);
    s.forward(Int32Array.from(prompt), loops, all, prompt.length);
    const logits = prompt.map((_, i) => all.slice(i * vocab, (i + 1) * vocab));
    const greedy: number[] = [];
    const greedyLogits: Float32Array[] = [];
    let last = logits[logits.length - 1];
    const out = new Float32Array(vocab);
    while (greedy.length < EQUIVALENCE_GREEDY_TOKENS) {
      const next = argmax(last);
      greedy.push(next);
      greedyLogits.push(last.slice());
      s.forward(Int32Array.of(next), loops, out, 1);
      last = out;
    }
    s.close();
    return { logits, greedy, greedyLogits };
  } finally {
    m.close();
  }
}

function standardDeviation(rows: number[][]): number {
  let sum = 0;
  let sumSq = 0;
  let n = 0;
  for (const row of rows) {
    for (const v of row) {
      sum += v;
      sumSq += v * v;
      n++;
    }
  }
  return Math.sqrt(sumSq / n - (sum / n) ** 2);
}

/** The largest |logit| difference the kernels may show against `ref` (the header above says why). */
export function logitTolerance(ref: TorchDepthResult): number {
  const spread = standardDeviation(ref.logits);
  expect(spread).toBeGreaterThan(1); // the logits really spread: the relative bound means something
  return Math.max(1e-3 * spread, 2 * ref.rounding_noise);
}

function maxAbsDiff(ref: number[], kernels: Float32Array): number {
  expect(kernels.length).toBe(ref.length);
  let worst = 0;
  ref.forEach((v, i) => {
    worst = Math.max(worst, Math.abs(v - kernels[i]));
  });
  return worst;
}

/**
 * The kernels' run against the float64 reference at one depth: every logit
 * within `logitTolerance`; greedy tokens (and exit steps) equal while the
 * reference's choice is clear of the tolerance, compared until a token
 * chosen within it differs.
 */
export function expectMatchesReference(label: string, ref: TorchDepthResult | TorchExitResult, k: KernelRun): void {
  const tolerance = logitTolerance(ref);
  let worst = 0;
  k.logits?.forEach((row, p) => {
    worst = Math.max(worst, maxAbsDiff(ref.logits[p], row));
  });
  expect(k.greedy.length).toBe(ref.greedy.length);
  let same = 0; // greedy tokens equal to the reference's, before the first that differs
  for (; same < ref.greedy.length; same++) {
    if ("exit_steps" in ref) expect(k.exitSteps?.[same]).toBe(ref.exit_steps[same]);
    worst = Math.max(worst, maxAbsDiff(ref.greedy_logits[same], k.greedyLogits[same]));
    if (k.greedy[same] !== ref.greedy[same]) {
      expect(ref.greedy_margins[same]).toBeLessThanOrEqual(2 * tolerance); // a choice within the noise
      break;
    }
  }
  console.log(
    `${label}: max |Δlogit| ${worst.toExponential(2)} (tolerance ${tolerance.toExponential(2)}), ` +
      `greedy tokens equal ${same}/${ref.greedy.length}`,
  );
  expect(worst).toBeLessThan(tolerance);
}

/** The kernels serving `kernelModel` match PyTorch reading `torchModel` (often the same file) at each depth. */
export function expectKernelsMatchTorch(label: string, torchModel: string, kernelModel: string, depths: number[]): void {
  const torch = torchLogits(torchModel, EQUIVALENCE_PROMPT, depths, EQUIVALENCE_GREEDY_TOKENS);
  for (const loops of depths) {
    expectMatchesReference(`${label} loops ${loops}`, torch[String(loops)], kernelRun(kernelModel, loops));
  }
}
