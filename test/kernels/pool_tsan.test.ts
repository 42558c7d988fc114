// The thread pool (kernels/cpu/threadpool.c) under ThreadSanitizer, through
// test/c/pool_driver.c: every task of a job runs exactly once at any thread
// count and job size (past the 65535 tasks one job word holds), back-to-back
// jobs lose none across generations, a stalled thread's range is finished
// by the others, and jobs after the workers have gone to sleep still run.
// Every kernel's thread-count invariance rests on this (forward.test.ts and
// quant_forward.test.ts compare whole passes across thread counts).
import { beforeAll, describe, expect, test } from "bun:test";
import { runSanitized, threadSanitizedDriver } from "../helpers/sanitized.ts";

let driver = "";

beforeAll(async () => {
  driver = await threadSanitizedDriver("pool_driver", ["cpu/threadpool.c"]);
}, 120_000);

describe("thread pool under ThreadSanitizer", () => {
  test("every task once, across sizes, thread counts, generations, stalls and sleeps; no data race", () => {
    const r = runSanitized(driver, []);
    expect(r.stdout).not.toContain("fail:");
    expect(r.stderr).not.toContain("ThreadSanitizer");
    expect(r.stdout.match(/^ok \w+$/gm)).toEqual(["ok every", "ok burst", "ok steal", "ok sleep"]);
    expect(r.code).toBe(0);
  });
});
