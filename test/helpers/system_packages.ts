// System packages some tests need beyond npm (PyTorch, the KJV text). Where
// one is missing those tests skip instead of failing, and the reason and the
// remedy are printed once per test run: `npm test` installs the packages
// itself where it can (root or passwordless sudo, and apt-get), so a skip
// only happens on a host where it could not.
import { existsSync } from "node:fs";
import { PYTHON } from "./torch.ts";

export interface SystemRequirement {
  /** What the tests need, in words. */
  what: string;
  /** The Debian packages that bring it. */
  packages: string[];
  /** Null when present, else what is wrong. */
  probe(): string | null;
}

/** Null when Debian's interpreter imports every module, else its last error line. */
function pythonImports(modules: string[]): string | null {
  if (!existsSync(PYTHON)) return `${PYTHON} does not exist`;
  const r = Bun.spawnSync([PYTHON, "-c", `import ${modules.join(", ")}`], { stdout: "ignore", stderr: "pipe" });
  if (r.exitCode === 0) return null;
  return r.stderr.toString().trim().split("\n").pop() ?? `${PYTHON} exited ${r.exitCode}`;
}

/** The PyTorch package's dependencies (torch/loopserve_torch): torch.nn, not torch alone, which an empty directory satisfies. */
export const PYTORCH: SystemRequirement = {
  what: "PyTorch",
  packages: ["python3-torch", "python3-numpy", "python3-tqdm"],
  probe: () => pythonImports(["torch.nn", "numpy", "tqdm"]),
};

/** The training text as torch/loopserve_torch/data.py reads it: bible(1) and numpy. */
export const KJV_TEXT: SystemRequirement = {
  what: "the King James Bible text",
  packages: ["bible-kjv", "python3-numpy"],
  probe: () => (Bun.which("bible") === null ? "the `bible` command is not installed" : pythonImports(["numpy"])),
};

const probed = new Map<SystemRequirement, string | null>();

/**
 * Null when every requirement is present; else why the tests that need them
 * skip. The first time a requirement is found missing, the reason and the
 * remedy are printed.
 */
export function skipReason(...requirements: SystemRequirement[]): string | null {
  const reasons: string[] = [];
  for (const req of requirements) {
    if (!probed.has(req)) {
      const problem = req.probe();
      probed.set(req, problem);
      if (problem !== null) {
        console.warn(
          `skipping the tests that need ${req.what}: ${problem}. ` +
            `Install the Debian packages ${req.packages.join(" ")} (npm test installs them itself when run as root or with passwordless sudo where apt-get exists).`,
        );
      }
    }
    const problem = probed.get(req);
    if (problem) reasons.push(`${req.what} is missing (${problem})`);
  }
  return reasons.length > 0 ? reasons.join("; ") : null;
}
