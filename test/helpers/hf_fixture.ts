// Random-weight checkpoints in the exact Hugging Face Ouro layout (or
// loopserve's own, model_type "loopserve"), for import-hf's tests and its
// benchmark: config.json, generation_config.json, weights as one
// model.safetensors or as shards with model.safetensors.index.json,
// tokenizer.json and tokenizer_config.json. As the published Ouro
// checkpoints are: bos, eos and pad <|endoftext|> in config.json and
// tokenizer_config.json, <|im_end|> (the end of a chat turn) named as an end
// id only in generation_config.json, and a ChatML template with a default
// system turn; the Thinking variant (`thinking`) has <think> and </think>
// tokens and a template that opens the reasoning.
//
// Deterministic: the same options give byte-identical files. Each tensor
// draws from its own stream (seed, tensor name), from xoshiro128** with
// Irwin-Hall normals (integer arithmetic only, as src/model/synthetic.ts does,
// so no platform's Math.log can change a bit).
//
// Scales keep a forward pass in fp16 sane: matrices and the embedding
// N(0, 0.02) (Ouro's initializer_range), norms 1 + N(0, 0.05), the exit
// gate's bias N(0, 0.02). Weights are streamed to disk tensor by tensor, so a
// 1.4B fixture (2.8 GB of bf16) needs no more memory than a small one.

import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ProgressCallback } from "../../src/progress.ts";
import { f32BitsToF16Bits } from "../../src/model/fp16.ts";
import { type HfArch, type HfDtype, type HfModelShape, loopserveTensorShapes, ouroName } from "../../src/model/hf_checkpoint.ts";
import { fillNormal, streamState } from "../../src/model/normal_stream.ts";
import { DTYPE_SIZES, ModelFormatError, type TensorSpec, writeSafetensorsStream } from "../../src/model/safetensors.ts";
import { BYTE_CHARS } from "../../src/tokenizer/byte_chars.ts";

export interface HfFixtureOptions {
  arch?: HfArch; // default "ouro"
  dim: number;
  nHeads: number;
  nKvHeads?: number; // default nHeads
  ffnDim: number;
  vocabSize: number;
  nLayers: number;
  totalUtSteps: number;
  seed: number;
  dtype?: HfDtype; // default BF16
  shards?: number; // 1 (default): model.safetensors; more: model-0000k-of-0000n.safetensors + index
  tied?: boolean; // tie_word_embeddings, no lm_head.weight
  earlyExitThreshold?: number | null; // default absent
  earlyExitStep?: number; // Ouro's early_exit_step; default absent
  thinking?: boolean; // the Thinking variant: <think>, </think> tokens; the template opens the reasoning
  /**
   * A token greedy decoding is pulled towards: every embedding's first
   * component is STEER_EMBEDDING, which the residual stream carries to the
   * head, and the head's row for this id reads it with weight STEER_HEAD.
   * Where the last hidden state keeps that component positive (tests check
   * it with the reference) the token wins by a wide margin. Untied heads only.
   */
  steerTo?: number;
  maxPositionEmbeddings?: number; // default 2048
  ropeTheta?: number; // default 10000
  rmsNormEps?: number; // default 1e-6
  onProgress?: ProgressCallback; // bytes of weights written
}

export interface HfFixtureResult {
  dir: string;
  files: string[]; // weight files
  bytes: number; // of the weight files
  parameters: number;
}

/** Ouro-1.4B's shape: 24 layers, hidden 2048, ffn 5632, 16 heads (no GQA), vocab 49152, 4 steps. */
export const OURO_1_4B = {
  dim: 2048,
  nHeads: 16,
  nKvHeads: 16,
  ffnDim: 5632,
  vocabSize: 49152,
  nLayers: 24,
  totalUtSteps: 4,
} as const;


/** fp32 -> bf16 bits, round to nearest even (values here are finite). */
function f32ToBf16Bits(f: number): number {
  return ((f + 0x7fff + ((f >>> 16) & 1)) >>> 16) & 0xffff;
}

// ---- tokenizer ----

