// The published looped families against their own modeling code: random
// checkpoints in the published layouts (Huginn-0125's, a checkpoint made by
// retrofitting recurrence into a Llama, Nanbeige4.2's: config.json, bf16
// shards, fused matrices, tokenizer files) imported by `model import-hf`
// and run by the kernels, beside torch/loopserve_torch/published.py, a
// float64 reference written from a reading of each family's published code
// that reads the checkpoint directory itself (so the importer's mapping is
// under test too), and beside loopserve's own PyTorch model of the format
// (model.py's LoopedLlama) reading the imported file. Greedy tokens equal at several depths; logits within
// fp16 tolerance; Huginn's zero-shot exits (KL, entropy) with both cache
// policies after an exit (exact: every step, select; copy: the published
// loop's stop with its latest-m4 lookup) and its bounded cache (compress-s,
// the kernels' cache_steps), exit steps included.
//
// fp16 tolerance: the kernels hold keys and values in fp16 (a relative
// 2^-11 each) and compute in float32, so logits must lie within 2^-10 of
// the largest logit's magnitude (what those roundings come to over a 32-step
// recurrence, with room), and greedy tokens must be the reference's wherever its top-2
// margin is clear of twice that (where it is not, the comparison of that
// run ends there: the contexts differ). Exit decisions must lie clear of
// their threshold (a relative 1e-3) for the comparison to be decisive.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { join, resolve } from "node:path";
import { NativeModel } from "../../src/engine/binding.ts";
import { type ExitPlan, GREEDY } from "../../src/engine/types.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { type HfFixtureOptions, writeHfFixture } from "../helpers/hf_fixture.ts";
import { ensureLibrary, LIB } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";
import { PYTORCH, skipReason } from "../helpers/system_packages.ts";
import { runTorchModule, torchLogits } from "../helpers/torch.ts";
import { argmax } from "../reference/forward.ts";

setDefaultTimeout(180_000);

const ROOT = resolve(import.meta.dir, "../..");
const PROMPT = [464, 7, 495, 318, 257, 133, 11, 290, 262, 6, 42, 0, 499, 13, 198, 50];
const GREEDY_TOKENS = 10;
const FP16_TOLERANCE = 2 ** -10;

/** published.py's answer at one depth. */
type Published = {
  logits: number[][];
  greedy: number[];
  greedy_logits: number[][];
  greedy_margins: number[];
  exit_steps: number[];
  exit_margin: number | null;
};

/** Huginn-0125's structure (2 prelude, 4 core, 2 coda layers, 32 steps by default) at a small width. */
const HUGINN: HfFixtureOptions = { arch: "huginn", dim: 96, nHeads: 3, ffnDim: 192, vocabSize: 512, nLayers: 4, nPrelude: 2, nCoda: 2, totalUtSteps: 32, seed: 11, shards: 2 };
/** A Llama retrofitted with recurrence: GQA, pre-norm blocks, Llama's RoPE, untied head. */
const RETROFIT: HfFixtureOptions = {
  arch: "huginn", retrofit: true, dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 160, vocabSize: 512, nLayers: 4, nPrelude: 2, nCoda: 2, totalUtSteps: 32, seed: 12, shards: 2, rmsNormEps: 1e-5,
};
/** Nanbeige4.2's structure: GQA, head_dim wider than dim / heads, the stack run twice by default. */
const NANBEIGE: HfFixtureOptions = { arch: "nanbeige", dim: 64, nHeads: 4, nKvHeads: 2, headDim: 32, ffnDim: 128, vocabSize: 512, nLayers: 3, totalUtSteps: 2, seed: 11, shards: 2, rmsNormEps: 1e-5 };

