// model import-hf: Hugging Face checkpoints (Ouro layout, written by
// test/helpers/hf_fixture.ts) into one loopserve fp16 file, read back byte for
// byte with readSafetensors (test/http/ouro_import.test.ts serves one).
import { describe, expect, test } from "bun:test";
import { closeSync, existsSync, openSync, readdirSync, readFileSync, rmSync, unlinkSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { runModelCommand } from "../../src/cli/model.ts";
import { bf16BitsToNumber, f16BitsToNumber, f64ToF16Bits } from "../../src/model/fp16.ts";
import { ouroName, readHfCheckpoint } from "../../src/model/hf_checkpoint.ts";
import { fixtureTokenizerJson, type HfFixtureOptions, writeHfFixture } from "../helpers/hf_fixture.ts";
import { convertToF16, importHfCheckpoint } from "../../src/model/import_hf.ts";
import { readSafetensors, type SafetensorsFile, writeSafetensors } from "../../src/model/safetensors.ts";
import { testTempDir } from "../helpers/models.ts";
import { modelFormatMessage } from "../helpers/safetensors.ts";

let n = 0;
const tmp = (name: string) => join(testTempDir(), `import-hf-${n++}-${name}`);

const SMALL: HfFixtureOptions = { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 96, vocabSize: 300, nLayers: 3, totalUtSteps: 4, seed: 5 };

function fixture(over: Partial<HfFixtureOptions> = {}): string {
  const dir = tmp("ckpt");
  writeHfFixture(dir, { ...SMALL, ...over });
  return dir;
}

/** Every source tensor of a checkpoint by name, from whichever shard holds it. */
function sourceTensors(dir: string): Map<string, { file: SafetensorsFile; name: string }> {
  const out = new Map<string, { file: SafetensorsFile; name: string }>();
  for (const f of readdirSync(dir).filter((f) => f.endsWith(".safetensors"))) {
    const file = readSafetensors(join(dir, f));
    for (const name of file.tensors.keys()) out.set(name, { file, name });
  }
  return out;
}

/** The fp16 bits the format asks for, one element at a time through the scalar f64 path. */
function expectedBits(dtype: string, data: Uint8Array): Uint16Array {
  const dv = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const size = dtype === "F32" ? 4 : 2;
  const out = new Uint16Array(data.byteLength / size);
  for (let i = 0; i < out.length; i++) {
    const v = dtype === "F32" ? dv.getFloat32(4 * i, true) : dtype === "BF16" ? bf16BitsToNumber(dv.getUint16(2 * i, true)) : f16BitsToNumber(dv.getUint16(2 * i, true));
    out[i] = f64ToF16Bits(v);
  }
  return out;
}

function f16Of(file: SafetensorsFile, name: string): Uint16Array {
  const t = file.tensors.get(name)!;
  return new Uint16Array(t.data.slice().buffer);
}

/** Every imported tensor equals the element-wise conversion of its Ouro source. */
function expectConvertedExactly(dir: string, out: SafetensorsFile): void {
  const src = sourceTensors(dir);
  for (const [target, t] of out.tensors) {
    expect(t.dtype).toBe("F16");
    const s = src.get(ouroName(target))!;
    const st = s.file.tensors.get(s.name)!;
    expect(t.shape).toEqual(st.shape);
    const want = expectedBits(st.dtype, st.data);
    const got = f16Of(out, target);
    expect(got.length).toBe(want.length);
    let mismatches = 0;
    for (let i = 0; i < got.length; i++) if (got[i] !== want[i]) mismatches++;
    expect({ target, mismatches }).toEqual({ target, mismatches: 0 });
  }
}

function expectError(f: () => unknown, ...parts: string[]): void {
  const message = modelFormatMessage(f);
  for (const p of parts) expect(message).toContain(p);
}

function editJson(path: string, edit: (v: Record<string, unknown>) => void): void {
  const v = JSON.parse(readFileSync(path, "utf8")) as Record<string, unknown>;
  edit(v);
  writeFileSync(path, JSON.stringify(v));
}

/** Overwrites element `index` of tensor `name` (in whichever shard holds it) with `bytes`. */
function patchElement(dir: string, name: string, index: number, bytes: Uint8Array): void {
  const s = sourceTensors(dir).get(name)!;
  const t = s.file.tensors.get(name)!;
  const fd = openSync(s.file.path, "r+");
  try {
    writeSync(fd, bytes, 0, bytes.length, t.offset + index * bytes.length);
  } finally {
    closeSync(fd);
  }
}

describe("import-hf: Ouro checkpoints", () => {
  test("a sharded bf16 checkpoint: the format's metadata, and every tensor's fp16 bits are the rounded bf16 values", () => {
    const dir = fixture({ shards: 3, earlyExitThreshold: 0.9 });
    expect(existsSync(join(dir, "model.safetensors.index.json"))).toBe(true);
    expect(readdirSync(dir).filter((f) => /^model-0000\d-of-00003\.safetensors$/.test(f))).toHaveLength(3);
    const outPath = tmp("out.safetensors");
    const r = importHfCheckpoint(dir, outPath);
    const out = readSafetensors(outPath);
    expect(r.bytes).toBe(readFileSync(outPath).byteLength);

    const { tokenizer_json, chat_template, ...meta } = out.metadata;
    expect(meta).toEqual({
      format: "loopserve",
      format_version: "2",
      arch: "looped-llama",
      dim: "64",
      n_heads: "4",
      n_kv_heads: "2",
      ffn_dim: "96",
      vocab_size: "300",
      default_loops: "4",
      max_seq_len: "2048",
      rope_theta: "10000",
      norm_eps: "0.000001",
      quant: "fp16",
      group_size: "0",
      n_layers: "3",
      norm_layout: "sandwich",
      step_norm: "1",
      exit_threshold: "0.9",
      generator: "loopserve import-hf",
      source_arch: "ouro",
      tokenizer: "bpe",
      chat_format: "chatml",
      special_tokens: JSON.stringify({ bos_token: "<|endoftext|>", eos_token: "<|endoftext|>", unk_token: "<|endoftext|>", pad_token: "<|endoftext|>" }),
      eos_token_ids: "0,2", // config.json's eos_token_id 0, generation_config.json's 2 (<|im_end|>), tokenizer_config's eos_token <|endoftext|> (0)
    });
    expect(tokenizer_json).toBe(readFileSync(join(dir, "tokenizer.json"), "utf8"));
    expect(chat_template).toBe(JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")).chat_template);

    const names = [...out.tensors.keys()];
    expect(names.slice(0, 12)).toEqual([
      "tok_embeddings.weight",
      "layers.0.attn_norm.weight",
      "layers.0.wq.weight",
      "layers.0.wk.weight",
      "layers.0.wv.weight",
      "layers.0.wo.weight",
      "layers.0.attn_out_norm.weight",
      "layers.0.ffn_norm.weight",
      "layers.0.w1.weight",
      "layers.0.w2.weight",
      "layers.0.w3.weight",
      "layers.0.ffn_out_norm.weight",
    ]);
    expect(names.slice(-4)).toEqual(["norm.weight", "output.weight", "exit_gate.weight", "exit_gate.bias"]);
    expect(names).toHaveLength(1 + 3 * 11 + 4);
    expect(out.tensors.get("layers.2.wk.weight")!.shape).toEqual([32, 64]);
    expect(out.tensors.get("exit_gate.weight")!.shape).toEqual([1, 64]);
    expect(out.tensors.get("exit_gate.bias")!.shape).toEqual([1]);
    expectConvertedExactly(dir, out);
    // Offsets are 8-byte aligned, as writeSafetensors aligns them.
    for (const t of out.tensors.values()) expect((t.offset - out.dataStart) % 8).toBe(0);
  });

  test("a single-file fp32 tied checkpoint: no output.weight, no exit_threshold, every value rounded to nearest even", () => {
    const dir = fixture({ dtype: "F32", tied: true, nLayers: 2 });
    expect(existsSync(join(dir, "model.safetensors"))).toBe(true);
    expect(existsSync(join(dir, "model.safetensors.index.json"))).toBe(false);
    const outPath = tmp("out.safetensors");
    importHfCheckpoint(dir, outPath);
    const out = readSafetensors(outPath);
    expect(out.tensors.has("output.weight")).toBe(false);
    expect(out.metadata.exit_threshold).toBeUndefined();
    expect(out.metadata.n_layers).toBe("2");
    expectConvertedExactly(dir, out);
  });

  test("the output does not depend on how the checkpoint was sharded", () => {
    const a = tmp("a.safetensors");
    const b = tmp("b.safetensors");
    importHfCheckpoint(fixture({ shards: 1 }), a);
    importHfCheckpoint(fixture({ shards: 4 }), b);
    expect(Buffer.compare(readFileSync(a), readFileSync(b))).toBe(0);
  });

  test("a one-layer stack uses the block. prefix", () => {
    const outPath = tmp("out.safetensors");
    importHfCheckpoint(fixture({ nLayers: 1 }), outPath);
    const out = readSafetensors(outPath);
    expect(out.metadata.n_layers).toBe("1");
    expect(out.tensors.has("block.wq.weight")).toBe(true);
    expect(out.tensors.has("block.ffn_out_norm.weight")).toBe(true);
    expect([...out.tensors.keys()].some((k) => k.startsWith("layers."))).toBe(false);
  });

  test("a tied config with lm_head.weight present ignores the copy; lm_head absent means tied", () => {
    const dir = fixture();
    editJson(join(dir, "config.json"), (c) => (c.tie_word_embeddings = true));
    const outPath = tmp("out.safetensors");
    importHfCheckpoint(dir, outPath);
    expect(readSafetensors(outPath).tensors.has("output.weight")).toBe(false);
    const tiedDir = fixture({ tied: true });
    editJson(join(tiedDir, "config.json"), (c) => (c.tie_word_embeddings = false));
    expect(readHfCheckpoint(tiedDir).model.tiedOutput).toBe(true);
  });

  test("tokenizer_config: add_bos_token sets bos_token_id, a template without <|im_start|> is plain, eos_token_id may be a list", () => {
    const dir = fixture();
    editJson(join(dir, "tokenizer_config.json"), (c) => {
      c.add_bos_token = true;
      c.bos_token = "<|im_start|>";
      c.chat_template = "{{ messages[0]['content'] }}";
      c.eos_token = { content: "<|endoftext|>", special: true };
    });
    editJson(join(dir, "config.json"), (c) => (c.eos_token_id = [2, 1]));
    const outPath = tmp("out.safetensors");
    importHfCheckpoint(dir, outPath);
    const m = readSafetensors(outPath).metadata;
    expect(m.bos_token_id).toBe("1"); // bos_token <|im_start|>
    expect(m.chat_format).toBe("plain");
    expect(m.chat_template).toBe("{{ messages[0]['content'] }}");
    expect(m.eos_token_ids).toBe("2,1,0");
    // Without a template: no chat_template key, plain.
    editJson(join(dir, "tokenizer_config.json"), (c) => delete c.chat_template);
    importHfCheckpoint(dir, outPath);
    expect(readSafetensors(outPath).metadata.chat_template).toBeUndefined();
    expect(readSafetensors(outPath).metadata.chat_format).toBe("plain");
  });

  test("the chat template: a list's default entry, chat_template.jinja when tokenizer_config.json has none; special tokens kept for it", () => {
    const dir = fixture();
    editJson(join(dir, "tokenizer_config.json"), (c) => {
      c.chat_template = [
        { name: "tool_use", template: "{{ tools }}" },
        { name: "default", template: "{{ bos_token }}{{ messages[0].content }}" },
      ];
      c.additional_special_tokens = ["<|im_start|>", { content: "<|im_end|>", special: true }];
    });
    const outPath = tmp("out.safetensors");
    importHfCheckpoint(dir, outPath);
    const m = readSafetensors(outPath).metadata;
    expect(m.chat_template).toBe("{{ bos_token }}{{ messages[0].content }}");
    expect(JSON.parse(m.special_tokens)).toMatchObject({ bos_token: "<|endoftext|>", additional_special_tokens: ["<|im_start|>", "<|im_end|>"] });
    editJson(join(dir, "tokenizer_config.json"), (c) => delete c.chat_template);
    writeFileSync(join(dir, "chat_template.jinja"), "{{ messages[0].content }}\n");
    importHfCheckpoint(dir, outPath);
    expect(readSafetensors(outPath).metadata.chat_template).toBe("{{ messages[0].content }}\n");
  });

  test("early_exit_step k: default_loops k + 1 and no exit_threshold; early_exit_threshold 1: no exit_threshold", () => {
    const outPath = tmp("out.safetensors");
    importHfCheckpoint(fixture({ earlyExitStep: 1, earlyExitThreshold: 0.5 }), outPath);
    const m = readSafetensors(outPath).metadata;
    expect(m.default_loops).toBe("2");
    expect(m.exit_threshold).toBeUndefined();
    importHfCheckpoint(fixture({ earlyExitThreshold: 1 }), outPath);
    const every = readSafetensors(outPath).metadata;
    expect(every.default_loops).toBe("4");
    expect(every.exit_threshold).toBeUndefined();
  });

  test("fixtures are deterministic: the same seed writes the same bytes", () => {
    const a = fixture({ shards: 2 });
    const b = fixture({ shards: 2 });
    for (const f of readdirSync(a)) expect(Buffer.compare(readFileSync(join(a, f)), readFileSync(join(b, f)))).toBe(0);
    const tok = JSON.parse(fixtureTokenizerJson());
    expect(tok.model.type).toBe("BPE");
    expect(tok.added_tokens.map((t: { content: string }) => t.content)).toEqual(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
    expect(Object.keys(tok.model.vocab)).toHaveLength(3 + 256 + tok.model.merges.length);
  });
});

describe("import-hf: loopserve's own layout", () => {
  test("model_type loopserve: config keys are metadata keys, tensor names are kept", () => {
    const dir = tmp("ls");
    writeHfFixture(dir, { ...SMALL, arch: "loopserve", nLayers: 2, dtype: "F16", earlyExitThreshold: 0.5 });
    const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
    expect(config).toMatchObject({ model_type: "loopserve", architectures: ["LoopedLlamaForCausalLM"], dim: 64, n_layers: 2 });
    const outPath = tmp("out.safetensors");
    const r = importHfCheckpoint(dir, outPath);
    expect(r.checkpoint.arch).toBe("loopserve");
    const out = readSafetensors(outPath);
    expect(out.metadata).toMatchObject({ n_layers: "2", norm_layout: "sandwich", step_norm: "1", exit_threshold: "0.5", source_arch: "loopserve" });
    const src = readSafetensors(join(dir, "model.safetensors"));
    expect([...out.tensors.keys()]).toEqual([...src.tensors.keys()]);
    for (const [name, t] of out.tensors) expect(Buffer.compare(t.data, src.tensors.get(name)!.data)).toBe(0); // F16 in, F16 out
  });
});

describe("import-hf: errors name the problem", () => {
  test("unknown architecture", () => {
    const dir = fixture();
    editJson(join(dir, "config.json"), (c) => {
      c.model_type = "llama";
      c.architectures = ["LlamaForCausalLM"];
    });
    expectError(() => readHfCheckpoint(dir), "config.json", "unknown architecture", '"llama"', "LlamaForCausalLM", "OuroForCausalLM");
  });

  test("a shard named in the index but missing", () => {
    const dir = fixture({ shards: 3 });
    unlinkSync(join(dir, "model-00002-of-00003.safetensors"));
    expectError(() => readHfCheckpoint(dir), "shard model-00002-of-00003.safetensors is missing", "model.safetensors.index.json maps");
  });

  test("a shard lacking a tensor the index maps to it, and a tensor the index does not list", () => {
    const dir = fixture({ shards: 2 });
    const indexPath = join(dir, "model.safetensors.index.json");
    const original = readFileSync(indexPath, "utf8");
    editJson(indexPath, (v) => ((v.weight_map as Record<string, string>)["model.layers.0.extra.weight"] = "model-00001-of-00002.safetensors"));
    expectError(() => readHfCheckpoint(dir), "model-00001-of-00002.safetensors", 'lacks tensor "model.layers.0.extra.weight"');
    writeFileSync(indexPath, original);
    // model.norm.weight is in the second shard (the fixture splits in state_dict order).
    editJson(indexPath, (v) => delete (v.weight_map as Record<string, string>)["model.norm.weight"]);
    expectError(() => readHfCheckpoint(dir), "model-00002-of-00002.safetensors", 'holds tensor "model.norm.weight", which model.safetensors.index.json does not map');
  });

  test("RoPE inv_freq buffers some exporters save are ignored", () => {
    const dir = fixture();
    const path = join(dir, "model.safetensors");
    const src = readSafetensors(path);
    const tensors = [...src.tensors].map(([name, t]) => ({ name, dtype: t.dtype, shape: t.shape, data: t.data.slice() }));
    tensors.push({ name: "model.layers.0.self_attn.rotary_emb.inv_freq", dtype: "F32", shape: [8], data: new Uint8Array(32) });
    writeSafetensors(path, {}, tensors);
    expect(readHfCheckpoint(dir).tensors.some((t) => t.name.includes("inv_freq"))).toBe(false);
  });

  test("an index entry that is a path, not a file name", () => {
    const dir = fixture({ shards: 2 });
    editJson(join(dir, "model.safetensors.index.json"), (v) => ((v.weight_map as Record<string, string>)["model.norm.weight"] = "../elsewhere.safetensors"));
    expectError(() => readHfCheckpoint(dir), 'weight_map["model.norm.weight"] must be a file name');
  });

  test("a shape that disagrees with the config", () => {
    const dir = fixture();
    editJson(join(dir, "config.json"), (c) => (c.intermediate_size = 128));
    expectError(() => readHfCheckpoint(dir), 'tensor "model.layers.0.mlp.gate_proj.weight" has shape [96, 64], the config says [128, 64]');
  });

  test("a missing tensor and an unexpected one", () => {
    const dir = fixture();
    editJson(join(dir, "config.json"), (c) => (c.num_hidden_layers = 4));
    expectError(() => readHfCheckpoint(dir), 'tensor "model.layers.3.input_layernorm.weight" is missing');
    editJson(join(dir, "config.json"), (c) => {
      c.num_hidden_layers = 2;
      delete c.layer_types;
    });
    expectError(() => readHfCheckpoint(dir), 'unexpected tensor "model.layers.2.');
  });

  test("an unknown dtype", () => {
    const dir = fixture();
    const path = join(dir, "model.safetensors");
    const src = readSafetensors(path);
    const tensors = [...src.tensors].map(([name, t]) =>
      name === "model.norm.weight"
        ? { name, dtype: "F64" as const, shape: t.shape, data: new Uint8Array(t.data.byteLength * 4) }
        : { name, dtype: t.dtype, shape: t.shape, data: t.data.slice() },
    );
    writeSafetensors(path, {}, tensors);
    expectError(() => readHfCheckpoint(dir), 'tensor "model.norm.weight" has dtype F64', "BF16, F16, F32");
  });

  test("a bf16 value beyond fp16's range names the tensor and element; no output file is left", () => {
    const dir = fixture({ shards: 2 });
    patchElement(dir, "model.layers.1.mlp.up_proj.weight", 1234, new Uint8Array([0x89, 0x47])); // bf16 0x4789 = 70144
    const outPath = tmp("out.safetensors");
    expectError(
      () => importHfCheckpoint(dir, outPath),
      'tensor "model.layers.1.mlp.up_proj.weight" element 1234 [19, 18] is 70144 (BF16)',
      "beyond fp16's range",
    );
    expect(existsSync(outPath)).toBe(false);
    expect(readdirSync(testTempDir()).some((f) => f.includes("out.safetensors.tmp"))).toBe(false);
  });

  test("an fp32 value that rounds to infinity is refused; one that rounds to 65504 is kept; NaN is refused", () => {
    const dir = fixture({ dtype: "F32" });
    const f32 = (v: number) => new Uint8Array(new Float32Array([v]).buffer);
    const outPath = tmp("out.safetensors");
    patchElement(dir, "model.embed_tokens.weight", 7, f32(65519.99));
    importHfCheckpoint(dir, outPath);
    expect(f16Of(readSafetensors(outPath), "tok_embeddings.weight")[7]).toBe(0x7bff); // 65504
    patchElement(dir, "model.embed_tokens.weight", 7, f32(-65520));
    expectError(() => importHfCheckpoint(dir, outPath), 'tensor "model.embed_tokens.weight" element 7 [0, 7] is -65520 (F32)', "beyond fp16's range");
    patchElement(dir, "model.embed_tokens.weight", 7, f32(NaN));
    expectError(() => importHfCheckpoint(dir, outPath), "element 7 [0, 7] is NaN (F32), not finite");
  });

  test("a missing tokenizer.json", () => {
    const dir = fixture();
    rmSync(join(dir, "tokenizer.json"));
    expectError(() => readHfCheckpoint(dir), "tokenizer.json is missing");
  });

  test("a malformed generation_config.json is refused naming the file and the field", () => {
    const dir = fixture();
    const path = join(dir, "generation_config.json");
    writeFileSync(path, "{ eos_token_id: 2 }");
    expectError(() => readHfCheckpoint(dir), path, "is not valid JSON");
    writeFileSync(path, "[2]");
    expectError(() => readHfCheckpoint(dir), path, "must be a JSON object");
    writeFileSync(path, JSON.stringify({ eos_token_id: [2, 9999] }));
    expectError(() => readHfCheckpoint(dir), path, "eos_token_id[1] must be a token id in [0, 300), got 9999");
  });

  test("a malformed chat template is refused at import naming the file and the field", () => {
    const cases: [unknown, string][] = [
      ["{% for m in messages %}{{ m.content }}", "chat_template does not parse"],
      ["{{ raise_exception('Conversation roles must alternate') }}", "chat_template failed to render: Conversation roles must alternate"],
      ["{{ messages[0].nothing() }}", "chat_template failed to render"],
      [42, "chat_template must be a string or a list"],
      [[{ name: "tool_use", template: "x" }], 'chat_template is a list without a {"name": "default"'],
    ];
    for (const [template, message] of cases) {
      const dir = fixture();
      editJson(join(dir, "tokenizer_config.json"), (c) => (c.chat_template = template));
      const outPath = tmp("out.safetensors");
      expectError(() => importHfCheckpoint(dir, outPath), join(dir, "tokenizer_config.json"), message);
      expect(existsSync(outPath)).toBe(false);
    }
    const dir = fixture();
    editJson(join(dir, "tokenizer_config.json"), (c) => (c.chat_template = [{ name: "default", template: "{% if %}" }]));
    expectError(() => readHfCheckpoint(dir), "tokenizer_config.json: chat_template[0].template does not parse");
    editJson(join(dir, "tokenizer_config.json"), (c) => delete c.chat_template);
    writeFileSync(join(dir, "chat_template.jinja"), "{{ messages[0]['content'] ");
    expectError(() => readHfCheckpoint(dir), join(dir, "chat_template.jinja"), "does not parse");
  });

  test("a special token that is no text is refused naming the key", () => {
    const dir = fixture();
    editJson(join(dir, "tokenizer_config.json"), (c) => (c.bos_token = ["<|endoftext|>"]));
    expectError(() => readHfCheckpoint(dir), "tokenizer_config.json", "bos_token must be a token's text");
    editJson(join(dir, "tokenizer_config.json"), (c) => {
      c.bos_token = "<|endoftext|>";
      c.additional_special_tokens = ["<|im_start|>", 7];
    });
    expectError(() => readHfCheckpoint(dir), "tokenizer_config.json", "additional_special_tokens[1] must be a token's text");
  });

  test("config values loopserve does not compute: sliding windows, RoPE scaling, another activation", () => {
    for (const [key, value, msg] of [
      ["use_sliding_window", true, "sliding-window"],
      ["rope_scaling", { rope_type: "yarn", factor: 4 }, "rope_scaling"],
      ["hidden_act", "gelu", 'hidden_act must be "silu"'],
      ["num_key_value_heads", 3, "must be a multiple of num_key_value_heads (3)"],
      ["total_ut_steps", 0, "total_ut_steps must be an integer in [1, 64]"],
    ] as const) {
      const dir = fixture();
      editJson(join(dir, "config.json"), (c) => (c[key] = value));
      expectError(() => readHfCheckpoint(dir), msg);
    }
  });
});

describe("convertToF16", () => {
  test("agrees with the scalar rounding on edge values of every source dtype", () => {
    const values = [0, -0, 1, -1, 65504, 65519, 65519.996, 2 ** -24, 2 ** -25, 3 * 2 ** -26, 2 ** -14, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 1e-10, 0.1, 1 / 3];
    const f32 = new Float32Array(values);
    const out = new Uint16Array(values.length);
    expect(convertToF16("F32", new Uint8Array(f32.buffer), values.length, out)).toBe(-1);
    expect([...out]).toEqual(values.map((v) => f64ToF16Bits(Math.fround(v))));
    // bf16: every pattern, against the scalar path (finite in range -> same bits; else the index).
    const all = new Uint16Array(65536).map((_, i) => i);
    const one = new Uint16Array(1);
    for (let b = 0; b < 65536; b++) {
      const v = bf16BitsToNumber(b);
      const bad = convertToF16("BF16", new Uint8Array(all.buffer, 2 * b, 2), 1, one);
      if (!Number.isFinite(v) || Math.abs(v) >= 65520) expect(bad).toBe(0);
      else if (bad !== -1 || one[0] !== f64ToF16Bits(v)) expect({ b, bad, got: one[0] }).toEqual({ b, bad: -1, got: f64ToF16Bits(v) });
    }
  });
});

describe("loopserve model import-hf (CLI)", () => {
  async function run(...argv: string[]): Promise<{ code: number; out: string; err: string }> {
    const out: string[] = [];
    const err: string[] = [];
    const code = await runModelCommand(argv, { out: (l) => out.push(l), err: (l) => err.push(l) });
    return { code, out: out.join("\n"), err: err.join("\n") };
  }

  test("imports, and says what it wrote", async () => {
    const outPath = tmp("cli.safetensors");
    const r = await run("import-hf", fixture({ shards: 2 }), outPath);
    expect(r.code).toBe(0);
    expect(r.err).toBe("");
    expect(r.out).toContain(`wrote ${outPath}:`);
    expect(r.out).toContain("ouro: dim 64, 3 layers, heads 4/2 kv, ffn 96, vocab 300, default loops 4, untied output, exit gate, end ids 0, 2)");
  });

  test("model inspect lists the end ids (generation_config.json's <|im_end|> among them) and the chat template's end of turn", async () => {
    const dir = fixture();
    const outPath = tmp("inspected.safetensors");
    expect((await run("import-hf", dir, outPath)).code).toBe(0);
    const r = await run("inspect", outPath);
    expect(r.code).toBe(0);
    expect(r.out).toContain('end ids: 0 "<|endoftext|>", 2 "<|im_end|>"; end of a chat turn: 2 "<|im_end|>"');
    rmSync(join(dir, "generation_config.json"));
    expect((await run("import-hf", dir, outPath)).code).toBe(0);
    const j = JSON.parse((await run("inspect", outPath, "--json")).out);
    expect([j.end_ids, j.chat_end_ids]).toEqual([[0], [2]]);
  });

  test("a bad checkpoint is exit 1 with one error line; a missing path is a usage error", async () => {
    const dir = fixture();
    rmSync(join(dir, "tokenizer.json"));
    const r = await run("import-hf", dir, tmp("cli.safetensors"));
    expect(r.code).toBe(1);
    expect(r.err.split("\n")).toHaveLength(1);
    expect(r.err).toStartWith("error: ");
    expect(r.err).toContain("tokenizer.json is missing");
    expect((await run("import-hf", dir)).code).toBe(2);
    expect((await run("import-hf", "--help")).out).toContain("usage: loopserve model import-hf DIR OUT");
  });
});
