// `loopserve model ...`: write synthetic models, inspect model files,
// quantize them (int4 / int2), export a model to GGUF for llama.cpp-based tools,
// import a Hugging Face checkpoint (Ouro, or loopserve's own layout).
//
// Exit codes: 0 done, 1 the work failed (bad file, cannot write), 2 bad
// arguments. src/cli/main.ts dispatches here with the arguments after `model`;
// `bun src/cli/model.ts ...` runs it directly.

import { statSync } from "node:fs";
import { libraryConfig, tokenizerHomeOf } from "../config.ts";
import { checkModelFile, NativeQuantizer } from "../engine/binding.ts";
import type { ModelFileInfo } from "../engine/types.ts";
import { CPU_LIBRARY_NAME, cacheDirCandidates, resolveKernelLibrary } from "../engine/library.ts";
import { type ProgressStream, withProgress } from "../progress.ts";
import { GROUP_SIZES, HEAD_QUANTS, isRecurrent, MAX_LOOPS, type ModelConfig, parseQuantMix, type QuantMix, quantMixNote } from "../model/format.ts";
import { FAMILY_TITLES } from "../model/family.ts";
import { exportGguf } from "../model/gguf.ts";
import { importHfCheckpoint } from "../model/import_hf.ts";
import { DEFAULT_GROUP_SIZE, type HeadQuant, type QuantizeResult, quantizeModelFile, type WeightQuant } from "../model/quantize.ts";
import { DTYPE_SIZES, ModelFormatError, readSafetensors, type SafetensorsFile } from "../model/safetensors.ts";
import { resolveSyntheticOptions, type SyntheticOptions, writeSyntheticModel } from "../model/synthetic.ts";
import { modelChat } from "../text/chat.ts";
import { loadModelTokenizer, ModelTokenizerError } from "../tokenizer/from_metadata.ts";

export interface CommandIO {
  out: (line: string) => void;
  err: (line: string) => void;
  /** Where long commands (quantize, export-gguf) show their progress; none when absent. */
  progress?: ProgressStream;
}

const defaultIO: CommandIO = {
  out: (line) => process.stdout.write(`${line}\n`),
  err: (line) => process.stderr.write(`${line}\n`),
  progress: process.stderr,
};

// ---- help ----

const MAIN_HELP = `usage: loopserve model <command> [options]

commands:
  new OUT        write a deterministic synthetic fp16 model to OUT
  inspect FILE   print a model file's header: metadata, then every tensor
  quantize IN OUT --quant int4|int2
                 write the fp16/bf16/fp32 model IN with int4 or int2 weights
  export-gguf IN OUT
                 write the fp16 model IN unrolled as a Llama GGUF (llama.cpp)
  import-hf DIR OUT
                 write the Hugging Face checkpoint in DIR (Ouro) as the
                 fp16 model OUT

Run \`loopserve model <command> --help\` for a command's options.`;

const NEW_HELP = `usage: loopserve model new OUT [options]

Writes a synthetic fp16 looped-llama model (.safetensors) to OUT, replacing
any file there. The same options and seed give a byte-identical file.

options (default in brackets):
  --dim N              residual width [256]
  --heads N            query heads [8]
  --kv-heads N         key/value heads, divides --heads [= --heads]
  --ffn N              SwiGLU hidden width [768]
  --vocab N            vocabulary size [50257, GPT-2]
  --loops N            default loops, 1..64 [8]
  --seed N             random seed, non-negative integer [1]
  --max-seq-len N      max_seq_len in the metadata [2048]
  --rope-theta X       RoPE base [10000]
  --norm-eps X         rmsnorm epsilon [1e-5]
  --residual-scale X   multiplies Wo and W2; small values make shallow
                       loops agree with deep ones [1]
  --tied               no output.weight: logits use tok_embeddings
  --layers N           a stack of N distinct layers per loop (step) [1]
  --sandwich           each sublayer's output normed before its residual add
  --step-norm          the final norm applied after every step
  --exit-gate          a learned exit gate (exit_gate.weight, exit_gate.bias)
  --exit-threshold X   the model's default exit threshold, in (0, 1] (needs --exit-gate)
  -h, --help           this help`;

