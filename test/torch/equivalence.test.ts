// PyTorch <-> loopserve: a model built and saved by the PyTorch package is
// served by the kernels with the same logits and the same greedy tokens, and
// a model written by loopserve loads in PyTorch with the same logits. The
// PyTorch side is the reference: float64 with K and V rounded to fp16 as the
// cache holds them. The kernels compute in float32, in another order, so
// logits agree to a tolerance and greedy tokens wherever the reference's
// choice is clear of it (test/helpers/torch.ts says why the tolerance is
// what it is).
import { beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { writeSyntheticModel } from "../../src/model/synthetic.ts";
import { ensureLibrary } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";
import { PYTORCH, skipReason } from "../helpers/system_packages.ts";
import { expectKernelsMatchTorch, runPythonModule, runTorchModule } from "../helpers/torch.ts";

const noTorch = skipReason(PYTORCH) !== null;
const DEPTHS = [1, 4, 8];

describe.skipIf(noTorch)("PyTorch <-> loopserve equivalence (fp16 models)", () => {
  const dir = testTempDir();
  beforeAll(() => ensureLibrary());

  test("a tied GQA model saved by PyTorch: same logits and greedy tokens at loops 1, 4, 8", () => {
    const path = join(dir, "torch-tied.safetensors");
    const made = JSON.parse(runTorchModule("crosscheck", ["make", path, "--seed", "3"]));
    expect(made.max_roundtrip_diff).toBe(0); // PyTorch reads back exactly what it wrote
    expect(readSafetensors(path).tensors.has("output.weight")).toBe(false);
    expectKernelsMatchTorch("torch->loopserve tied", path, path, DEPTHS);
  });

  test("an untied model held in bf16 in PyTorch: saved as fp16, same logits and greedy tokens", () => {
    const path = join(dir, "torch-untied-bf16.safetensors");
    const made = JSON.parse(runTorchModule("crosscheck", ["make", path, "--seed", "4", "--untied", "--bf16", "--kv-heads", "4"]));
    expect(made.max_roundtrip_diff).toBe(0);
    const f = readSafetensors(path);
    expect(f.tensors.get("output.weight")?.dtype).toBe("F16");
    expectKernelsMatchTorch("torch->loopserve untied bf16", path, path, DEPTHS);
  });

  test("a model written by `loopserve model new` loads in PyTorch with the same logits and greedy tokens", () => {
    const path = join(dir, "loopserve-new.safetensors");
    writeSyntheticModel(path, { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 128, vocabSize: 1000, loops: 4, seed: 9 });
    expectKernelsMatchTorch("loopserve->torch", path, path, DEPTHS);
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
