// Random-weight checkpoints in the exact Hugging Face layouts import-hf reads
// (Ouro's; Huginn-0125's and Nanbeige4.2's, as their published config.json,
// tensor names, fused matrices, dtypes, shards and tokenizer files are laid
// out; loopserve's own, model_type "loopserve"), for import-hf's tests and
// its benchmarks: config.json, generation_config.json (Ouro's), weights as
// one model.safetensors or as shards with model.safetensors.index.json,
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
import { type HfArch, type HfDtype, type HfFamily, type HfModelShape, loopserveTensorShapes, ouroName } from "../../src/model/hf_checkpoint.ts";
import { HUGINN } from "../../src/model/hf_huginn.ts";
import { NANBEIGE } from "../../src/model/hf_nanbeige.ts";
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
  nLayers: number; // the looped core's layers
  totalUtSteps: number; // steps: Ouro's total_ut_steps, Huginn's mean_recurrence, Nanbeige's num_loops
  seed: number;
  /** Huginn: the prelude's and coda's layers (default 2 each, as Huginn-0125's). */
  nPrelude?: number;
  nCoda?: number;
  /** Huginn: a checkpoint made by retrofitting recurrence into a pretrained Llama (pre-norm blocks, Llama's RoPE, no qk_bias, untied, embed_scale 1). */
  retrofit?: boolean;
  /** Nanbeige: the per-head width when not dim / nHeads (Nanbeige4.2-3B's 128 against 3072 / 48). */
  headDim?: number;
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
 * A small valid byte-level BPE tokenizer.json: the special tokens (by
 * default Ouro's three at ids 0..2; those numbered from 0 before the byte
 * tokens, the rest at the ids given), the 256 byte tokens (GPT-2's
 * byte-to-unicode strings, after the leading specials), then one token per
 * merge, then (`thinking`) <think> and </think>. Loads in Hugging Face
 * `tokenizers`.
 */
