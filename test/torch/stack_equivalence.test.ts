// PyTorch <-> loopserve for stacked models (format version 2, docs/model-format.md):
// n_layers distinct layers per step, sandwich and step norms, the exit gate.
// PyTorch (torch/loopserve_torch, model.py) is the reference: float64 with K
// and V rounded to fp16 as the cache holds them. The kernels compute in
// float32, in another order; in a deep stack (3 layers times 8 steps) the
// fp16 roundings of K and V that the two decide differently compound, so
// logits agree to a tolerance that grows with that noise, measured on the
// reference (test/helpers/torch.ts says why), greedy tokens wherever the
// reference's choice is clear of it, and exit steps exactly. PyTorch decodes
// token by token as a server does (model.Decoder; with early exit the
// prompt's positions before the last run every step; each sampled token's
// logits come from the first step whose exit cdf reaches the threshold, and
// under the exact policy it still runs every step, while under the copy
// policy it stops there and the deeper steps' cache slots of every layer
// get copies of its K/V from that step). The fixture's exit decisions are
// checked to lie well away from the threshold, so a different summation
// order cannot flip one.
//
// Needs the stacked kernels (LS_FEATURE_STACKS) and the binding's early-exit
// surface; the calls the test makes of the binding are in `ExitSession`.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { NativeModel } from "../../src/engine/binding.ts";
import { type ExitPlan, GREEDY } from "../../src/engine/types.ts";
import { fixtureTokenizerConfig, fixtureTokenizerJson } from "../helpers/hf_fixture.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { ensureLibrary, LIB } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";
import { PYTORCH, skipReason } from "../helpers/system_packages.ts";
import {
  EQUIVALENCE_GREEDY_TOKENS,
  EQUIVALENCE_PROMPT,
  expectKernelsMatchTorch,
  expectMatchesReference,
  type KernelRun,
  runTorchModule,
  torchExitLogits,
} from "../helpers/torch.ts";

setDefaultTimeout(120_000);

const noTorch = skipReason(PYTORCH) !== null;
const DEPTHS = [1, 2, 3, 4, 8];
// Thresholds whose decisions on the fixture lie well away from them under each policy (checked below).
const EXITS: ExitPlan[] = [
  { threshold: 0.6, policy: "exact" },
  { threshold: 0.7, policy: "exact" },
  { threshold: 0.5, policy: "copy" },
  { threshold: 0.7, policy: "copy" },
];
const GREEDY_TOKENS = EQUIVALENCE_GREEDY_TOKENS;
const PROMPT = EQUIVALENCE_PROMPT;
const ROOT = resolve(import.meta.dir, "../..");

/** Early exit: greedy steps through the kernels' sampler, each step's logits and exit step. */
function kernelExitRun(path: string, loops: number, exit: ExitPlan): KernelRun {
  const m = NativeModel.load(LIB, path, 2, "auto");
  try {
    const vocab = m.info.vocabSize;
    const s = m.newSession(256, loops, 0);
    const out = new Float32Array(vocab);
    const greedyLogits: Float32Array[] = [];
    const greedy: number[] = [];
    const exitSteps: number[] = [];
    let feed = Int32Array.from(PROMPT);
    while (greedy.length < GREEDY_TOKENS) {
      const next = s.step(feed, loops, GREEDY, out, exit);
      greedy.push(next);
      exitSteps.push(s.lastSteps - 1);
      greedyLogits.push(out.slice());
      feed = Int32Array.of(next);
    }
    s.close();
    return { greedy, greedyLogits, exitSteps };
  } finally {
    m.close();
  }
}

