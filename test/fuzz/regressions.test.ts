// Every saved fuzz finding (fuzz/regressions/, see docs/fuzzing.md) replayed
// on every test run, so a fixed crash stays fixed:
//   - libFuzzer's inputs (a model descriptor, then a model file) and its
//     seed corpus through the libFuzzer target itself, built without
//     libFuzzer (fuzz/replay_main.c) under gcc's AddressSanitizer and UBSan:
//     no sanitizer report, no abort;
//   - the validator fuzzer's model files and its seeds through the
//     TypeScript loader: loaded, or refused with a ModelFormatError;
//   - saved requests against a real server: no 5xx, still healthy.
// Needs only gcc: it runs where clang and libFuzzer are absent.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdtempSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { writeModelSeeds, writeSeedCorpus } from "../../fuzz/corpus.ts";
import { serverProblems } from "../../fuzz/properties.ts";
import { regressionFiles } from "../../fuzz/regressions.ts";
import { checkHealthy, type FuzzRequest, send } from "../../fuzz/requests.ts";
import { checkImage } from "../../fuzz/validator.ts";
import { testTempDir } from "../helpers/models.ts";
import { runSanitized, SANITIZED_BUILD_MS, sanitizedProgram } from "../helpers/sanitized.ts";
import { startServer } from "../helpers/server.ts";

// Sanitized builds and runs are slow on a busy machine.
setDefaultTimeout(300_000);

const FUZZ = resolve(import.meta.dir, "../../fuzz");

let seeds: string[] = []; // libFuzzer's: descriptor + file
let modelSeeds: string[] = []; // the validator's: files
beforeAll(() => {
  seeds = writeSeedCorpus(join(testTempDir(), "fuzz-seeds"));
  modelSeeds = writeModelSeeds(join(testTempDir(), "fuzz-model-seeds"));
});

describe("saved model findings and the seed corpora", () => {
  test("there are saved findings to replay", () => {
    // fuzz/regressions/validator/ holds at least the nested-header finding.
    expect(regressionFiles("validator").length).toBeGreaterThan(0);
  });

  test("the library's loader under ASan and UBSan: each descriptor and file loads or is refused, no sanitizer report", async () => {
    const exe = await sanitizedProgram("fuzz_model_load_replay", [join(FUZZ, "model_load.c"), join(FUZZ, "replay_main.c")]);
    const files = [...seeds, ...regressionFiles("model_load")];
    // runSanitized throws on any sanitizer report; the target aborts on its own findings.
    const r = runSanitized(exe, files);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect(r.stdout.trim().split("\n")).toEqual(files.map((f) => `ok ${f}`));
  }, SANITIZED_BUILD_MS);

  test("the TypeScript loader: each file loads or is refused with a ModelFormatError", () => {
    const dir = mkdtempSync(join(testTempDir(), "fuzz-replay-"));
    const verdicts = [...modelSeeds, ...regressionFiles("validator")].map((f) => ({ f, v: checkImage(new Uint8Array(readFileSync(f)), dir) }));
    // The valid seeds load; the corrupted seeds and the findings are refused.
    for (const { f, v } of verdicts) {
      const loads = /\/(fp16|fp16-tied|int4-head-int8|int2-head-fp16|fp16-head-int4|int4-head-int6|stack-gated|stack-int4)\.safetensors$/.test(f);
      expect({ f, loaded: v.loaded }).toEqual({ f, loaded: loads });
    }
  });
});

const requests = regressionFiles("requests");

test("request regressions are saved (the bodies behind fixed 500s)", () => {
  expect(requests.length).toBeGreaterThan(0);
});

test("saved requests answer without a 5xx and leave the server healthy", async () => {
  const server = await startServer({ env: { SERVICE_MAX_SEQ_LEN: "256" } });
  try {
    for (const file of requests) {
      const req = JSON.parse(readFileSync(file, "utf8")) as FuzzRequest;
      const outcome = await send(server.url, req);
      expect({ file, problem: outcome.problem }).toEqual({ file, problem: null });
      expect({ file, health: await checkHealthy(server.url) }).toEqual({ file, health: null });
    }
    expect(await serverProblems(server.url, server.output())).toEqual([]);
  } finally {
    await server.stop();
  }
});