export function fixtureTokenizerJson(thinking = false, specials: readonly { content: string; id: number }[] = FIXTURE_SPECIAL_TOKENS.map((content, id) => ({ content, id }))): string {
  const vocab: Record<string, number> = {};
  const leading = specials.filter((t) => t.id < specials.length && specials.slice(0, t.id + 1).every((u, i) => u.id === i));
  leading.forEach((t) => (vocab[t.content] = t.id));
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
      added_tokens: [...specials.map(({ content, id }) => ({ id, content, special: true })), ...think].map((t) => ({
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

/** The characters of the SentencePiece-style fixture's vocabulary (others fall back to their bytes): "▁", letters, digits, some punctuation, four CJK characters. */
const SP_CHARS = ["▁", ..."abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-你好世界"];
/** Its merges, in rank order (each makes the two tokens joined). */
const SP_MERGES = [
  "▁ t", "h e", "▁t he", "i n", "▁ a", "e r", "o n", "▁ s", "r e", "a n", "l l", "e ll", "ell o", "▁ H", "▁H ello", "o r", "w or", "wor l",
  "worl d", "▁ world", "▁ i", "▁ I", "▁I n", "▁ b", "▁b e", "g in", "n in", "nin g", "▁be gin", "▁begin ning", "▁the re", "▁H i", "▁ 你", "你 好", "▁你 好",
  "世 界",
];

/** How a SentencePiece-style tokenizer.json puts "▁" in: a Metaspace pre-tokenizer (its prepend_scheme and split), or the older normalizer (Prepend "▁", Replace " " with "▁"; no pre-tokenizer). */
export type SentencePieceForm = { prepend: "first" | "always"; split: boolean } | "normalizer";

/**
 * A small SentencePiece-style BPE tokenizer.json laid out as Llama's and
 * Nanbeige4.2's: <unk> <s> </s> at 0..2, the 256 byte tokens <0x00>..<0xFF>
 * (byte_fallback), the characters, then one token per merge; the other
 * specials (`specials`, ids past those) as added tokens; the decoder
 * Replace "▁" with " ", ByteFallback, Fuse, Strip one leading space.
 */
export function sentencePieceTokenizerJson(
  form: SentencePieceForm = { prepend: "first", split: true },
  specials: readonly { content: string; id: number }[] = [],
  byteFallback = true,
): string {
  const leading = ["<unk>", "<s>", "</s>"];
  const vocab: Record<string, number> = {};
  const add = (t: string) => (vocab[t] ??= Object.keys(vocab).length);
  leading.forEach(add);
  for (let b = 0; b < 256; b++) add(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
  SP_CHARS.forEach(add);
  for (const m of SP_MERGES) add(m.replace(" ", ""));
  const size = Object.keys(vocab).length;
  if (specials.some((t) => t.id < size)) throw new Error(`sentencePieceTokenizerJson: special ids must be at least ${size} (the vocabulary's size)`);
  const all = [...leading.map((content, id) => ({ content, id })), ...specials];
  const normalizer =
    form === "normalizer"
      ? { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] }
      : null;
  const preTokenizer = form === "normalizer" ? null : { type: "Metaspace", replacement: "▁", prepend_scheme: form.prepend, split: form.split };
  return JSON.stringify(
    {
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: all.map(({ content, id }) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true })),
      normalizer,
      pre_tokenizer: preTokenizer,
      post_processor: null,
      decoder: {
        type: "Sequence",
        decoders: [
          { type: "Replace", pattern: { String: "▁" }, content: " " },
          { type: "ByteFallback" },
          { type: "Fuse" },
          { type: "Strip", content: " ", start: 1, stop: 0 },
        ],
      },
      model: {
        type: "BPE",
        dropout: null,
        unk_token: "<unk>",
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: true,
        byte_fallback: byteFallback,
        ignore_merges: false,
        vocab,
        merges: SP_MERGES,
      },
    },
    null,
    2,
  );
}

/** The ids of token strings in a tokenizer.json: its added tokens', else its vocabulary's. */
export function tokenIdsOf(json: string, tokens: readonly string[]): number[] {
  const j = JSON.parse(json);
  const added = new Map<string, number>(j.added_tokens.map((t: { content: string; id: number }) => [t.content, t.id]));
  return tokens.map((t) => {
    const id = added.get(t) ?? j.model.vocab[t];
    if (id === undefined) throw new Error(`tokenizer.json has no token ${JSON.stringify(t)}`);
    return id;
  });
}

/** The forms the reference ids are recorded for (test/tokenizer/fixtures/make_sentencepiece_reference.mjs). */
export const SENTENCEPIECE_FORMS: readonly SentencePieceForm[] = [
  { prepend: "first", split: true },
  { prepend: "always", split: true },
  { prepend: "first", split: false },
  { prepend: "always", split: false },
  "normalizer",
];
/** ChatML's tokens past the fixture's vocabulary, as the recorded reference has them. */
export const SENTENCEPIECE_SPECIALS = [
  { content: "<|im_start|>", id: 400 },
  { content: "<|im_end|>", id: 401 },
];
/** Texts for the reference: spaces first, in runs and last, newlines, tabs, emoji, CJK in and out of the vocabulary, unknown characters, special tokens in text, a literal "▁". */
export const SENTENCEPIECE_CORPUS = [
  "Hello world", " Hello world", "  Hello   world  ", "Hi there\nIn the beginning", "\n\nline one\r\nline two\t tab", "emoji 😀👍🏽 end",
  "CJK 你好世界 and 你们好", "unknown ✓ ∑ é ü ß", "<s>Hello</s> world<unk>", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
  "", " ", "▁already ▁marked", "ÅÉÎ Ωmega ‽ 𝔘𝔫𝔦", "a  b   c    d", "x<s> y", "Hello</s>", "\u0000\u0001 control\u007f", "the the the there thee",
];

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

// ---- the published families' tokenizer files ----

/** Huginn-0125's 32 special tokens, the last 32 ids of its vocabulary (65504.. in 65536), in order. */
const HUGINN_SPECIALS = [
  "<|begin_text|>", "<|end_text|>", "<|begin_header|>", "<|end_header|>", "<|end_turn|>", "<|pad|>", "<|fim_prefix|>", "<|fim_middle|>",
  "<|fim_suffix|>", "<|fim_pad|>", "<|...|>", "<|del|>", ...Array.from({ length: 10 }, (_, i) => `<|c_${i}|>`), "<|?|>", "<|&|>", "<|!|>",
  "<|-|>", "<|+|>", "<|interrupt|>", "<|>>-|>", "<|-<<|>", "<|->>|>", "<|<<-|>",
];

/** Huginn-0125's chat template (tokenizer_config.json): headers around each role's turn, the assistant's named Huginn. */
export const HUGINN_CHAT_TEMPLATE =
  "{% set loop_messages = messages %}{% for message in loop_messages %}{% set start_content = '<|begin_header|>' %}" +
  "{% set end_content = message['content'] | trim  + '<|end_turn|>' %}{% if loop.index0 == 0 %}{% set start_content = bos_token + start_content %}{% endif %}" +
  "{% if message['role'] == 'Huginn' or message['role'] == 'assistant' %}{% set start_content = start_content + 'Huginn<|end_header|>\n\n' %}" +
  "{{ start_content }}{% generation %}{{ end_content }}{% endgeneration %}{% else %}{% set start_content = start_content + message['role'] + '<|end_header|>\n\n' %}" +
  "{{ start_content }}{{ end_content }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|begin_header|>Huginn<|end_header|>\n\n' }}{% else %}{{ '<|end_text|>' }}{% endif %}";

/** Nanbeige's special tokens: SentencePiece's three first, ChatML's and the tool tokens 44 ids before the vocabulary's end (166100.. in 166144). */
function nanbeigeSpecials(vocab: number): { content: string; id: number }[] {
  const chat = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>"];
  return [..."<unk> <s> </s>".split(" ").map((content, id) => ({ content, id })), ...chat.map((content, k) => ({ content, id: vocab - 44 + k }))];
}

/** Nanbeige's ChatML template, as its tokenizer_config.json carries one. */
export const NANBEIGE_CHAT_TEMPLATE =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/** tokenizer.json and tokenizer_config.json of a family's checkpoint (a retrofitted one keeps its pretrained model's: Llama's SentencePiece-style tokenizer, its three specials, no template; Nanbeige4.2's is SentencePiece-style too). */
function familyTokenizer(arch: "huginn" | "nanbeige", vocab: number, retrofit: boolean): { json: string; config: Record<string, unknown> } {
  if (retrofit) {
    return { json: sentencePieceTokenizerJson({ prepend: "first", split: true }), config: { add_bos_token: true, bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>", tokenizer_class: "LlamaTokenizer" } };
  }
  const specials = arch === "huginn" ? HUGINN_SPECIALS.map((content, k) => ({ content, id: vocab - 32 + k })) : nanbeigeSpecials(vocab);
  const decoder = Object.fromEntries(specials.map(({ content, id }) => [String(id), { content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true }]));
  const config: Record<string, unknown> =
    arch === "huginn"
      ? { added_tokens_decoder: decoder, bos_token: "<|begin_text|>", chat_template: HUGINN_CHAT_TEMPLATE, clean_up_tokenization_spaces: true, eos_token: "<|end_text|>", pad_token: "<|pad|>", tokenizer_class: "PreTrainedTokenizerFast" }
      : { add_bos_token: false, added_tokens_decoder: decoder, bos_token: "<|im_start|>", chat_template: NANBEIGE_CHAT_TEMPLATE, eos_token: "<|im_end|>", pad_token: "<|endoftext|>", unk_token: "<unk>", tokenizer_class: "LlamaTokenizer" };
  const json = arch === "huginn" ? fixtureTokenizerJson(false, specials) : sentencePieceTokenizerJson({ prepend: "first", split: true }, specials.slice(3));
  return { json, config };
}

/** generation_config.json as published beside an Ouro config: <|im_end|> is an end id only here. */
function generationConfig(): Record<string, unknown> {
  return { bos_token_id: 0, eos_token_id: FIXTURE_IDS.imEnd, pad_token_id: 0, transformers_version: "4.55.0" };
}

// ---- config ----

function shapeOf(o: HfFixtureOptions): HfModelShape {
  const nKvHeads = o.nKvHeads ?? o.nHeads;
  const arch = o.arch ?? "ouro";
  const ouro = arch === "ouro" || arch === "loopserve";
  return {
    dim: o.dim,
    nHeads: o.nHeads,
    nKvHeads,
    headDim: o.headDim ?? o.dim / o.nHeads,
    ffnDim: o.ffnDim,
    vocabSize: o.vocabSize,
    nLayers: o.nLayers,
    defaultLoops: o.totalUtSteps,
    maxSeqLen: o.maxPositionEmbeddings ?? 2048,
    ropeTheta: o.ropeTheta ?? 10000,
    normEps: o.rmsNormEps ?? 1e-6,
    sandwich: ouro,
    stepNorm: arch !== "huginn",
    exitGate: ouro,
    exitThreshold: o.earlyExitThreshold ?? null,
    tiedOutput: o.tied ?? (arch === "huginn" && !o.retrofit),
  };
}

/** config.json as Huginn-0125's config class saves it (its derived values included). */
function huginnConfig(m: HfModelShape, o: HfFixtureOptions, dtype: HfDtype): Record<string, unknown> {
  const nPrelude = o.nPrelude ?? 2;
  const nCoda = o.nCoda ?? 2;
  const depth = nPrelude + nCoda + m.nLayers * m.defaultLoops;
  const std = Math.sqrt(2 / (5 * m.dim));
  const config: Record<string, unknown> = {
    activation_checkpoint_impl: "per-iteration",
    architecture_class_name: "RecurrentGPT",
    architectures: ["RavenForCausalLM"],
    auto_map: { AutoConfig: "raven_config_minimal.RavenConfig", AutoModelForCausalLM: "raven_modeling_minimal.RavenForCausalLM" },
    bias: false,
    block_class_name: "SandwichBlock",
    block_size: m.maxSeqLen,
    bos_token_id: m.vocabSize - 32,
    effective_expected_depth: depth,
    eos_token_id: m.vocabSize - 31,
    head_dim: m.headDim,
    init_orthogonal: false,
    init_strategy: "takase",
    init_values: { embed_scale: Math.sqrt(m.dim), embedding: std, out_proj: std / Math.sqrt(2 * depth), std },
    injection_type: "linear",
    intermediate_size: m.ffnDim,
    mean_backprop_depth: 8,
    mean_recurrence: m.defaultLoops,
    mlp_class_name: "GatedMLP",
    model_type: "huginn_raven",
    n_embd: m.dim,
    n_heads: m.nHeads,
    n_layers: nPrelude + m.nLayers + nCoda,
    n_layers_in_coda: nCoda,
    n_layers_in_prelude: nPrelude,
    n_layers_in_recurrent_block: m.nLayers,
    nonlin_name: "SiLU",
    norm_class_name: "RMSNorm_llama",
    norm_eps: m.normEps,
    num_key_value_heads: m.nKvHeads,
    pad_token_id: m.vocabSize - 27,
    padded_vocab_size: m.vocabSize,
    padding_multiple: 4096,
    qk_bias: true,
    rope_base: m.ropeTheta,
    sampling_scheme: "poisson-lognormal-filling",
    state_init: "like-init",
    test_time_noise: 0,
    test_time_noise_type: "fixed",
    tie_embeddings: m.tiedOutput,
    tie_word_embeddings: m.tiedOutput,
    torch_dtype: { BF16: "bfloat16", F16: "float16", F32: "float32" }[dtype],
    transformers_version: "4.47.1",
    vocab_size: m.vocabSize,
  };
  if (!o.retrofit) return config;
  // Huginn-0125's config with the pretrained model's values written over it (the retrofitting code's conversion):
  // its init_values.std stays Huginn's
  return {
    ...config,
    init_values: { ...(config.init_values as object), embed_scale: 1.0 },
    max_position_embeddings: m.maxSeqLen,
    qk_bias: false,
    rope_base: 500000.0,
    rope_theta: m.ropeTheta,
    bos_token_id: 1,
    eos_token_id: 2,
    pad_token_id: null,
  };
}

/** config.json of a Nanbeige4.2 checkpoint (Llama's keys, the loops, head_dim). */
function nanbeigeConfig(m: HfModelShape, dtype: HfDtype): Record<string, unknown> {
  return {
    architectures: ["NanbeigeForCausalLM"],
    attention_bias: false,
    attention_dropout: 0.0,
    bos_token_id: 1,
    eos_token_id: m.vocabSize - 43,
    head_dim: m.headDim,
    hidden_act: "silu",
    hidden_size: m.dim,
    initializer_range: 0.02,
    intermediate_size: m.ffnDim,
    loop_loss_weights: [],
    max_position_embeddings: m.maxSeqLen,
    mlp_bias: false,
    model_type: "nanbeige",
    num_attention_heads: m.nHeads,
    num_hidden_layers: m.nLayers,
    num_key_value_heads: m.nKvHeads,
    num_loops: m.defaultLoops,
    pad_token_id: m.vocabSize - 42,
    pretraining_tp: 1,
    rms_norm_eps: m.normEps,
    rope_scaling: null,
    rope_theta: m.ropeTheta,
    skip_loop_final_norm: !m.stepNorm,
    tie_word_embeddings: m.tiedOutput,
    torch_dtype: { BF16: "bfloat16", F16: "float16", F32: "float32" }[dtype],
    transformers_version: "4.57.0",
    use_cache: true,
    vocab_size: m.vocabSize,
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

/** A weight file's tensor: its name, the loopserve name its values are drawn as, shape and dtype. */
interface SourceTensor {
  name: string;
  target: string;
  shape: number[];
  dtype: HfDtype;
}

const FAMILIES: Record<string, HfFamily> = { huginn: HUGINN, nanbeige: NANBEIGE };

/** A family's weight tensors as its checkpoints hold them: fused ones once, in their own shape, and Huginn's extras. */
function familySources(family: HfFamily, m: HfModelShape, o: HfFixtureOptions, dtype: HfDtype): SourceTensor[] {
  const config = family.arch === "huginn" ? huginnConfig(m, o, dtype) : nanbeigeConfig(m, dtype);
  // the retrofitted blocks have no norm_3 / norm_4
  const layout = family.layout(m, config, (name) => !(o.retrofit && name.endsWith("norm_3.weight")));
  const seen = new Map<string, SourceTensor>();
  for (const t of family.tensors(m, layout))
    if (!seen.has(t.name)) seen.set(t.name, { name: t.name, target: t.target, shape: t.part?.of ?? t.shape, dtype });
  const out = [...seen.values()];
  if (family.arch === "huginn" && !o.retrofit) {
    // as published: a copy of the tied embedding as lm_head, and the RoPE table, a persistent fp32 buffer
    if (m.tiedOutput) out.push({ name: "lm_head.weight", target: "tok_embeddings.weight", shape: [m.vocabSize, m.dim], dtype });
    out.push({ name: "freqs_cis", target: "freqs_cis", shape: [1, m.maxSeqLen, 1, m.headDim / 2, 2], dtype: "F32" });
  }
  return out;
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

  const family = FAMILIES[arch];
  const sources: SourceTensor[] = family
    ? familySources(family, m, o, dtype)
    : loopserveTensorShapes(m).map(([target, shape]) => ({ target, name: arch === "ouro" ? ouroName(target) : target, shape, dtype }));
  const all = sources.map((t) => {
    const count = t.shape.reduce((a, b) => a * b, 1);
    return { ...t, count, bytes: count * DTYPE_SIZES[t.dtype] };
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
    const specs: TensorSpec[] = group.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape }));
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
        if (t.dtype === "F32") {
          write(new Uint8Array(f32.buffer, 0, n * 4));
        } else {
          if (t.dtype === "BF16") for (let j = 0; j < n; j++) out16[j] = f32ToBf16Bits(bits[j]);
          else for (let j = 0; j < n; j++) out16[j] = f32BitsToF16Bits(bits[j]);
          write(new Uint8Array(out16.buffer, 0, n * 2));
        }
        done += n * DTYPE_SIZES[t.dtype];
        o.onProgress?.(done, total);
      }
    });
  });

  const json = (name: string, v: unknown) => writeFileSync(join(dir, name), `${JSON.stringify(v, null, 2)}\n`);
  if (groups.length > 1) {
    const sorted = Object.fromEntries(Object.entries(weightMap).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
    json("model.safetensors.index.json", { metadata: { total_size: total }, weight_map: sorted });
  }
  const config = arch === "huginn" ? huginnConfig(m, o, dtype) : arch === "nanbeige" ? nanbeigeConfig(m, dtype) : arch === "ouro" ? ouroConfig(m, dtype, o.earlyExitStep) : loopserveConfig(m);
  json("config.json", config);
  if (!family) json("generation_config.json", generationConfig());
  const tokenizer = family ? familyTokenizer(family.arch as "huginn" | "nanbeige", m.vocabSize, o.retrofit ?? false) : { json: fixtureTokenizerJson(o.thinking), config: fixtureTokenizerConfig(o.thinking) };
  writeFileSync(join(dir, "tokenizer.json"), tokenizer.json);
  json("tokenizer_config.json", tokenizer.config);
  return {
    dir,
    files: fileNames.map((f) => join(dir, f)),
    bytes,
    parameters: all.reduce((a, t) => a + t.count, 0),
  };
}