const INSPECT_HELP = `usage: loopserve model inspect FILE [--json]

Prints the safetensors header of FILE (metadata, then each tensor's name,
dtype, shape and byte size), then checks the file with the server's own
loader (the kernel library: header, metadata, tensors, and every fp16
weight and quantization scale finite, then the tokenizer), names the
model's family (the published one it was imported from, else its layout)
and lists the ids that end generation and those that also end a chat reply
(the chat template's end of turn). Exit status 1 when the server would
refuse to load it, with the loader's reason.

options:
  --json       print the header as one JSON object
  -h, --help   this help`;

const QUANTIZE_HELP = `usage: loopserve model quantize IN OUT --quant int4|int2|fp16 [options]

Writes IN (a loopserve model with F16, BF16 or F32 tensors) to OUT with the
shared block's seven matrices quantized in groups along their inputs:
  int4  symmetric, codes -8..7 and one fp16 scale per group
  int2  codes 0..3 with one fp16 scale and one fp16 offset per group
  fp16  kept as they are (quantize the output head only)
A model may keep some matrices in the other of int4 and int2 (--mix): by
default int2 keeps wv, wo and w2 at int4, as llama.cpp's Q2_K keeps them at
more bits, which halves int2's quality cost on the trained model.
The output head (vocab x dim, the largest matrix, read once per decoded
token) becomes, per --head, symmetric codes with one fp16 scale per group:
  int8  codes -127..127      int6  codes -32..31 (dim a multiple of 64)
  int4  codes -8..7          fp16  kept (a tied model stays tied)
The norms stay fp16, and so does the embedding, except in a tied model with
a quantized head: there the head's rows, dequantized, are the embedding, and
the file keeps no fp16 copy. The output is smaller than the input. The same
input and options give a byte-identical file, whatever the thread count.
The kernel library quantizes (SERVICE_BUILD_DIR, as the server finds it),
reading the input a chunk at a time; the output appears only once complete.

options (default in brackets):
  --quant int4|int2|fp16   block format (required)
  --group-size N           inputs per scale: 32, 64, 128 or 256 [${DEFAULT_GROUP_SIZE}];
                           dim and ffn_dim must be multiples of it
  --head int8|int6|int4|fp16
                           output head format [int6; int8 when dim is not
                           a multiple of 64]
  --head-group-size N      the head's inputs per scale [--group-size]
  --mix LIST|none          matrices in the other block format, as
                           name=format pairs: wv=int4,wo=int4,w2=int4
                           [int2: that list; int4: none]. w1 and w3 share one
  --threads N              threads quantizing [every core]
  -h, --help               this help`;

const EXPORT_GGUF_HELP = `usage: loopserve model export-gguf IN OUT [--loops N]

Writes the fp16 model IN as a GGUF v3 file OUT that llama.cpp-based tools
load as a plain Llama model: the shared block unrolled into N identical
layers (GGUF cannot share tensor data, so each layer holds a copy; a stack
of pre-norm layers unrolls into N copies of the stack), F16 matrices, F32
norms, Wq/Wk rows permuted for llama.cpp's RoPE pairing (as its
convert_hf_to_gguf.py does), and the GPT-2 vocabulary and merges from the
bundled tokenizer data. Quantize the result with llama-quantize.

options:
  --loops N    loops to unroll, 1..${MAX_LOOPS} [the model's default_loops]
  -h, --help   this help`;

const IMPORT_HF_HELP = `usage: loopserve model import-hf DIR OUT

Writes the Hugging Face checkpoint directory DIR as one loopserve fp16 model
file OUT (format_version 2), replacing any file there. DIR holds config.json,
model.safetensors or shards listed by model.safetensors.index.json (BF16,
F16 or F32), tokenizer.json and tokenizer_config.json, as published.

Accepted: Ouro (model_type "ouro", OuroForCausalLM): its layers, sandwich
norms, per-step final norm and early-exit gate, looped total_ut_steps times
by default; and loopserve's own layout (model_type "loopserve").
The tokenizer (tokenizer.json verbatim), chat template, end-of-sequence
and beginning-of-sequence tokens are stored in OUT's metadata.

Every value is rounded to fp16 (nearest, ties to even); one that fp16
cannot hold (|x| >= 65520, or not finite) is an error naming the tensor and
element. Tensors stream through: memory does not grow with the model.
See docs/import-hf.md.

options:
  -h, --help   this help`;

// ---- argument parsing ----

class UsageError extends Error {}

interface ParsedArgs {
  positional: string[];
  flags: Map<string, string | true>;
}

