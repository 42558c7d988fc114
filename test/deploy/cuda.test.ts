// libloopserve_cuda.so (kernels/cuda/): built whenever nvcc is present.
//
// On every host that has the library: it loads without a GPU or a driver,
// reports 0 devices instead of failing, and refuses a model with a clear
// message, which is what lets the server probe it and fall back to the CPU.
//
// On a GPU host it is held to the CPU library (the reference): same model
// file, logits within fp16-rounding tolerance, the same greedy tokens,
// batch invariance on its own (a prompt's last logits are bit-identical
// whether prefilled in one call or fed token by token), windowed caches,
// rollback, prefix copies, temperature draws that equal ls_sample on the
// same logits (the draw is sample.c's code in both libraries), batched
// steps whose every row is bit-identical to its session stepped alone, and
// the server, which picks the CUDA library on its own, giving concurrent
// requests batched on the device exactly their one-at-a-time tokens.
//
// (It sits with the deployment tests because it is about which library a
// host can run; test/kernels/ would be its home next to the CPU kernels.)
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { dlopen, FFIType } from "bun:ffi";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { LS_SIMD_AVX2, LS_SIMD_CUDA } from "../../src/abi/abi.generated.ts";
import { NativeModel } from "../../src/engine/binding.ts";
import { GREEDY } from "../../src/engine/types.ts";
import { CUDA_LIBRARY_NAME } from "../../src/engine/library.ts";
import { expectSameAsSolo, plans } from "../helpers/batch.ts";
import { tokensFor } from "../helpers/kernels.ts";
import { tinyModelPath } from "../helpers/models.ts";
import { jsonBody } from "../helpers/http.ts";
import { startServer } from "../helpers/server.ts";
import { GenerateResponse } from "../../src/wire/responses.ts";

const ROOT = resolve(import.meta.dir, "../..");
const CPU_LIB = join(ROOT, "build", "libloopserve.so");
const CUDA_LIB = join(ROOT, "build", CUDA_LIBRARY_NAME);

const built = existsSync(CUDA_LIB);
const probe = built
  ? dlopen(CUDA_LIB, {
      ls_cuda_device_count: { args: [], returns: FFIType.i32 },
      ls_simd_name: { args: [FFIType.i32], returns: FFIType.cstring },
    }).symbols
  : null;
const devices = probe ? probe.ls_cuda_device_count() : 0;
if (!built) console.warn(`skipping CUDA library tests: ${CUDA_LIBRARY_NAME} is not built (no nvcc on this host)`);
else if (devices === 0) console.warn("skipping CUDA agreement tests: no usable GPU on this host");

describe.skipIf(!built)("CUDA library on any host", () => {
  test("loads and reports its device count without failing", () => {
    expect(Number.isInteger(devices)).toBe(true);
    expect(devices).toBeGreaterThanOrEqual(0);
    expect(String(probe?.ls_simd_name(LS_SIMD_CUDA))).toBe("cuda");
    expect(String(probe?.ls_simd_name(LS_SIMD_AVX2))).toBe("avx2");
  });

  test.skipIf(devices > 0)("without a GPU, loading a model says there is no usable device", () => {
    expect(() => NativeModel.load(CUDA_LIB, tinyModelPath(), 0, "auto")).toThrow(/no usable CUDA device/);
  });

  test("validation is the same as with the CPU library: a missing file names the path", () => {
    expect(() => NativeModel.load(CUDA_LIB, join(ROOT, "no-such-model.safetensors"), 0, "auto")).toThrow(/no-such-model/);
  });
});

