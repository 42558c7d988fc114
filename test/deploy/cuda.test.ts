// libloopserve_cuda.so (kernels/cuda/) and its validation.
//
// The CUDA library is held to the CPU library by one set of checks, the
// GPU validation run (bench/gpu/validate.sh and its C driver,
// bench/gpu/driver/; docs/gpu.md), which a bare GPU host runs without bun.
// Here, on any host, that run is proven: without a GPU it builds everything
// with make alone, runs the CPU harness of the quantized kernels and every
// check of the driver with the CPU library against itself, checks what the
// CUDA library reports and refuses, and reports the GPU stages as not
// available. On a GPU host the driver's checks run on the GPU.
//
// Also here: what the server's binding sees of the CUDA library on any host
// (it loads without a GPU or a driver, reports 0 devices, refuses a model
// with a clear message), and on a GPU host the server picking the CUDA
// library by itself.
//
// (It sits with the deployment tests because it is about which library a
// host can run.)
import { beforeAll, describe, expect, test } from "bun:test";
import { dlopen, FFIType } from "bun:ffi";
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { C_FLAGS, GPU_MAKEFILE, simdFlags } from "../../build.ts";
import { LS_SIMD_AVX2, LS_SIMD_CUDA } from "../../src/abi/abi.generated.ts";
import { NativeModel } from "../../src/engine/binding.ts";
import { CUDA_LIBRARY_NAME } from "../../src/engine/library.ts";
import { jsonBody } from "../helpers/http.ts";
import { descriptorOf } from "../helpers/model_descriptor.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";
import { startServer } from "../helpers/server.ts";
import { GenerateResponse } from "../../src/wire/responses.ts";

const ROOT = resolve(import.meta.dir, "../..");
const BUILD = join(ROOT, "build");
const CPU_LIB = join(BUILD, "libloopserve.so");
const CUDA_LIB = join(BUILD, CUDA_LIBRARY_NAME);
const VALIDATE = join(ROOT, "bench", "gpu", "validate.sh");
const DRIVER = join(BUILD, "gpu_driver");

const built = existsSync(CUDA_LIB);
const probe = built
  ? dlopen(CUDA_LIB, {
      ls_cuda_device_count: { args: [], returns: FFIType.i32 },
      ls_simd_name: { args: [FFIType.i32], returns: FFIType.cstring },
    }).symbols
  : null;
const devices = probe ? probe.ls_cuda_device_count() : 0;
if (!built) console.warn(`the CUDA library is not built (no nvcc on this host): its own checks are skipped`);
else if (devices === 0) console.warn("no usable GPU on this host: the driver's checks run CPU against CPU");

interface Check {
  name: string;
  status: "pass" | "fail" | "skip";
  value: number | null;
  detail: string;
}

/** The JSON lines of a command's stdout. */
function records(stdout: string): Check[] {
  return stdout
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l));
}

function run(cmd: string[], env: Record<string, string> = {}): { code: number; stdout: string; stderr: string } {
  const r = spawnSync(cmd[0], cmd.slice(1), { cwd: ROOT, encoding: "utf8", env: { ...process.env, ...env }, maxBuffer: 1 << 26 });
  return { code: r.status ?? -1, stdout: r.stdout ?? "", stderr: r.stderr ?? "" };
}

