// The pool of session buffers (kernels/cpu/bufpool.c) under ASan/UBSan, through
// test/c/bufpool_driver.c: buffers under 2 MB (calloc's) and those mapped
// on their own into huge pages (a session's K/V cache) come zeroed, fresh
// or reused; a held buffer and the bytes past what was asked for are
// poisoned, so a write past the end is reported for both kinds.
import { beforeAll, describe, expect, test } from "bun:test";
import { runSanitized, SANITIZED_BUILD_MS, SANITIZER_ENV, sanitizedDriver } from "../helpers/sanitized.ts";

let driver = "";

beforeAll(async () => {
  driver = await sanitizedDriver("bufpool_driver");
}, SANITIZED_BUILD_MS);

describe("session buffer pool under ASan/UBSan", () => {
  test("fresh and reused buffers are zeroed, held and past-the-end bytes poisoned, the pool's limits kept", () => {
    const r = runSanitized(driver, ["check"]);
    expect(r.stdout).not.toContain("fail:");
    expect(r.code).toBe(0);
    expect(r.stdout.match(/^ok /gm)?.length).toBe(4);
  });

  for (const [mode, bytes] of [
    ["overflow", 300_000],
    ["overflow", 3 * 1024 * 1024 + 100],
    ["reused", 300_000],
    ["reused", 3 * 1024 * 1024 + 100],
  ] as const) {
    test(`a write past a ${mode === "reused" ? "reused" : "fresh"} ${bytes}-byte buffer is reported`, () => {
      const r = Bun.spawnSync([driver, mode, String(bytes)], { env: SANITIZER_ENV, stdout: "pipe", stderr: "pipe" });
      expect(r.stdout.toString()).not.toContain("unreported");
      expect(r.stderr.toString()).toMatch(/ERROR: AddressSanitizer: (use-after-poison|heap-buffer-overflow)/);
    });
  }
});
