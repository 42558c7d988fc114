// model import-hf on the published looped families beside Ouro (test/helpers/
// hf_fixture.ts writes their layouts): Huginn-0125's (fused Wqkv and mlp.fc
// split by rows, the qk_bias pair, sandwich norms, the adapter, a tied head
// stored twice, the RoPE buffer), a checkpoint retrofitted with recurrence
// (pre-norm, Llama's RoPE, GQA, untied) and Nanbeige4.2's (Llama names,
// head_dim of its own, num_loops). Every imported tensor is the element-wise
// fp16 rounding of its source's elements; the metadata says the layout and
// the tokenizer's ids; `model inspect` names the family; configs the kernels
// would compute otherwise are refused by key. test/torch/families.test.ts
// holds the imports to the families' published code.
import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { runModelCommand } from "../../src/cli/model.ts";
import { bf16BitsToNumber, f64ToF16Bits } from "../../src/model/fp16.ts";
import { readHfCheckpoint } from "../../src/model/hf_checkpoint.ts";
import { HF_FAMILIES } from "../../src/model/hf_families.ts";
import { importHfCheckpoint } from "../../src/model/import_hf.ts";
import { readSafetensors, type SafetensorsFile } from "../../src/model/safetensors.ts";
import { type HfFixtureOptions, writeHfFixture } from "../helpers/hf_fixture.ts";
import { ensureLibrary } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";
import { modelFormatMessage } from "../helpers/safetensors.ts";

let n = 0;
const tmp = (name: string) => join(testTempDir(), `import-families-${n++}-${name}`);

const HUGINN: HfFixtureOptions = { arch: "huginn", dim: 64, nHeads: 4, ffnDim: 96, vocabSize: 320, nLayers: 2, nPrelude: 2, nCoda: 1, totalUtSteps: 8, seed: 5, shards: 3 };
// vocabSize: room for Llama's SentencePiece-style tokenizer
const RETROFIT: HfFixtureOptions = { ...HUGINN, retrofit: true, nKvHeads: 2, nPrelude: 1, nCoda: 2, vocabSize: 512 };
const NANBEIGE: HfFixtureOptions = { arch: "nanbeige", dim: 64, nHeads: 4, nKvHeads: 2, headDim: 32, ffnDim: 96, vocabSize: 512, nLayers: 3, totalUtSteps: 2, seed: 5, shards: 2 };

function fixture(o: HfFixtureOptions): string {
  const dir = tmp("ckpt");
  writeHfFixture(dir, o);
  return dir;
}

/** Every source tensor's bf16 elements, as numbers, by name. */
function sourceValues(dir: string): Map<string, { shape: number[]; values: Float64Array }> {
  const out = new Map<string, { shape: number[]; values: Float64Array }>();
  for (const f of readdirSync(dir).filter((f) => f.endsWith(".safetensors"))) {
    for (const [name, t] of readSafetensors(join(dir, f)).tensors) {
      const values = new Float64Array(t.data.byteLength / (t.dtype === "F32" ? 4 : 2));
      const dv = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
      for (let i = 0; i < values.length; i++) values[i] = t.dtype === "F32" ? dv.getFloat32(4 * i, true) : bf16BitsToNumber(dv.getUint16(2 * i, true));
      out.set(name, { shape: t.shape, values });
    }
  }
  return out;
}

/** The target's fp16 bits equal the rounding of the source's elements from `first`. */
function expectSlice(out: SafetensorsFile, target: string, src: Float64Array, first: number): void {
  const t = out.tensors.get(target);
  expect(t, target).toBeDefined();
  const bits = new Uint16Array(t!.data.slice().buffer);
  for (let i = 0; i < bits.length; i++) if (bits[i] !== f64ToF16Bits(src[first + i])) throw new Error(`${target}[${i}]: not the rounding of source element ${first + i}`);
}

function editJson(path: string, edit: (v: Record<string, unknown>) => void): void {
  const v = JSON.parse(readFileSync(path, "utf8")) as Record<string, unknown>;
  edit(v);
  writeFileSync(path, JSON.stringify(v));
}

function expectError(f: () => unknown, ...parts: string[]): void {
  const message = modelFormatMessage(f);
  for (const p of parts) expect(message).toContain(p);
}

async function inspect(path: string): Promise<string> {
  const out: string[] = [];
  expect(await runModelCommand(["inspect", path], { out: (l) => out.push(l), err: () => {} })).toBe(0);
  return out.join("\n");
}

