// A Hugging Face checkpoint directory, read as published: config.json,
// generation_config.json, the weights (model.safetensors, or shards listed by
// model.safetensors.index.json), tokenizer.json and tokenizer_config.json (or
// chat_template.jinja).
//
// Two architectures are understood (docs/import-hf.md):
// - Ouro (config model_type "ouro", architectures ["OuroForCausalLM"]): a
//   stack of sandwich-norm layers looped total_ut_steps times, named and
//   mapped as docs/import-hf.md's table says.
// - loopserve's own (model_type "loopserve", architectures
//   ["LoopedLlamaForCausalLM"]): config keys are loopserve's metadata keys
//   and tensor names are loopserve's already.
//
// Reading checks everything that can be checked without reading the weights:
// the config against loopserve's limits, every tensor's name, shape and dtype
// against the config, every shard named by the index present and holding
// what the index says, every end id a token of the vocabulary, the chat
// template parsed and run on a conversation. Weight bytes are not touched
// here: each tensor is located (file, offset) so the importer can stream it.
// torch/loopserve_torch/hf.py reads configs alike; one table of cases holds
// the two to the same defaults and refusals (torch/tests/hf_config_cases.json).

import { existsSync } from "node:fs";
import { basename, join } from "node:path";
import { LS_MAX_NORM_EPS, LS_MAX_ROPE_THETA } from "../abi/abi.generated.ts";
import { CheckpointDir, FILE_CAPS } from "./checkpoint_files.ts";
import { type AttentionFieldNames, attentionHeadDim, exitThresholdRefusal, SETTING_RANGES } from "./format.ts";
import { DTYPE_SIZES, ModelFormatError, readSafetensors } from "./safetensors.ts";
import { ChatTemplate, ChatTemplateError } from "../text/jinja_template.ts";
import { HfBpe, HfTokenizerError } from "../tokenizer/hf_bpe.ts";
import type { SpecialTokens } from "../tokenizer/tokenizer.ts";

// ---- types ----

/** Ouro, loopserve's own, and the families of HfFamily readers (hf_families.ts). */
export type HfArch = "ouro" | "loopserve" | "huginn" | "nanbeige";

/** Source dtypes the importer converts to fp16. */
export const HF_DTYPES = ["BF16", "F16", "F32"] as const;
export type HfDtype = (typeof HF_DTYPES)[number];


/** The model a checkpoint describes, in loopserve's terms. */
export interface HfModelShape {
  dim: number; // hidden_size
  nHeads: number;
  nKvHeads: number;
  headDim: number; // dim / nHeads unless the family's config sets it (checkAttention)
  ffnDim: number; // intermediate_size
  vocabSize: number;
  nLayers: number; // distinct layers per step
  defaultLoops: number; // steps through the stack (Ouro total_ut_steps, or early_exit_step + 1)
  maxSeqLen: number;
  ropeTheta: number;
  normEps: number;
  sandwich: boolean; // attn_out_norm / ffn_out_norm after each sublayer
  stepNorm: boolean; // `norm` after every step
  exitGate: boolean; // exit_gate.weight [1, dim] and exit_gate.bias [1]
  exitThreshold: number | null; // default early-exit threshold, in (0, 1); null: fixed depth
  tiedOutput: boolean; // no output.weight: logits use tok_embeddings
}

/** One tensor of the checkpoint, where the importer finds it. */
export interface HfTensor {
  name: string; // the checkpoint's name
  target: string; // loopserve's name
  dtype: HfDtype;
  shape: number[];
  file: string; // the shard's path
  offset: number; // of the first byte in that file
  bytes: number;
}

export interface HfTokenizer {
  /** tokenizer.json, verbatim. */
  json: string;
  /** tokenizer.json parsed (for token ids). */
  parsed: Record<string, unknown>;
  /** tokenizer_config.json, or {} when the directory has none. */
  config: Record<string, unknown>;
  /** tokenizer_config.json's chat_template (a string, or the list's "default"), else chat_template.jinja's text, else null. */
  chatTemplate: string | null;
  /** tokenizer_config.json's special tokens as text, by name: what the chat template reads. */
  specialTokens: SpecialTokens;
  /** The ids tokenizer.json's post-processor puts before every text (Llama's <s>). */
  prefixIds: readonly number[];
}

