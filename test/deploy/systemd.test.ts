// The shipped systemd units pass `systemd-analyze verify`, and their
// hardening scores as "OK" in `systemd-analyze security`.
//
// verify checks that every Exec*= command exists and is executable, which
// /usr/local/bin/loopserve is not on a build host. So the units are verified
// inside a throwaway root (--root): a copy of the host's systemd units (for
// network-online.target, multi-user.target and the rest), the units under
// test in /etc/systemd/system, and a stand-in executable at every path the
// units run. Verify only needs the paths to be executables; what the binary
// does is test/binary.test.ts's business.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";

const ROOT = resolve(import.meta.dir, "../..");
const DEPLOY = join(ROOT, "deploy");
const UNITS = ["loopserve.service", "loopserve@.service"];
// What verify is asked about: the template is checked through one instance.
const VERIFY_AS: Record<string, string> = { "loopserve.service": "loopserve.service", "loopserve@.service": "loopserve@8001.service" };

const analyze = Bun.which("systemd-analyze");
const hostUnits = ["/usr/lib/systemd/system", "/lib/systemd/system"].find((d) => existsSync(join(d, "multi-user.target")));
const skipReason = !analyze
  ? "systemd-analyze is not installed (.ci/system-deps.sh installs it)"
  : !hostUnits
    ? "no systemd unit directory with multi-user.target on this host"
    : null;
if (skipReason) console.warn(`skipping systemd unit tests: ${skipReason}`);

/** Absolute programs run by Exec*= lines (prefixes such as - @ : + ! stripped). */
function execPaths(unitText: string): string[] {
  const paths = new Set<string>();
  for (const line of unitText.split("\n")) {
    const m = /^\s*Exec[A-Za-z]*=\s*[-@:+!]*(\/\S+)/.exec(line);
    if (m) paths.add(m[1]);
  }
  return [...paths];
}

let root = "";

function run(args: string[]): { code: number; out: string } {
  const p = Bun.spawnSync([analyze as string, ...args], { stdout: "pipe", stderr: "pipe" });
  return { code: p.exitCode ?? -1, out: `${p.stdout.toString()}${p.stderr.toString()}` };
}

describe.skipIf(skipReason !== null)("systemd units", () => {
  beforeAll(() => {
    root = mkdtempSync(join(tmpdir(), "loopserve-systemd-"));
    const unitDir = join(root, "etc/systemd/system");
    mkdirSync(unitDir, { recursive: true });
    cpSync(hostUnits as string, join(root, "usr/lib/systemd/system"), { recursive: true, verbatimSymlinks: true });
    for (const unit of UNITS) {
      const text = readFileSync(join(DEPLOY, unit), "utf8");
      writeFileSync(join(unitDir, unit), text);
      for (const exe of execPaths(text)) {
        const at = join(root, exe);
        mkdirSync(dirname(at), { recursive: true });
        writeFileSync(at, "#!/bin/sh\nexit 0\n");
        chmodSync(at, 0o755);
      }
    }
  });

  afterAll(() => {
    if (root) rmSync(root, { recursive: true, force: true });
  });

  test("the units run the installed binary and read the environment file", () => {
    for (const unit of UNITS) {
      const text = readFileSync(join(DEPLOY, unit), "utf8");
      expect(text).toMatch(/^ExecStart=\/usr\/local\/bin\/loopserve serve/m);
      expect(text).toMatch(/^EnvironmentFile=\/etc\/loopserve\/loopserve\.env$/m);
      expect(text).toMatch(/^Restart=on-failure$/m);
      expect(text).toMatch(/^ExecStartPost=.*\/healthz/m);
      for (const hardening of ["DynamicUser=yes", "ProtectSystem=strict", "ProtectHome=yes", "NoNewPrivileges=yes", "PrivateTmp=yes", "CacheDirectory=loopserve"])
        expect(text).toContain(`\n${hardening}\n`);
    }
    expect(readFileSync(join(DEPLOY, "loopserve@.service"), "utf8")).toContain("loopserve serve --port %i");
  });

  for (const unit of UNITS) {
    test(`systemd-analyze verify accepts ${unit} without a warning`, () => {
      const { code, out } = run(["verify", "--man=no", `--root=${root}`, VERIFY_AS[unit]]);
      expect(out.trim()).toBe("");
      expect(code).toBe(0);
    });
  }

  test("verify really checks the unit: a unit with a typo is reported", () => {
    const unitDir = join(root, "etc/systemd/system");
    writeFileSync(join(unitDir, "typo.service"), "[Service]\nExecStart=/usr/local/bin/loopserve serve\nRestartt=always\n");
    const { out } = run(["verify", "--man=no", `--root=${root}`, "typo.service"]);
    expect(out).toContain("Restartt");
  });

  for (const unit of UNITS) {
    test(`systemd-analyze security rates ${unit}'s hardening OK (exposure below 4)`, () => {
      const { code, out } = run(["security", "--offline=yes", `--root=${root}`, VERIFY_AS[unit]]);
      if (code !== 0 && /unrecognized option|offline/i.test(out)) {
        console.warn(`systemd-analyze security --offline is not supported here: ${out.split("\n")[0]}`);
        return;
      }
      const m = /Overall exposure level for \S+: ([0-9.]+)/.exec(out);
      expect(m).not.toBeNull();
      expect(Number(m?.[1])).toBeLessThan(4);
    });
  }
});
