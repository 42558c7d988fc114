import { describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { runModelCommand } from "../../src/cli/model.ts";
import { loadModelFile } from "../../src/model/format.ts";
import { writeSafetensors } from "../../src/model/safetensors.ts";
import { testTempDir } from "../helpers/models.ts";

async function run(...argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runModelCommand(argv, { out: (l) => out.push(l), err: (l) => err.push(l) });
  return { code, out: out.join("\n"), err: err.join("\n") };
}

let n = 0;
const tmp = (name: string) => join(testTempDir(), `cli-${n++}-${name}`);

describe("loopserve model CLI", () => {
  test("model new writes a loadable model with the requested shape", async () => {
    const path = tmp("new.safetensors");
    const r = await run(
      "new",
      path,
      "--dim",
      "32",
      "--heads=4",
      "--kv-heads",
      "2",
      "--ffn",
      "48",
      "--vocab",
      "1000",
      "--loops",
      "3",
      "--seed",
      "7",
      "--max-seq-len",
      "512",
      "--residual-scale",
      "0.1",
      "--tied",
    );
    expect(r).toMatchObject({ code: 0, err: "" });
    expect(r.out).toContain(`wrote ${path}`);
    const m = loadModelFile(path);
    expect(m.config).toMatchObject({
      dim: 32,
      nHeads: 4,
      nKvHeads: 2,
      ffnDim: 48,
      vocabSize: 1000,
      defaultLoops: 3,
      maxSeqLen: 512,
      tiedOutput: true,
    });
    // Same arguments, same bytes.
    const again = tmp("again.safetensors");
    await run("new", again, "--dim", "32", "--heads=4", "--kv-heads", "2", "--ffn", "48", "--vocab", "1000",
      "--loops", "3", "--seed", "7", "--max-seq-len", "512", "--residual-scale", "0.1", "--tied");
    expect(readFileSync(again).equals(readFileSync(path))).toBe(true);
  });

  test("model new defaults: the demo model (dim 256, 8 heads, ffn 768, GPT-2 vocab, 8 loops)", async () => {
    const path = tmp("demo.safetensors");
    expect((await run("new", path)).code).toBe(0);
    expect(loadModelFile(path).config).toMatchObject({
      dim: 256,
      nHeads: 8,
      nKvHeads: 8,
      ffnDim: 768,
      vocabSize: 50257,
      defaultLoops: 8,
      tiedOutput: false,
    });
  });

  test("model inspect prints the metadata, then every tensor's name, dtype, shape and bytes", async () => {
    const path = tmp("inspect.safetensors");
    await run("new", path, "--dim", "32", "--heads", "4", "--ffn", "64", "--vocab", "100");
    const r = await run("inspect", path);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/metadata \(\d+\):\n {2}format +loopserve\n/);
    expect(r.out).toMatch(/ {2}dim +32\n/);
    expect(r.out).toMatch(/tok_embeddings\.weight +F16 +\[100, 32\] +6400\n/);
    expect(r.out).toMatch(/block\.w2\.weight +F16 +\[32, 64\] +4096\n/);
    expect(r.out).toMatch(/output\.weight +F16 +\[100, 32\] +6400\n/);
    expect(r.out).toContain("loopserve model: fp16, dim 32");
    expect(r.out.indexOf("\nmetadata (")).toBeLessThan(r.out.indexOf("\ntensors ("));

    const j = await run("inspect", path, "--json");
    const parsed = JSON.parse(j.out);
    expect(parsed.metadata.dim).toBe("32");
    expect(parsed.tensors[0]).toEqual({ name: "tok_embeddings.weight", dtype: "F16", shape: [100, 32], bytes: 6400 });
  });

  test("model inspect of a bad file: a clear error and exit code 1", async () => {
    const junk = tmp("junk.safetensors");
    writeFileSync(junk, "this is not a safetensors file at all");
    const r = await run("inspect", junk);
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/^error: .*junk\.safetensors: header length \d+ runs past the end of the file \(29 bytes follow the length field\)$/);

    const missing = await run("inspect", tmp("missing.safetensors"));
    expect(missing.code).toBe(1);
    expect(missing.err).toMatch(/cannot open/);
  });

  test("model inspect of a valid safetensors file that is not a loopserve model: header, then exit 1", async () => {
    const path = tmp("plain.safetensors");
    writeSafetensors(path, {}, [{ name: "w", dtype: "F32", shape: [2, 3], data: new Uint8Array(24) }]);
    const r = await run("inspect", path);
    expect(r.code).toBe(1);
    expect(r.out).toMatch(/ {2}w +F32 +\[2, 3\] +24\n/);
    expect(r.err).toMatch(/plain\.safetensors: metadata: missing required key "format"$/);
  });

  test("argument errors exit 2 with a message naming the flag", async () => {
    const cases: [string[], RegExp][] = [
      [["new"], /missing OUT path/],
      [["new", "a", "b"], /unexpected argument "b"/],
      [["new", "a", "--dim"], /--dim needs a value/],
      [["new", "a", "--dim", "abc"], /--dim must be a non-negative integer, got "abc"/],
      [["new", "a", "--dim", "30", "--heads", "4"], /--dim \(30\) must be a multiple of --heads \(4\)/],
      [["new", "a", "--loops", "65"], /--loops must be an integer in \[1, 64\]/],
      [["new", "a", "--residual-scale", "x"], /--residual-scale must be a number/],
      [["new", "a", "--bogus"], /unknown option --bogus/],
      [["new", "a", "--tied=yes"], /--tied takes no value/],
      [["inspect"], /missing FILE path/],
      [["frobnicate"], /unknown command "frobnicate"/],
    ];
    for (const [argv, re] of cases) {
      const r = await run(...argv);
      expect({ argv, code: r.code }).toEqual({ argv, code: 2 });
      expect(r.err).toMatch(re);
    }
    expect((await run()).code).toBe(2);
  });

  test("--help for the group and for each command", async () => {
    for (const argv of [["--help"], ["new", "--help"], ["inspect", "-h"]]) {
      const r = await run(...argv);
      expect(r.code).toBe(0);
      expect(r.out).toContain("usage: loopserve model");
    }
    expect((await run("new", "--help")).out).toContain("--residual-scale");
  });

  test("runs as a script: bun src/cli/model.ts new ... / inspect ...", async () => {
    const path = tmp("spawn.safetensors");
    const script = join(import.meta.dir, "../../src/cli/model.ts");
    const made = Bun.spawnSync([process.execPath, script, "new", path, "--dim", "16", "--heads", "2", "--ffn", "32", "--vocab", "50"]);
    expect(made.exitCode).toBe(0);
    const shown = Bun.spawnSync([process.execPath, script, "inspect", path]);
    expect(shown.exitCode).toBe(0);
    expect(shown.stdout.toString()).toContain("block.wq.weight");
    const bad = Bun.spawnSync([process.execPath, script, "new"]);
    expect(bad.exitCode).toBe(2);
    expect(bad.stderr.toString()).toContain("missing OUT path");
  });
});