export interface HfCheckpoint {
  dir: string;
  arch: HfArch;
  /** config.json, parsed. */
  config: Record<string, unknown>;
  model: HfModelShape;
  /** A family's own metadata keys (the recurrent-depth layout, docs/model-format.md), over those of `model`. */
  layout: Record<string, string>;
  /** In loopserve's order (tok_embeddings, the layers, norm, output, exit gate). */
  tensors: HfTensor[];
  /** The weight files, in the order the index (or the directory) gives them. */
  shards: string[];
  /** null only for a loopserve checkpoint without tokenizer.json (it uses the GPT-2 tokenizer). */
  tokenizer: HfTokenizer | null;
  /**
   * The ids that end generation: config.json's eos_token_id (a number or a
   * list), generation_config.json's, then the id of tokenizer_config.json's
   * eos_token; each once.
   */
  eosIds: number[];
}

// ---- small readers ----

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The JSON object in the checkpoint's file `what`, read under `cap` bytes (src/model/checkpoint_files.ts); null when there is no such file. */
function readJsonObject(files: CheckpointDir, what: string, cap: number): { text: string; value: Record<string, unknown> } | null {
  const path = join(files.dir, what);
  const text = files.readText(what, cap);
  if (text === null) return null;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw ModelFormatError.about(path, `${what} is not valid JSON: ${(e as Error).message}`);
  }
  if (!isObject(value)) throw ModelFormatError.about(path, `${what} must be a JSON object`);
  return { text, value };
}

/** A config value for a message: JSON, except numbers JSON cannot write (1e400 parses to Infinity). */
function shown(v: unknown): string {
  return typeof v === "number" && !Number.isFinite(v) ? `${v} (beyond a double's range)` : JSON.stringify(v);
}

/** Reads typed config values, each failure naming config.json and the key. */
export class ConfigReader {
  constructor(
    private readonly path: string,
    private readonly c: Record<string, unknown>,
  ) {}

  fail(reason: string): never {
    throw ModelFormatError.about(this.path, reason);
  }

  has(key: string): boolean {
    return this.c[key] !== undefined && this.c[key] !== null;
  }

  int(key: string, min: number, max: number, dflt?: number): number {
    const v = this.c[key] ?? dflt;
    if (v === undefined) this.fail(`${key} is required`);
    if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
      this.fail(`${key} must be an integer in [${min}, ${max}], got ${shown(v)}`);
    }
    return v as number;
  }

  /** A positive number below `max`, also once rounded to fp32: what a model file's metadata may hold (src/model/format.ts). */
  positive(key: string, max: number, dflt: number): number {
    const v = this.c[key] ?? dflt;
    const f = typeof v === "number" ? Math.fround(v) : Number.NaN;
    if (typeof v !== "number" || !(f > 0 && v < max && f < max)) this.fail(`${key} must be a positive number below ${max}, got ${shown(v)}`);
    return v as number;
  }

  /**
   * The model's default exit threshold at `key`: null when absent, and when 1
   * (the gate's cumulative probability reaches 1 only at the last step: every
   * step, the fixed depth). The gate is judged with the tensors.
   */
  exitThreshold(key: string): number | null {
    if (!this.has(key)) return null;
    const v = this.c[key];
    const refused = typeof v === "number" ? exitThresholdRefusal(v, true) : `must be a number, got ${JSON.stringify(v)}`;
    if (refused) this.fail(`${key} ${refused}`);
    return v === 1 ? null : (v as number);
  }

  bool(key: string, dflt: boolean): boolean {
    const v = this.c[key] ?? dflt;
    if (typeof v !== "boolean") this.fail(`${key} must be true or false, got ${JSON.stringify(v)}`);
    return v as boolean;
  }
}

// ---- architecture ----

const OURO_ARCH = "OuroForCausalLM";
const LOOPSERVE_ARCH = "LoopedLlamaForCausalLM";

/**
 * A published family read by its own module (hf_families.ts lists them): its
 * config keys, its tensor names and how they map onto loopserve's, and the
 * metadata of its layout. The reading around it is this module's.
 */
export interface HfFamily {
  arch: HfArch;
  /** How messages name it: e.g. `Huginn (model_type "huginn_raven", RavenForCausalLM)`. */
  title: string;
  matches(config: Record<string, unknown>, archs: readonly unknown[]): boolean;
  /** The model its config.json describes (tiedOutput as the config says). */
  shape(r: ConfigReader, config: Record<string, unknown>): HfModelShape;
  /** The layout its checkpoint's tensors show, as loopserve metadata keys (docs/model-format.md). */
  layout(m: HfModelShape, config: Record<string, unknown>, has: (name: string) => boolean): Record<string, string>;
  /** Its tensors for a model of this shape and layout, in loopserve's order. */
  tensors(m: HfModelShape, layout: Record<string, string>): ExpectedTensor[];
  /** The name of its output head (absent when tied). */
  head: string;
  /** Tensors a checkpoint may carry that the model does not need (buffers, a tied head's copy). */
  ignorable(name: string, m: HfModelShape): boolean;
  /** Tokens its published generation code stops at beside eos_token, by text (those the tokenizer has). */
  stopTokens?: readonly string[];
}