/** Splits argv into positionals and flags; `valued` flags take a value. */
function parseArgs(argv: string[], valued: Set<string>, boolean: Set<string>): ParsedArgs {
  const positional: string[] = [];
  const flags = new Map<string, string | true>();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--") {
      positional.push(...argv.slice(i + 1));
      break;
    }
    if (!a.startsWith("-") || a === "-") {
      positional.push(a);
      continue;
    }
    const eq = a.indexOf("=");
    const name = eq >= 0 ? a.slice(0, eq) : a;
    if (valued.has(name)) {
      let value: string;
      if (eq >= 0) value = a.slice(eq + 1);
      else {
        if (i + 1 >= argv.length) throw new UsageError(`${name} needs a value`);
        value = argv[++i];
      }
      if (flags.has(name)) throw new UsageError(`${name} given twice`);
      flags.set(name, value);
    } else if (boolean.has(name)) {
      if (eq >= 0) throw new UsageError(`${name} takes no value`);
      flags.set(name, true);
    } else {
      throw new UsageError(`unknown option ${name}`);
    }
  }
  return { positional, flags };
}

/** The positional paths, exactly as many as `names` (IN, OUT...): a usage error names the missing ones or the first extra. */
function paths(p: ParsedArgs, names: string[]): string[] {
  const missing = names.slice(p.positional.length);
  if (missing.length > 0) throw new UsageError(`missing ${missing.join(" and ")} path${missing.length > 1 ? "s" : ""}`);
  if (p.positional.length > names.length) throw new UsageError(`unexpected argument "${p.positional[names.length]}"`);
  return p.positional;
}

function intFlag(p: ParsedArgs, name: string, dflt: number): number {
  const v = p.flags.get(name);
  if (v === undefined) return dflt;
  if (typeof v !== "string" || !/^[0-9]+$/.test(v) || !Number.isSafeInteger(Number(v))) {
    throw new UsageError(`${name} must be a non-negative integer, got "${String(v)}"`);
  }
  return Number(v);
}

function numFlag(p: ParsedArgs, name: string, dflt: number): number {
  const v = p.flags.get(name);
  if (v === undefined) return dflt;
  const n = typeof v === "string" && /^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$/.test(v) ? Number(v) : NaN;
  if (!Number.isFinite(n)) throw new UsageError(`${name} must be a number, got "${String(v)}"`);
  return n;
}

// ---- commands ----

function cmdNew(argv: string[], io: CommandIO): number {
  const p = parseArgs(
    argv,
    new Set([
      "--dim",
      "--heads",
      "--kv-heads",
      "--ffn",
      "--vocab",
      "--loops",
      "--seed",
      "--max-seq-len",
      "--rope-theta",
      "--norm-eps",
      "--residual-scale",
      "--layers",
      "--exit-threshold",
    ]),
    new Set(["--tied", "--sandwich", "--step-norm", "--exit-gate", "-h", "--help"]),
  );
  if (p.flags.has("-h") || p.flags.has("--help")) {
    io.out(NEW_HELP);
    return 0;
  }
  const [out] = paths(p, ["OUT"]);
  const heads = intFlag(p, "--heads", 8);
  const opts: SyntheticOptions = {
    dim: intFlag(p, "--dim", 256),
    nHeads: heads,
    nKvHeads: intFlag(p, "--kv-heads", heads),
    ffnDim: intFlag(p, "--ffn", 768),
    vocabSize: intFlag(p, "--vocab", 50257),
    loops: intFlag(p, "--loops", 8),
    seed: intFlag(p, "--seed", 1),
    maxSeqLen: intFlag(p, "--max-seq-len", 2048),
    ropeTheta: numFlag(p, "--rope-theta", 10000),
    normEps: numFlag(p, "--norm-eps", 1e-5),
    residualScale: numFlag(p, "--residual-scale", 1),
    tiedOutput: p.flags.has("--tied"),
    nLayers: intFlag(p, "--layers", 1),
    sandwichNorm: p.flags.has("--sandwich"),
    stepNorm: p.flags.has("--step-norm"),
    exitGate: p.flags.has("--exit-gate"),
    exitThreshold: p.flags.has("--exit-threshold") ? numFlag(p, "--exit-threshold", 0) : null,
  };
  try {
    resolveSyntheticOptions(opts);
  } catch (e) {
    if (e instanceof ModelFormatError) {
      // Name the flags, not the option fields.
      const flagOf: Record<string, string> = {
        dim: "--dim",
        nHeads: "--heads",
        nKvHeads: "--kv-heads",
        ffnDim: "--ffn",
        vocabSize: "--vocab",
        loops: "--loops",
        seed: "--seed",
        maxSeqLen: "--max-seq-len",
        ropeTheta: "--rope-theta",
        normEps: "--norm-eps",
        residualScale: "--residual-scale",
        nLayers: "--layers",
        exitThreshold: "--exit-threshold",
      };
      const msg = e.message.replace(/^synthetic model: /, "").replace(/\b(\w+)\b/g, (w) => flagOf[w] ?? w);
      throw new UsageError(msg);
    }
    throw e;
  }
  const t0 = performance.now();
  const r = writeSyntheticModel(out, opts);
  const ms = performance.now() - t0;
  const c = r.config;
  io.out(
    `wrote ${out}: ${r.bytes} bytes, ${r.parameters} parameters ` +
      `(dim ${c.dim}, heads ${c.nHeads}/${c.nKvHeads} kv, ffn ${c.ffnDim}, vocab ${c.vocabSize}, ` +
      `loops ${c.defaultLoops}, ${c.tiedOutput ? "tied" : "untied"} output${stackNote(c)}, seed ${opts.seed}) in ${ms.toFixed(0)} ms`,
  );
  return 0;
}

