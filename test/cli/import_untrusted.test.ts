// `model import-hf` on checkpoints that are not what they claim: a file that
// is a link to a device or out of the directory, a FIFO, a loop of links, an
// oversized file, a safetensors header of a million junk entries, a tokenizer
// the server would refuse. Each is refused by the command as a person runs
// it, in a process of its own: exit 1, one error line naming the file, within
// a second and 200 MB, and no model file written.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, rmSync, symlinkSync, truncateSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { writeHfFixture } from "../helpers/hf_fixture.ts";
import { testTempDir } from "../helpers/models.ts";
import { writeRawSafetensors } from "../helpers/safetensors.ts";

const ROOT = resolve(import.meta.dir, "../..");
let n = 0;

function checkpoint(): string {
  const dir = join(testTempDir(), `untrusted-${n++}`);
  mkdirSync(dir, { recursive: true });
  writeHfFixture(dir, { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 96, vocabSize: 300, nLayers: 2, totalUtSteps: 4, seed: 3 });
  return dir;
}

/** Runs the import; its peak memory is read from /proc while it runs (VmHWM only grows). */
async function importHf(dir: string): Promise<{ code: number; err: string; ms: number; peakMb: number; out: string }> {
  const out = join(testTempDir(), `untrusted-out-${n++}.safetensors`);
  const t0 = performance.now();
  const proc = Bun.spawn([process.execPath, "src/cli/main.ts", "model", "import-hf", dir, out], { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
  let peakKb = 0;
  const poll = setInterval(() => {
    try {
      const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${proc.pid}/status`, "utf8"));
      if (m) peakKb = Math.max(peakKb, Number(m[1]));
    } catch {
      // exited between two polls
    }
  }, 10);
  const code = await proc.exited;
  const ms = performance.now() - t0;
  clearInterval(poll);
  return { code, err: (await new Response(proc.stderr).text()).trim(), ms, peakMb: peakKb / 1024, out };
}

async function expectRefused(dir: string, ...patterns: (string | RegExp)[]): Promise<void> {
  const r = await importHf(dir);
  expect(r.code).toBe(1);
  expect(r.err.split("\n")).toHaveLength(1);
  for (const p of patterns) expect(r.err).toMatch(p);
  expect(existsSync(r.out)).toBe(false);
  // The targets: a second and 200 MB. Starting the runtime takes part of the second; a loaded machine gets some slack.
  expect(r.ms).toBeLessThan(3000);
  expect(r.peakMb).toBeLessThan(200);
}

describe("model import-hf refuses what it should not read", () => {
  test("tokenizer.json that is a link to /dev/zero: a device, refused unread", async () => {
    const dir = checkpoint();
    rmSync(join(dir, "tokenizer.json"));
    symlinkSync("/dev/zero", join(dir, "tokenizer.json"));
    await expectRefused(dir, "tokenizer.json", /links outside the checkpoint directory \(to \/dev\/zero\)/);
  });

  test("tokenizer.json that is a FIFO: refused, never opened to wait for a writer", async () => {
    const dir = checkpoint();
    rmSync(join(dir, "tokenizer.json"));
    Bun.spawnSync(["mkfifo", join(dir, "tokenizer.json")]);
    await expectRefused(dir, "tokenizer.json", /is a FIFO, not a regular file/);
  });

  test("chat_template.jinja linked to a file outside the checkpoint: refused, nothing of it copied", async () => {
    const dir = checkpoint();
    const secret = join(testTempDir(), `secret-${n++}.txt`);
    writeFileSync(secret, "the operator's secret");
    const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
    delete config.chat_template;
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(config));
    symlinkSync(secret, join(dir, "chat_template.jinja"));
    await expectRefused(dir, "chat_template.jinja", "links outside the checkpoint directory");
  });

  test("a link inside the directory is followed", async () => {
    const dir = checkpoint();
    const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
    delete config.chat_template;
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(config));
    mkdirSync(join(dir, "templates"));
    writeFileSync(join(dir, "templates", "chat.jinja"), "{{ messages }}");
    symlinkSync("templates/chat.jinja", join(dir, "chat_template.jinja"));
    const r = await importHf(dir);
    expect(r.code).toBe(0);
    expect(readSafetensors(r.out).metadata.chat_template).toBe("{{ messages }}");
  });

  test("a loop of links is a loop, not a missing file", async () => {
    const dir = checkpoint();
    rmSync(join(dir, "tokenizer_config.json"));
    symlinkSync("loop-b", join(dir, "tokenizer_config.json"));
    symlinkSync("tokenizer_config.json", join(dir, "loop-b"));
    await expectRefused(dir, "tokenizer_config.json", "is a loop of symbolic links");
  });

  test("a file past its kind's size cap is refused before it is read", async () => {
    const dir = checkpoint();
    truncateSync(join(dir, "tokenizer.json"), 200 * 2 ** 20); // sparse: 200 MiB that take no disk
    await expectRefused(dir, "tokenizer.json", /is 209715200 bytes, more than the 134217728 bytes a file of its kind may have/);
  });

  test("a weight file whose header is a million junk entries (60 MB)", async () => {
    const dir = checkpoint();
    const junk = `{${Array.from({ length: 1_000_000 }, (_, i) => `"k${i}":[${"0,".repeat(25)}0]`).join(",")}}`;
    writeRawSafetensors(join(dir, "model.safetensors"), junk, new Uint8Array(0), { pad: false });
    await expectRefused(dir, "model.safetensors", "header has more than 65536 entries");
  });

  test("a tokenizer the server would refuse at load is refused at import", async () => {
    const dir = checkpoint();
    const tok = JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8"));
    tok.pre_tokenizer = { type: "Metaspace", replacement: "▁", add_prefix_space: true };
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tok));
    await expectRefused(dir, "tokenizer.json", /tokenizer\.json pre_tokenizer: must end with a ByteLevel pre-tokenizer/);
  });

  test("a config number too large for a double is shown as what it became, not null", async () => {
    const dir = checkpoint();
    const text = readFileSync(join(dir, "config.json"), "utf8").replace(/"hidden_size":\s*\d+/, '"hidden_size": 1e400');
    writeFileSync(join(dir, "config.json"), text);
    await expectRefused(dir, "config.json", /hidden_size must be an integer in \[1, \d+\], got Infinity \(beyond a double's range\)/);
  });
});