/** Writes the checkpoint and imports it with the CLI; returns both paths. */
function imported(name: string, o: HfFixtureOptions): { hf: string; model: string } {
  const hf = join(testTempDir(), `${name}-hf`);
  writeHfFixture(hf, o);
  const model = join(testTempDir(), `${name}.safetensors`);
  const r = Bun.spawnSync([process.execPath, "src/cli/main.ts", "model", "import-hf", hf, model], { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`model import-hf exited ${r.exitCode}: ${r.stderr.toString()}`);
  return { hf, model };
}

function published(hf: string, depths: number[], extra: string[] = []): Record<string, Published> {
  return JSON.parse(runTorchModule("published", ["logits", hf, "--tokens", PROMPT.join(","), "--steps", depths.join(","), "--greedy", String(GREEDY_TOKENS), ...extra]));
}

/** The kernels: the prompt in one call (every position's logits), then greedy tokens one step each, exiting by `exit` after the first. */
function kernels(model: string, loops: number, exit?: ExitPlan, cacheSteps = 0) {
  const m = NativeModel.load(LIB, model, 2, "auto");
  try {
    const vocab = m.info.vocabSize;
    const s = m.newSession(PROMPT.length + GREEDY_TOKENS, loops, 0, { mode: "fp16", cacheSteps });
    const all = new Float32Array(PROMPT.length * vocab);
    s.forward(Int32Array.from(PROMPT), loops, all, PROMPT.length);
    const out = { logits: PROMPT.map((_, i) => all.slice(i * vocab, (i + 1) * vocab)), greedy: [] as number[], greedyLogits: [] as Float32Array[], steps: [] as number[] };
    let last = out.logits[PROMPT.length - 1];
    let steps = loops;
    while (out.greedy.length < GREEDY_TOKENS) {
      const next = argmax(last);
      out.greedy.push(next);
      out.greedyLogits.push(last);
      out.steps.push(steps);
      last = new Float32Array(vocab);
      if (out.greedy.length < GREEDY_TOKENS) {
        s.step(Int32Array.of(next), loops, GREEDY, last, exit);
        steps = s.lastSteps;
      }
    }
    s.close();
    return out;
  } finally {
    m.close();
  }
}

function maxAbs(rows: number[][]): number {
  return Math.max(...rows.map((r) => Math.max(...r.map(Math.abs))));
}

function maxDiff(ref: number[], got: Float32Array): number {
  expect(got.length).toBe(ref.length);
  return Math.max(...ref.map((v, i) => Math.abs(v - got[i])));
}

function tolerance(ref: Published): number {
  return FP16_TOLERANCE * maxAbs([...ref.logits, ...ref.greedy_logits]);
}

/** How far two of the reference's runs' greedy logits lie apart (up to the first token they choose differently). */
function apart(a: Published, b: Published): number {
  let worst = 0;
  for (let i = 0; i < a.greedy.length; i++) {
    worst = Math.max(worst, ...a.greedy_logits[i].map((v, j) => Math.abs(v - b.greedy_logits[i][j])));
    if (a.greedy[i] !== b.greedy[i]) return Infinity;
  }
  return worst;
}

/** The kernels' run beside the reference's: logits within fp16 tolerance, greedy tokens (and steps) equal while decisive. Returns the tokens compared and the largest difference. */
function expectPublished(label: string, ref: Published, got: ReturnType<typeof kernels>): { same: number; worst: number } {
  const bound = tolerance(ref);
  let worst = Math.max(...ref.logits.map((row, p) => maxDiff(row, got.logits[p])));
  let same = 0;
  for (; same < ref.greedy.length; same++) {
    expect(got.steps[same], `${label}: steps of token ${same}`).toBe(ref.exit_steps[same]);
    worst = Math.max(worst, maxDiff(ref.greedy_logits[same], got.greedyLogits[same]));
    if (got.greedy[same] !== ref.greedy[same]) {
      expect(ref.greedy_margins[same], `${label}: token ${same} differs though the reference's choice is clear`).toBeLessThanOrEqual(2 * bound);
      break;
    }
  }
  console.log(`${label}: max |Δlogit| ${worst.toExponential(2)} (tolerance ${bound.toExponential(2)}), greedy tokens equal ${same}/${ref.greedy.length}, steps ${got.steps.join(",")}`);
  expect(worst).toBeLessThan(bound);
  return { same, worst };
}

/** Every depth: the kernels at fixed depth against the reference; most greedy tokens compared. */
function expectDepths(label: string, model: string, ref: Record<string, Published>, depths: number[]): void {
  let compared = 0;
  for (const d of depths) compared += expectPublished(`${label} ${d} steps`, ref[String(d)], kernels(model, d)).same;
  expect(compared).toBeGreaterThanOrEqual(0.8 * depths.length * GREEDY_TOKENS);
  // loopserve's own PyTorch model (model.py's LoopedLlama, K and V in fp16) reads the imported file alike
  const looped = torchLogits(model, PROMPT, depths, GREEDY_TOKENS);
  for (const d of depths) {
    const r = looped[String(d)];
    expectPublished(`${label} ${d} steps, LoopedLlama`, { ...r, exit_steps: r.greedy.map(() => d), exit_margin: null }, kernels(model, d));
  }
}

describe.skipIf(skipReason(PYTORCH) !== null)("the published families, imported, against their published code", () => {
  beforeAll(ensureLibrary);

  test("Huginn-0125's layout: every prompt position's logits and the greedy tokens at steps 1, 2, 4, 8 and 32", () => {
    const { hf, model } = imported("huginn", HUGINN);
    const meta = readSafetensors(model).metadata;
    expect(meta).toMatchObject({ injection: "adapter", norm_layout: "sandwich_sum", rope_layout: "interleaved", qk_bias: "1", mid_norm: "1", n_prelude: "2", n_coda: "2" });
    const depths = [1, 2, 4, 8, 32];
    expectDepths("huginn", model, published(hf, depths), depths);
  });

  test("a Llama retrofitted with recurrence (pre-norm, Llama RoPE, GQA, untied): the same at steps 1, 4 and 32", () => {
    const { hf, model } = imported("retrofit", RETROFIT);
    expect(readSafetensors(model).metadata).toMatchObject({ norm_layout: "pre", rope_layout: "half", qk_bias: "0", mid_norm: "0", embed_scale: "1" });
    const depths = [1, 4, 32];
    expectDepths("retrofit", model, published(hf, depths), depths);
  });

  test("Nanbeige4.2's layout: the same at steps 1, 2 (its num_loops) and 3", () => {
    const { hf, model } = imported("nanbeige", NANBEIGE);
    expect(readSafetensors(model).metadata).toMatchObject({ step_norm: "1", head_dim: "32" });
    const depths = [1, 2, 3];
    expectDepths("nanbeige", model, published(hf, depths), depths);
  });

  test("Huginn's zero-shot exits (KL, entropy), both cache policies after an exit, at 8 and 32 steps: tokens, exit steps and logits", () => {
    const { hf, model } = imported("huginn-exits", HUGINN);
    const early = new Set<number>();
    let policiesApart = 0; // the two policies' logits apart, in units of the kernels' difference from the reference: it tells them apart
    for (const [rule, threshold] of [["kl", 1e-3], ["kl", 1e-2], ["entropy", 1e-3], ["entropy", 1e-2]] as const) {
      const args = ["--rule", rule, "--threshold", String(threshold)];
      const refs = { exact: published(hf, [8, 32], [...args, "--policy", "exact"]), copy: published(hf, [8, 32], [...args, "--policy", "copy"]) };
      for (const policy of ["exact", "copy"] as const) {
        for (const d of [8, 32]) {
          const r = refs[policy][String(d)];
          expect(r.exit_margin, "no exit decision near the threshold").toBeGreaterThan(1e-3);
          const { worst } = expectPublished(`huginn ${d} steps, ${rule} < ${threshold}, ${policy}`, r, kernels(model, d, { rule, threshold, policy }));
          for (const s of r.exit_steps) if (s < d) early.add(s);
          policiesApart = Math.max(policiesApart, apart(refs.exact[String(d)], refs.copy[String(d)]) / worst);
        }
      }
    }
    expect(early.size).toBeGreaterThan(2); // tokens exit early, at several steps
    expect(policiesApart).toBeGreaterThan(10);
  });

  test("Huginn's bounded cache: cache_steps S is the published compress-s (S x 4 indices), alone and with copy-policy exits", () => {
    const { hf, model } = imported("huginn-compress", HUGINN);
    for (const [d, steps] of [[32, 4], [8, 2]] as const) {
      const ref = published(hf, [d], ["--cache", `compress-s${steps * 4}`]);
      const { worst } = expectPublished(`huginn ${d} steps, compress-s${steps * 4}`, ref[String(d)], kernels(model, d, undefined, steps));
      // sharing steps' caches changes the function by far more than the kernels differ from it: the comparison tells them apart
      expect(apart(ref[String(d)], published(hf, [d])[String(d)])).toBeGreaterThan(10 * worst);
      const exits = published(hf, [d], ["--cache", `compress-s${steps * 4}`, "--rule", "kl", "--threshold", "1e-2", "--policy", "copy"])[String(d)];
      expect(exits.exit_margin).toBeGreaterThan(1e-3);
      expectPublished(`huginn ${d} steps, compress-s${steps * 4}, kl exits`, exits, kernels(model, d, { rule: "kl", threshold: 1e-2, policy: "copy" }, steps));
    }
  });
});