/** ", 4 layers per step, sandwich norms, ..." for a stack; "" for a single block. */
function stackNote(c: Pick<ModelConfig, "nLayers" | "normLayout" | "stepNorm" | "exitGate" | "exitThreshold">): string {
  const parts = [
    ...(c.nLayers > 1 ? [`${c.nLayers} layers per step`] : []),
    ...(c.normLayout === "sandwich" ? ["sandwich norms"] : []),
    ...(c.stepNorm ? ["a norm after every step"] : []),
    ...(c.exitGate ? [`an exit gate${c.exitThreshold !== null ? ` (default threshold ${c.exitThreshold})` : ""}`] : []),
  ];
  return parts.map((p) => `, ${p}`).join("");
}

/** The recurrent-depth layout (docs/model-format.md), when the model has one. */
function recurrenceNote(c: ModelFileInfo): string {
  if (!isRecurrent(c)) return "";
  const parts = [
    ...(c.nPrelude > 0 ? [`${c.nPrelude} prelude layers`] : []),
    ...(c.nCoda > 0 ? [`${c.nCoda} coda layers`] : []),
    ...(c.injection === "adapter" ? [`the prelude's output injected every step (adapter; first state std ${Number(c.stateStd.toPrecision(6))})`] : []),
    ...(c.embedScale !== 1 ? [`embeddings scaled by ${Number(c.embedScale.toPrecision(6))}`] : []),
    ...(c.midNorm ? ["a norm between the core and the coda"] : []),
    ...(c.normLayout === "sandwich_sum" ? ["sandwich norms of the residual sums"] : []),
    ...(c.ropeLayout === "interleaved" ? ["RoPE on adjacent pairs"] : []),
    ...(c.qkBias ? ["q/k biases"] : []),
    ...(c.headDim * c.nHeads !== c.dim ? [`head_dim ${c.headDim}`] : []),
  ];
  return parts.map((p) => `; ${p}`).join("");
}

/** The server's verdict on a model file: its loader's description, or its reason to refuse it. */
function checkWithServerLoader(path: string): ModelFileInfo {
  const { buildDir, cacheHome } = libraryConfig();
  try {
    return checkModelFile(resolveKernelLibrary(buildDir, CPU_LIBRARY_NAME, cacheDirCandidates({ xdgCacheHome: cacheHome })), path);
  } catch (e) {
    throw ModelFormatError.about(path, (e as Error).message);
  }
}

/** The ids that end generation, and those that also end a chat reply, as the server reads them from a model file's metadata. */
async function endIds(path: string, meta: Record<string, string>): Promise<{ eos: number[]; chatTurn: number[]; text: (id: number) => string }> {
  let tokenizer: Awaited<ReturnType<typeof loadModelTokenizer>>;
  try {
    tokenizer = await loadModelTokenizer(meta, path, tokenizerHomeOf());
  } catch (e) {
    if (e instanceof ModelTokenizerError) throw new ModelFormatError(e.message);
    throw e;
  }
  try {
    const chat = modelChat(tokenizer);
    const decoded = new Map([...tokenizer.conventions.eosIds, ...chat.turnEndIds].map((id) => [id, tokenizer.decode([id])]));
    return { eos: [...tokenizer.conventions.eosIds], chatTurn: [...chat.turnEndIds], text: (id) => decoded.get(id) ?? "" };
  } finally {
    tokenizer.close();
  }
}