function detectArch(path: string, c: Record<string, unknown>, families: readonly HfFamily[]): HfArch {
  const archs = Array.isArray(c.architectures) ? c.architectures : [];
  const modelType = c.model_type;
  if (modelType === "ouro" || archs.includes(OURO_ARCH)) return "ouro";
  if (modelType === "loopserve" || archs.includes(LOOPSERVE_ARCH)) return "loopserve";
  const family = families.find((f) => f.matches(c, archs));
  if (family) return family.arch;
  const named = [
    modelType !== undefined ? `model_type ${JSON.stringify(modelType)}` : "no model_type",
    archs.length > 0 ? `architectures ${JSON.stringify(archs)}` : "no architectures",
  ].join(", ");
  const readers = [`Ouro (model_type "ouro", ${OURO_ARCH})`, ...families.map((f) => f.title), `loopserve (model_type "loopserve", ${LOOPSERVE_ARCH})`];
  throw ModelFormatError.about(path, `unknown architecture (${named}): import-hf reads ${readers.slice(0, -1).join(", ")} and ${readers.at(-1)} checkpoints`);
}

/**
 * The attention's shape in a config's own names (format.ts's one check of
 * it); `stated` is head_dim where the family's config sets it apart from
 * dim / n_heads. Returns head_dim.
 */
export function checkAttention(r: ConfigReader, m: Pick<HfModelShape, "dim" | "nHeads" | "nKvHeads">, names: AttentionFieldNames, stated?: number): number {
  const headDim = attentionHeadDim(m.dim, m.nHeads, m.nKvHeads, stated, names);
  if (typeof headDim === "string") r.fail(headDim);
  return headDim;
}

/**
 * Ouro's exit settings as the published OuroForCausalLM reads them:
 * early_exit_step k (0-based) takes the head's input from step k for every
 * token, before any threshold. A token's step j attends only to earlier
 * tokens' step-j keys and values, so stopping every token after step k is
 * that computation exactly: a fixed depth of k + 1 steps, with no default
 * threshold (docs/import-hf.md#exits). The published code ignores a step
 * outside [0, total_ut_steps); here that is refused, naming the key.
 */
/**
 * A Llama-like config's widths: the residual and query heads under the
 * family's keys, num_key_value_heads (the query heads when absent), each
 * head dim / heads wide, intermediate_size.
 */
export function llamaWidths(r: ConfigReader, dimKey: string, headsKey: string): Pick<HfModelShape, "dim" | "nHeads" | "nKvHeads" | "headDim" | "ffnDim"> {
  const dim = r.int(dimKey, ...SETTING_RANGES.dim);
  const nHeads = r.int(headsKey, ...SETTING_RANGES.nHeads);
  return {
    dim,
    nHeads,
    nKvHeads: r.int("num_key_value_heads", ...SETTING_RANGES.nKvHeads, nHeads),
    headDim: dim / nHeads,
    ffnDim: r.int("intermediate_size", ...SETTING_RANGES.ffnDim),
  };
}

function ouroExit(r: ConfigReader, c: Record<string, unknown>, steps: number): Pick<HfModelShape, "defaultLoops" | "exitThreshold"> {
  const threshold = r.exitThreshold("early_exit_threshold");
  if (!r.has("early_exit_step")) return { defaultLoops: steps, exitThreshold: threshold };
  const k = c.early_exit_step;
  if (typeof k !== "number" || !Number.isInteger(k) || k < 0 || k >= steps)
    r.fail(`early_exit_step must be an integer in [0, ${steps}) (a 0-based step of total_ut_steps ${steps}), got ${shown(k)}`);
  return { defaultLoops: (k as number) + 1, exitThreshold: null };
}

