// The CI share of `npm run fuzz` (docs/fuzzing.md): about a minute in all.
// 30 s of libFuzzer on the library's model loader, then the property fuzzers: the
// TypeScript validator for 10 s and request bodies against a real server
// for 20 s. A finding fails the test and is saved under fuzz/regressions/
// (commit it with the fix: test/fuzz/regressions.test.ts replays it).
// The libFuzzer part is skipped, with the reason, only where clang or its
// libFuzzer runtime is missing (.ci/system-deps.sh installs both).
import { expect, test } from "bun:test";
import { mkdtempSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { libFuzzerMissing, seedCorpus } from "../../fuzz/build.ts";
import { runLibFuzzer } from "../../fuzz/libfuzzer.ts";
import { fuzzRequests, fuzzValidator } from "../../fuzz/properties.ts";
import { testTempDir } from "../helpers/models.ts";

const LIBFUZZER_SECONDS = 30;
const VALIDATOR_MS = 10_000;
const REQUESTS_MS = 20_000;
// Generous: the limits above plus builds and a server start on a busy machine.
const TIMEOUT_MS = 600_000;

const missing = await libFuzzerMissing();
if (missing !== null) console.warn(`skipping the libFuzzer session: ${missing}`);

test.skipIf(missing !== null)(
  `libFuzzer: ${LIBFUZZER_SECONDS} s of model descriptors and files through ls_model_load under ASan and UBSan`,
  async () => {
    const corpus = mkdtempSync(join(testTempDir(), "libfuzzer-corpus-"));
    const r = await runLibFuzzer("model_load", { seconds: LIBFUZZER_SECONDS, corpus });
    expect({ exitCode: r.exitCode, findings: r.findings, report: r.report }).toEqual({ exitCode: 0, findings: [], report: "" });
    // It really fuzzed: at least the seeds ran, and it printed its final statistics.
    expect(r.executions).toBeGreaterThanOrEqual(readdirSync(seedCorpus("model_load")).length);
  },
  TIMEOUT_MS,
);

test(
  `validator properties: ${VALIDATOR_MS / 1000} s of valid and hostile model files through the TypeScript loader`,
  async () => {
    const results = await fuzzValidator(VALIDATOR_MS);
    for (const r of results) {
      expect({ name: r.name, failure: r.failure }).toEqual({ name: r.name, failure: null });
      expect(r.runs).toBeGreaterThan(0);
    }
  },
  TIMEOUT_MS,
);

test(
  `request bodies: ${REQUESTS_MS / 1000} s of generated bodies on every route family, no 5xx, server healthy`,
  async () => {
    const r = await fuzzRequests(REQUESTS_MS);
    expect({ failure: r.failure, serverProblems: r.serverProblems }).toEqual({ failure: null, serverProblems: [] });
    expect(r.runs).toBeGreaterThan(0);
  },
  TIMEOUT_MS,
);
