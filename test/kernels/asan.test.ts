// The kernels under AddressSanitizer + UndefinedBehaviorSanitizer, driven by
// test/c/asan_driver.c: every corrupt model file must be refused with exit
// code 2 and a message naming the problem, never a crash, an out-of-bounds
// read or a leak; the forward pass on every SIMD path must match the
// TypeScript reference with no sanitizer report; ls_sample must match its
// documented procedure.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { closeSync, ftruncateSync, openSync, readFileSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { type SyntheticOptions, writeSyntheticModel } from "../../src/model/synthetic.ts";
import { pathsWhere } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";
import { runSanitized, type SanitizedRun, sanitizedDriver } from "../helpers/sanitized.ts";
import { ReferenceModel } from "../reference/forward.ts";

const TOL = 1e-3; // max|c - r| / max|r| against the float64 reference

// Sanitized code runs several times slower, and bun test's 5 s default (which
// bunfig.toml cannot raise) is too tight for sample-check on a busy machine.
setDefaultTimeout(120_000);

let driver = "";

/** Runs the sanitized driver; a sanitizer report fails the test (test/helpers/sanitized.ts). */
function run(...args: string[]): SanitizedRun {
  return runSanitized(driver, args);
}

// ---- model files ----

let n = 0;
function tmpPath(name: string): string {
  return join(testTempDir(), `asan-${n++}-${name}.safetensors`);
}

const SMALL: SyntheticOptions = { dim: 32, nHeads: 4, nKvHeads: 2, ffnDim: 64, vocabSize: 256, loops: 2, seed: 5 };

interface Parsed {
  header: Record<string, any>;
  data: Uint8Array;
  bytes: Uint8Array;
}

function parse(path: string): Parsed {
  const bytes = new Uint8Array(readFileSync(path));
  const len = Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + len)));
  return { header, data: bytes.subarray(8 + len), bytes };
}

/** A safetensors image: header text padded with spaces to 8 bytes (the data stays aligned), then data. */
function writeRaw(name: string, header: unknown, data: Uint8Array, opts: { len?: bigint } = {}): string {
  let text = typeof header === "string" ? header : JSON.stringify(header);
  while (text.length % 8 !== 0) text += " ";
  const head = new TextEncoder().encode(text);
  const buf = new Uint8Array(8 + head.length + data.length);
  new DataView(buf.buffer).setBigUint64(0, opts.len ?? BigInt(head.length), true);
  buf.set(head, 8);
  buf.set(data, 8 + head.length);
  const path = tmpPath(name);
  writeFileSync(path, buf);
  return path;
}

let valid: string; // SMALL, untied
let validTied: string;
let base: Parsed;

/** The valid header with `edit` applied to a deep copy, and the valid data. */
function variant(name: string, edit: (h: Record<string, any>) => void, data?: Uint8Array): string {
  const h = structuredClone(base.header);
  edit(h);
  return writeRaw(name, h, data ?? base.data);
}

const meta = (key: string, value: unknown) => (h: Record<string, any>) => {
  if (value === undefined) delete h.__metadata__[key];
  else h.__metadata__[key] = value;
};

beforeAll(async () => {
  driver = await sanitizedDriver("asan_driver");
  valid = tmpPath("valid");
  writeSyntheticModel(valid, SMALL);
  validTied = tmpPath("valid-tied");
  writeSyntheticModel(validTied, { ...SMALL, tiedOutput: true });
  base = parse(valid);
}, 240_000);

// ---- loading ----

function expectRefused(path: string, message: RegExp): void {
  const r = run("load", path);
  expect(r.stdout).toMatch(/^error: /);
  expect(r.stdout).toMatch(message);
  expect(r.code).toBe(2);
}