/** Special tokens at ids 0..2, as in Ouro's (SmolLM2's) tokenizer. */
export const FIXTURE_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] as const;
const FIXTURE_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a n"];
/** The Thinking variant's reasoning tokens, after the merges (added, not special, as Qwen 3 has them). */
export const FIXTURE_THINK_TOKENS = ["<think>", "</think>"] as const;
/** Ids of the fixture's tokens by text. */
export const FIXTURE_IDS = { endoftext: 0, imStart: 1, imEnd: 2, think: 3 + 256 + FIXTURE_MERGES.length, thinkEnd: 4 + 256 + FIXTURE_MERGES.length } as const;

/**
 * A small valid byte-level BPE tokenizer.json: the three special tokens, the
 * 256 byte tokens (ids 3..258, GPT-2's byte-to-unicode strings), then one
 * token per merge, then (`thinking`) <think> and </think>. Loads in Hugging
 * Face `tokenizers`.
 */
export function fixtureTokenizerJson(thinking = false): string {
  const vocab: Record<string, number> = {};
  FIXTURE_SPECIAL_TOKENS.forEach((t, i) => (vocab[t] = i));
  for (const ch of BYTE_CHARS) vocab[ch] = Object.keys(vocab).length;
  for (const m of FIXTURE_MERGES) vocab[m.replace(" ", "")] = Object.keys(vocab).length;
  const first = Object.keys(vocab).length;
  const think = thinking ? FIXTURE_THINK_TOKENS.map((content, i) => ({ id: first + i, content, special: false })) : [];
  for (const t of think) vocab[t.content] = t.id;
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
  return JSON.stringify(
    {
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: [...FIXTURE_SPECIAL_TOKENS.map((content, id) => ({ id, content, special: true })), ...think].map((t) => ({
        id: t.id,
        content: t.content,
        single_word: false,
        lstrip: false,
        rstrip: false,
        normalized: false,
        special: t.special,
      })),
      normalizer: null,
      pre_tokenizer: byteLevel,
      post_processor: byteLevel,
      decoder: byteLevel,
      model: {
        type: "BPE",
        dropout: null,
        unk_token: null,
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: false,
        byte_fallback: false,
        ignore_merges: false,
        vocab,
        merges: FIXTURE_MERGES,
      },
    },
    null,
    2,
  );
}

/** The system turn the template puts first when the conversation has none. */
export const FIXTURE_SYSTEM_TURN = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";

/** A ChatML template in the form Ouro's tokenizer_config.json carries: a default system turn, then the messages; the Thinking variant opens the reasoning. */
export function fixtureChatTemplate(thinking = false): string {
  return (
    "{% for message in messages %}" +
    `{% if loop.first and messages[0]['role'] != 'system' %}{{ ${JSON.stringify(FIXTURE_SYSTEM_TURN)} }}{% endif %}` +
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}" +
    `{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n${thinking ? "<think>\\n" : ""}' }}{% endif %}`
  );
}

export function fixtureTokenizerConfig(thinking = false): Record<string, unknown> {
  return {
    add_bos_token: false,
    add_prefix_space: false,
    bos_token: "<|endoftext|>",
    eos_token: "<|endoftext|>",
    pad_token: "<|endoftext|>",
    unk_token: "<|endoftext|>",
    model_max_length: 2048,
    tokenizer_class: "GPT2Tokenizer",
    clean_up_tokenization_spaces: false,
    chat_template: fixtureChatTemplate(thinking),
  };
}

/** generation_config.json as published beside an Ouro config: <|im_end|> is an end id only here. */
function generationConfig(): Record<string, unknown> {
  return { bos_token_id: 0, eos_token_id: FIXTURE_IDS.imEnd, pad_token_id: 0, transformers_version: "4.55.0" };
}

// ---- config ----

function shapeOf(o: HfFixtureOptions): HfModelShape {
  const nKvHeads = o.nKvHeads ?? o.nHeads;
  return {
    dim: o.dim,
    nHeads: o.nHeads,
    nKvHeads,
    headDim: o.dim / o.nHeads,
    ffnDim: o.ffnDim,
    vocabSize: o.vocabSize,
    nLayers: o.nLayers,
    defaultLoops: o.totalUtSteps,
    maxSeqLen: o.maxPositionEmbeddings ?? 2048,
    ropeTheta: o.ropeTheta ?? 10000,
    normEps: o.rmsNormEps ?? 1e-6,
    sandwich: true,
    stepNorm: true,
    exitGate: true,
    exitThreshold: o.earlyExitThreshold ?? null,
    tiedOutput: o.tied ?? false,
  };
}