/** "0 "<|endoftext|>", 2 "<|im_end|>"", or "none". */
function idList(ids: number[], text: (id: number) => string): string {
  return ids.length === 0 ? "none" : ids.map((id) => `${id} ${JSON.stringify(text(id))}`).join(", ");
}

interface HeaderRow {
  name: string;
  dtype: string;
  shape: number[];
  bytes: number;
}

function headerRows(file: SafetensorsFile): HeaderRow[] {
  return [...file.tensors].map(([name, t]) => ({
    name,
    dtype: t.dtype,
    shape: t.shape,
    bytes: t.shape.reduce((a, b) => a * b, 1) * DTYPE_SIZES[t.dtype],
  }));
}

function printHeader(io: CommandIO, path: string, file: SafetensorsFile): void {
  const size = statSync(path).size;
  const rows = headerRows(file);
  io.out(`${path}: ${size} bytes, header ${file.dataStart - 8} bytes, data at offset ${file.dataStart}`);
  const meta = Object.entries(file.metadata);
  io.out(`metadata (${meta.length}):`);
  const kw = Math.max(0, ...meta.map(([k]) => k.length));
  for (const [k, v] of meta) io.out(`  ${k.padEnd(kw)}  ${v}`);
  io.out(`tensors (${rows.length}):`);
  const shapes = rows.map((r) => `[${r.shape.join(", ")}]`);
  const nw = Math.max(4, ...rows.map((r) => r.name.length));
  const sw = Math.max(5, ...shapes.map((s) => s.length));
  io.out(`  ${"name".padEnd(nw)}  dtype    ${"shape".padEnd(sw)}  bytes`);
  rows.forEach((r, i) => io.out(`  ${r.name.padEnd(nw)}  ${r.dtype.padEnd(7)}  ${shapes[i].padEnd(sw)}  ${r.bytes}`));
  const elems = rows.reduce((a, r) => a + r.shape.reduce((x, y) => x * y, 1), 0);
  const bytes = rows.reduce((a, r) => a + r.bytes, 0);
  io.out(`total: ${elems} elements, ${bytes} bytes of tensor data`);
}

async function cmdInspect(argv: string[], io: CommandIO): Promise<number> {
  const p = parseArgs(argv, new Set(), new Set(["--json", "-h", "--help"]));
  if (p.flags.has("-h") || p.flags.has("--help")) {
    io.out(INSPECT_HELP);
    return 0;
  }
  const [path] = paths(p, ["FILE"]);
  const json = p.flags.has("--json");
  // Failures here are about the file, not the arguments: exit 1 (see runModelCommand).
  // The verdict is the server loader's, so inspect and serve never disagree
  // about a file; the listing is of any well-formed safetensors header, so a
  // file that is not a loopserve model is still shown before it is refused.
  const file: SafetensorsFile = readSafetensors(path);
  if (json) {
    // One object: the header, with the end ids when the file is a model the server loads.
    const header = { path, bytes: statSync(path).size, data_start: file.dataStart, metadata: file.metadata, tensors: headerRows(file) };
    let ends: Awaited<ReturnType<typeof endIds>> | null = null;
    let family: string | null = null;
    try {
      family = checkWithServerLoader(path).family;
      ends = await endIds(path, file.metadata);
    } finally {
      io.out(JSON.stringify({ ...header, ...(family ? { family } : {}), ...(ends ? { end_ids: ends.eos, chat_end_ids: ends.chatTurn } : {}) }));
    }
    return 0;
  }
  printHeader(io, path, file);
  const c = checkWithServerLoader(path);
  const head = c.headQuant === "fp16" ? "" : `, output head ${c.headQuant} (group ${c.headGroupSize})`;
  io.out(
    `loopserve model: ${c.quant}${c.quant === "fp16" ? "" : ` (group ${c.groupSize}${quantMixNote(c.quantMix)})`}${head}, dim ${c.dim}, heads ${c.nHeads} (kv ${c.nKvHeads}), head_dim ${c.headDim}, ` +
      `ffn ${c.ffnDim}, vocab ${c.vocabSize}, default loops ${c.defaultLoops}, ` +
      `output ${c.tiedOutput ? "tied to tok_embeddings" : c.embeddingFromHead ? "tied (the embedding is the quantized head)" : "untied"}${stackNote(c)}`,
  );
  io.out(`family: ${c.family}, ${FAMILY_TITLES[c.family]}${recurrenceNote(c)}`);
  const ends = await endIds(path, file.metadata);
  io.out(`end ids: ${idList(ends.eos, ends.text)}; end of a chat turn: ${idList(ends.chatTurn, ends.text)}`);
  return 0;
}

