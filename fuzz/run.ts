// `npm run fuzz`: a fuzz session of a given length over every fuzzer, one
// after the other: the libFuzzer target of the C model loader (half the
// time), then the TypeScript validator's properties and the request-body
// property against a real server (the other half, 2:3). Findings are saved
// under fuzz/regressions/ and the exit code is 1 when there are any.
//
//   npm run fuzz                        600 s in all
//   npm run fuzz -- --seconds 3600      an hour
//   npm run fuzz -- --only validator    one fuzzer (libfuzzer, validator, requests)
//   npm run fuzz -- --seed 42           the properties' fast-check seed, to reproduce a run
import { parseArgs } from "node:util";
import { libFuzzerMissing } from "./build.ts";
import { runLibFuzzer } from "./libfuzzer.ts";
import { fuzzRequests, fuzzValidator, type PropertyResult } from "./properties.ts";

const FUZZERS = ["libfuzzer", "validator", "requests"] as const;
type Fuzzer = (typeof FUZZERS)[number];
/** Share of the session each fuzzer gets (renormalised over those that run). */
const SHARE: Record<Fuzzer, number> = { libfuzzer: 0.5, validator: 0.2, requests: 0.3 };

function usage(message: string): never {
  console.error(`${message}\nusage: npm run fuzz -- [--seconds N] [--only ${FUZZERS.join("|")}] [--seed N]`);
  process.exit(2);
}

const { values } = parseArgs({
  args: process.argv.slice(2),
  options: { seconds: { type: "string", default: "600" }, only: { type: "string" }, seed: { type: "string" } },
  strict: true,
});
const seconds = Number(values.seconds);
if (!Number.isFinite(seconds) || seconds < 3) usage(`--seconds must be a number of seconds, at least 3, got ${values.seconds}`);
if (values.only !== undefined && !(FUZZERS as readonly string[]).includes(values.only)) usage(`--only must be one of ${FUZZERS.join(", ")}`);
const seed = values.seed === undefined ? undefined : Number(values.seed);
if (seed !== undefined && !Number.isSafeInteger(seed)) usage(`--seed must be an integer, got ${values.seed}`);

let chosen: Fuzzer[] = values.only ? [values.only as Fuzzer] : [...FUZZERS];
const missing = chosen.includes("libfuzzer") ? await libFuzzerMissing() : null;
if (missing !== null) {
  console.error(`skipping libFuzzer: ${missing}`);
  chosen = chosen.filter((f) => f !== "libfuzzer");
  if (chosen.length === 0) process.exit(1);
}
const total = chosen.reduce((a, f) => a + SHARE[f], 0);
const budget = (f: Fuzzer) => (seconds * SHARE[f]) / total;

const findings: string[] = [];
const show = (r: PropertyResult) => {
  console.log(`${r.name}: ${r.runs} runs (seed ${r.seed})${r.failure ? "  FINDING" : ""}`);
  if (r.failure) findings.push(`${r.name}: ${r.failure}`);
};

if (chosen.includes("libfuzzer")) {
  console.log(`libFuzzer, model_load: ${Math.round(budget("libfuzzer"))} s`);
  const r = await runLibFuzzer("model_load", { seconds: budget("libfuzzer") });
  console.log(`libFuzzer, model_load: ${r.executions} executions, corpus ${r.corpusSize} inputs, exit ${r.exitCode} (log ${r.logPath})`);
  if (r.findings.length > 0 || r.exitCode !== 0) {
    findings.push(`libFuzzer model_load: exit ${r.exitCode}, saved ${r.findings.join(", ") || "nothing"}\n${r.report || r.log.slice(-3000)}`);
  }
}
if (chosen.includes("validator")) {
  console.log(`validator properties: ${Math.round(budget("validator"))} s`);
  for (const r of await fuzzValidator(budget("validator") * 1000, seed)) show(r);
}
if (chosen.includes("requests")) {
  console.log(`request bodies: ${Math.round(budget("requests"))} s`);
  const r = await fuzzRequests(budget("requests") * 1000, seed);
  show(r);
  for (const p of r.serverProblems) findings.push(`server after the request fuzzing: ${p}`);
}

if (findings.length > 0) {
  console.error(`\n${findings.length} finding(s):\n\n${findings.join("\n\n")}`);
  process.exit(1);
}
console.log("no findings");