/** config.json as Ouro's transformers code writes it. */
function ouroConfig(m: HfModelShape, dtype: HfDtype, earlyExitStep: number | undefined): Record<string, unknown> {
  const config: Record<string, unknown> = {
    architectures: ["OuroForCausalLM"],
    attention_dropout: 0.0,
    bos_token_id: 0,
    eos_token_id: 0,
    hidden_act: "silu",
    hidden_size: m.dim,
    initializer_range: 0.02,
    intermediate_size: m.ffnDim,
    layer_types: Array.from({ length: m.nLayers }, () => "full_attention"),
    max_position_embeddings: m.maxSeqLen,
    max_window_layers: m.nLayers,
    model_type: "ouro",
    num_attention_heads: m.nHeads,
    num_hidden_layers: m.nLayers,
    num_key_value_heads: m.nKvHeads,
    pad_token_id: 0,
    rms_norm_eps: m.normEps,
    rope_scaling: null,
    rope_theta: m.ropeTheta,
    sliding_window: null,
    tie_word_embeddings: m.tiedOutput,
    torch_dtype: { BF16: "bfloat16", F16: "float16", F32: "float32" }[dtype],
    total_ut_steps: m.defaultLoops,
    transformers_version: "4.55.0",
    use_cache: true,
    use_sliding_window: false,
    vocab_size: m.vocabSize,
  };
  if (m.exitThreshold !== null) config.early_exit_threshold = m.exitThreshold;
  if (earlyExitStep !== undefined) config.early_exit_step = earlyExitStep;
  return config;
}

/** config.json of a loopserve checkpoint: its metadata keys as JSON values. */
function loopserveConfig(m: HfModelShape): Record<string, unknown> {
  const config: Record<string, unknown> = {
    architectures: ["LoopedLlamaForCausalLM"],
    model_type: "loopserve",
    dim: m.dim,
    n_heads: m.nHeads,
    n_kv_heads: m.nKvHeads,
    ffn_dim: m.ffnDim,
    vocab_size: m.vocabSize,
    n_layers: m.nLayers,
    default_loops: m.defaultLoops,
    max_seq_len: m.maxSeqLen,
    rope_theta: m.ropeTheta,
    norm_eps: m.normEps,
    norm_layout: "sandwich",
    step_norm: true,
    eos_token_id: 0,
  };
  if (m.exitThreshold !== null) config.exit_threshold = m.exitThreshold;
  return config;
}

// ---- writer ----

/** [mean, std] of a tensor by its loopserve name. */
function distribution(target: string): [number, number] {
  if (target.endsWith("norm.weight")) return [1, 0.05];
  return [0, 0.02];
}

/** Tensors in Ouro's state_dict order (embedding, layers, norm, gate, head), split into `n` runs of about equal bytes. */
function splitIntoShards<T extends { bytes: number }>(tensors: T[], n: number): T[][] {
  const total = tensors.reduce((a, t) => a + t.bytes, 0);
  const shards: T[][] = [[]];
  let acc = 0;
  for (const t of tensors) {
    const cur = shards[shards.length - 1];
    if (cur.length > 0 && shards.length < n && acc + t.bytes / 2 > (total * shards.length) / n) shards.push([]);
    shards[shards.length - 1].push(t);
    acc += t.bytes;
  }
  return shards;
}

/** The first component of every embedding, and the weight the steered token's head row reads it with (steerTo). */
const STEER_EMBEDDING = 1;
const STEER_HEAD = 20;

/** `chunk` (the elements from `offset` of a [rows, dim] tensor) with the steering of `steerTo` written in. */
function steer(chunk: Float32Array, offset: number, dim: number, target: string, steerTo: number): void {
  for (let e = offset; e < offset + chunk.length; e++) {
    if (target === "tok_embeddings.weight" && e % dim === 0) chunk[e - offset] = STEER_EMBEDDING;
    if (target === "output.weight" && e === steerTo * dim) chunk[e - offset] = STEER_HEAD;
  }
}