/** The kernel library's quantizer, the library found as the server finds it; a missing library is the command's error. */
function openQuantizer(threads: number): NativeQuantizer {
  const { buildDir, cacheHome } = libraryConfig();
  try {
    return NativeQuantizer.open(resolveKernelLibrary(buildDir, CPU_LIBRARY_NAME, cacheDirCandidates({ xdgCacheHome: cacheHome })), threads);
  } catch (e) {
    throw new ModelFormatError(`cannot quantize: ${(e as Error).message}`);
  }
}

function cmdQuantize(argv: string[], io: CommandIO): number {
  const p = parseArgs(argv, new Set(["--quant", "--group-size", "--head", "--head-group-size", "--mix", "--threads"]), new Set(["-h", "--help"]));
  if (p.flags.has("-h") || p.flags.has("--help")) {
    io.out(QUANTIZE_HELP);
    return 0;
  }
  const [inPath, outPath] = paths(p, ["IN", "OUT"]);
  const quant = p.flags.get("--quant");
  if (quant === undefined) throw new UsageError("--quant int4|int2|fp16 is required");
  if (quant !== "int4" && quant !== "int2" && quant !== "fp16") {
    throw new UsageError(`--quant must be int4, int2 or fp16, got "${String(quant)}"`);
  }
  const head = p.flags.get("--head");
  if (head !== undefined && (typeof head !== "string" || !(HEAD_QUANTS as readonly string[]).includes(head))) {
    throw new UsageError(`--head must be one of ${HEAD_QUANTS.join(", ")}, got "${String(head)}"`);
  }
  if (quant === "fp16" && head === "fp16") throw new UsageError("--quant fp16 with --head fp16 leaves nothing to quantize");
  const groupSize = intFlag(p, "--group-size", DEFAULT_GROUP_SIZE);
  const headGroupSize = intFlag(p, "--head-group-size", groupSize);
  for (const [flag, g] of [["--group-size", groupSize], ["--head-group-size", headGroupSize]] as const) {
    if (!GROUP_SIZES.includes(g)) throw new UsageError(`${flag} must be 32, 64, 128 or 256, got ${g}`);
  }
  const mixText = p.flags.get("--mix");
  let mix: QuantMix | undefined;
  if (mixText !== undefined) {
    if (typeof mixText !== "string") throw new UsageError("--mix takes a list such as wv=int4,wo=int4,w2=int4, or none");
    if (quant === "fp16" && mixText !== "none") throw new UsageError("--mix needs --quant int4 or int2 (fp16 keeps the block as it is)");
    try {
      mix = mixText === "none" ? {} : parseQuantMix(mixText, quant);
    } catch (e) {
      throw new UsageError(`--mix: ${(e as Error).message}`);
    }
  }
  const threads = intFlag(p, "--threads", 0);
  const t0 = performance.now();
  const quantizer = openQuantizer(threads);
  let r: QuantizeResult;
  try {
    r = withProgress("quantize", io.progress, (onProgress) =>
      quantizeModelFile(inPath, outPath, {
        quant: quant as WeightQuant | "fp16",
        groupSize,
        head: head as HeadQuant | undefined,
        headGroupSize,
        mix,
        onProgress,
        quantizer,
      }),
    );
  } finally {
    quantizer.close();
  }
  const ms = performance.now() - t0;
  io.out(
    `wrote ${outPath}: ${r.bytes} bytes (${((100 * r.bytes) / r.inputBytes).toFixed(1)}% of ${r.inputBytes}), ` +
      `${quant} block${quant === "fp16" ? "" : `, group ${groupSize}`}${quantMixNote(r.config.quantMix)}, output head ` +
      `${r.head === "tied" ? "tied (fp16)" : r.head === "fp16" ? "fp16" : `${r.head}, group ${headGroupSize}`}` +
      `${r.config.embeddingFromHead ? " (also the embedding)" : ""} in ${ms.toFixed(0)} ms`,
  );
  return 0;
}

