// Every key/value cache mode under AddressSanitizer + UndefinedBehaviorSanitizer
// (test/c/kv_driver.c linked with the sanitized kernels of
// test/helpers/sanitized.ts), on every SIMD path: windows whose ring wraps so
// that attention runs end at every slot, uneven prefill splits, prefix
// copies and speculative cycles, with the quantized attention kernels'
// vector tails (head_dim 40: a short int4 group and a partial vector; 16 and
// 64). No sanitizer report, and the driver's own bit-exactness checks pass.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { LS_SIMD_AVX2, LS_SIMD_AVX512, LS_SIMD_PORTABLE } from "../../src/abi/abi.generated.ts";
import type { SyntheticOptions } from "../../src/model/synthetic.ts";
import { writeDescriptor } from "../helpers/model_descriptor.ts";
import { tinyModelPath } from "../helpers/models.ts";
import { runSanitized, SANITIZED_BUILD_MS, sanitizedDriver } from "../helpers/sanitized.ts";

setDefaultTimeout(240_000);

const SHAPES: Record<string, SyntheticOptions> = {
  hd16: { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 64, vocabSize: 97, loops: 3, seed: 41, residualScale: 0.05 },
  hd40: { dim: 80, nHeads: 2, nKvHeads: 1, ffnDim: 48, vocabSize: 83, loops: 3, seed: 42, residualScale: 0.05 },
  hd64: { dim: 128, nHeads: 2, nKvHeads: 2, ffnDim: 64, vocabSize: 71, loops: 3, seed: 43, residualScale: 0.05 },
};

let driver = "";

beforeAll(async () => {
  driver = await sanitizedDriver("kv_driver");
}, SANITIZED_BUILD_MS);

describe("cache modes under ASan/UBSan", () => {
  for (const [name, shape] of Object.entries(SHAPES)) {
    test(`${name}: every mode, with and without a window, on every SIMD path`, () => {
      const path = writeDescriptor(tinyModelPath(shape));
      const hd = shape.dim / shape.nHeads;
      let ran = 0;
      for (const simd of [LS_SIMD_PORTABLE, LS_SIMD_AVX2, LS_SIMD_AVX512].map(String)) {
        const r = runSanitized(driver, [path, simd]);
        if (r.code === 3) continue; // path not on this CPU
        if (r.code !== 0) throw new Error(`kv_driver exit ${r.code} (simd ${simd}):\n${r.stdout}${r.stderr}`);
        // 6 modes x 2 windows, or the 3 unrotated modes when head_dim is not a power of two
        expect(r.stdout.match(/^ok /gm)?.length).toBe((hd & (hd - 1)) === 0 ? 12 : 6);
        ran++;
      }
      expect(ran).toBeGreaterThan(0);
    });
  }
});