/** Writes a random checkpoint directory (created if needed); returns its weight files. */
export function writeHfFixture(dir: string, o: HfFixtureOptions): HfFixtureResult {
  const arch = o.arch ?? "ouro";
  const dtype = o.dtype ?? "BF16";
  const m = shapeOf(o);
  if (!Number.isInteger(m.headDim)) throw new ModelFormatError(`hf fixture: dim ${m.dim} is not a multiple of nHeads ${m.nHeads}`);
  if (o.steerTo !== undefined && m.tiedOutput) throw new ModelFormatError("hf fixture: steerTo needs an untied head");
  mkdirSync(dir, { recursive: true });

  const size = DTYPE_SIZES[dtype];
  const all = loopserveTensorShapes(m).map(([target, shape]) => {
    const count = shape.reduce((a, b) => a * b, 1);
    return { target, name: arch === "ouro" ? ouroName(target) : target, shape, count, bytes: count * size };
  });
  // Ouro's state_dict puts the gate before lm_head (model.* first).
  if (arch === "ouro") all.sort((a, b) => Number(a.name === "lm_head.weight") - Number(b.name === "lm_head.weight"));

  const nShards = Math.max(1, Math.min(o.shards ?? 1, all.length));
  const groups = splitIntoShards(all, nShards);
  const pad = (k: number) => String(k).padStart(5, "0");
  const fileNames = groups.length === 1 ? ["model.safetensors"] : groups.map((_, k) => `model-${pad(k + 1)}-of-${pad(groups.length)}.safetensors`);

  const total = all.reduce((a, t) => a + t.bytes, 0);
  const CHUNK = 1 << 20;
  const f32 = new Float32Array(CHUNK);
  const bits = new Uint32Array(f32.buffer);
  const out16 = new Uint16Array(CHUNK);
  let done = 0;
  let bytes = 0;
  const weightMap: Record<string, string> = {};
  groups.forEach((group, k) => {
    const specs: TensorSpec[] = group.map((t) => ({ name: t.name, dtype, shape: t.shape }));
    bytes += writeSafetensorsStream(join(dir, fileNames[k]), { format: "pt" }, specs, (_s, i, write) => {
      const t = group[i];
      weightMap[t.name] = fileNames[k];
      const [mean, std] = distribution(t.target);
      const state = streamState(o.seed, t.target);
      for (let off = 0; off < t.count; off += CHUNK) {
        const n = Math.min(CHUNK, t.count - off);
        const chunk = f32.subarray(0, n);
        fillNormal(chunk, mean, std, state);
        if (o.steerTo !== undefined) steer(chunk, off, m.dim, t.target, o.steerTo);
        if (dtype === "F32") {
          write(new Uint8Array(f32.buffer, 0, n * 4));
        } else {
          if (dtype === "BF16") for (let j = 0; j < n; j++) out16[j] = f32ToBf16Bits(bits[j]);
          else for (let j = 0; j < n; j++) out16[j] = f32BitsToF16Bits(bits[j]);
          write(new Uint8Array(out16.buffer, 0, n * 2));
        }
        done += n * size;
        o.onProgress?.(done, total);
      }
    });
  });

  const json = (name: string, v: unknown) => writeFileSync(join(dir, name), `${JSON.stringify(v, null, 2)}\n`);
  if (groups.length > 1) {
    const sorted = Object.fromEntries(Object.entries(weightMap).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
    json("model.safetensors.index.json", { metadata: { total_size: total }, weight_map: sorted });
  }
  json("config.json", arch === "ouro" ? ouroConfig(m, dtype, o.earlyExitStep) : loopserveConfig(m));
  json("generation_config.json", generationConfig());
  writeFileSync(join(dir, "tokenizer.json"), fixtureTokenizerJson(o.thinking));
  json("tokenizer_config.json", fixtureTokenizerConfig(o.thinking));
  return {
    dir,
    files: fileNames.map((f) => join(dir, f)),
    bytes,
    parameters: all.reduce((a, t) => a + t.count, 0),
  };
}
