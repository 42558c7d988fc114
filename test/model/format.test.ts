import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { attentionHeadDim, expectedTensorShapes, loadModelFile, NO_RECURRENCE, parseModelConfig, parseModelMetadata, validateModel } from "../../src/model/format.ts";
import { quantizeModelFile } from "../../src/model/quantize.ts";
import { readSafetensors, type TensorToWrite, writeSafetensors } from "../../src/model/safetensors.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";
import { modelFormatMessage } from "../helpers/safetensors.ts";

// A small vocabulary keeps the rewritten copies small; the schema is the same.
const SMALL = { vocabSize: 300 };

let n = 0;
/** Copies a model file with its metadata and/or tensor list edited. */
function rewrite(
  src: string,
  edit: { meta?: (m: Record<string, string>) => void; tensors?: (t: TensorToWrite[]) => TensorToWrite[] },
): string {
  const file = readSafetensors(src);
  const meta = { ...file.metadata };
  edit.meta?.(meta);
  let tensors: TensorToWrite[] = [...file.tensors].map(([name, t]) => ({ name, ...t }));
  if (edit.tensors) tensors = edit.tensors(tensors);
  const path = join(testTempDir(), `fmt-${n++}.safetensors`);
  writeSafetensors(path, meta, tensors);
  return path;
}

function expectLoadError(path: string, pattern: RegExp) {
  expect(modelFormatMessage(() => loadModelFile(path))).toMatch(pattern);
}

const withMeta = (key: string, value: string | undefined) =>
  rewrite(tinyModelPath(SMALL), {
    meta: (m) => {
      if (value === undefined) delete m[key];
      else m[key] = value;
    },
  });