describe("model loading under ASan/UBSan", () => {
  test("a valid model loads and reports its shape; tied output when output.weight is absent", () => {
    let r = run("load", valid);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^ok dim=32 n_heads=4 n_kv_heads=2 head_dim=8 ffn_dim=64 vocab=256 loops=2 /);
    expect(r.stdout).toMatch(/ tied=0 /);
    r = run("load", validTied);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/ tied=1 /);
  });

  test("unknown extra tensors are ignored", () => {
    const extra = new Uint8Array(base.data.length + 8);
    extra.set(base.data);
    const path = variant(
      "extra",
      (h) => {
        h["lm_head.bias"] = { dtype: "U8", shape: [3], data_offsets: [base.data.length, base.data.length + 3] };
      },
      extra,
    );
    const r = run("load", path);
    expect(r.code).toBe(0);
  });

  test("metadata numbers in the loader's lenient float grammar load", () => {
    const r = run("load", variant("floats", (h) => Object.assign(h.__metadata__, { rope_theta: "1e4", norm_eps: "1e-05" })));
    expect(r.stdout).toMatch(/rope_theta=10000 norm_eps=1e-05 /);
  });

  test("files that cannot be opened or are not regular files", () => {
    expectRefused(join(testTempDir(), "no-such-file.safetensors"), /cannot open model file .*No such file/);
    expectRefused(testTempDir(), /not a regular file/);
  });

  test("truncated files, cut inside the length field, the header and the data", () => {
    const size = base.bytes.length;
    const headerEnd = size - base.data.length;
    const cuts: [number, RegExp][] = [
      [0, /file is 0 bytes, too short for the 8-byte header length/],
      [5, /file is 5 bytes, too short/],
      [8, /header length \d+ exceeds file size 8/],
      [8 + 20, /header length \d+ exceeds file size 28/],
      [headerEnd - 1, /header length \d+ exceeds file size/],
      [headerEnd, /tensor 'tok_embeddings\.weight': data_offsets \[0, \d+\] past end of data \(0 bytes\)/],
      [headerEnd + 1001, /data_offsets \[\d+, \d+\] past end of data \(1001 bytes\)/],
      [size - 1, /tensor '[\w.]+': data_offsets \[\d+, \d+\] past end of data \(\d+ bytes\)/],
    ];
    for (const [cut, message] of cuts) {
      const path = tmpPath(`cut-${cut}`);
      writeFileSync(path, base.bytes.subarray(0, cut));
      expectRefused(path, message);
    }
  });

  test("header length past the end of the file, absurd, or over the 100 MB limit", () => {
    const size = base.bytes.length;
    expectRefused(writeRaw("len-size", base.header, base.data, { len: BigInt(size) }), /header length \d+ exceeds file size \d+/);
    expectRefused(
      writeRaw("len-max", base.header, base.data, { len: (1n << 64n) - 1n }),
      /header length 18446744073709551615 exceeds file size/,
    );
    // A sparse file: the length fits the file but not the format's limit.
    const path = tmpPath("len-limit");
    const fd = openSync(path, "w");
    const len = new Uint8Array(8);
    new DataView(len.buffer).setBigUint64(0, 150_000_000n, true);
    writeSync(fd, len);
    ftruncateSync(fd, 150_000_100);
    closeSync(fd);
    expectRefused(path, /header length 150000000 exceeds the 100000000-byte limit/);
  });

  test("header that is not valid JSON, or not an object", () => {
    const text = JSON.stringify(base.header);
    const cases: [string, RegExp][] = [
      [`${text.slice(0, -1)},}`, /header JSON invalid: expected a string key in object, found '}' at byte \d+/],
      [text.replace('"dtype"', '"dtype" 1'), /header JSON invalid: expected ':' after object key/],
      [text.replace('"F16"', '"F16\\x"'), /invalid escape in string/],
      [text.replace('"F16"', '"\\ud800"'), /unpaired high surrogate/],
      [text.replace(':"64"', ":064"), /invalid number/],
      [`${text}x`, /unexpected data after the JSON value/],
      [text.replace("{", '{"norm.weight":1,'), /duplicate key 'norm\.weight'/],
      ["[".repeat(100) + "]".repeat(100), /nested deeper than 64 levels/],
      ["[1, 2]", /header JSON is an array, expected an object/],
      ['"x"', /header JSON is a string, expected an object/],
      ["", /unexpected end of input/],
    ];
    for (const [bad, message] of cases) expectRefused(writeRaw("json", bad, base.data), message);
    // Raw bytes: invalid UTF-8 inside a string and a control character.
    const utf8 = new TextEncoder().encode(text.replace('"F16"', '"F16\u0001"'));
    expectRefused(writeRaw("ctl", new TextDecoder().decode(utf8), base.data), /unescaped control character in string/);
    const bytes = new TextEncoder().encode(text);
    const at = text.indexOf('"F16"') + 1;
    bytes[at] = 0xc3; // a lead byte with no continuation
    const path = tmpPath("utf8");
    const buf = new Uint8Array(8 + bytes.length + base.data.length);
    new DataView(buf.buffer).setBigUint64(0, BigInt(bytes.length), true);
    buf.set(bytes, 8);
    buf.set(base.data, 8 + bytes.length);
    writeFileSync(path, buf);
    expectRefused(path, /invalid UTF-8 in string at byte \d+/);
  });

  test("metadata missing, of the wrong type, non-numeric, out of range or inconsistent", () => {
    const cases: [string, (h: Record<string, any>) => void, RegExp][] = [
      ["no-meta", (h) => delete h.__metadata__, /'__metadata__'/],
      ["meta-array", (h) => (h.__metadata__ = []), /'__metadata__' is an array, expected an object/],
      ["no-dim", meta("dim", undefined), /metadata 'dim' missing/],
      ["no-quant", meta("quant", undefined), /metadata 'quant' missing/],
      ["no-eps", meta("norm_eps", undefined), /metadata 'norm_eps' missing/],
      ["dim-number", meta("dim", 32), /metadata 'dim' is a number, expected a string/],
      ["dim-abc", meta("dim", "abc"), /metadata 'dim' is 'abc', expected an integer/],
      ["dim-float", meta("dim", "32.0"), /metadata 'dim' is '32\.0', expected an integer/],
      ["dim-neg", meta("dim", "-32"), /metadata 'dim' is '-32', expected an integer/],
      ["dim-lead0", meta("dim", "032"), /metadata 'dim' is '032', expected an integer/],
      ["dim-zero", meta("dim", "0"), /metadata 'dim' is 0, expected 1\.\.65536/],
      ["dim-huge", meta("dim", "1000000"), /metadata 'dim' is 1000000, expected 1\.\.65536/],
      ["dim-overflow", meta("dim", "123456789012345678901234567890"), /metadata 'dim' is '1234567890.*', expected an integer/],
      ["vocab-huge", meta("vocab_size", "99999999999"), /metadata 'vocab_size' is 99999999999, expected 1\.\.1048576/],
      ["ffn-huge", meta("ffn_dim", "4294967296"), /metadata 'ffn_dim' is 4294967296, expected/],
      ["loops-65", meta("default_loops", "65"), /metadata 'default_loops' is 65, expected 1\.\.64/],
      ["loops-0", meta("default_loops", "0"), /metadata 'default_loops' is 0, expected 1\.\.64/],
      ["heads-3", meta("n_heads", "3"), /dim 32 is not divisible by n_heads 3/],
      ["head-dim-odd", meta("n_heads", "32"), /head_dim 1 \(dim 32 \/ n_heads 32\) must be even/],
      ["kv-3", meta("n_kv_heads", "3"), /n_heads 4 is not divisible by n_kv_heads 3/],
      ["kv-8", meta("n_kv_heads", "8"), /n_heads 4 is not divisible by n_kv_heads 8/],
      ["quant-int4-no-group", meta("quant", "int4"), /metadata 'group_size' is 0, expected 32, 64, 128 or 256 for quant int4/],
      ["quant-q8", meta("quant", "q8_0"), /quant 'q8_0' is not supported by this build/],
      ["format", meta("format", "gguf"), /metadata 'format' is 'gguf', expected 'loopserve'/],
      ["version", meta("format_version", "2"), /metadata 'format_version' is 2, this build reads version 1/],
      ["arch", meta("arch", "llama"), /metadata 'arch' is 'llama', expected 'looped-llama'/],
      ["tokenizer", meta("tokenizer", "llama"), /metadata 'tokenizer' is 'llama', expected 'gpt2'/],
      ["theta", meta("rope_theta", "fast"), /metadata 'rope_theta' is 'fast', expected a number/],
      ["theta-inf", meta("rope_theta", "1e999"), /metadata 'rope_theta' is '1e999', expected a positive number/],
      ["eps-zero", meta("norm_eps", "0"), /metadata 'norm_eps' is '0', expected a positive number/],
      ["eps-neg", meta("norm_eps", "-1e-5"), /metadata 'norm_eps' is '-1e-5', expected a positive number/],
      // Consistent metadata, huge dimensions: the tensors cannot match.
      ["vocab-max", meta("vocab_size", "1048576"), /tensor 'tok_embeddings\.weight': shape \[256, 32\] expected \[1048576, 32\]/],
      ["dim-max", (h) => Object.assign(h.__metadata__, { dim: "65536", n_heads: "4" }), /shape \[256, 32\] expected \[256, 65536\]/],
    ];
    for (const [name, edit, message] of cases) expectRefused(variant(name, edit), message);
  });

  test("tensors missing, of the wrong dtype or shape, or with bad data_offsets", () => {
    const off = (name: string): [number, number] => base.header[name].data_offsets;
    const dataLen = base.data.length;
    const cases: [string, (h: Record<string, any>) => void, RegExp][] = [
      ["no-wk", (h) => delete h["block.wk.weight"], /tensor 'block\.wk\.weight' missing/],
      ["no-emb", (h) => delete h["tok_embeddings.weight"], /tensor 'tok_embeddings\.weight' missing/],
      ["entry-number", (h) => (h["block.wq.weight"] = 5), /tensor 'block\.wq\.weight': entry is a number, expected an object/],
      ["shape-swapped", (h) => (h["block.w1.weight"].shape = [32, 64]), /tensor 'block\.w1\.weight': shape \[32, 64\] expected \[64, 32\]/],
      ["shape-rank", (h) => (h["norm.weight"].shape = [32, 1]), /tensor 'norm\.weight': shape \[32, 1\] expected \[32\]/],
      ["shape-float", (h) => (h["norm.weight"].shape = [32.5]), /tensor 'norm\.weight': shape \[32\.5\] is not a list of non-negative integers/],
      ["shape-neg", (h) => (h["norm.weight"].shape = [-32]), /shape \[-32\] is not a list of non-negative integers/],
      ["shape-missing", (h) => delete h["block.wo.weight"].shape, /tensor 'block\.wo\.weight': 'shape' missing/],
      ["dtype-f32", (h) => (h["norm.weight"].dtype = "F32"), /tensor 'norm\.weight': dtype 'F32' expected F16/],
      ["dtype-bf16", (h) => (h["block.wq.weight"].dtype = "BF16"), /tensor 'block\.wq\.weight': dtype 'BF16' expected F16/],
      ["dtype-missing", (h) => delete h["block.wv.weight"].dtype, /tensor 'block\.wv\.weight': 'dtype' missing/],
      ["offsets-missing", (h) => delete h["block.w2.weight"].data_offsets, /tensor 'block\.w2\.weight': 'data_offsets' missing/],
      ["offsets-one", (h) => (h["block.w2.weight"].data_offsets = [0]), /tensor 'block\.w2\.weight': data_offsets \[0\], expected two integers/],
      ["offsets-string", (h) => (h["block.w2.weight"].data_offsets = ["0", "8"]), /data_offsets \[<string>, <string>\], expected two integers/],
      [
        "past-end",
        (h) => (h["output.weight"].data_offsets = [off("output.weight")[0], dataLen + 64]),
        new RegExp(`tensor 'output\\.weight': data_offsets \\[\\d+, ${dataLen + 64}\\] past end of data \\(${dataLen} bytes\\)`),
      ],
      ["negative", (h) => (h["norm.weight"].data_offsets = [-64, 0]), /tensor 'norm\.weight': data_offsets \[-64, 0\] has a negative offset/],
      [
        "reversed",
        (h) => (h["norm.weight"].data_offsets = [off("norm.weight")[1], off("norm.weight")[0]]),
        /tensor 'norm\.weight': data_offsets \[\d+, \d+\] has begin > end/,
      ],
      [
        "short",
        (h) => (h["block.ffn_norm.weight"].data_offsets = [off("block.ffn_norm.weight")[0], off("block.ffn_norm.weight")[0] + 2]),
        /tensor 'block\.ffn_norm\.weight': data_offsets \[\d+, \d+\] hold 2 bytes, expected 64/,
      ],
      [
        "misaligned",
        (h) => (h["block.attn_norm.weight"].data_offsets = off("block.attn_norm.weight").map((o) => o + 1)),
        /tensor 'block\.attn_norm\.weight': data at file offset \d+ is not 2-byte aligned/,
      ],
      [
        "overlap",
        (h) => (h["norm.weight"].data_offsets = off("block.ffn_norm.weight")),
        /tensors '[\w.]+' \[\d+, \d+\] and '[\w.]+' \[\d+, \d+\] overlap/,
      ],
    ];
    for (const [name, edit, message] of cases) expectRefused(variant(name, edit), message);
    // Offsets beyond int64 and beyond 2^53 are written as raw text.
    const text = JSON.stringify(base.header);
    const [b0, e0] = off("norm.weight");
    const huge = (s: string) => text.replace(`"data_offsets":[${b0},${e0}]`, `"data_offsets":${s}`);
    expectRefused(writeRaw("off-u64", huge(`[${b0},99999999999999999999]`), base.data), /tensor 'norm\.weight': data_offsets \[\d+, 1e\+20\], expected two integers/);
    expectRefused(writeRaw("off-2^60", huge(`[${b0},1152921504606846976]`), base.data), /data_offsets \[\d+, 1152921504606846976\] past end of data/);
  });

  test("thousands of randomly mutated headers are each loaded or refused, with no sanitizer report", () => {
    for (const [path, seed] of [
      [valid, "1"],
      [validTied, "2"],
    ]) {
      const r = run("fuzz", path, "3000", seed);
      expect(r.stdout).toMatch(/^ok \d+ loaded \d+ rejected/);
      expect(r.code).toBe(0);
    }
  });
});