describe("import-hf: Huginn-0125's layout", () => {
  test("fused matrices split by rows, the q/k biases, sandwich norms, the adapter; the tied head's copy and the RoPE buffer ignored", async () => {
    const dir = fixture(HUGINN);
    const src = sourceValues(dir);
    expect(src.has("lm_head.weight") && src.has("freqs_cis")).toBe(true); // as published
    const path = tmp("huginn.safetensors");
    importHfCheckpoint(dir, path);
    const out = readSafetensors(path);
    expect(out.metadata).toMatchObject({
      source_arch: "huginn", n_layers: "2", default_loops: "8", n_prelude: "2", n_coda: "1", injection: "adapter",
      embed_scale: String(Math.sqrt(64)), norm_layout: "sandwich_sum", mid_norm: "1", rope_layout: "interleaved", qk_bias: "1", step_norm: "0",
    });
    expect(Number(out.metadata.state_std)).toBeCloseTo(Math.sqrt(2 / (5 * 64)) * 8, 12);
    expect(out.tensors.has("output.weight")).toBe(false);
    const q = 64;
    for (const [from, to] of [["transformer.prelude.1.", "prelude.1."], ["transformer.core_block.1.", "layers.1."], ["transformer.coda.0.", "coda.0."]]) {
      const wqkv = src.get(`${from}attn.Wqkv.weight`)!.values;
      expectSlice(out, `${to}wq.weight`, wqkv, 0);
      expectSlice(out, `${to}wk.weight`, wqkv, q * 64);
      expectSlice(out, `${to}wv.weight`, wqkv, 2 * q * 64);
      const bias = src.get(`${from}attn.qk_bias`)!;
      expect(bias.shape).toEqual([2, 1, 4, 16]);
      expectSlice(out, `${to}wq.bias`, bias.values, 0);
      expectSlice(out, `${to}wk.bias`, bias.values, q);
      const fc = src.get(`${from}mlp.fc.weight`)!.values;
      expectSlice(out, `${to}w1.weight`, fc, 0);
      expectSlice(out, `${to}w3.weight`, fc, 96 * 64);
      for (const [norm, name] of [["norm_1", "attn_norm"], ["norm_2", "attn_out_norm"], ["norm_3", "ffn_norm"], ["norm_4", "ffn_out_norm"]])
        expectSlice(out, `${to}${name}.weight`, src.get(`${from}${norm}.weight`)!.values, 0);
    }
    expectSlice(out, "adapter.weight", src.get("transformer.adapter.weight")!.values, 0);
    expect(out.tensors.get("adapter.weight")!.shape).toEqual([64, 128]);
    // the ends: eos <|end_text|>, then those the published generate stops at too (<|begin_text|>, the template's <|end_turn|>)
    expect(out.metadata.eos_token_ids).toBe("289,288,292");
    expect(await inspect(path)).toContain("family: huginn, Huginn (RavenForCausalLM); 2 prelude layers; 1 coda layers");
  });

  test("a retrofitted checkpoint: pre-norm blocks (no norm_3 / norm_4), Llama's RoPE, no q/k bias, GQA, an untied head", async () => {
    const dir = fixture(RETROFIT);
    const path = tmp("retrofit.safetensors");
    importHfCheckpoint(dir, path);
    const out = readSafetensors(path);
    expect(out.metadata).toMatchObject({ source_arch: "huginn", norm_layout: "pre", mid_norm: "0", rope_layout: "half", qk_bias: "0", embed_scale: "1", n_kv_heads: "2" });
    expect(out.tensors.has("output.weight")).toBe(true);
    expect(out.tensors.has("layers.0.wq.bias")).toBe(false);
    const src = sourceValues(dir);
    expectSlice(out, "prelude.0.ffn_norm.weight", src.get("transformer.prelude.0.norm_2.weight")!.values, 0);
    expectSlice(out, "coda.1.wv.weight", src.get("transformer.coda.1.attn.Wqkv.weight")!.values, (64 + 32) * 64);
    expect(await inspect(path)).toContain("family: huginn-retrofit, recurrence retrofitted into a pretrained model");
  });

  test("Llama's TemplateProcessing post-processor ([<s>, $A]) becomes the file's beginning-of-sequence token; add_bos_token false turns it off; two tokens before the text, or one after, are refused", () => {
    const llamaTemplate = (single: unknown[]) => ({
      type: "TemplateProcessing",
      single,
      pair: [],
      special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] }, "</s>": { id: "</s>", ids: [2], tokens: ["</s>"] } },
    });
    const bos = { SpecialToken: { id: "<s>", type_id: 0 } };
    const text = { Sequence: { id: "A", type_id: 0 } };
    const withTemplate = (single: unknown[], addBos?: boolean) => {
      const dir = fixture(RETROFIT);
      editJson(join(dir, "tokenizer.json"), (t) => void (t.post_processor = llamaTemplate(single)));
      if (addBos !== undefined) editJson(join(dir, "tokenizer_config.json"), (c) => void (c.add_bos_token = addBos));
      return dir;
    };
    const path = tmp("bos.safetensors");
    importHfCheckpoint(withTemplate([bos, text]), path);
    expect(readSafetensors(path).metadata.bos_token_id).toBe("1");
    importHfCheckpoint(withTemplate([bos, text], false), path);
    expect(readSafetensors(path).metadata.bos_token_id).toBeUndefined();
    expectError(() => importHfCheckpoint(withTemplate([bos, bos, text]), tmp("x.safetensors")), "puts 2 tokens (ids 1, 1) before every text");
    expectError(() => importHfCheckpoint(withTemplate([text, { SpecialToken: { id: "</s>", type_id: 0 } }]), tmp("x.safetensors")), "single must be special tokens followed by the text ($A)");
  });

  test("refused by key: what the kernels would compute otherwise", () => {
    for (const [key, value, msg] of [
      ["injection_type", "add", 'injection_type must be "linear"'],
      ["block_class_name", "TransformerPreNormBlock", 'block_class_name must be "SandwichBlock"'],
      ["test_time_noise", 0.1, "test_time_noise must be 0"],
      ["bias", true, "bias must be false"],
      ["rope_scaling", { rope_type: "llama3", factor: 32 }, "rope_scaling"],
      ["n_layers", 9, "n_layers (9) must be n_layers_in_prelude + n_layers_in_recurrent_block + n_layers_in_coda = 5"],
      ["num_key_value_heads", 2, "qk_bias needs num_key_value_heads"],
    ] as const) {
      const dir = fixture(HUGINN);
      editJson(join(dir, "config.json"), (c) => (c[key] = value));
      expectError(() => readHfCheckpoint(dir, HF_FAMILIES), msg);
    }
    // a sandwich block missing its fourth norm
    const dir = fixture(HUGINN);
    const index = join(dir, "model.safetensors.index.json");
    editJson(index, (v) => delete (v.weight_map as Record<string, string>)["transformer.core_block.0.norm_4.weight"]);
    expectError(() => readHfCheckpoint(dir, HF_FAMILIES), "transformer.core_block.0.norm_4.weight");
  });
});