describe("loopserve model format", () => {
  test("loads a synthetic model: config from the metadata, fp16 weights as views into the mapping", () => {
    const m = loadModelFile(tinyModelPath());
    expect(m.config).toEqual({
      arch: "looped-llama",
      formatVersion: 1,
      dim: 64,
      nHeads: 4,
      nKvHeads: 2,
      headDim: 16,
      ffnDim: 128,
      vocabSize: 50257,
      defaultLoops: 4,
      maxSeqLen: 2048,
      ropeTheta: 10000,
      normEps: 1e-5,
      quant: "fp16",
      groupSize: 0,
      tokenizer: "gpt2",
      nLayers: 1,
      normLayout: "pre",
      stepNorm: false,
      exitThreshold: null,
      ...NO_RECURRENCE,
      exitGate: false,
      quantMix: {},
      tiedOutput: false,
      headQuant: "fp16",
      headGroupSize: 0,
      embeddingFromHead: false,
    });
    expect(m.weights.wk.length).toBe(32 * 64);
    expect(m.weights.wo.length).toBe(64 * 64);
    expect(m.weights.output.length).toBe(50257 * 64);
    expect(m.weights.output).not.toBe(m.weights.tokEmbeddings);
    expect(m.weights.wq.buffer).toBe(m.tensors.get("block.wq.weight")!.data.buffer);
  });

  test("absent output.weight means the output is tied to tok_embeddings", () => {
    const m = loadModelFile(tinyModelPath({ ...SMALL, tiedOutput: true }));
    expect(m.config.tiedOutput).toBe(true);
    expect(m.tensors.has("output.weight")).toBe(false);
    expect(m.weights.output).toBe(m.weights.tokEmbeddings);
  });

  test("a missing required tensor is named", () => {
    for (const name of ["tok_embeddings.weight", "block.w3.weight", "norm.weight"]) {
      const path = rewrite(tinyModelPath(SMALL), { tensors: (t) => t.filter((x) => x.name !== name) });
      expectLoadError(path, new RegExp(`missing tensor "${name.replace(".", "\\.")}"`));
    }
  });

  test("a tensor with the wrong shape is named with the expected and actual shapes", () => {
    const transposeWk = rewrite(tinyModelPath(SMALL), {
      tensors: (t) => t.map((x) => (x.name === "block.wk.weight" ? { ...x, shape: [64, 32] } : x)),
    });
    expectLoadError(transposeWk, /tensor "block\.wk\.weight": shape must be \[32, 64\], got \[64, 32\]/);
    const badOutput = rewrite(tinyModelPath(SMALL), {
      tensors: (t) =>
        t.map((x) => (x.name === "output.weight" ? { ...x, shape: [64, 300] } : x)),
    });
    expectLoadError(badOutput, /tensor "output\.weight": shape must be \[300, 64\], got \[64, 300\]/);
  });

  test("a tensor with the wrong dtype is named", () => {
    const path = rewrite(tinyModelPath(SMALL), {
      tensors: (t) => t.map((x) => (x.name === "norm.weight" ? { ...x, dtype: "BF16" } : x)),
    });
    expectLoadError(path, /tensor "norm\.weight": dtype must be F16, got BF16/);
  });

  test("missing metadata keys are named", () => {
    for (const key of ["format", "dim", "n_kv_heads", "rope_theta", "quant", "group_size", "tokenizer"]) {
      expectLoadError(withMeta(key, undefined), new RegExp(`missing required key "${key}"`));
    }
  });

  test("integers are parsed strictly", () => {
    for (const bad of ["64.0", "0x40", "+64", " 64", "064", "6e1", "", "-64", "99999999999"]) {
      expectLoadError(withMeta("dim", bad), /metadata: dim must be/);
    }
  });

  test("fixed strings and value ranges", () => {
    expectLoadError(withMeta("format", "gguf"), /format must be "loopserve", got "gguf"/);
    expectLoadError(withMeta("format_version", "3"), /format_version must be one of 1, 2, got "3"/);
    expectLoadError(withMeta("arch", "llama"), /arch must be "looped-llama"/);
    expectLoadError(withMeta("tokenizer", "llama3"), /tokenizer must be "gpt2" or "bpe", got "llama3"/);
    expectLoadError(withMeta("quant", "int8"), /quant must be one of fp16, int4, int2, got "int8"/);
    expectLoadError(withMeta("default_loops", "0"), /default_loops must be in \[1, 64\], got 0/);
    expectLoadError(withMeta("default_loops", "65"), /default_loops must be in \[1, 64\], got 65/);
    expectLoadError(withMeta("max_seq_len", "0"), /max_seq_len must be in \[1,/);
    for (const bad of ["abc", "-1", "0", "inf", "1e999", "NaN"]) {
      expectLoadError(withMeta("rope_theta", bad), /rope_theta must be a positive finite number/);
    }
    expectLoadError(withMeta("norm_eps", "0"), /norm_eps must be a positive finite number/);
  });

  test("a version-1 file carries none of version 2's keys; version 2's are checked", () => {
    expectLoadError(withMeta("n_layers", "2"), /format_version 1 cannot carry n_layers/);
    const v2 = (key: string, value: string) =>
      rewrite(tinyModelPath(SMALL), {
        meta: (m) => {
          m.format_version = "2";
          m[key] = value;
        },
      });
    expectLoadError(v2("n_layers", "0"), /n_layers must be in \[1, 128\], got 0/);
    expectLoadError(v2("norm_layout", "post"), /norm_layout must be one of pre, sandwich, sandwich_sum, got "post"/);
    expectLoadError(v2("step_norm", "yes"), /step_norm must be "0" or "1", got "yes"/);
    expectLoadError(v2("exit_threshold", "1.5"), /exit_threshold must be in \(0, 1\]/);
    expectLoadError(v2("exit_threshold", "0.5"), /exit_threshold given, but the model has no exit gate/);
    expectLoadError(v2("tokenizer", "bpe"), /tokenizer "bpe" needs tokenizer_json/);
    // a one-block file relabelled as two layers names the tensors it lacks
    expectLoadError(v2("n_layers", "2"), /does not belong in a 2-layer model/);
    expectLoadError(v2("norm_layout", "sandwich"), /missing tensor "block.attn_out_norm.weight"/);
  });

  test("floats accept the forms other writers produce", () => {
    for (const ok of ["10000", "10000.0", "1e4", "1E+4", "500000.5"]) {
      const m = { ...readSafetensors(tinyModelPath(SMALL)).metadata, rope_theta: ok };
      expect(parseModelMetadata(m, "x").ropeTheta).toBe(Number(ok));
    }
    const m = { ...readSafetensors(tinyModelPath(SMALL)).metadata, norm_eps: "1e-05" };
    expect(parseModelMetadata(m, "x").normEps).toBe(1e-5);
  });

  test("dimension consistency: dim % n_heads, even head_dim, n_heads % n_kv_heads", () => {
    expectLoadError(withMeta("n_heads", "3"), /dim \(64\) must be a multiple of n_heads \(3\)/);
    expectLoadError(withMeta("n_heads", "64"), /head_dim = dim \/ n_heads = 1 must be even/);
    expectLoadError(withMeta("n_kv_heads", "3"), /n_heads \(4\) must be a multiple of n_kv_heads \(3\)/);
    expectLoadError(withMeta("n_kv_heads", "8"), /n_heads \(4\) must be a multiple of n_kv_heads \(8\)/);
  });

  test("a stated head_dim: even, the heads' width within LS_MAX_DIM, the query heads still a multiple of the key/value heads", () => {
    const stating = (extra: Record<string, string>) =>
      rewrite(tinyModelPath(SMALL), { meta: (m) => Object.assign(m, { format_version: "2" }, extra) }); // head_dim needs format 2
    expectLoadError(stating({ head_dim: "15" }), /head_dim \(15\) must be even/);
    expectLoadError(stating({ head_dim: "32768" }), /n_heads x head_dim \(131072\) must be at most 65536/);
    expectLoadError(stating({ head_dim: "8", n_kv_heads: "3" }), /n_heads \(4\) must be a multiple of n_kv_heads \(3\)/);
  });

  test("every reader refuses the same attention shapes, each in its own field names (one check: attentionHeadDim)", () => {
    const names = { dim: "D", nHeads: "H", nKvHeads: "K", headDim: "E" };
    expect(attentionHeadDim(64, 4, 2, undefined, names)).toBe(16);
    expect(attentionHeadDim(64, 4, 2, 24, names)).toBe(24); // a stated head_dim need not be dim / n_heads
    expect(attentionHeadDim(64, 3, 1, undefined, names)).toBe("D (64) must be a multiple of H (3)");
    expect(attentionHeadDim(64, 64, 64, undefined, names)).toBe("head_dim = D / H = 1 must be even (RoPE rotates pairs)");
    expect(attentionHeadDim(64, 4, 4, 7, names)).toBe("E (7) must be even (RoPE rotates pairs)");
    expect(attentionHeadDim(64, 4096, 4096, 32, names)).toBe("H x E (131072) must be at most 65536");
    expect(attentionHeadDim(64, 4, 8, undefined, names)).toBe("H (4) must be a multiple of K (8)");
    expect(attentionHeadDim(64, 4, 3, 16, names)).toBe("H (4) must be a multiple of K (3)");
  });

  test("metadata that disagrees with the tensors is caught by the shape check", () => {
    expectLoadError(withMeta("ffn_dim", "256"), /tensor "block\.w1\.weight": shape must be \[256, 64\], got \[128, 64\]/);
    expectLoadError(withMeta("vocab_size", "301"), /tensor "tok_embeddings\.weight": shape must be \[301, 64\]/);
  });

  test("a quantized model is judged by its own tensors; loadModelFile reads fp16 only", () => {
    const int4Meta = rewrite(tinyModelPath(SMALL), {
      meta: (m) => {
        m.quant = "int4";
        m.group_size = "32";
      },
    });
    expect(() => parseModelConfig(readSafetensors(int4Meta))).toThrow(/tensor "block\.wq\.weight" present in an int4 model/);
    const int4 = join(testTempDir(), `fmt-${n++}-int4.safetensors`);
    quantizeModelFile(tinyModelPath(SMALL), int4, { quant: "int4", groupSize: 32 });
    expect(parseModelConfig(readSafetensors(int4))).toMatchObject({ quant: "int4", groupSize: 32 });
    expectLoadError(int4, /quant "int4" is not supported by the TypeScript loader/);
    const noGroup = rewrite(tinyModelPath(SMALL), { meta: (m) => void (m.quant = "int2") });
    expectLoadError(noGroup, /group_size must be in \[1,/);
  });

  test("dimensions the kernels cannot hold are refused at the validator, with the limit named", () => {
    expectLoadError(withMeta("dim", "100000"), /metadata: dim must be in \[1, 65536\], got 100000/);
    expectLoadError(withMeta("n_heads", "4097"), /metadata: n_heads must be in \[1, 4096\], got 4097/);
    expectLoadError(withMeta("ffn_dim", "262145"), /metadata: ffn_dim must be in \[1, 262144\], got 262145/);
    expectLoadError(withMeta("vocab_size", "1048577"), /metadata: vocab_size must be in \[1, 1048576\]/);
    expectLoadError(withMeta("max_seq_len", "1048577"), /metadata: max_seq_len must be in \[1, 1048576\]/);
    expectLoadError(withMeta("rope_theta", "1e12"), /rope_theta must be a positive finite number below 1000000000000, got "1e12"/);
    expectLoadError(withMeta("norm_eps", "1"), /norm_eps must be a positive finite number below 1, got "1"/);
    // Positive, but 0 once rounded to the fp32 the kernels compute with.
    expectLoadError(withMeta("norm_eps", "1e-50"), /norm_eps must be a positive finite number/);
  });

  test("fp16 models take group_size 0, whatever the writer recorded", () => {
    expect(parseModelConfig(readSafetensors(withMeta("group_size", "64"))).groupSize).toBe(0);
  });

  test("validateModel names the tensors the model consists of, with their place in the file; others are ignored", () => {
    const src = tinyModelPath({ ...SMALL, tiedOutput: true });
    const path = rewrite(src, { tensors: (t) => [...t, { name: "notes.extra", dtype: "U8", shape: [3], data: new Uint8Array(3) }] });
    const file = readSafetensors(path);
    const { config, tensors } = validateModel(file);
    expect(config.tiedOutput).toBe(true);
    expect([...tensors.keys()].sort()).toEqual(expectedTensorShapes(config).map(([name]) => name).filter((name) => name !== "output.weight").sort());
    for (const [name, t] of tensors) {
      expect(t).toBe(file.tensors.get(name)!);
      expect(t.offset).toBe(t.data.byteOffset - file.map!.byteOffset);
      expect(t.offset % 8).toBe(0);
    }
  });

  test("errors of the container (safetensors) come through as ModelFormatError", () => {
    expectLoadError(join(testTempDir(), "nope.safetensors"), /cannot open/);
  });
});
