// Runs a libFuzzer target for a while and keeps what it finds: the target's
// artifacts (crash-*, leak-*, timeout-*, oom-*) are copied into
// fuzz/regressions/<target>/, where the regression test replays them.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { buildFuzzTarget, dictionary, FUZZ_BUILD, type FuzzTarget, seedCorpus } from "./build.ts";
import { keepArtifacts } from "./regressions.ts";

export interface LibFuzzerOptions {
  seconds: number;
  /** Working corpus (grows as libFuzzer finds new coverage); default build/fuzz/corpus/<target>/. */
  corpus?: string;
  /** Largest input in bytes; the seeds are a few kilobytes. */
  maxLen?: number;
}

export interface LibFuzzerResult {
  target: FuzzTarget;
  /** libFuzzer's exit code: 0 when the time ran out without a finding. */
  exitCode: number;
  executions: number;
  corpusSize: number;
  /** Findings, as saved under fuzz/regressions/<target>/. */
  findings: string[];
  /** libFuzzer's whole output (build/fuzz/<target>.log). */
  log: string;
  logPath: string;
  /** The report of the finding (sanitizer or the target's own), or "" when none. */
  report: string;
}

const ARTIFACT = /^(crash|leak|timeout|oom|slow-unit)-/;

/** From the first sanitizer report or target abort in a libFuzzer log, a few kilobytes. */
function findingReport(log: string): string {
  const at = log.search(/==\d+==ERROR|runtime error|^model_load: |ERROR: libFuzzer/m);
  return at < 0 ? "" : log.slice(at, at + 3000);
}

/** Fuzzes `target` for opts.seconds; resolves when libFuzzer stops (time up or a finding). */
export async function runLibFuzzer(target: FuzzTarget, opts: LibFuzzerOptions): Promise<LibFuzzerResult> {
  const exe = await buildFuzzTarget(target);
  const seeds = seedCorpus(target);
  const corpus = opts.corpus ?? join(FUZZ_BUILD, "corpus", target);
  mkdirSync(corpus, { recursive: true });
  const artifacts = mkdtempSync(join(FUZZ_BUILD, `artifacts-${target}-`));
  const dict = dictionary(target);
  const args = [
    exe,
    `-max_total_time=${Math.max(1, Math.round(opts.seconds))}`,
    `-max_len=${opts.maxLen ?? 16384}`,
    "-timeout=20", // seconds per input: a hang, never a slow input (they take milliseconds)
    "-rss_limit_mb=4096",
    "-use_value_profile=1",
    "-print_final_stats=1",
    `-artifact_prefix=${artifacts}/`,
    ...(dict ? [`-dict=${dict}`] : []),
    corpus, // first directory: new inputs are written here
    seeds,
  ];
  const p = Bun.spawn(args, { stdout: "pipe", stderr: "pipe", env: { ...process.env, ASAN_OPTIONS: "detect_leaks=1", UBSAN_OPTIONS: "print_stacktrace=1" } });
  const [exitCode, out, err] = await Promise.all([p.exited, new Response(p.stdout).text(), new Response(p.stderr).text()]);
  const log = out + err;
  const logPath = join(FUZZ_BUILD, `${target}.log`);
  writeFileSync(logPath, log);

  const found = existsSync(artifacts) ? readdirSync(artifacts).filter((f) => ARTIFACT.test(f)).map((f) => join(artifacts, f)) : [];
  const findings = keepArtifacts(target, found);
  rmSync(artifacts, { recursive: true, force: true });
  const stat = (name: string) => Number(new RegExp(`stat::${name}:\\s+(\\d+)`).exec(log)?.[1] ?? 0);
  return {
    target,
    exitCode,
    executions: stat("number_of_executed_units"),
    corpusSize: readdirSync(corpus).length,
    findings,
    log,
    logPath,
    report: findingReport(log),
  };
}