/** Ouro's config.json, with OuroConfig's defaults for the keys it may leave out. */
function ouroShape(r: ConfigReader, c: Record<string, unknown>): HfModelShape {
  const m: HfModelShape = {
    ...llamaWidths(r, "hidden_size", "num_attention_heads"),
    vocabSize: r.int("vocab_size", ...SETTING_RANGES.vocabSize),
    nLayers: r.int("num_hidden_layers", ...SETTING_RANGES.nLayers),
    ...ouroExit(r, c, r.int("total_ut_steps", ...SETTING_RANGES.loops, 4)),
    maxSeqLen: r.int("max_position_embeddings", ...SETTING_RANGES.maxSeqLen, 32768),
    ropeTheta: r.positive("rope_theta", LS_MAX_ROPE_THETA, 10000),
    normEps: r.positive("rms_norm_eps", LS_MAX_NORM_EPS, 1e-6),
    sandwich: true,
    stepNorm: true,
    exitGate: true,
    tiedOutput: r.bool("tie_word_embeddings", false),
  };
  checkAttention(r, m, { dim: "hidden_size", nHeads: "num_attention_heads", nKvHeads: "num_key_value_heads", headDim: "head_dim" });
  if (r.has("head_dim") && c.head_dim !== m.headDim) {
    r.fail(`head_dim (${JSON.stringify(c.head_dim)}) must equal hidden_size / num_attention_heads = ${m.headDim}`);
  }
  // What loopserve's kernels do not compute: refuse rather than serve another function.
  if (r.has("hidden_act") && c.hidden_act !== "silu") r.fail(`hidden_act must be "silu", got ${JSON.stringify(c.hidden_act)}`);
  if (c.attention_bias === true) r.fail("attention_bias must be false (loopserve's projections have no bias)");
  if (r.has("partial_rotary_factor") && c.partial_rotary_factor !== 1) {
    r.fail(`partial_rotary_factor must be 1, got ${JSON.stringify(c.partial_rotary_factor)}`);
  }
  const scaling = c.rope_scaling;
  if (scaling !== undefined && scaling !== null) {
    const type = isObject(scaling) ? (scaling.rope_type ?? scaling.type) : undefined;
    if (type !== "default") r.fail(`rope_scaling ${JSON.stringify(scaling)} is not supported (plain RoPE only)`);
  }
  const sliding = Array.isArray(c.layer_types) && c.layer_types.some((t) => t !== "full_attention");
  if (c.use_sliding_window === true || sliding) r.fail("sliding-window attention is not supported (use_sliding_window / layer_types)");
  return m;
}

/** loopserve's own config.json: its metadata keys as JSON values (docs/import-hf.md). */
function loopserveShape(r: ConfigReader, c: Record<string, unknown>): HfModelShape {
  const dim = r.int("dim", ...SETTING_RANGES.dim);
  const nHeads = r.int("n_heads", ...SETTING_RANGES.nHeads);
  const layout = c.norm_layout ?? "pre";
  if (layout !== "pre" && layout !== "sandwich") r.fail(`norm_layout must be "pre" or "sandwich", got ${JSON.stringify(layout)}`);
  const m: HfModelShape = {
    dim,
    nHeads,
    nKvHeads: r.int("n_kv_heads", ...SETTING_RANGES.nKvHeads, nHeads),
    headDim: dim / nHeads,
    ffnDim: r.int("ffn_dim", ...SETTING_RANGES.ffnDim),
    vocabSize: r.int("vocab_size", ...SETTING_RANGES.vocabSize),
    nLayers: r.int("n_layers", ...SETTING_RANGES.nLayers, 1),
    defaultLoops: r.int("default_loops", ...SETTING_RANGES.loops),
    maxSeqLen: r.int("max_seq_len", ...SETTING_RANGES.maxSeqLen, 2048),
    ropeTheta: r.positive("rope_theta", LS_MAX_ROPE_THETA, 10000),
    normEps: r.positive("norm_eps", LS_MAX_NORM_EPS, 1e-5),
    sandwich: layout === "sandwich",
    stepNorm: r.bool("step_norm", false),
    exitGate: false, // decided by the tensors (both or neither)
    exitThreshold: r.exitThreshold("exit_threshold"),
    tiedOutput: false, // decided by the tensors
  };
  checkAttention(r, m, { dim: "dim", nHeads: "n_heads", nKvHeads: "n_kv_heads", headDim: "head_dim" });
  return m;
}

// ---- tensor names ----

/**
 * A tensor the model needs: its name in the checkpoint, in loopserve, and its
 * shape; `part`: the target is the elements from `first` of the checkpoint's
 * tensor, whose shape is `of` (a fused matrix's rows, one of two biases).
 */
export interface ExpectedTensor {
  name: string;
  target: string;
  shape: number[];
  part?: { of: number[]; first: number };
}

