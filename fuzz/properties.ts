// Runs the fast-check properties for a time budget and keeps the
// counterexamples: model images under fuzz/regressions/validator/, requests
// under fuzz/regressions/requests/ (test/fuzz/regressions.test.ts replays both).
import fc from "fast-check";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describeCounters, identityHolds, settledRequestCounters } from "../test/helpers/request_counters.ts";
import { startServer } from "../test/helpers/server.ts";
import { saveRegression } from "./regressions.ts";
import { checkHealthy, type FuzzRequest, requestsNeverFailTheServer } from "./requests.ts";
import { hostileModelsAreRefusedCleanly, validModelsLoad } from "./validator.ts";

export interface PropertyResult {
  name: string;
  runs: number;
  seed: number;
  /** Why it failed (with the saved counterexample), or null. */
  failure: string | null;
}

/** Runs a property until timeMs has passed (or it fails) and reports. */
async function runFor<Ts>(
  name: string,
  property: fc.IProperty<Ts> | fc.IAsyncProperty<Ts>,
  timeMs: number,
  save: (counterexample: Ts) => string,
  seed?: number,
): Promise<PropertyResult> {
  const details = await fc.check(property, {
    numRuns: Number.MAX_SAFE_INTEGER,
    plugins: [fc.interruptAfterTimeLimit(timeMs)],
    ...(seed === undefined ? {} : { seed }),
  });
  if (!details.failed || details.counterexample === null) return { name, runs: details.numRuns, seed: details.seed, failure: null };
  const path = save(details.counterexample as Ts);
  const error = details.errorInstance instanceof Error ? details.errorInstance.stack ?? details.errorInstance.message : String(details.errorInstance);
  return {
    name,
    runs: details.numRuns,
    seed: details.seed,
    failure: `${error}\ncounterexample saved as ${path} (seed ${details.seed}, path ${details.counterexamplePath})`,
  };
}

/** The validator's two properties, sharing timeMs; model images are loaded from files in a scratch directory. */
export async function fuzzValidator(timeMs: number, seed?: number): Promise<PropertyResult[]> {
  const dir = mkdtempSync(join(tmpdir(), "loopserve-fuzz-validator-"));
  try {
    const saveImage = ([bytes]: [Uint8Array]) => saveRegression("validator", bytes, ".safetensors");
    return [
      await runFor("validator: valid models load", validModelsLoad(dir), timeMs * 0.25, saveImage, seed),
      await runFor("validator: hostile models refused cleanly", hostileModelsAreRefusedCleanly(dir), timeMs * 0.75, saveImage, seed),
    ];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export interface RequestFuzzResult extends PropertyResult {
  /** What the server looked like afterwards: problems found beyond single answers. */
  serverProblems: string[];
}

/** Sequential request bodies against a real server on a tiny model (its own process), for timeMs. */
export async function fuzzRequests(timeMs: number, seed?: number): Promise<RequestFuzzResult> {
  // A short sequence limit keeps each accepted generation short.
  const server = await startServer({ env: { SERVICE_MAX_SEQ_LEN: "256" } });
  try {
    const save = ([req]: [FuzzRequest]) => saveRegression("requests", `${JSON.stringify(req, null, 2)}\n`, ".json");
    const result = await runFor("requests: no 5xx, server stays healthy", requestsNeverFailTheServer(server.url), timeMs, save, seed);
    return { ...result, serverProblems: await serverProblems(server.url, server.output()) };
  } finally {
    await server.stop();
  }
}

// ---- the server after a fuzz session ----

/**
 * Once the last request has settled: healthy, the request counters add up
 * (test/helpers/request_counters.ts), no engine error, and no internal error
 * in the log (500s inside streams included).
 */
export async function serverProblems(baseUrl: string, log: string): Promise<string[]> {
  const problems: string[] = [];
  const counters = await settledRequestCounters(baseUrl);
  if (!counters.settled || !identityHolds(counters)) problems.push(`metrics: ${describeCounters(counters)}`);
  if (counters.errored !== 0) problems.push(`metrics: ${counters.errored} requests failed with an engine error`);
  const sick = await checkHealthy(baseUrl);
  if (sick !== null) problems.push(sick);
  const internal = log.split("\n").filter((l) => l.includes("internal error on"));
  if (internal.length > 0) problems.push(`server log: ${internal.length} internal errors, first: ${internal[0]}`);
  return problems;
}