describe.skipIf(!built || devices === 0)("CUDA library against the CPU library", () => {
  let cpu: NativeModel;
  let gpu: NativeModel;
  const prompt = Int32Array.from([15496, 995, 11, 314, 716, 257, 1332, 286, 262, 6427, 13]);

  beforeAll(() => {
    const path = tinyModelPath();
    cpu = NativeModel.load(CPU_LIB, path, 2, "portable");
    gpu = NativeModel.load(CUDA_LIB, path, 0, "auto");
  });
  afterAll(() => {
    cpu?.close();
    gpu?.close();
  });

  test("reports the device's memory (the server's default cache budget): some free, no more than in all", () => {
    const mem = gpu.deviceMemory();
    expect(mem).not.toBeNull();
    expect(mem?.free).toBeGreaterThan(0);
    expect(mem?.free).toBeLessThanOrEqual(mem?.total ?? 0);
  });

  test("reports the cuda path and the same model shape", () => {
    expect(gpu.info.simd).toBe("cuda");
    const { simd: _a, threads: _b, ...g } = gpu.info;
    const { simd: _c, threads: _d, ...c } = cpu.info;
    expect(g).toEqual(c);
  });

  function lastLogits(model: NativeModel, tokens: Int32Array, loops: number, window = 0): Float32Array<ArrayBuffer> {
    const s = model.newSession(tokens.length + 8, loops, window);
    try {
      const out = new Float32Array(model.info.vocabSize);
      s.forward(tokens, loops, out, 1);
      return out;
    } finally {
      s.close();
    }
  }

  function maxRelDiff(a: Float32Array, b: Float32Array): number {
    let scale = 0;
    let diff = 0;
    for (let i = 0; i < a.length; i++) {
      scale = Math.max(scale, Math.abs(a[i]));
      diff = Math.max(diff, Math.abs(a[i] - b[i]));
    }
    return diff / Math.max(scale, 1e-6);
  }

  for (const loops of [1, 4]) {
    test(`logits agree with the CPU library within 1e-3 of their scale (loops ${loops})`, () => {
      expect(maxRelDiff(lastLogits(cpu, prompt, loops), lastLogits(gpu, prompt, loops))).toBeLessThan(1e-3);
    });
  }

  test("a windowed cache agrees with the CPU library", () => {
    const long = Int32Array.from({ length: 150 }, (_, i) => (i * 7919 + 13) % 50257);
    expect(maxRelDiff(lastLogits(cpu, long, 2, 16), lastLogits(gpu, long, 2, 16))).toBeLessThan(1e-3);
  });

  test("batch invariant: one prefill call equals feeding token by token, bit for bit", () => {
    const whole = lastLogits(gpu, prompt, 4);
    const s = gpu.newSession(prompt.length, 4, 0);
    const out = new Float32Array(gpu.info.vocabSize);
    for (let i = 0; i < prompt.length; i++) s.forward(prompt.subarray(i, i + 1), 4, out, 1);
    s.close();
    expect(out).toEqual(whole);
  });

  test("greedy decoding gives the CPU library's tokens", () => {
    const run = (m: NativeModel) => {
      const s = m.newSession(prompt.length + 16, 4, 0);
      const tokens: number[] = [];
      let input = prompt;
      for (let i = 0; i < 16; i++) {
        const t = s.step(input, 4, { ...GREEDY, repetitionPenalty: 1.1 });
        tokens.push(t);
        input = Int32Array.of(t);
      }
      s.close();
      return tokens;
    };
    expect(run(gpu)).toEqual(run(cpu));
  });

  test("rollback then re-feeding reproduces the same logits", () => {
    const s = gpu.newSession(prompt.length + 4, 2, 0);
    const a = new Float32Array(gpu.info.vocabSize);
    const b = new Float32Array(gpu.info.vocabSize);
    s.forward(prompt, 2, a, 1);
    s.rollback(prompt.length - 3);
    expect(s.pos).toBe(prompt.length - 3);
    s.forward(prompt.subarray(prompt.length - 3), 2, b, 1);
    s.close();
    expect(b).toEqual(a);
  });

  test("a copied prefix continues exactly as the original session would", () => {
    const src = gpu.newSession(prompt.length + 2, 4, 0);
    src.forward(prompt, 4);
    const dst = gpu.newSession(prompt.length + 2, 4, 0);
    dst.copyPrefixFrom(src, prompt.length - 2);
    expect(dst.pos).toBe(prompt.length - 2);
    const copied = new Float32Array(gpu.info.vocabSize);
    dst.forward(prompt.subarray(prompt.length - 2), 4, copied, 1);
    src.close();
    dst.close();
    expect(copied).toEqual(lastLogits(gpu, prompt, 4));
  });

  test("a temperature draw equals ls_sample on the same logits (shared RNG contract)", () => {
    for (const [temperature, topK, topP] of [
      [0.8, 0, 1],
      [1.0, 40, 1],
      [0.7, 0, 0.9],
      [1.2, 50, 0.8],
      [0.9, 0, 0], // top_p 0 keeps the most likely token: accepted as ls_sample accepts it
    ] as const) {
      for (let seed = 1; seed <= 5; seed++) {
        const s = gpu.newSession(prompt.length + 1, 2, 0);
        const logits = new Float32Array(gpu.info.vocabSize);
        const sampling = { ...GREEDY, temperature, topK, topP, seed };
        const token = s.step(prompt, 2, sampling, logits);
        s.close();
        const expected = cpu.sample(logits, prompt, sampling, prompt.length);
        expect(token).toBe(expected);
      }
    }
  });

  test("a batched step gives every row what it gets alone, bit for bit: mixed depths, windows, sampling, prompt chunks", () => {
    const vocab = 512;
    const m = NativeModel.load(CUDA_LIB, tinyModelPath({ vocabSize: vocab, loops: 6, seed: 3 }), 0, "auto");
    try {
      expectSameAsSolo(m, plans(vocab, 16, 1, [{ mode: "fp16" }]), "cuda, 16 requests");
      // more rows than one block, and a prompt longer than several blocks
      const many = plans(vocab, 70, 4, [{ mode: "fp16" }]).map((p, i) => ({ ...p, arrives: 0, chunk: i === 5 ? 400 : 1, prompt: i === 5 ? tokensFor(vocab, 300, 9) : p.prompt.slice(0, 3) }));
      expectSameAsSolo(m, many, "cuda, 70 rows");
    } finally {
      m.close();
    }
  }, 120_000);
});