// ---- forward pass ----

const FWD: Record<string, SyntheticOptions> = {
  gqa: { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 96, vocabSize: 300, loops: 3, seed: 21 },
  "mha-tied": { dim: 40, nHeads: 4, nKvHeads: 4, ffnDim: 56, vocabSize: 67, loops: 2, seed: 22, tiedOutput: true },
};
const TOKENS = [1, 7, 42, 13, 0, 5, 5, 29, 66];

/** The SIMD paths the sanitized build runs on this CPU. */
function supportedPaths(path: string): string[] {
  return pathsWhere((simd) => {
    const r = run("load", path, simd);
    return r.code === 0 ? null : r.stdout;
  });
}

describe("forward pass under ASan/UBSan", () => {
  for (const [shape, opts] of Object.entries(FWD)) {
    test(`${shape}: logits on every SIMD path match the TypeScript reference within ${TOL}`, () => {
      const path = tmpPath(`fwd-${shape}`);
      writeSyntheticModel(path, opts);
      const ref = ReferenceModel.load(path);
      const tokens = TOKENS.map((t) => t % opts.vocabSize);
      for (const loops of [1, opts.loops]) {
        const want = ref.forward(tokens, loops);
        for (const simd of supportedPaths(path)) {
          const r = run("logits", path, String(loops), simd, ...tokens.map(String));
          expect(r.code).toBe(0);
          const lines = r.stdout.trim().split("\n");
          expect(lines.length).toBe(tokens.length);
          lines.forEach((line, t) => {
            const got = line.split(" ").map(Number);
            expect(got.length).toBe(opts.vocabSize);
            let d = 0;
            let m = 0;
            for (let i = 0; i < got.length; i++) {
              d = Math.max(d, Math.abs(got[i] - want[t][i]));
              m = Math.max(m, Math.abs(want[t][i]));
            }
            if (!(d / m < TOL)) throw new Error(`${shape} ${simd} loops ${loops} token ${t}: rel err ${d / m}`);
          });
        }
      }
    });

    test(`${shape}: prefill and one-token steps give bit-identical logits on every SIMD path`, () => {
      const path = tmpPath(`inv-${shape}`);
      writeSyntheticModel(path, opts);
      for (const simd of supportedPaths(path)) {
        const r = run("invariance", path, String(opts.loops), simd, ...TOKENS.map((t) => String(t % opts.vocabSize)));
        expect(r.stdout).toMatch(/^ok /);
        expect(r.code).toBe(0);
      }
    });
  }

  test("out-of-range tokens are refused, not read", () => {
    const r = run("logits", valid, "1", "portable", "1", "256");
    expect(r.code).toBe(2);
    expect(r.stdout).toMatch(/^error: /);
  });
});