function expectExitEquivalent(path: string, label: string): void {
  const earlyExits = new Set<number>(); // the steps tokens stopped at before their last, across depths and thresholds
  for (const exit of EXITS) {
    const torch = torchExitLogits(path, PROMPT, DEPTHS, GREEDY_TOKENS, exit);
    for (const loops of DEPTHS) {
      const t = torch[String(loops)];
      if (t.margin !== null) expect(t.margin).toBeGreaterThan(5e-3); // the fixture: no decision near the threshold
      for (const s of t.exit_steps) if (s < loops - 1) earlyExits.add(s);
      expectMatchesReference(`${label} loops ${loops}, ${exit.policy} exit at ${exit.threshold}`, t, kernelExitRun(path, loops, exit));
    }
  }
  expect(earlyExits.size).toBeGreaterThan(1); // tokens really exit early, at more than one step
}

describe.skipIf(noTorch)("PyTorch <-> loopserve equivalence, stacked models (format version 2)", () => {
  const dir = testTempDir();
  beforeAll(() => ensureLibrary());

  const ouroLike = () => {
    const path = join(dir, "torch-ouro-like.safetensors");
    if (!existsSync(path)) {
      const made = JSON.parse(runTorchModule("crosscheck", ["make", path, "--seed", "5", "--layers", "3", "--sandwich", "--step-norm", "--exit-gate"]));
      expect(made.max_roundtrip_diff).toBe(0);
    }
    return path;
  };

  test("3 layers, sandwich and step norms, exit gate (GQA, tied): same logits and greedy tokens at steps 1, 2, 3, 4, 8", () => {
    const path = ouroLike();
    const f = readSafetensors(path);
    expect(f.metadata.format_version).toBe("2");
    expect(f.tensors.has("layers.2.ffn_out_norm.weight")).toBe(true);
    expect(f.tensors.has("exit_gate.bias")).toBe(true);
    expectKernelsMatchTorch("ouro-like", path, path, DEPTHS);
  });

  test("the same model with early exit under both policies (exact: every step, select; copy), two thresholds each: same greedy tokens, exit steps and logits", () => {
    expectExitEquivalent(ouroLike(), "ouro-like");
  });

  test("2 pre-norm layers without step norm or gate, untied head: same logits and greedy tokens", () => {
    const path = join(dir, "torch-stack-pre.safetensors");
    const made = JSON.parse(runTorchModule("crosscheck", ["make", path, "--seed", "7", "--layers", "2", "--untied", "--kv-heads", "4"]));
    expect(made.max_roundtrip_diff).toBe(0);
    expectKernelsMatchTorch("pre-norm stack", path, path, DEPTHS);
  });

  test("one layer with sandwich, step norm and gate (version 2, block. names): same logits and greedy tokens", () => {
    const path = join(dir, "torch-one-layer-v2.safetensors");
    const made = JSON.parse(runTorchModule("crosscheck", ["make", path, "--seed", "5", "--sandwich", "--step-norm", "--exit-gate"]));
    expect(made.max_roundtrip_diff).toBe(0);
    expect(readSafetensors(path).tensors.has("block.attn_out_norm.weight")).toBe(true);
    expectKernelsMatchTorch("one layer v2", path, path, DEPTHS);
  });

  test("a Hugging Face Ouro checkpoint (bf16, 2 shards) imported by `model import-hf` serves what PyTorch computes from the checkpoint", () => {
    const hf = join(dir, "ouro-hf");
    runTorchModule("crosscheck", ["make-hf", hf, "--seed", "5", "--shards", "2", "--dtype", "BF16"]);
    // the checkpoint as published carries its tokenizer, which the importer stores in the model file
    writeFileSync(join(hf, "tokenizer.json"), fixtureTokenizerJson());
    writeFileSync(join(hf, "tokenizer_config.json"), JSON.stringify(fixtureTokenizerConfig()));
    const out = join(dir, "ouro-imported.safetensors");
    const r = Bun.spawnSync([process.execPath, "src/cli/main.ts", "model", "import-hf", hf, out], { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
    if (r.exitCode !== 0) throw new Error(`model import-hf exited ${r.exitCode}: ${r.stderr.toString()}`);
    // PyTorch reads the checkpoint directory itself: the importer's mapping and fp16 rounding are under test too
    expectKernelsMatchTorch("import-hf", hf, out, [1, 4]);
  });
});