describe("import-hf: Nanbeige4.2's layout", () => {
  test("Llama's names, head_dim of its own, num_loops as the default depth, the loop-boundary norm as the step norm", async () => {
    const dir = fixture(NANBEIGE);
    const path = tmp("nanbeige.safetensors");
    importHfCheckpoint(dir, path);
    const out = readSafetensors(path);
    expect(out.metadata).toMatchObject({ source_arch: "nanbeige", n_layers: "3", default_loops: "2", head_dim: "32", step_norm: "1", norm_layout: "pre" });
    expect(out.metadata.n_prelude ?? "0").toBe("0");
    expect(out.tensors.get("layers.2.wq.weight")!.shape).toEqual([128, 64]);
    expect(out.tensors.get("layers.2.wo.weight")!.shape).toEqual([64, 128]);
    const src = sourceValues(dir);
    expectSlice(out, "layers.1.wk.weight", src.get("model.layers.1.self_attn.k_proj.weight")!.values, 0);
    expectSlice(out, "output.weight", src.get("lm_head.weight")!.values, 0);
    // ChatML's end: <|im_end|>, 43 ids before the vocabulary's end
    expect(out.metadata.eos_token_ids).toBe(String(512 - 43));
    expect(await inspect(path)).toContain("family: nanbeige, Nanbeige4.2 (NanbeigeForCausalLM); head_dim 32");
    // skip_loop_final_norm: the norm after the last loop only
    editJson(join(dir, "config.json"), (c) => (c.skip_loop_final_norm = true));
    expect(readHfCheckpoint(dir, HF_FAMILIES).model.stepNorm).toBe(false);
  });

  test("refused by key: the options of its config class this family leaves off", () => {
    for (const [key, value, msg] of [
      ["loop_share_kv", true, "loop_share_kv true is not supported"],
      ["enable_hyper_connection", true, "enable_hyper_connection true is not supported"],
      ["qk_layernorm", true, "qk_layernorm true is not supported"],
      ["rope_scaling", { rope_type: "yarn", factor: 4 }, "rope_scaling"],
      ["attention_bias", true, "attention_bias and mlp_bias must be false"],
      ["head_dim", 15, "head_dim (15) must be even"],
    ] as const) {
      const dir = fixture(NANBEIGE);
      editJson(join(dir, "config.json"), (c) => (c[key] = value));
      expectError(() => readHfCheckpoint(dir, HF_FAMILIES), msg);
    }
  });
});

test("model inspect names the family of a file made here by its layout", async () => {
  ensureLibrary();
  const { tinyModelPath } = await import("../helpers/models.ts");
  expect(await inspect(tinyModelPath({}))).toContain("family: block, a looped block");
  expect(await inspect(tinyModelPath({ nLayers: 2 }))).toContain("family: stack, a looped stack of layers");
  expect(await inspect(tinyModelPath({ nLayers: 2, nPrelude: 1, nCoda: 1, injection: "adapter", stateStd: 0.5 }))).toContain("family: recurrent");
});
