// `loopserve model inspect` and the server judge a model file by the same
// loader (the TypeScript validator, then the kernel library's descriptor
// checks through ls_model_check / ls_model_load): a file one refuses, the
// other refuses with the same message, and a file one accepts the other
// accepts. Among the checks: every fp16 weight and every quantization scale
// or offset must be finite; a NaN or Inf used to load, report healthy and
// then fail every request.
import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { join } from "node:path";
import { NativeModel } from "../../src/engine/binding.ts";
import { ErrorBody } from "../../src/wire/responses.ts";
import { runModelCommand } from "../../src/cli/model.ts";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import { jsonBody } from "../helpers/http.ts";
import { ensureLibrary, LIB } from "../helpers/kernels.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";
import { type RawHeader, readRawSafetensors, writeRawSafetensors } from "../helpers/safetensors.ts";
import { startServer } from "../helpers/server.ts";

setDefaultTimeout(60_000);

const F16_NAN = 0x7e00;
const F16_INF = 0x7c00;
const F16_NEG_INF = 0xfc00;

let n = 0;
const out = (name: string) => join(testTempDir(), `agreement-${n++}-${name}.safetensors`);

/** A copy of `src` with element `index` of the F16 tensor `tensor` set to the fp16 bits `bits`. */
function patched(src: string, tensor: string, index: number, bits: number): string {
  const { header, data } = readRawSafetensors(src);
  const t = header[tensor] as { dtype: string; data_offsets: [number, number] };
  expect(t.dtype).toBe("F16");
  const copy = new Uint8Array(data);
  new DataView(copy.buffer).setUint16(t.data_offsets[0] + index * 2, bits, true);
  return writeRawSafetensors(out(`${tensor}-${index}`), header, copy);
}

/** A copy of `src` with its header edited (and `shift` bytes inserted before the data). */
function edited(src: string, name: string, edit: (h: RawHeader) => void, shift = 0): string {
  const { header, data } = readRawSafetensors(src);
  edit(header);
  if (shift > 0)
    for (const [k, v] of Object.entries(header)) {
      if (k === "__metadata__") continue;
      const t = v as { data_offsets: [number, number] };
      t.data_offsets = [t.data_offsets[0] + shift, t.data_offsets[1] + shift];
    }
  return writeRawSafetensors(out(name), header, Buffer.concat([new Uint8Array(shift), data]));
}

/** A copy of `src` with one more tensor, "notes.extra", whose data start `after` bytes past the model's. */
function withExtra(src: string, name: string, entry: { dtype: string; shape: number[]; data_offsets: [number, number] }, after = -1): string {
  const { header, data } = readRawSafetensors(src);
  const at = data.length;
  header["notes.extra"] = { ...entry, data_offsets: [at + entry.data_offsets[0], at + entry.data_offsets[1]] };
  const room = after < 0 ? entry.data_offsets[1] : after;
  return writeRawSafetensors(out(name), header, Buffer.concat([data, new Uint8Array(room)]));
}