describe("the GPU validation run, on a host without a GPU", () => {
  // build/ is shared with build.ts: the objects it compiled are reused, so only the driver and the harness build here
  const out = mkdtempSync(join(testTempDir(), "validate-"));
  const env = { TMPDIR: out };
  let report: {
    mode: string;
    summary: { pass: number; fail: number; skip: number };
    checks: Check[];
    figures: { engine: string; tok_s: number }[];
    targets: { name: string; met: boolean; value: unknown }[];
  };
  let code = -1;
  let stderr = "";

  beforeAll(() => {
    const r = run(["bash", VALIDATE, "--no-gpu", "--out", out, "--build", BUILD], env);
    code = r.code;
    stderr = r.stderr;
    report = JSON.parse(readFileSync(join(out, "gpu.json"), "utf8"));
  }, 600_000);

  const check = (name: string) => report.checks.find((c) => c.name === name);

  test("passes, and every check it reports ran or says why not", () => {
    expect(stderr).toContain("mode: no-gpu");
    expect(report.mode).toBe("no-gpu");
    expect(report.checks.filter((c) => c.status === "fail")).toEqual([]);
    expect(code).toBe(0);
    expect(report.summary.pass).toBeGreaterThan(100);
    for (const c of report.checks.filter((c) => c.status === "skip")) expect(c.detail).not.toBe("");
  });

  test("the CPU harness holds the CUDA library's arithmetic and schedules to the CPU library, and the build to no register spills", () => {
    for (const name of ["codes", "act", "amax", "matmul", "schedule", "gate-exp", "exit-schedule"]) expect(check(`harness/${name}`)?.status).toBe("pass");
    // block_steps.h with the CPU library's kernels against its ls_batch_step, on the driver's stack (and the shipped one)
    expect(check("harness/exit-schedule")?.detail).toMatch(/exited early\): every token, logits, exit step, cache unit and kept state the CPU library's/);
    expect(check("build/libraries")?.status).toBe("pass");
    if (built) expect(check("build/no-register-spills")?.status).toBe("pass");
  });

  test("every weight format and feature of the driver's cases is checked, CPU against CPU", () => {
    const stacks = ["stack-2-layers", "stack-3-layers-tied", "stack-2-layers-mha-sandwich", "stack-int4", "stack-int2-mix-head-int6"];
    for (const model of ["fp16", "fp16-tied", "fp16-head-int8", "int4-g32", "int2-g32-mix-head-int6", "int4-g256-head-int8-g128", ...stacks]) {
      for (const c of ["load", "logits", "window", "sample", "prefill-vs-steps", "rollback", "prefix-copy", "rows"])
        expect(check(`${model}/${c}`)?.status).toBe("pass");
    }
    // a model with an exit gate: rows mixing exit rules, and deferred units through every entry point
    for (const model of stacks.filter((m) => m !== "stack-2-layers-mha-sandwich")) {
      expect(check(`${model}/rows`)?.detail).toContain("exit thresholds and policies");
      expect(check(`${model}/deferred`)?.status).toBe("pass");
    }
    // the shipped trained models, and quantized copies of one, where models/ has them
    if (existsSync(join(ROOT, "models", "kjv-looped-256.safetensors")))
      for (const model of ["trained", "trained-int4", "trained-int2-mix"]) expect(check(`${model}/greedy`)?.status).toBe("pass");
    // the shipped Ouro-class stack and its Ouro-layout copy: tokens and exit steps at every exit setting
    if (existsSync(join(ROOT, "models", "kjv-ouro-2x4-256.safetensors"))) {
      for (const model of ["trained-ouro", "trained-ouro-import"]) {
        expect(check(`${model}/exits`)?.status).toBe("pass");
        expect(check(`${model}/exits`)?.detail).toMatch(/fixed 1-4; exact and copy at 0.5 and 0.7/);
      }
      expect(check("trained-ouro-import/import")?.status).toBe("pass");
      expect(check("trained-ouro-int4/greedy")?.status).toBe("pass");
    }
    for (const model of ["dim2048-fp16", "ouro-1.4b"]) expect(check(`${model}/load`)?.status).toBe("skip");
  });

  test("the CUDA library serves its verified kernel families by default, and reports them", () => {
    if (!built) return;
    expect(check("library/cuda-device-count")?.status).toBe("pass");
    // quantized weights and stacks passed a validation run on a GPU (bench/gpu-runs/gpu-2026-11-28-h200.json)
    for (const family of ["gating", "stacks-gating"]) {
      expect(check(`library/cuda-${family}-off`)).toMatchObject({ status: "pass", detail: "the family is verified: on by default" });
      expect(check(`library/cuda-${family}-on`)?.detail).toContain("no usable CUDA device");
    }
    expect(check("library/cuda-features")?.status).toBe("pass");
  });

  test("the GPU stages are reported as not available, the figures as a CPU smoke run, the targets unmet", () => {
    for (const name of ["sanitizer/memcheck", "sanitizer/racecheck", "figures/pytorch-peer"]) {
      expect(check(name)?.status).toBe("skip");
      expect(check(name)?.detail).toContain("not available");
    }
    expect(report.figures.map((f) => f.engine)).toEqual(["loopserve (cpu smoke run)"]);
    expect(report.figures[0].tok_s).toBeGreaterThan(0);
    const target = (name: string) => report.targets.find((t) => t.name === name);
    expect(target("one stream dim-2048 fp16 loops 8 tok/s")).toMatchObject({ value: "not measured", met: false });
    expect(target("Ouro-1.4B shape one stream: exit at 0.7 (exact) x 4 steps tok/s")).toMatchObject({ value: "not measured", met: false });
    expect(target("checks failing")).toMatchObject({ value: 0, met: true });
  });

  test("the driver's model descriptors are the TypeScript loader's, byte for byte: the shipped models and every format it writes", () => {
    const files = readdirSync(join(out, "loopserve-gpu-validate")).filter((f) => f.endsWith(".safetensors")).map((f) => join(out, "loopserve-gpu-validate", f));
    for (const f of readdirSync(join(ROOT, "models")).filter((f) => f.endsWith(".safetensors"))) files.push(join(ROOT, "models", f));
    expect(files.length).toBeGreaterThan(10);
    for (const file of files) {
      const r = spawnSync(DRIVER, ["desc", file], { maxBuffer: 1 << 24 });
      expect(r.status).toBe(0);
      expect(Uint8Array.from(r.stdout)).toEqual(Uint8Array.from(descriptorOf(file))); // descriptorOf validates the file first
    }
  });

  test("the driver needs no models/: without them the shipped models' cases are skipped, naming what is absent", () => {
    const r = run([DRIVER, "checks", CPU_LIB, "-", join(out, "drv"), join(out, "no-models"), "--cpu", "--only=trained"]);
    expect(r.code).toBe(0);
    const got = records(r.stdout);
    expect(got.map((c) => [c.name, c.status])).toEqual([
      ["library/cpu-features", "pass"],
      ["trained/load", "skip"],
      ["trained-int4/load", "skip"],
      ["trained-int2-mix/load", "skip"],
      ["trained-ouro/load", "skip"],
      ["trained-ouro-import/load", "skip"],
      ["trained-ouro-int4/load", "skip"],
    ]);
    expect(got[1].detail).toContain("no-models/kjv-looped-256.safetensors is absent");
  });
});