// ---- fp16 ----

describe("fp16 conversions under ASan/UBSan", () => {
  test("every half round-trips and every rounding boundary goes to nearest even, subnormals and overflow included", () => {
    const r = run("f16-check");
    expect(r.stdout).toMatch(/^ok \d+ conversions/);
    expect(r.code).toBe(0);
  });
});

// ---- sampling ----

describe("ls_sample under ASan/UBSan", () => {
  test("every top-k / top-p / temperature / penalty path picks the token of the documented procedure", () => {
    const r = run("sample-check");
    expect(r.stdout).toMatch(/^ok \d+ configurations match/);
    expect(r.code).toBe(0);
  });

  test("greedy picks the lowest id on ties and invalid parameters are refused", () => {
    let r = run("sample", "0", "0", "1", "1", "0", "0", "1,3,2,3");
    expect(r.stdout.trim()).toBe("1");
    for (const bad of [
      ["nan", "0", "1", "1"],
      ["-1", "0", "1", "1"],
      ["1", "-1", "1", "1"],
      ["1", "0", "1.5", "1"],
      ["1", "0", "nan", "1"],
      ["1", "0", "1", "0"],
      ["1", "0", "1", "nan"],
    ]) {
      r = run("sample", ...bad, "0", "0", "1,2,3");
      expect(r.stdout).toMatch(/^error: ls_sample returned -1/);
      expect(r.code).toBe(2);
    }
  });

  test("same seed and counter give the same token; history ids outside the vocabulary are ignored", () => {
    const logits = Array.from({ length: 50 }, (_, i) => String(Math.sin(i) * 2)).join(",");
    const a = run("sample", "0.8", "10", "0.9", "1.2", "77", "5", logits, "-4,3,3,999,2147483647");
    const b = run("sample", "0.8", "10", "0.9", "1.2", "77", "5", logits, "-4,3,3,999,2147483647");
    expect(a.code).toBe(0);
    expect(a.stdout).toBe(b.stdout);
  });
});