describe.skipIf(!built || devices === 0)("the server on the GPU", () => {
  test("concurrent requests batched on the device get exactly the tokens they get one at a time", async () => {
    const bodies = Array.from({ length: 10 }, (_, i) => ({
      prompt: `${["In the beginning", "And the LORD spake unto Moses", "The LORD is my shepherd", "Blessed are"][i % 4]} ${i}`.repeat(1 + (i % 3) * 4),
      max_tokens: 8 + (i % 5) * 3,
      loops: 1 + (i % 4),
      ...(i % 3 === 1 ? { temperature: 0.8, top_k: 40, sample_seed: 100 + i } : {}),
    }));
    const generate = async (env: Record<string, string>, together: boolean) => {
      const s = await startServer({ gpu: true, env: { SERVICE_MAX_SEQ_LEN: "512", SERVICE_PREFILL_CHUNK: "16", ...env } });
      try {
        expect(s.output()).toContain("simd cuda");
        const one = async (body: (typeof bodies)[number]) => (await jsonBody(await s.post("/generate", body), GenerateResponse)).tokens;
        if (together) return await Promise.all(bodies.map(one));
        const out: number[][] = [];
        for (const body of bodies) out.push(await one(body));
        return out;
      } finally {
        await s.stop();
      }
    };
    const alone = await generate({ SERVICE_MAX_BATCH: "1" }, false);
    const batched = await generate({ SERVICE_MAX_BATCH: "8" }, true);
    expect(batched).toEqual(alone);
    expect(alone.every((t) => t.length > 0)).toBe(true);
    // Steps on the library's thread (ls_pipeline_begin) while the previous step's tokens stream.
    const pipelined = await generate({ SERVICE_MAX_BATCH: "8", SERVICE_PIPELINE_STEPS: "1" }, true);
    expect(pipelined).toEqual(alone);
  }, 120_000);

  test("SERVICE_SIMD naming a CPU path keeps the server on the CPU kernels, where speculative decoding runs", async () => {
    const s = await startServer({ gpu: true, env: { SERVICE_SIMD: "avx2" } });
    try {
      expect(s.output()).toContain("simd avx2");
      const res = await s.post("/generate/speculative", { prompt: "In the beginning", max_tokens: 8, draft_loops: 1, verify_loops: 4 });
      expect(res.status).toBe(200);
    } finally {
      await s.stop();
    }
  });
});