describe("the GPU build", () => {
  test("builds the CPU library with build.ts's flags (the Makefile a bare GPU host uses)", () => {
    const r = run(["make", "--no-print-directory", "-s", "-f", GPU_MAKEFILE, "print-flags"]);
    expect(r.code).toBe(0);
    const lines = r.stdout.split("\n");
    expect(lines).toContain(`C_FLAGS ${C_FLAGS.join(" ")}`);
    expect(lines).toContain(`ISA avx2 ${simdFlags("cpu/avx2/quant_avx2.c").join(" ")}`);
    expect(lines).toContain(`ISA avx512 ${simdFlags("cpu/avx512/quant_avx512.c").join(" ")}`);
  });

  test("fails on a register spill, naming the kernel; the CUDA kernels have none", () => {
    const log = join(testTempDir(), "spill.ptxas");
    Bun.write(log, "ptxas info    : Compiling entry function '_Z6k_testPf' for 'sm_90'\nptxas info    : Function properties for _Z6k_testPf\n    8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n");
    const awk = join(ROOT, "bench", "gpu", "spills.awk");
    const spill = run(["awk", "-f", awk, log]);
    expect(spill.code).toBe(1);
    expect(spill.stdout).toContain("_Z6k_testPf 'sm_90': 8 bytes of spill stores");
    if (!built) return;
    const logs = readdirSync(join(BUILD, "obj", "cuda")).filter((f) => f.endsWith(".ptxas"));
    expect(logs.length).toBeGreaterThan(5);
    expect(run(["awk", "-f", awk, ...logs.map((f) => join(BUILD, "obj", "cuda", f))]).code).toBe(0);
  });
});

describe.skipIf(!built)("the CUDA library through the server's binding, on any host", () => {
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

describe.skipIf(!built || devices === 0)("on a GPU host", () => {
  test("the driver's checks pass with the CUDA library against the CPU library", () => {
    const r = run([DRIVER, "checks", CPU_LIB, CUDA_LIB, mkdtempSync(join(testTempDir(), "gpu-")), join(ROOT, "models")]);
    expect(records(r.stdout).filter((c) => c.status === "fail")).toEqual([]);
    expect(r.code).toBe(0);
  }, 600_000);

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