/** loopserve's tensors for a model, in file order: [target name, shape]. */
export function loopserveTensorShapes(m: HfModelShape): [string, number[]][] {
  const q = m.nHeads * m.headDim;
  const kv = m.nKvHeads * m.headDim;
  const out: [string, number[]][] = [["tok_embeddings.weight", [m.vocabSize, m.dim]]];
  for (let i = 0; i < m.nLayers; i++) {
    const p = m.nLayers === 1 ? "block." : `layers.${i}.`;
    out.push(
      [`${p}attn_norm.weight`, [m.dim]],
      [`${p}wq.weight`, [q, m.dim]],
      [`${p}wk.weight`, [kv, m.dim]],
      [`${p}wv.weight`, [kv, m.dim]],
      [`${p}wo.weight`, [m.dim, q]],
    );
    if (m.sandwich) out.push([`${p}attn_out_norm.weight`, [m.dim]]);
    out.push(
      [`${p}ffn_norm.weight`, [m.dim]],
      [`${p}w1.weight`, [m.ffnDim, m.dim]],
      [`${p}w2.weight`, [m.dim, m.ffnDim]],
      [`${p}w3.weight`, [m.ffnDim, m.dim]],
    );
    if (m.sandwich) out.push([`${p}ffn_out_norm.weight`, [m.dim]]);
  }
  out.push(["norm.weight", [m.dim]]);
  if (!m.tiedOutput) out.push(["output.weight", [m.vocabSize, m.dim]]);
  if (m.exitGate) out.push(["exit_gate.weight", [1, m.dim]], ["exit_gate.bias", [1]]);
  return out;
}

/** Ouro's name of each loopserve tensor (docs/import-hf.md), layer by layer. */
const OURO_LAYER_NAMES: Record<string, string> = {
  "attn_norm.weight": "input_layernorm.weight",
  "wq.weight": "self_attn.q_proj.weight",
  "wk.weight": "self_attn.k_proj.weight",
  "wv.weight": "self_attn.v_proj.weight",
  "wo.weight": "self_attn.o_proj.weight",
  "attn_out_norm.weight": "input_layernorm_2.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "w1.weight": "mlp.gate_proj.weight",
  "w2.weight": "mlp.down_proj.weight",
  "w3.weight": "mlp.up_proj.weight",
  "ffn_out_norm.weight": "post_attention_layernorm_2.weight",
};
const OURO_GLOBAL_NAMES: Record<string, string> = {
  "tok_embeddings.weight": "model.embed_tokens.weight",
  "norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
  "exit_gate.weight": "model.early_exit_gate.weight",
  "exit_gate.bias": "model.early_exit_gate.bias",
};

/** The Hugging Face Ouro name of loopserve tensor `target`. */
export function ouroName(target: string): string {
  const global = OURO_GLOBAL_NAMES[target];
  if (global !== undefined) return global;
  const m = /^(?:block\.|layers\.(\d+)\.)(.+)$/.exec(target);
  const local = m ? OURO_LAYER_NAMES[m[2]] : undefined;
  if (!m || local === undefined) throw new Error(`no Ouro name for ${target}`);
  return `model.layers.${m[1] ?? "0"}.${local}`;
}

function expectedTensors(arch: HfArch, m: HfModelShape): ExpectedTensor[] {
  return loopserveTensorShapes(m).map(([target, shape]) => ({ name: arch === "ouro" ? ouroName(target) : target, target, shape }));
}

// ---- weight files ----

interface Located {
  dtype: string;
  shape: number[];
  file: string;
  offset: number;
  bytes: number;
}

const INDEX_FILE = "model.safetensors.index.json";
const SINGLE_FILE = "model.safetensors";

