// /healthz when the model failed to load (docs/security.md): the reason is
// there for everyone (a 503 with a description), the server's file paths
// only in the log and for callers holding the API key; without a key
// configured the model list shows the path to everyone, so /healthz does too.
import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { copyFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";
import { readRawSafetensors, writeRawSafetensors } from "../helpers/safetensors.ts";
import { expect503 } from "../helpers/scheduling.ts";
import { serverForTests, startServer } from "../helpers/server.ts";

setDefaultTimeout(60_000);

const KEY = "healthz-test-key";
const F16_NAN = 0x7e00;

/** The tiny model with one NaN weight: the loader refuses it, naming the file and the tensor. */
function nanModelPath(): string {
  const { header, data } = readRawSafetensors(tinyModelPath());
  const t = header["block.w3.weight"] as { dtype: string; data_offsets: [number, number] };
  expect(t.dtype).toBe("F16");
  const copy = new Uint8Array(data);
  new DataView(copy.buffer).setUint16(t.data_offsets[0], F16_NAN, true);
  return writeRawSafetensors(join(testTempDir(), "healthz-nan.safetensors"), header, copy);
}

const REASON = "tensor 'block.w3.weight' holds a non-finite value (NaN) at element 0";

describe("with an API key configured", () => {
  let path = "";
  const s = serverForTests(() => {
    path = nanModelPath();
    return { modelPath: path, env: { SERVICE_API_KEY: KEY } };
  });

  test("without the key: 503 with the reason and no file path", async () => {
    const body = await expect503(await fetch(`${s.url}/healthz`), "model_not_loaded");
    expect(body.error.message).toContain(REASON);
    expect(body.error.message).not.toContain(path);
    expect(body.error.message).not.toContain(testTempDir());
    expect(body.error.message).not.toContain("/");
  });

  test("a wrong key is no key", async () => {
    const body = await expect503(await fetch(`${s.url}/healthz`, { headers: { authorization: "Bearer wrong" } }), "model_not_loaded");
    expect(body.error.message).not.toContain(path);
  });

  test("with the key: the full detail, path included; and the log has it", async () => {
    const body = await expect503(await fetch(`${s.url}/healthz`, { headers: { authorization: `Bearer ${KEY}` } }), "model_not_loaded");
    expect(body.error.message).toContain(path);
    expect(body.error.message).toContain(REASON);
    expect(s.output()).toContain(path);
  });

  test("a 503 for a model that did not load says to retry in a minute", async () => {
    expect((await fetch(`${s.url}/healthz`)).headers.get("retry-after")).toBe("60");
  });
});

describe("with an API key: a model path with spaces, and a bare file name", () => {
  const ROOT = join(import.meta.dir, "../..");

  test("neither shows any part of the path", async () => {
    const dir = join(testTempDir(), "models with spaces");
    mkdirSync(dir, { recursive: true });
    const spaced = join(dir, "my nan model.safetensors");
    copyFileSync(nanModelPath(), spaced);
    const bare = "healthz-bare-nan.safetensors";
    copyFileSync(nanModelPath(), join(testTempDir(), bare));
    for (const [modelPath, cwd, parts] of [
      [spaced, ROOT, ["models with spaces", "my nan model", "with spaces", "nan model"]],
      [bare, testTempDir(), [bare, "healthz-bare-nan"]],
    ] as const) {
      const s = await startServer({ modelPath, cwd, command: [process.execPath, join(ROOT, "src/cli/main.ts"), "serve"], env: { SERVICE_API_KEY: KEY } });
      try {
        const body = await expect503(await fetch(`${s.url}/healthz`), "model_not_loaded");
        expect(body.error.message).toContain(REASON);
        for (const part of parts) expect(body.error.message).not.toContain(part);
        const full = await expect503(await fetch(`${s.url}/healthz`, { headers: { authorization: `Bearer ${KEY}` } }), "model_not_loaded");
        expect(full.error.message).toContain(modelPath);
      } finally {
        await s.stop();
      }
    }
  });
});

describe("without an API key", () => {
  let path = "";
  const s = serverForTests(() => {
    path = nanModelPath();
    return { modelPath: path };
  });

  test("everyone sees the full detail, as everyone sees the model list", async () => {
    const body = await expect503(await fetch(`${s.url}/healthz`), "model_not_loaded");
    expect(body.error.message).toContain(path);
  });
});
