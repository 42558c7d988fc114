// The shipped deployment files as the deployment tests read them.
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";

export const DEPLOY_DIR = resolve(import.meta.dir, "../../deploy");

/** The active VAR=value lines of deploy/loopserve.env (what systemd's EnvironmentFile= reads). */
export function shippedEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const line of readFileSync(join(DEPLOY_DIR, "loopserve.env"), "utf8").split("\n")) {
    const m = /^([A-Z_][A-Z0-9_]*)=(.*)$/.exec(line.trim());
    if (m) env[m[1]] = m[2];
  }
  return env;
}

/** The shipped settings for a test instance, whose model and port are the test's own. */
export function shippedInstanceEnv(extra: Record<string, string> = {}): Record<string, string> {
  const { SERVICE_MODEL_PATH: _model, PORT: _port, ...rest } = shippedEnv();
  return { ...rest, ...extra };
}