/** Every tensor of the weight files by name, and the files, in order. */
function locateTensors(files: CheckpointDir): { located: Map<string, Located>; shards: string[] } {
  const dir = files.dir;
  const located = new Map<string, Located>();
  const addFile = (path: string, expect: Set<string> | null, indexPath: string) => {
    const f = readSafetensors(path);
    for (const [name, t] of f.tensors) {
      if (expect !== null && !expect.has(name)) {
        throw ModelFormatError.about(path, `holds tensor "${name}", which ${INDEX_FILE} does not map to this file`);
      }
      if (located.has(name)) throw ModelFormatError.about(path, `tensor "${name}" is also in ${basename(located.get(name)!.file)}`);
      located.set(name, { dtype: t.dtype, shape: t.shape, file: path, offset: t.offset, bytes: t.data.byteLength });
    }
    if (expect !== null) {
      for (const name of expect) {
        if (!f.tensors.has(name)) throw ModelFormatError.about(path, `lacks tensor "${name}", which ${indexPath} maps to it`);
      }
    }
  };

  const indexPath = join(dir, INDEX_FILE);
  const index = readJsonObject(files, INDEX_FILE, FILE_CAPS.index);
  if (index !== null) {
    const { value } = index;
    const map = value.weight_map;
    if (!isObject(map)) throw ModelFormatError.about(indexPath, "weight_map must be an object of tensor name -> file name");
    const byFile = new Map<string, Set<string>>();
    for (const [name, file] of Object.entries(map)) {
      // A file name, never a path: the index must not reach outside the directory.
      if (typeof file !== "string" || file === "" || file.includes("/") || file.includes("\\") || file === "." || file === "..") {
        throw ModelFormatError.about(indexPath, `weight_map["${name}"] must be a file name in the checkpoint directory, got ${JSON.stringify(file)}`);
      }
      if (!byFile.has(file)) byFile.set(file, new Set());
      byFile.get(file)!.add(name);
    }
    if (byFile.size === 0) throw ModelFormatError.about(indexPath, "weight_map is empty");
    const shards = [...byFile.keys()];
    for (const file of shards) {
      if (files.locate(file) === null) {
        const first = byFile.get(file)!.values().next().value;
        throw ModelFormatError.about(dir, `shard ${file} is missing (${INDEX_FILE} maps ${byFile.get(file)!.size} tensors to it, "${first}" first)`);
      }
    }
    for (const file of shards) addFile(join(dir, file), byFile.get(file)!, INDEX_FILE);
    return { located, shards: shards.map((f) => join(dir, f)) };
  }
  const single = join(dir, SINGLE_FILE);
  if (files.locate(SINGLE_FILE) !== null) {
    addFile(single, null, "");
    return { located, shards: [single] };
  }
  const hint = existsSync(join(dir, "pytorch_model.bin")) || existsSync(join(dir, "pytorch_model.bin.index.json"))
    ? " (pytorch_model.bin is not read: convert the checkpoint to safetensors)"
    : "";
  throw ModelFormatError.about(dir, `no ${SINGLE_FILE} and no ${INDEX_FILE}${hint}`);
}

function isHfDtype(s: string): s is HfDtype {
  return (HF_DTYPES as readonly string[]).includes(s);
}

/** The located tensors checked against the expected set: names, shapes, dtypes; none extra. */
function matchTensors(dir: string, arch: HfArch, m: HfModelShape, located: Map<string, Located>, family?: HfFamily, layout: Record<string, string> = {}): HfTensor[] {
  const expected = family ? family.tensors(m, layout) : expectedTensors(arch, m);
  const out: HfTensor[] = [];
  const used = new Set<string>();
  for (const e of expected) {
    const t = located.get(e.name);
    const whole = e.part?.of ?? e.shape;
    if (t === undefined) throw ModelFormatError.about(dir, `tensor "${e.name}" is missing (expected shape [${whole.join(", ")}])`);
    used.add(e.name);
    if (t.shape.length !== whole.length || t.shape.some((d, i) => d !== whole[i])) {
      throw ModelFormatError.about(
        t.file,
        `tensor "${e.name}" has shape [${t.shape.join(", ")}], the config says [${whole.join(", ")}]`,
      );
    }
    if (!isHfDtype(t.dtype)) {
      throw ModelFormatError.about(t.file, `tensor "${e.name}" has dtype ${t.dtype}: import-hf converts ${HF_DTYPES.join(", ")}`);
    }
    const size = DTYPE_SIZES[t.dtype];
    const count = e.shape.reduce((a, b) => a * b, 1);
    const at = e.part ? { offset: t.offset + e.part.first * size, bytes: count * size } : { offset: t.offset, bytes: t.bytes };
    out.push({ name: e.name, target: e.target, dtype: t.dtype, shape: e.shape, file: t.file, ...at });
  }
  // A tied model may still carry the head (a copy of the embedding): not needed, not an error.
  // Nor are RoPE frequency buffers, which some exporters save: loopserve computes them from rope_theta.
  const ignorable = new Set(m.tiedOutput ? [family ? family.head : arch === "ouro" ? "lm_head.weight" : "output.weight"] : []);
  for (const [name, t] of located) {
    if (!used.has(name) && !ignorable.has(name) && !name.endsWith("rotary_emb.inv_freq") && !family?.ignorable(name, m)) {
      throw ModelFormatError.about(t.file, `unexpected tensor "${name}" [${t.shape.join(", ")}] (not part of a ${arch} model with this config)`);
    }
  }
  return out;
}

// ---- tokenizer ----

/** The special tokens tokenizer_config.json names with one text each (transformers' SPECIAL_TOKENS_ATTRIBUTES). */
const SPECIAL_TOKEN_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];
const ADDITIONAL_TOKENS = "additional_special_tokens";