/** The server loader's verdict: null (loads) or its message. */
function serverVerdict(path: string): string | null {
  try {
    NativeModel.load(LIB, path, 1, "portable").close();
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}

async function inspect(path: string): Promise<{ code: number; out: string; err: string }> {
  const o: string[] = [];
  const e: string[] = [];
  const code = await runModelCommand(["inspect", path], { out: (l) => o.push(l), err: (l) => e.push(l) });
  return { code, out: o.join("\n"), err: e.join("\n") };
}

let fp16 = "";
let int4 = "";
let int2 = "";
let tiedInt4 = "";

beforeAll(() => {
  ensureLibrary();
  fp16 = tinyModelPath({ vocabSize: 300 });
  int4 = out("int4");
  quantizeModelFile(fp16, int4, { quant: "int4", groupSize: 32 });
  int2 = out("int2");
  quantizeModelFile(fp16, int2, { quant: "int2", groupSize: 32, head: "fp16" });
  tiedInt4 = out("tied-int4");
  quantizeModelFile(tinyModelPath({ vocabSize: 300, tiedOutput: true }), tiedInt4, { quant: "int4", groupSize: 32, head: "int8" });
});

describe("inspect and the server's loader agree", () => {
  const cases: [string, () => string, RegExp | null][] = [
    ["a valid fp16 model", () => fp16, null],
    ["a valid int4 model (int8 head)", () => int4, null],
    ["a valid int2 model (fp16 head)", () => int2, null],
    ["a valid tied int4 model, its int8 head the embedding too", () => tiedInt4, null],
    [
      "no embedding and an fp16 head (the quantized one's tensors dropped)",
      () =>
        edited(tiedInt4, "no-embedding", (h) => {
          h.__metadata__.output_quant = "fp16";
          delete h["output.qweight"];
          delete h["output.scales"];
        }),
      /^missing tensor "tok_embeddings\.weight" \(F16 \[300, 64\]\)$/,
    ],
    ["Inf in the scales of a head that is the embedding too", () => patched(tiedInt4, "output.scales", 7, F16_INF), /tensor 'output\.scales' holds a non-finite value \(\+Inf\)/],
    [
      "NaN in an fp16 matrix",
      () => patched(fp16, "block.wq.weight", 70, F16_NAN),
      /^tensor 'block\.wq\.weight' holds a non-finite value \(NaN\) at element 70 \(row 1, column 6\): the weights are corrupt$/,
    ],
    ["+Inf in a norm", () => patched(fp16, "norm.weight", 3, F16_INF), /tensor 'norm\.weight' holds a non-finite value \(\+Inf\) at element 3 /],
    [
      "-Inf in the embedding, past the first scan block",
      () => patched(fp16, "tok_embeddings.weight", 300 * 64 - 1, F16_NEG_INF),
      /tensor 'tok_embeddings\.weight' holds a non-finite value \(-Inf\) at element 19199 \(row 299, column 63\)/,
    ],
    ["NaN in an int4 scale", () => patched(int4, "block.w2.scales", 5, F16_NAN), /tensor 'block\.w2\.scales' holds a non-finite value \(NaN\)/],
    ["Inf in the int8 head's scales", () => patched(int4, "output.scales", 0, F16_INF), /tensor 'output\.scales' holds a non-finite value \(\+Inf\)/],
    ["Inf in an int2 offset", () => patched(int2, "block.w1.zeros", 9, F16_INF), /tensor 'block\.w1\.zeros' holds a non-finite value \(\+Inf\)/],
    ["NaN in an int2 model's fp16 head", () => patched(int2, "output.weight", 1, F16_NAN), /tensor 'output\.weight' holds a non-finite value/],
    // Files the TypeScript header checks used to judge differently from the loader:
    ["tensor data one byte off alignment", () => edited(fp16, "unaligned", () => {}, 1), /^tensor "tok_embeddings\.weight": data at file offset \d+ is not 2-byte aligned for F16$/],
    ["rope_theta past the kernels' bound", () => edited(fp16, "theta", (h) => void (h.__metadata__.rope_theta = "1e13")), /^metadata: rope_theta must be a positive finite number below 1000000000000, got "1e13"$/],
    ["norm_eps of 2", () => edited(fp16, "eps", (h) => void (h.__metadata__.norm_eps = "2")), /^metadata: norm_eps must be a positive finite number below 1, got "2"$/],
    ["norm_eps that is 0 in fp32", () => edited(fp16, "eps-fp32", (h) => void (h.__metadata__.norm_eps = "1e-50")), /^metadata: norm_eps must be a positive finite number/],
    ["dim past the kernels' cap", () => edited(fp16, "dim", (h) => void (h.__metadata__.dim = "100000")), /^metadata: dim must be in \[1, 65536\], got 100000$/],
    // Extra tensors are ignored, but must be well-formed entries (docs/model-format.md):
    ["a well-formed extra tensor", () => withExtra(fp16, "extra-ok", { dtype: "U8", shape: [3], data_offsets: [0, 3] }), null],
    [
      "an extra tensor of a dtype safetensors does not define",
      () => withExtra(fp16, "extra-dtype", { dtype: "Q7", shape: [1], data_offsets: [0, 1] }),
      /^tensor "notes\.extra": dtype "Q7" is not a safetensors dtype/,
    ],
    [
      "an extra tensor past the end of the data",
      () => withExtra(fp16, "extra-past", { dtype: "U8", shape: [16], data_offsets: [8, 24] }, 4),
      /^tensor "notes\.extra": data_offsets \[\d+, \d+\] run past the end of the data region/,
    ],
    [
      "an extra tensor whose offsets do not fit its shape",
      () => withExtra(fp16, "extra-size", { dtype: "F32", shape: [2], data_offsets: [0, 4] }),
      /^tensor "notes\.extra": data_offsets \[\d+, \d+\] span 4 bytes but F32 \[2\] needs 8$/,
    ],
    [
      "an extra tensor overlapping a weight",
      () => edited(fp16, "extra-overlap", (h) => void (h["notes.extra"] = { dtype: "U8", shape: [2], data_offsets: [0, 2] })),
      /^tensor "tok_embeddings\.weight": data_offsets \[0, \d+\] overlap tensor "notes\.extra" \[0, 2\]$/,
    ],
    [
      "a metadata value that is not a string",
      () => edited(fp16, "meta-number", (h) => void ((h.__metadata__ as Record<string, unknown>).note = 5)),
      /^__metadata__\.note must be a string, got 5$/,
    ],
  ];

  for (const [name, make, refusal] of cases)
    test(name, async () => {
      const path = make();
      const verdict = serverVerdict(path);
      const r = await inspect(path);
      if (refusal === null) {
        expect(verdict).toBeNull();
        expect(r.code).toBe(0);
        expect(r.out).toContain("loopserve model: ");
      } else {
        expect(verdict).toMatch(refusal);
        expect(r.code).toBe(1);
        expect(r.err).toBe(`error: ${path}: ${verdict}`);
      }
    });

  test("inspect names an embedding read from the quantized head", async () => {
    const r = await inspect(tiedInt4);
    expect(r.code).toBe(0);
    expect(r.out).not.toContain("tok_embeddings.weight");
    expect(r.out).toMatch(/, output tied \(the embedding is the quantized head\)$/m);
  });

  test("a header with a duplicate key is refused by both, naming the key", async () => {
    const { header, data } = readRawSafetensors(fp16);
    const json = JSON.stringify(header).replace(/^\{/, '{"norm.weight":{"dtype":"F16","shape":[0],"data_offsets":[0,0]},');
    const path = writeRawSafetensors(out("duplicate"), json, data);
    const verdict = serverVerdict(path);
    expect(verdict).toBe('header repeats the key "norm.weight" (duplicate keys are ambiguous)');
    const r = await inspect(path);
    expect(r.code).toBe(1);
    expect(r.err).toBe(`error: ${path}: ${verdict}`);
  });
});

describe("a model with a NaN weight, served", () => {
  let server: Awaited<ReturnType<typeof startServer>>;
  let path = "";
  beforeAll(async () => {
    path = patched(fp16, "block.w3.weight", 1, F16_NAN);
    server = await startServer({ modelPath: path });
  });
  afterAll(async () => {
    await server.stop();
  });

  test("is not loaded: /healthz and generation answer 503 naming the tensor", async () => {
    const body = await jsonBody(await fetch(`${server.url}/healthz`), ErrorBody, 503);
    expect(body.error.code).toBe("model_not_loaded");
    expect(body.error.message).toContain("tensor 'block.w3.weight' holds a non-finite value (NaN) at element 1");
    expect((await server.post("/generate", { prompt: "Hi", max_tokens: 1 })).status).toBe(503);
    expect(server.output()).toContain("model NOT LOADED");
  });
});
