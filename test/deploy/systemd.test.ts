// The shipped systemd units pass `systemd-analyze verify`, and their
// hardening scores as "OK" in `systemd-analyze security`, alone and with the
// API-key drop-in (deploy/api-key.conf). The environment file is a valid
// configuration, and the units' readiness probe, run for real, passes
// against a server started with the shipped settings and an API key.
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
import { loadConfig } from "../../src/config.ts";
import { startServer } from "../helpers/server.ts";
import { shippedEnv, shippedInstanceEnv } from "../helpers/deploy.ts";

const ROOT = resolve(import.meta.dir, "../..");
const DEPLOY = join(ROOT, "deploy");
const UNITS = ["loopserve.service", "loopserve@.service"];
const DROP_IN = "api-key.conf";
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

  describe("with the API-key drop-in", () => {
    beforeAll(() => {
      // The drop-in as installed, for both units, in the same throwaway root.
      for (const unit of UNITS) {
        const dir = join(root, "etc/systemd/system", `${unit}.d`);
        mkdirSync(dir, { recursive: true });
        writeFileSync(join(dir, DROP_IN), readFileSync(join(DEPLOY, DROP_IN), "utf8"));
      }
    });

    test("the drop-in hands the key file over as a credential", () => {
      const text = readFileSync(join(DEPLOY, DROP_IN), "utf8");
      expect(text).toMatch(/^LoadCredential=api-key:\/etc\/loopserve\/api-key$/m);
      expect(text).toMatch(/^Environment=SERVICE_API_KEY_FILE=%d\/api-key$/m);
    });

    test("verify really reads drop-ins: a typo in one is reported", () => {
      const dir = join(root, "etc/systemd/system/typo-dropin.service.d");
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(root, "etc/systemd/system/typo-dropin.service"), "[Service]\nExecStart=/usr/local/bin/loopserve serve\n");
      writeFileSync(join(dir, DROP_IN), "[Service]\nLoadCredentiall=api-key:/etc/loopserve/api-key\n");
      expect(run(["verify", "--man=no", `--root=${root}`, "typo-dropin.service"]).out).toContain("LoadCredentiall");
    });

    for (const unit of UNITS) {
      test(`systemd-analyze verify accepts ${unit} with it without a warning`, () => {
        const { code, out } = run(["verify", "--man=no", `--root=${root}`, VERIFY_AS[unit]]);
        expect(out.trim()).toBe("");
        expect(code).toBe(0);
      });

      test(`${unit} with it still rates below 4 in systemd-analyze security`, () => {
        const { code, out } = run(["security", "--offline=yes", `--root=${root}`, VERIFY_AS[unit]]);
        if (code !== 0 && /unrecognized option|offline/i.test(out)) return;
        const m = /Overall exposure level for \S+: ([0-9.]+)/.exec(out);
        expect(m).not.toBeNull();
        expect(Number(m?.[1])).toBeLessThan(4);
      });
    }
  });
});

describe("the shipped environment file and the readiness probe", () => {
  test("deploy/loopserve.env is a valid configuration", () => {
    const config = loadConfig(shippedEnv());
    expect(config.host).toBe("127.0.0.1");
    expect(config.allowedHosts.length).toBeGreaterThan(0);
    expect(config.apiKey).toBeNull();
  });

  // The probe's shell script as systemd hands it to bash: `$$` is `$`, `\\` is `\`, %i the port.
  function probeScript(unit: string, port: number): string {
    const line = readFileSync(join(DEPLOY, unit), "utf8").split("\n").find((l) => l.startsWith("ExecStartPost=")) as string;
    const m = /^ExecStartPost=\/bin\/bash -c '(.*)'$/.exec(line);
    if (!m) throw new Error(`${unit}: ExecStartPost is no longer /bin/bash -c '...'`);
    return m[1].replaceAll("$$", "$").replaceAll("\\\\", "\\").replaceAll("%i", String(port));
  }

  test.each(UNITS)("%s: the readiness probe passes against the shipped settings with an API key (healthz needs no key, no Host is sent)", async (unit) => {
    const keyDir = mkdtempSync(join(tmpdir(), "loopserve-probe-"));
    writeFileSync(join(keyDir, "api-key"), "sk-probe\n");
    const s = await startServer({ env: shippedInstanceEnv({ SERVICE_API_KEY_FILE: join(keyDir, "api-key") }) });
    try {
      const port = Number(new URL(s.url).port);
      const probe = Bun.spawn(["/bin/bash", "-c", probeScript(unit, port)], { env: { PORT: String(port) }, stdout: "pipe", stderr: "pipe" });
      const timer = setTimeout(() => probe.kill(), 20_000);
      expect(await probe.exited).toBe(0);
      clearTimeout(timer);
      // And the key is really required on the API.
      expect((await fetch(`${s.url}/v1/models`)).status).toBe(401);
    } finally {
      await s.stop();
      rmSync(keyDir, { recursive: true, force: true });
    }
  });
});
