// `loopserve tokenize` and the training text split (torch/loopserve_torch/data.py):
// the token file holds the server tokenizer's ids as little-endian uint16,
// and the KJV split holds out exactly every 20th block of 30 verses.
import { describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { testTempDir } from "../helpers/models.ts";
import { KJV_TEXT, skipReason } from "../helpers/system_packages.ts";
import { runTorchModule } from "../helpers/torch.ts";

const ROOT = resolve(import.meta.dir, "../..");

function cli(args: string[]): { code: number; out: string; err: string } {
  const r = Bun.spawnSync([process.execPath, "src/cli/main.ts", ...args], { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
  return { code: r.exitCode ?? -1, out: r.stdout.toString(), err: r.stderr.toString() };
}

describe("loopserve tokenize", () => {
  const dir = testTempDir();

  test("writes the tokenizer's ids as little-endian uint16, with --eot appended", async () => {
    const text = "In the beginning God created the heaven and the earth.\nHello world ünïcödé 🙂\n";
    const input = join(dir, "in.txt");
    writeFileSync(input, text);
    const expected = (await Tokenizer.load()).encode(text);
    for (const [flags, ids] of [[[], expected], [["--eot"], [...expected, 50256]]] as const) {
      const out = join(dir, `out${flags.length}.bin`);
      const r = cli(["tokenize", input, out, ...flags]);
      expect(r.code).toBe(0);
      expect(r.out).toContain(`${ids.length} tokens`);
      const bytes = readFileSync(out);
      expect(Array.from(new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2))).toEqual([...ids]);
      expect(bytes[0] | (bytes[1] << 8)).toBe(ids[0]); // little-endian on disk whatever the host
    }
  });

  test("bad arguments exit 2 with the usage; an unreadable input exits 1 naming it", () => {
    expect(cli(["tokenize", "only-one"]).code).toBe(2);
    const bad = cli(["tokenize", "a", "b", "--nope"]);
    expect(bad.code).toBe(2);
    expect(bad.err).toContain("unknown option --nope");
    const missing = cli(["tokenize", join(dir, "missing.txt"), join(dir, "x.bin")]);
    expect(missing.code).toBe(1);
    expect(missing.err).toContain("missing.txt");
  });
});

describe.skipIf(skipReason(KJV_TEXT) !== null)("training text split (King James Bible)", () => {
  test("every verse once, references stripped, every 20th block of 30 verses held out", () => {
    const dir = join(testTempDir(), "kjv");
    runTorchModule("data", [dir]);
    const lines = (name: string) => readFileSync(join(dir, name), "utf8").trimEnd().split("\n");
    const train = lines("train.txt");
    const val = lines("val.txt");
    expect(train.length + val.length).toBe(31102);
    expect(val.length).toBe(1530); // 51 blocks of 30 verses
    expect(train[0]).toBe("In the beginning God created the heaven and the earth.");
    expect([...train, ...val].some((l) => /^[1-3]?[A-Za-z]+\d+:\d+/.test(l))).toBe(false);
    // block 19 (verses 570..599, 0-based; Genesis 22:23 to 24:8) is the first held out
    expect(train[569]).toBe("And Chesed, and Hazo, and Pildash, and Jidlaph, and Bethuel.");
    expect(val[0]).toBe("And Bethuel begat Rebekah: these eight Milcah did bear to Nahor, Abraham's brother.");
    expect(train[570]).toStartWith("And the servant put his hand under the thigh of Abraham");
  });
});