/** A special token's text: a string, or an AddedToken object's content; undefined when it is neither. */
function tokenText(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (isObject(v) && typeof v.content === "string") return v.content;
  return undefined;
}

/** tokenizer_config.json's special tokens as text, by name; a value that is no token text is refused naming its key. */
function readSpecialTokens(path: string, config: Record<string, unknown>): SpecialTokens {
  const out: SpecialTokens = {};
  const bad = (key: string, v: unknown): never => {
    throw ModelFormatError.about(path, `${key} must be a token's text or an object with its "content", got ${JSON.stringify(v)}`);
  };
  for (const key of SPECIAL_TOKEN_KEYS) {
    const v = config[key];
    if (v !== undefined && v !== null) out[key] = tokenText(v) ?? bad(key, v);
  }
  const more = config[ADDITIONAL_TOKENS];
  if (Array.isArray(more)) out[ADDITIONAL_TOKENS] = more.map((v, i) => tokenText(v) ?? bad(`${ADDITIONAL_TOKENS}[${i}]`, v));
  else if (more !== undefined && more !== null) bad(ADDITIONAL_TOKENS, more);
  return out;
}

/** The conversation a template must render at import: one user message, then the opening of the reply. */
const TEMPLATE_CHECK = [{ role: "user", content: "Hello" }];

/**
 * The model's chat template: tokenizer_config.json's chat_template (a
 * string, or the entry named "default" of a list of {name, template}, as
 * transformers picks it), else chat_template.jinja. It must parse and render
 * a conversation; a failure is refused naming the file and the field.
 */
function readChatTemplate(files: CheckpointDir, config: Record<string, unknown>, specialTokens: SpecialTokens): string | null {
  const configPath = join(files.dir, "tokenizer_config.json");
  let source: string | null = null;
  let file = configPath;
  let field = "chat_template ";
  const v = config.chat_template;
  if (typeof v === "string") source = v;
  else if (Array.isArray(v)) {
    const at = v.findIndex((t) => isObject(t) && t.name === "default");
    const entry = v[at];
    if (!isObject(entry) || typeof entry.template !== "string")
      throw ModelFormatError.about(configPath, 'chat_template is a list without a {"name": "default", "template": "..."} entry');
    source = entry.template;
    field = `chat_template[${at}].template `;
  } else if (v !== undefined && v !== null) {
    throw ModelFormatError.about(configPath, `chat_template must be a string or a list of {"name", "template"} objects, got ${JSON.stringify(v)}`);
  } else {
    source = files.readText("chat_template.jinja", FILE_CAPS.template);
    file = join(files.dir, "chat_template.jinja");
    field = "";
  }
  if (source === null) return null;
  try {
    ChatTemplate.compile(source, specialTokens).render(TEMPLATE_CHECK);
  } catch (e) {
    if (e instanceof ChatTemplateError) throw ModelFormatError.about(file, `${field}${e.message}`);
    throw e;
  }
  return source;
}

function readTokenizer(files: CheckpointDir, required: boolean): HfTokenizer | null {
  const dir = files.dir;
  const path = join(dir, "tokenizer.json");
  const tokenizer = readJsonObject(files, "tokenizer.json", FILE_CAPS.tokenizer);
  if (tokenizer === null) {
    if (required) throw ModelFormatError.about(dir, "tokenizer.json is missing (the model's tokenizer is stored in the imported file)");
    return null;
  }
  const { text, value } = tokenizer;
  if (!isObject(value.model)) throw ModelFormatError.about(path, "tokenizer.json has no model object");
  // What the server would refuse at load is refused here, before a model file is written.
  let prefixIds: readonly number[];
  try {
    prefixIds = new HfBpe(text).prefixIds;
  } catch (e) {
    if (e instanceof HfTokenizerError) throw ModelFormatError.about(path, e.message);
    throw e;
  }
  const config = readJsonObject(files, "tokenizer_config.json", FILE_CAPS.config)?.value ?? {};
  const specialTokens = readSpecialTokens(join(dir, "tokenizer_config.json"), config);
  return { json: text, parsed: value, config, chatTemplate: readChatTemplate(files, config, specialTokens), specialTokens, prefixIds };
}

/** A token's id by its text: tokenizer.json's added_tokens first, then the model's vocabulary. */
export function tokenId(tok: HfTokenizer, content: string): number | null {
  const added = Array.isArray(tok.parsed.added_tokens) ? tok.parsed.added_tokens : [];
  for (const a of added) {
    if (isObject(a) && a.content === content && typeof a.id === "number") return a.id;
  }
  const model = tok.parsed.model as Record<string, unknown>;
  const vocab = model.vocab;
  if (isObject(vocab) && typeof vocab[content] === "number") return vocab[content] as number;
  return null;
}

