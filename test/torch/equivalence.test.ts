// PyTorch <-> loopserve: a model built and saved by the PyTorch package is
// served by the kernels with the same logits and the same greedy tokens, and
// a model written by loopserve loads in PyTorch with the same logits. The
// PyTorch side runs in float32 with K and V rounded to fp16 as the cache
// holds them; the kernels sum in another order, so logits agree to a small
// tolerance against their spread, and greedy tokens agree exactly.
import { beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { NativeModel } from "../../src/engine/binding.ts";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { writeSyntheticModel } from "../../src/model/synthetic.ts";
import { ensureLibrary, LIB } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";
import { PYTORCH, skipReason } from "../helpers/system_packages.ts";
import { runPythonModule, runTorchModule, type TorchDepthResult, torchLogits } from "../helpers/torch.ts";
import { argmax } from "../reference/forward.ts";

const noTorch = skipReason(PYTORCH) !== null;
const DEPTHS = [1, 4, 8];
const GREEDY = 12;
const PROMPT = [464, 7, 995, 318, 257, 133, 11, 290, 262, 6, 42, 0, 999, 13, 198, 50]; // ids < 1000, the test models' vocabulary

/** Logits of every prompt position and GREEDY greedy tokens from the kernels. */
function kernelRun(path: string, loops: number): { logits: Float32Array[]; greedy: number[] } {
  const m = NativeModel.load(LIB, path, 2, "auto");
  try {
    const vocab = m.info.vocabSize;
    const s = m.newSession(256, loops, 0);
    const all = new Float32Array(PROMPT.length * vocab);
    s.forward(Int32Array.from(PROMPT), loops, all, PROMPT.length);
    const logits = PROMPT.map((_, i) => all.slice(i * vocab, (i + 1) * vocab));
    const greedy: number[] = [];
    let last = logits[logits.length - 1];
    const out = new Float32Array(vocab);
    while (greedy.length < GREEDY) {
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

interface Agreement {
  maxAbsDiff: number;
  spread: number; // standard deviation of the PyTorch logits
}

function compare(torch: TorchDepthResult, kernels: Float32Array[]): Agreement {
  let maxAbsDiff = 0;
  let sum = 0;
  let sumSq = 0;
  let n = 0;
  torch.logits.forEach((row, p) => {
    expect(kernels[p].length).toBe(row.length);
    row.forEach((v, i) => {
      maxAbsDiff = Math.max(maxAbsDiff, Math.abs(v - kernels[p][i]));
      sum += v;
      sumSq += v * v;
      n++;
    });
  });
  return { maxAbsDiff, spread: Math.sqrt(sumSq / n - (sum / n) ** 2) };
}

function expectEquivalent(path: string, label: string): void {
  const torch = torchLogits(path, PROMPT, DEPTHS, GREEDY);
  for (const loops of DEPTHS) {
    const k = kernelRun(path, loops);
    const a = compare(torch[String(loops)], k.logits);
    console.log(`${label} loops ${loops}: max |Δlogit| ${a.maxAbsDiff.toExponential(2)}, logit std ${a.spread.toFixed(2)}`);
    expect(a.spread).toBeGreaterThan(1);
    expect(a.maxAbsDiff).toBeLessThan(1e-3 * a.spread);
    expect(k.greedy).toEqual(torch[String(loops)].greedy);
  }
}

describe.skipIf(noTorch)("PyTorch <-> loopserve equivalence (fp16 models)", () => {
  const dir = testTempDir();
  beforeAll(() => ensureLibrary());

  test("a tied GQA model saved by PyTorch: same logits and greedy tokens at loops 1, 4, 8", () => {
    const path = join(dir, "torch-tied.safetensors");
    const made = JSON.parse(runTorchModule("crosscheck", ["make", path, "--seed", "3"]));
    expect(made.max_roundtrip_diff).toBe(0); // PyTorch reads back exactly what it wrote
    expect(readSafetensors(path).tensors.has("output.weight")).toBe(false);
    expectEquivalent(path, "torch->loopserve tied");
  });

  test("an untied model held in bf16 in PyTorch: saved as fp16, same logits and greedy tokens", () => {
    const path = join(dir, "torch-untied-bf16.safetensors");
    const made = JSON.parse(runTorchModule("crosscheck", ["make", path, "--seed", "4", "--untied", "--bf16", "--kv-heads", "4"]));
    expect(made.max_roundtrip_diff).toBe(0);
    const f = readSafetensors(path);
    expect(f.tensors.get("output.weight")?.dtype).toBe("F16");
    expectEquivalent(path, "torch->loopserve untied bf16");
  });

  test("a model written by `loopserve model new` loads in PyTorch with the same logits and greedy tokens", () => {
    const path = join(dir, "loopserve-new.safetensors");
    writeSyntheticModel(path, { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 128, vocabSize: 1000, loops: 4, seed: 9 });
    expectEquivalent(path, "loopserve->torch");
  });

  test("PyTorch's loader refuses a quantized file, naming the reason", () => {
    const fp16 = join(dir, "to-quantize.safetensors");
    const int4 = join(dir, "quantized-int4.safetensors");
    writeSyntheticModel(fp16, { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 128, vocabSize: 1000, loops: 4, seed: 2 });
    quantizeModelFile(fp16, int4, { quant: "int4" });
    expect(() => runTorchModule("crosscheck", ["logits", int4, "--tokens", "1"])).toThrow(
      /quant 'int4': this loader reads fp16 models/,
    );
  });
});

describe.skipIf(noTorch)("training", () => {
  test("the out-of-text softmax used in training is the exported model's full-vocabulary loss", () => {
    const r = JSON.parse(runTorchModule("crosscheck", ["head"]));
    expect(r.full).toBeGreaterThan(1);
    expect(Math.abs(r.restricted - r.full)).toBeLessThan(1e-4 * r.full);
  });
});

describe.skipIf(noTorch)("the PyTorch package's own unit tests", () => {
  test("save and load refuse what loopserve would refuse (python3 -m unittest)", () => {
    expect(() => runPythonModule("unittest", ["discover", "-s", "tests"])).not.toThrow();
  });
});
