// Where a system package is missing, the tests that need it skip with the
// reason instead of failing. Checked for real where the host allows it (root
// and unshare): the PyTorch and KJV tests run in a sub-`bun test` with the
// package hidden in a private mount namespace (something empty mounted over
// it, visible to that process tree alone), and must end in skips, the
// printed reason and no failure.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, statSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { testTempDir } from "./helpers/models.ts";

const ROOT = resolve(import.meta.dir, "..");
/** Where Debian's python3-torch lives. */
const TORCH_DIR = "/usr/lib/python3/dist-packages/torch";

function namespaceUnavailable(): string | null {
  if (process.getuid?.() !== 0) return "not running as root";
  if (Bun.which("unshare") === null) return "unshare is not installed (util-linux)";
  // A container may grant the namespace but not the mount: try both.
  const dir = testTempDir();
  const r = Bun.spawnSync(["unshare", "-m", "--propagation", "private", "mount", "--bind", dir, dir], { stderr: "pipe" });
  return r.exitCode === 0 ? null : `a bind mount in a private mount namespace failed: ${r.stderr.toString().trim()}`;
}

const unavailable = namespaceUnavailable();
if (unavailable !== null) console.warn(`skipping the hidden-package checks: ${unavailable}`);

/** Runs `tests` in a sub-`bun test` with `path` (when it exists) covered by an empty directory or file. */
function runWithHidden(path: string | null, tests: string[]): { output: string; exitCode: number | null } {
  const empty = mkdtempSync(join(testTempDir(), "hidden-"));
  let cover = empty;
  if (path !== null && !statSync(path).isDirectory()) {
    cover = join(empty, "not-executable");
    writeFileSync(cover, "");
  }
  const mount = path !== null && existsSync(path) ? 'mount --bind "$1" "$2" && ' : "";
  const script = `${mount}exec "$3" test --timeout 120000 "\${@:4}"`;
  const r = Bun.spawnSync(
    ["unshare", "-m", "--propagation", "private", "bash", "-c", script, "hide", cover, path ?? "", process.execPath, ...tests],
    { cwd: ROOT, stdout: "pipe", stderr: "pipe" },
  );
  return { output: r.stdout.toString() + r.stderr.toString(), exitCode: r.exitCode };
}

/** bun test's summary count of `what` ("pass", "skip", "fail"). */
function count(output: string, what: string): number {
  return Number(new RegExp(`^\\s*(\\d+) ${what}$`, "m").exec(output)?.[1] ?? 0);
}

/** The sub-run printed the reason and the package, skipped at least `skips` tests, passed some and failed none. */
function expectSkipped(r: { output: string; exitCode: number | null }, reason: string, pkg: string, skips: number): void {
  const seen = {
    reasonPrinted: r.output.includes(reason),
    packageNamed: r.output.includes(pkg),
    enoughSkips: count(r.output, "skip") >= skips,
    somePass: count(r.output, "pass") > 0,
    fail: count(r.output, "fail"),
    exitCode: r.exitCode,
  };
  const wanted = { reasonPrinted: true, packageNamed: true, enoughSkips: true, somePass: true, fail: 0, exitCode: 0 };
  if (!Bun.deepEquals(seen, wanted)) console.log(r.output); // the sub-run's own report
  expect(seen).toEqual(wanted);
}

describe.skipIf(unavailable !== null)("the PyTorch and KJV tests with a package hidden", () => {
  test("without PyTorch: its tests skip with the reason and the Debian packages, the rest pass", () => {
    const r = runWithHidden(existsSync(TORCH_DIR) ? TORCH_DIR : null, ["test/torch", "test/cli/tokenize.test.ts"]);
    // 6: the equivalence, training and unittest checks
    expectSkipped(r, "skipping the tests that need PyTorch", "python3-torch", 6);
  });

  test("without bible-kjv: the KJV split and the trained model's English checks skip with the reason, the rest pass", () => {
    const r = runWithHidden(Bun.which("bible"), ["test/cli/tokenize.test.ts", "test/http/trained_model.test.ts"]);
    expectSkipped(r, "skipping the tests that need the King James Bible text", "bible-kjv", 4);
  });
});