// ---- end ids ----

/**
 * Every id that ends generation, in order, each once: config.json's
 * eos_token_id (a number or a list), generation_config.json's (what
 * `generate` stops at: a published Ouro checkpoint names <|im_end|> only
 * there), then the id of the tokenizer's eos_token. A value that is no id of
 * the vocabulary is refused naming the file and the key.
 */
function endTokenIds(dir: string, sources: [string, Record<string, unknown>][], tok: HfTokenizer | null, vocabSize: number): number[] {
  const ids: number[] = [];
  const add = (id: unknown, file: string, key: string) => {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id >= vocabSize)
      throw ModelFormatError.about(join(dir, file), `${key} must be a token id in [0, ${vocabSize}), got ${shown(id)}`);
    if (!ids.includes(id)) ids.push(id);
  };
  for (const [file, c] of sources) {
    const e = c.eos_token_id;
    if (Array.isArray(e)) e.forEach((id, i) => add(id, file, `eos_token_id[${i}]`));
    else if (e !== undefined && e !== null) add(e, file, "eos_token_id");
  }
  const text = tok?.specialTokens.eos_token;
  if (tok && typeof text === "string") {
    const id = tokenId(tok, text);
    if (id === null) throw ModelFormatError.about(join(dir, "tokenizer_config.json"), `eos_token ${JSON.stringify(text)} is not a token of tokenizer.json`);
    add(id, "tokenizer_config.json", `the id of eos_token ${JSON.stringify(text)}`);
  }
  return ids;
}

// ---- entry ----

/** Reads and checks a checkpoint directory; weights are located, not read. `families`: the readers of published families beside Ouro's and loopserve's (hf_families.ts). */
export function readHfCheckpoint(dir: string, families: readonly HfFamily[] = []): HfCheckpoint {
  const files = new CheckpointDir(dir);
  const configPath = join(dir, "config.json");
  const configFile = readJsonObject(files, "config.json", FILE_CAPS.config);
  if (configFile === null) throw ModelFormatError.about(dir, "config.json is missing");
  const config = configFile.value;
  const arch = detectArch(configPath, config, families);
  const family = families.find((f) => f.arch === arch);
  const r = new ConfigReader(configPath, config);
  const model = family ? family.shape(r, config) : arch === "ouro" ? ouroShape(r, config) : loopserveShape(r, config);
  const generation = readJsonObject(files, "generation_config.json", FILE_CAPS.config)?.value ?? {};

  const { located, shards } = locateTensors(files);
  let layout: Record<string, string> = {};
  if (family) {
    // Tied when the config says so or the head is absent.
    if (!located.has(family.head)) model.tiedOutput = true;
    layout = family.layout(model, config, (name) => located.has(name));
  } else if (arch === "ouro") {
    // Tied when the config says so or the head is absent (HF then ties it).
    if (!located.has("lm_head.weight")) model.tiedOutput = true;
  } else {
    model.tiedOutput = !located.has("output.weight");
    const w = located.has("exit_gate.weight");
    if (w !== located.has("exit_gate.bias")) {
      throw ModelFormatError.about(dir, `exit_gate.weight and exit_gate.bias come together: the checkpoint has only ${w ? "the weight" : "the bias"}`);
    }
    model.exitGate = w;
  }
  const refused = model.exitThreshold === null ? null : exitThresholdRefusal(model.exitThreshold, model.exitGate);
  if (refused) r.fail(`exit_threshold ${refused}`);
  const tensors = matchTensors(dir, arch, model, located, family, layout);
  for (const t of tensors) {
    const count = t.shape.reduce((a, b) => a * b, 1);
    if (t.bytes !== count * DTYPE_SIZES[t.dtype]) throw ModelFormatError.about(t.file, `tensor "${t.name}": size does not match its shape`);
  }
  const tokenizer = readTokenizer(files, arch !== "loopserve");
  const sources: [string, Record<string, unknown>][] = [
    ["config.json", config],
    ["generation_config.json", generation],
  ];
  const eosIds = endTokenIds(dir, sources, tokenizer, model.vocabSize);
  // what the family's published generate stops at too, where the tokenizer has it
  for (const stop of family?.stopTokens ?? []) {
    const id = tokenizer ? tokenId(tokenizer, stop) : null;
    if (id !== null && !eosIds.includes(id)) eosIds.push(id);
  }
  return { dir, arch, config, model, layout, tensors, shards, tokenizer, eosIds };
}