function cmdExportGguf(argv: string[], io: CommandIO): number {
  const p = parseArgs(argv, new Set(["--loops"]), new Set(["-h", "--help"]));
  if (p.flags.has("-h") || p.flags.has("--help")) {
    io.out(EXPORT_GGUF_HELP);
    return 0;
  }
  const [inPath, outPath] = paths(p, ["IN", "OUT"]);
  let loops: number | undefined;
  if (p.flags.has("--loops")) {
    loops = intFlag(p, "--loops", 0);
    if (loops < 1 || loops > MAX_LOOPS) throw new UsageError(`--loops must be in [1, ${MAX_LOOPS}], got ${loops}`);
  }
  const t0 = performance.now();
  const r = withProgress("export-gguf", io.progress, (onProgress) => exportGguf(inPath, outPath, { loops, onProgress }));
  const ms = performance.now() - t0;
  io.out(
    `wrote ${outPath}: ${r.bytes} bytes, GGUF v3, llama, ${r.loops} layers, ${r.tensors} tensors ` +
      `(dim ${r.config.dim}, heads ${r.config.nHeads}/${r.config.nKvHeads} kv, ffn ${r.config.ffnDim}, ` +
      `vocab ${r.config.vocabSize}, ${r.config.tiedOutput ? "tied" : "untied"} output) in ${ms.toFixed(0)} ms`,
  );
  return 0;
}

function cmdImportHf(argv: string[], io: CommandIO): number {
  const p = parseArgs(argv, new Set(), new Set(["-h", "--help"]));
  if (p.flags.has("-h") || p.flags.has("--help")) {
    io.out(IMPORT_HF_HELP);
    return 0;
  }
  const [dir, outPath] = paths(p, ["DIR", "OUT"]);
  const t0 = performance.now();
  const r = withProgress("import-hf", io.progress, (onProgress) => importHfCheckpoint(dir, outPath, { onProgress }));
  const ms = performance.now() - t0;
  const m = r.checkpoint.model;
  io.out(
    `wrote ${outPath}: ${r.bytes} bytes, ${r.tensors} tensors, ${r.parameters} parameters ` +
      `(${r.checkpoint.arch}: dim ${m.dim}, ${m.nLayers} layers, heads ${m.nHeads}/${m.nKvHeads} kv, ffn ${m.ffnDim}, ` +
      `vocab ${m.vocabSize}, default loops ${m.defaultLoops}, ${m.tiedOutput ? "tied" : "untied"} output, ` +
      `${m.exitGate ? `exit gate${m.exitThreshold !== null ? `, threshold ${m.exitThreshold}` : ""}` : "no exit gate"}` +
      `${r.checkpoint.tokenizer ? `, end ids ${r.checkpoint.eosIds.join(", ")}` : ""}) in ${ms.toFixed(0)} ms`,
  );
  return 0;
}

// ---- entry ----

/** Runs `loopserve model <argv...>`; returns the exit code. */
export async function runModelCommand(argv: string[], io: CommandIO = defaultIO): Promise<number> {
  const [cmd, ...rest] = argv;
  try {
    switch (cmd) {
      case undefined:
        io.err(MAIN_HELP);
        return 2;
      case "-h":
      case "--help":
      case "help":
        io.out(MAIN_HELP);
        return 0;
      case "new":
        return cmdNew(rest, io);
      case "inspect":
        return await cmdInspect(rest, io);
      case "export-gguf":
        return cmdExportGguf(rest, io);
      case "quantize":
        return cmdQuantize(rest, io);
      case "import-hf":
        return cmdImportHf(rest, io);
      default:
        throw new UsageError(`unknown command "${cmd}" (expected new, inspect, quantize, export-gguf or import-hf)`);
    }
  } catch (e) {
    if (e instanceof UsageError) {
      io.err(`error: ${e.message}`);
      const known = cmd === "new" || cmd === "inspect" || cmd === "export-gguf" || cmd === "quantize" || cmd === "import-hf";
      io.err(`run \`loopserve model ${known ? `${cmd} ` : ""}--help\` for usage`);
      return 2;
    }
    if (e instanceof ModelFormatError) {
      io.err(`error: ${e.message}`);
      return 1;
    }
    throw e;
  }
}

// No top-level await: `bun build --compile --bytecode` rejects it.
if (import.meta.main) {
  void runModelCommand(Bun.argv.slice(2)).then((code) => process.exit(code));
}
