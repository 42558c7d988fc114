// Runs the fast-check properties for a time budget and keeps the
// counterexamples: model images under fuzz/regressions/validator/, requests
// under fuzz/regressions/requests/ (test/fuzz/regressions.test.ts replays both).
import fc from "fast-check";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
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

function metric(text: string, name: string): number {
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, "m").exec(text);
  return m ? Number(m[1]) : Number.NaN;
}

/**
 * Once the last request has settled: healthy, the request counters add up
 * (submitted = completed + rejected + errored + cancelled), no engine error,
 * and no internal error in the log (500s in streams included).
 */
export async function serverProblems(baseUrl: string, log: string): Promise<string[]> {
  const problems: string[] = [];
  let text = "";
  for (let i = 0; i < 200; i++) {
    text = await (await fetch(`${baseUrl}/metrics`)).text();
    if (metric(text, "service_queue_depth") === 0 && metric(text, "service_requests_in_flight") === 0) break;
    await Bun.sleep(50);
  }
  const [submitted, completed, rejected, errored, cancelled] = [
    "service_requests_submitted_total",
    "service_requests_completed_total",
    "service_requests_rejected_total",
    "service_requests_errored_total",
    "service_requests_cancelled_total",
  ].map((n) => metric(text, n));
  if (submitted !== completed + rejected + errored + cancelled) {
    problems.push(`metrics: submitted ${submitted} != completed ${completed} + rejected ${rejected} + errored ${errored} + cancelled ${cancelled}`);
  }
  if (errored !== 0) problems.push(`metrics: ${errored} requests failed with an engine error`);
  const sick = await checkHealthy(baseUrl);
  if (sick !== null) problems.push(sick);
  const internal = log.split("\n").filter((l) => l.includes("internal error on"));
  if (internal.length > 0) problems.push(`server log: ${internal.length} internal errors, first: ${internal[0]}`);
  return problems;
}
