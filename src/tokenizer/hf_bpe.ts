// A model's own BPE tokenizer, read from the Hugging Face tokenizer.json
// text a model file carries (docs/tokenizers.md). Encoding gives the ids of
// the `tokenizers` library's `encode(text)` (what `tokenizer(text)` gives in
// transformers): added tokens (special or not, <|im_start|> included) are
// matched in the text first, the text between them is normalized,
// pre-tokenized (src/tokenizer/pretokenize.ts) and each piece BPE-merged by
// merge rank (src/tokenizer/merge.ts).
//
// Two kinds of BPE are read, told apart by a ByteLevel pre-tokenizer or
// decoder:
// - byte-level (GPT-2, SmolLM, Llama 3, Qwen): a piece's symbols are its
//   bytes, in GPT-2's byte-to-character mapping;
// - SentencePiece-style (Llama 2, TinyLlama, Nanbeige): spaces become "▁"
//   (a Metaspace pre-tokenizer, or the older Prepend + Replace normalizer),
//   a piece's symbols are its characters, and a character the vocabulary
//   lacks becomes its UTF-8 bytes' <0xNN> tokens (byte_fallback), else
//   <unk>.
// Only the configurations these models use are accepted; any other
// normalizer, pre-tokenizer, model option, decoder or post-processor is
// refused at load with the reason (HfTokenizerError), so that no prompt is
// silently tokenized otherwise than the model was trained on.
//
// Decoding is bytes: a token's bytes undo the byte-to-character mapping, or
// (SentencePiece-style) are its text with "▁" as a space, a <0xNN> token its
// byte; an added token's are its content's, so a character split across
// tokens is put together by the caller's streaming UTF-8 decoder. The
// SentencePiece decoder's Strip (the space Metaspace put first) is the
// caller's too: stripsLeadingSpace.

import type { LinearRegex } from "./linear_regex.ts";
import {
  byteLevelStage,
  digitsStage,
  gpt2Pattern,
  literalPattern,
  METASPACE,
  metaspaceStage,
  PatternError,
  pretokenize,
  SPLIT_BEHAVIORS,
  type SplitBehavior,
  splitStage,
  type Stage,
  translatePattern,
} from "./pretokenize.ts";
import { BYTE_CHARS } from "./byte_chars.ts";
import { mergeByRank, PieceTooLongError } from "./merge.ts";

export class HfTokenizerError extends Error {}

const EMPTY = new Uint8Array(0);

// ---- GPT-2's byte <-> character mapping ----

const CHAR_BYTE = new Map(BYTE_CHARS.map((c, b) => [c, b]));

/** A piece's UTF-8 in the vocabulary's byte characters. */
function vocabString(piece: string): string {
  let mapped = "";
  for (const b of new TextEncoder().encode(piece)) mapped += BYTE_CHARS[b];
  return mapped;
}

/** A vocabulary string as bytes: each character its byte, or (a string not all byte characters) its own UTF-8, as the library's ByteLevel decoder does. */
function vocabStringBytes(s: string): Uint8Array {
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) {
    const b = CHAR_BYTE.get(s[i]);
    if (b === undefined) return new TextEncoder().encode(s);
    out[i] = b;
  }
  return out;
}

// ---- configuration ----

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

function fail(where: string, msg: string): never {
  throw new HfTokenizerError(`tokenizer.json ${where}: ${msg}`);
}

function typeOf(node: Json, where: string): string {
  if (typeof node.type !== "string") fail(where, `"type" must be a string, got ${JSON.stringify(node.type)}`);
  return node.type;
}

/** A field that must be absent or one of `allowed` (the library's defaults and the values implemented here). */
function only(node: Json, key: string, allowed: readonly unknown[], where: string): void {
  if (key in node && !allowed.includes(node[key]))
    fail(where, `${key} ${JSON.stringify(node[key])} is not supported (only ${allowed.map((a) => JSON.stringify(a)).join(" or ")})`);
}

function bool(node: Json, key: string, fallback: boolean, where: string): boolean {
  const v = node[key] ?? fallback;
  if (typeof v !== "boolean") fail(where, `${key} must be true or false, got ${JSON.stringify(v)}`);
  return v;
}

/** One normalizer step, in the library's order of application. */
type NormalizerStep = { type: "NFC" } | { type: "Prepend"; text: string } | { type: "Replace"; from: string; to: string };

/** The text `steps` make of `text` (Prepend leaves an empty text empty, as the library's does). */
function normalize(text: string, steps: readonly NormalizerStep[]): string {
  let s = text;
  for (const step of steps) {
    if (step.type === "NFC") s = s.normalize("NFC");
    else if (step.type === "Prepend") s = s === "" ? s : step.text + s;
    else s = s.replaceAll(step.from, step.to);
  }
  return s;
}

/** The string a {"String": ...} pattern holds, or undefined. */
function stringPattern(pattern: unknown): string | undefined {
  return isObject(pattern) && typeof pattern.String === "string" ? pattern.String : undefined;
}

/**
 * The normalizer: none, NFC, or a Sequence of those; SentencePiece-style
 * (`sentencePiece`) also Prepend "▁" and Replace " " with "▁", the form
 * Llama's tokenizer.json had before Metaspace's prepend_scheme.
 */
function parseNormalizer(node: unknown, sentencePiece: boolean, where = "normalizer"): NormalizerStep[] {
  if (node === null || node === undefined) return [];
  if (!isObject(node)) fail(where, "must be an object or null");
  const type = typeOf(node, where);
  if (type === "NFC") return [{ type: "NFC" }];
  if (type === "Sequence") {
    if (!Array.isArray(node.normalizers)) fail(where, "Sequence needs a normalizers array");
    return node.normalizers.flatMap((n, i) => parseNormalizer(n, sentencePiece, `${where}.normalizers[${i}]`));
  }
  if (sentencePiece && type === "Prepend") {
    if (node.prepend !== METASPACE) fail(where, `Prepend ${JSON.stringify(node.prepend)} is not supported (only "${METASPACE}")`);
    return [{ type: "Prepend", text: METASPACE }];
  }
  if (sentencePiece && type === "Replace") {
    if (stringPattern(node.pattern) !== " " || node.content !== METASPACE)
      fail(where, `Replace ${JSON.stringify(node.pattern)} with ${JSON.stringify(node.content)} is not supported (only {"String": " "} with "${METASPACE}")`);
    return [{ type: "Replace", from: " ", to: METASPACE }];
  }
  const extra = sentencePiece ? `, Prepend "${METASPACE}" and Replace " " with "${METASPACE}"` : "";
  return fail(where, `type ${JSON.stringify(type)} is not supported (only NFC${extra}, or a Sequence of those)`);
}

/** Whether a tokenizer.json is byte-level BPE: a ByteLevel pre-tokenizer anywhere, or a ByteLevel decoder. */
function isByteLevel(root: Json): boolean {
  const has = (n: unknown, list: string): boolean =>
    isObject(n) && (n.type === "ByteLevel" || (n.type === "Sequence" && Array.isArray(n[list]) && n[list].some((m) => has(m, list))));
  return has(root.pre_tokenizer, "pretokenizers") || has(root.decoder, "decoders");
}

/** A Metaspace pre-tokenizer's prefix rule: a "▁" put first in every text between added tokens, the text's first only, or never. */
type PrependScheme = "always" | "first" | "never";

/** SentencePiece-style pre-tokenization: none (the normalizer did its work), or one Metaspace. */
function parseMetaspace(node: unknown, where = "pre_tokenizer"): { prepend: PrependScheme; split: boolean } | null {
  if (node === null || node === undefined) return null;
  if (!isObject(node)) fail(where, "must be an object or null");
  const type = typeOf(node, where);
  if (type !== "Metaspace") fail(where, `type ${JSON.stringify(type)} is not supported (SentencePiece-style BPE takes one Metaspace pre-tokenizer, or none)`);
  if (node.replacement !== METASPACE) fail(where, `replacement ${JSON.stringify(node.replacement)} is not supported (only "${METASPACE}")`);
  const schemes: PrependScheme[] = ["always", "first", "never"];
  // Files written before prepend_scheme have add_prefix_space (default true) instead.
  const prepend = node.prepend_scheme ?? (bool(node, "add_prefix_space", true, where) ? "always" : "never");
  if (!schemes.includes(prepend as PrependScheme)) fail(where, `prepend_scheme ${JSON.stringify(prepend)} is not one of ${schemes.join(", ")}`);
  return { prepend: prepend as PrependScheme, split: bool(node, "split", true, where) };
}

/**
 * The SentencePiece decoder: Replace "▁" with " ", then ByteFallback
 * (<0xNN> tokens are bytes), Fuse and Strip one leading space, the last
 * three each optional, Fuse needed before Strip (without it Strip would cut
 * every token's space). Returns which of them it has.
 */
function parseSentencePieceDecoder(node: unknown, where = "decoder"): { byteFallback: boolean; strip: boolean } {
  const form = `Sequence[Replace "${METASPACE}" with " ", ByteFallback, Fuse, Strip one leading " "]`;
  if (!isObject(node) || node.type !== "Sequence" || !Array.isArray(node.decoders))
    fail(where, `must be the SentencePiece decoder ${form}, got ${JSON.stringify(node === undefined ? null : isObject(node) ? node.type : node)}`);
  const steps = node.decoders as unknown[];
  const out = { byteFallback: false, strip: false };
  let fused = false;
  steps.forEach((d, i) => {
    const w = `${where}.decoders[${i}]`;
    if (!isObject(d)) fail(w, "must be an object");
    const type = typeOf(d, w);
    if (i === 0) {
      if (type !== "Replace" || stringPattern(d.pattern) !== METASPACE || d.content !== " ") fail(w, `must be Replace {"String": "${METASPACE}"} with " " (the decoder is ${form})`);
    } else if (type === "ByteFallback" && i === 1) {
      out.byteFallback = true;
    } else if (type === "Fuse" && !fused) {
      fused = true;
    } else if (type === "Strip" && fused && i === steps.length - 1) {
      if (d.content !== " " || d.start !== 1 || d.stop !== 0) fail(w, `Strip ${JSON.stringify(d.content)} start ${d.start} stop ${d.stop} is not supported (only " " start 1 stop 0)`);
      out.strip = true;
    } else {
      fail(w, `type ${JSON.stringify(type)} is not supported here (the decoder is ${form})`);
    }
  });
  if (steps.length === 0) fail(where, `must be ${form}`);
  return out;
}

const BYTE_TOKEN = /^<0x([0-9A-Fa-f]{2})>$/;

/** A SentencePiece-style token's bytes: its text with "▁" as a space, or (a <0xNN> token, with the ByteFallback decoder) the byte. */
function sentencePieceBytes(s: string, byteFallback: boolean): Uint8Array {
  const byte = byteFallback ? BYTE_TOKEN.exec(s) : null;
  if (byte !== null) return Uint8Array.of(Number.parseInt(byte[1], 16));
  return new TextEncoder().encode(s.replaceAll(METASPACE, " "));
}

/** The pre-tokenizer stages of a tokenizer.json `pre_tokenizer`; a ByteLevel stage must come last (it maps bytes to the vocabulary's characters). */
export function parsePreTokenizer(node: unknown, where = "pre_tokenizer"): { stages: Stage[]; removesText: boolean; patternSteps: number } {
  if (!isObject(node)) fail(where, "must be an object (byte-level BPE needs a ByteLevel pre-tokenizer)");
  const flat: [Json, string][] = [];
  const flatten = (n: unknown, w: string) => {
    if (!isObject(n)) fail(w, "must be an object");
    if (typeOf(n, w) !== "Sequence") return void flat.push([n, w]);
    if (!Array.isArray(n.pretokenizers)) fail(w, "Sequence needs a pretokenizers array");
    n.pretokenizers.forEach((p, i) => flatten(p, `${w}.pretokenizers[${i}]`));
  };
  flatten(node, where);
  const last = flat.at(-1);
  if (last === undefined || typeOf(last[0], last[1]) !== "ByteLevel")
    fail(where, "must end with a ByteLevel pre-tokenizer (only byte-level BPE is supported)");
  const removesText = flat.some(([n]) => n.type === "Split" && n.behavior === "Removed");
  let patternSteps = 0;
  const stages = flat.map(([n, w], i) => {
    const type = typeOf(n, w);
    if (type === "ByteLevel") {
      if (i !== flat.length - 1) fail(w, "ByteLevel must be the last pre-tokenizer");
      const useRegex = bool(n, "use_regex", true, w);
      if (useRegex) patternSteps += gpt2Pattern().size;
      return byteLevelStage(bool(n, "add_prefix_space", true, w), useRegex);
    }
    if (type === "Digits") return digitsStage(bool(n, "individual_digits", false, w));
    if (type === "Split") {
      const behavior = n.behavior as SplitBehavior;
      if (!SPLIT_BEHAVIORS.includes(behavior)) fail(w, `behavior ${JSON.stringify(n.behavior)} is not one of ${SPLIT_BEHAVIORS.join(", ")}`);
      const pattern = n.pattern;
      let re: LinearRegex;
      const source = isObject(pattern) ? (pattern.Regex ?? pattern.String) : undefined;
      if (typeof source !== "string") return fail(w, `pattern must be {"Regex": "..."} or {"String": "..."}, got ${JSON.stringify(pattern)}`);
      try {
        re = typeof (pattern as Json).Regex === "string" ? translatePattern(source) : literalPattern(source);
      } catch (e) {
        if (e instanceof PatternError) fail(w, `pattern ${JSON.stringify(source)}: ${e.message}`);
        throw e;
      }
      patternSteps += re.size;
      return splitStage(re, behavior, bool(n, "invert", false, w));
    }
    return fail(w, `type ${JSON.stringify(type)} is not supported (only ByteLevel, Split, Digits and Sequence)`);
  });
  return { stages, removesText, patternSteps };
}

function checkDecoder(node: unknown, where = "decoder"): void {
  if (node === null || node === undefined) fail(where, "is missing (byte-level BPE needs the ByteLevel decoder)");
  if (!isObject(node)) fail(where, "must be an object");
  const type = typeOf(node, where);
  if (type === "ByteLevel") return;
  if (type === "Sequence" && Array.isArray(node.decoders) && node.decoders.length === 1) return checkDecoder(node.decoders[0], `${where}.decoders[0]`);
  fail(where, `type ${JSON.stringify(type)} is not supported (only ByteLevel)`);
}

/**
 * The ids the post-processor puts before every single text (Llama's
 * TemplateProcessing [<s>, $A]); the server prepends a beginning-of-sequence
 * token itself (bos_token_id), so import reads it from here. Tokens after
 * the text, or a template of another shape, are refused.
 */
function parsePostProcessor(node: unknown, where = "post_processor"): number[] {
  if (node === null || node === undefined) return [];
  if (!isObject(node)) fail(where, "must be an object or null");
  const type = typeOf(node, where);
  // ByteLevel's post-processing only trims offsets: the ids are unchanged.
  if (type === "ByteLevel") return [];
  if (type === "Sequence" && Array.isArray(node.processors)) {
    return node.processors.flatMap((p, i) => parsePostProcessor(p, `${where}.processors[${i}]`));
  }
  if (type === "TemplateProcessing") return templatePrefix(node, where);
  fail(where, `type ${JSON.stringify(type)} is not supported (ByteLevel, TemplateProcessing or a Sequence of them)`);
}

/** A TemplateProcessing's single template: special tokens, then the text ($A) last. */
function templatePrefix(node: Record<string, unknown>, where: string): number[] {
  const single = node.single;
  const shape = `${where}.single must be special tokens followed by the text ($A) and nothing after it`;
  if (!Array.isArray(single) || single.length === 0) fail(where, shape);
  const last = single[single.length - 1];
  if (!isObject(last) || !isObject(last.Sequence) || last.Sequence.id !== "A") fail(where, shape);
  const specials = isObject(node.special_tokens) ? node.special_tokens : {};
  return single.slice(0, -1).flatMap((piece, i) => {
    const name = isObject(piece) && isObject(piece.SpecialToken) ? piece.SpecialToken.id : undefined;
    if (typeof name !== "string") fail(`${where}.single[${i}]`, shape);
    const entry = Object.hasOwn(specials, name) ? specials[name] : undefined;
    const ids = isObject(entry) ? entry.ids : undefined;
    if (!Array.isArray(ids) || !ids.every((id) => Number.isInteger(id) && id >= 0)) {
      fail(`${where}.special_tokens`, `${JSON.stringify(name)} must list its token ids`);
    }
    return ids as number[];
  });
}

// ---- added tokens ----

interface AddedToken {
  id: number;
  content: string;
  special: boolean;
  /** Matched after normalization (only differs from the raw text with a normalizer). */
  normalized: boolean;
  /** Matched only where neither neighbour is a word character. */
  singleWord: boolean;
}

function parseAddedTokens(node: unknown): AddedToken[] {
  if (node === undefined || node === null) return [];
  if (!Array.isArray(node)) fail("added_tokens", "must be an array");
  return node.map((t, i) => {
    const w = `added_tokens[${i}]`;
    if (!isObject(t)) fail(w, "must be an object");
    if (!Number.isInteger(t.id) || (t.id as number) < 0) fail(w, `id must be a non-negative integer, got ${JSON.stringify(t.id)}`);
    if (typeof t.content !== "string" || t.content === "") fail(w, "content must be a non-empty string");
    // Stripping would let one token take any amount of whitespace, which the
    // prompt-length bounds (src/tokenizer/count_bound.ts) cannot allow for.
    only(t, "lstrip", [false], w);
    only(t, "rstrip", [false], w);
    const special = bool(t, "special", false, w);
    return { id: t.id as number, content: t.content, special, normalized: bool(t, "normalized", !special, w), singleWord: bool(t, "single_word", false, w) };
  });
}

const WORD_CHAR = /^[\p{L}\p{N}_]$/u;

/** The text cut at the added tokens (leftmost, then longest, as the library's matcher). Strings are text, numbers token ids. */
function splitAdded(text: string, tokens: readonly AddedToken[], re: RegExp | null): (string | number)[] {
  if (re === null || text === "") return text === "" ? [] : [text];
  const byContent = new Map(tokens.map((t) => [t.content, t]));
  const out: (string | number)[] = [];
  let prev = 0;
  re.lastIndex = 0;
  for (let m = re.exec(text); m !== null; m = re.exec(text)) {
    const t = byContent.get(m[0]) as AddedToken;
    const start = m.index;
    const end = start + m[0].length;
    if (t.singleWord) {
      const before = String.fromCodePoint(text.codePointAt(start - 1) ?? 32);
      const after = String.fromCodePoint(text.codePointAt(end) ?? 32);
      if ((start > 0 && WORD_CHAR.test(before)) || (end < text.length && WORD_CHAR.test(after))) {
        re.lastIndex = start + 1;
        continue;
      }
    }
    if (start > prev) out.push(text.slice(prev, start));
    out.push(t.id);
    prev = end;
  }
  if (prev < text.length) out.push(text.slice(prev));
  return out;
}

function alternation(tokens: readonly AddedToken[]): RegExp | null {
  if (tokens.length === 0) return null;
  // Longest first: JavaScript's alternation takes the first that matches.
  const sorted = [...tokens].sort((a, b) => b.content.length - a.content.length);
  // Syntax characters only: under the u flag an escaped "-" outside a class is an error (Huginn's <|-|> holds one).
  return new RegExp(sorted.map((t) => t.content.replace(/[\\^$.*+?()[\]{}|/]/g, "\\$&")).join("|"), "gu");
}

// ---- the tokenizer ----

/** Pieces whose ids are remembered; the cache is emptied when it holds this many. */
const CACHE_ENTRIES = 100_000;
/** Pieces longer than this (UTF-16 units) are not cached. */
const CACHE_MAX_PIECE = 256;

/** A segment of an encoded text: an added token's id, or the pre-tokenized pieces of the text between them. */
export type EncodedSegment = { id: number; text: string } | { pieces: string[] };

export class HfBpe {
  /** One past the highest id of the vocabulary and the added tokens. */
  readonly vocabSize: number;
  /** SentencePiece-style ("▁" for spaces, characters as symbols, <0xNN> byte tokens), else byte-level. */
  readonly sentencePiece: boolean;
  /** Texts are NFC-normalized before pre-tokenization. */
  readonly nfc: boolean;
  /** A Split stage removes text (its ids then cover less than the text). */
  readonly removesText: boolean;
  /** The steps of its pre-tokenizers' patterns together: pre-tokenizing costs at most this many per character. */
  readonly patternSteps: number;
  /** The decoder strips one space from the start of a decoded text (SentencePiece's Strip). */
  readonly stripsLeadingSpace: boolean;
  /** The ids the file's post-processor puts before every text (its beginning-of-sequence token, if any). */
  readonly prefixIds: readonly number[];
  /** Each id's bytes; holes for ids neither the vocabulary nor the added tokens have. */
  private readonly bytesById: (Uint8Array | undefined)[] = [];
  private readonly vocab: Map<string, number>;
  /** The vocabulary id of each byte's character (byte-level), -1 when it has none. */
  private readonly byteIds = new Int32Array(256).fill(-1);
  /** The id of each byte's <0xNN> token (SentencePiece-style byte fallback), -1 when it has none. */
  private readonly fallbackIds = new Int32Array(256).fill(-1);
  private readonly byteFallback: boolean;
  /** Merge rank by pair key (left * pairBase + right). */
  private readonly mergeRank = new Map<number, number>();
  /** The id a merge of that rank makes. */
  private readonly mergeResult: Int32Array;
  private readonly pairBase: number;
  private readonly unkId: number | null;
  private readonly fuseUnk: boolean;
  private readonly ignoreMerges: boolean;
  private readonly normalizer: NormalizerStep[];
  /** The stages for the text at the start of the input, and for every other text between added tokens (they differ with Metaspace's prepend_scheme "first"). */
  private readonly firstStages: Stage[];
  private readonly laterStages: Stage[];
  private readonly added: AddedToken[];
  private readonly rawMatcher: RegExp | null;
  private readonly normalizedMatcher: RegExp | null;
  private readonly cache = new Map<string, number[]>();

  constructor(json: string) {
    let root: unknown;
    try {
      root = JSON.parse(json);
    } catch (e) {
      throw new HfTokenizerError(`tokenizer.json is not valid JSON: ${(e as Error).message}`);
    }
    if (!isObject(root)) fail("root", "must be a JSON object");
    for (const key of ["truncation", "padding"]) if (root[key] !== null && root[key] !== undefined) fail(key, "must be null (the server neither truncates nor pads)");
    this.sentencePiece = !isByteLevel(root);
    this.normalizer = parseNormalizer(root.normalizer, this.sentencePiece);
    this.nfc = this.normalizer.some((step) => step.type === "NFC");
    let decoderByteFallback = false;
    if (this.sentencePiece) {
      const metaspace = parseMetaspace(root.pre_tokenizer);
      this.firstStages = metaspace ? [metaspaceStage(metaspace.prepend !== "never", metaspace.split)] : [];
      this.laterStages = metaspace ? [metaspaceStage(metaspace.prepend === "always", metaspace.split)] : [];
      this.removesText = false;
      this.patternSteps = 0;
      ({ byteFallback: decoderByteFallback, strip: this.stripsLeadingSpace } = parseSentencePieceDecoder(root.decoder));
    } else {
      ({ stages: this.firstStages, removesText: this.removesText, patternSteps: this.patternSteps } = parsePreTokenizer(root.pre_tokenizer));
      this.laterStages = this.firstStages;
      checkDecoder(root.decoder);
      this.stripsLeadingSpace = false;
    }
    this.prefixIds = parsePostProcessor(root.post_processor);
    this.added = parseAddedTokens(root.added_tokens);

    const model = root.model;
    if (!isObject(model)) fail("model", "must be an object");
    if (typeOf(model, "model") !== "BPE") fail("model", `type ${JSON.stringify(model.type)} is not supported (only BPE)`);
    only(model, "dropout", [null, 0], "model");
    only(model, "continuing_subword_prefix", [null, ""], "model");
    only(model, "end_of_word_suffix", [null, ""], "model");
    // Byte-level BPE has a symbol for every byte already.
    if (!this.sentencePiece) only(model, "byte_fallback", [false], "model");
    this.byteFallback = bool(model, "byte_fallback", false, "model");
    this.fuseUnk = bool(model, "fuse_unk", false, "model");
    this.ignoreMerges = bool(model, "ignore_merges", false, "model");
    if (!isObject(model.vocab)) fail("model.vocab", "must be an object of token -> id");
    this.vocab = new Map();
    let maxId = -1;
    for (const [token, id] of Object.entries(model.vocab)) {
      if (!Number.isInteger(id) || (id as number) < 0) fail("model.vocab", `id of ${JSON.stringify(token)} must be a non-negative integer, got ${JSON.stringify(id)}`);
      this.vocab.set(token, id as number);
      maxId = Math.max(maxId, id as number);
    }
    for (const t of this.added) maxId = Math.max(maxId, t.id);
    this.vocabSize = maxId + 1;
    this.pairBase = this.vocabSize;
    for (let b = 0; b < 256; b++) {
      this.byteIds[b] = this.vocab.get(BYTE_CHARS[b]) ?? -1;
      this.fallbackIds[b] = this.vocab.get(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`) ?? -1;
    }
    const unk = model.unk_token;
    if (unk !== null && unk !== undefined && typeof unk !== "string") fail("model", "unk_token must be a string or null");
    this.unkId = typeof unk === "string" ? (this.vocab.get(unk) ?? fail("model", `unk_token ${JSON.stringify(unk)} is not in the vocabulary`)) : null;

    if (!Array.isArray(model.merges)) fail("model.merges", "must be an array");
    this.mergeResult = new Int32Array(model.merges.length);
    model.merges.forEach((m: unknown, rank: number) => {
      let pair: unknown[];
      if (typeof m === "string") {
        pair = m.split(" ");
      } else if (Array.isArray(m)) {
        pair = m;
      } else {
        return fail(`model.merges[${rank}]`, `must be "a b" or ["a", "b"], got ${JSON.stringify(m)}`);
      }
      if (pair.length !== 2 || typeof pair[0] !== "string" || typeof pair[1] !== "string")
        fail(`model.merges[${rank}]`, `must be two tokens, got ${JSON.stringify(m)}`);
      const [a, b] = pair as [string, string];
      const left = this.vocab.get(a);
      const right = this.vocab.get(b);
      const merged = this.vocab.get(a + b);
      if (left === undefined || right === undefined || merged === undefined)
        fail(`model.merges[${rank}]`, `${JSON.stringify(m)}: ${JSON.stringify(left === undefined ? a : right === undefined ? b : a + b)} is not in the vocabulary`);
      const key = left * this.pairBase + right;
      // A repeated merge keeps its first (lowest) rank.
      if (!this.mergeRank.has(key)) this.mergeRank.set(key, rank);
      this.mergeResult[rank] = merged;
    });

    const normalizes = this.normalizer.length > 0;
    this.rawMatcher = alternation(this.added.filter((t) => !t.normalized || !normalizes));
    this.normalizedMatcher = normalizes ? alternation(this.added.filter((t) => t.normalized)) : null;
    // The decoder runs on added tokens' content as on the vocabulary's.
    const bytesOf = this.sentencePiece ? (s: string) => sentencePieceBytes(s, decoderByteFallback) : vocabStringBytes;
    for (const [s, id] of this.vocab) this.bytesById[id] = bytesOf(s);
    for (const t of this.added) this.bytesById[t.id] = this.sentencePiece ? bytesOf(t.content) : new TextEncoder().encode(t.content);
  }

  /** The id of the added token `content` (matched whole in text), if there is one. */
  addedTokenId(content: string): number | undefined {
    return this.added.find((t) => t.content === content)?.id;
  }

  /** Raw bytes of one token; no bytes for an id the tokenizer does not have. */
  tokenBytes(id: number): Uint8Array {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) return EMPTY;
    return this.bytesById[id] ?? EMPTY;
  }

  /** The bytes a pre-tokenized piece's tokens decode to (before any Strip): its UTF-8, "▁" as a space when SentencePiece-style. */
  pieceBytes(piece: string): Uint8Array {
    return new TextEncoder().encode(this.sentencePiece ? piece.replaceAll(METASPACE, " ") : piece);
  }

  /** The text cut into added tokens and pre-tokenized pieces, in order; `checkpoint` may throw to stop. */
  segments(text: string, checkpoint?: () => void): EncodedSegment[] {
    const out: EncodedSegment[] = [];
    splitAdded(text, this.added, this.rawMatcher).forEach((part, i) => {
      if (typeof part === "number") {
        out.push({ id: part, text: "" });
        return;
      }
      splitAdded(normalize(part, this.normalizer), this.added, this.normalizedMatcher).forEach((inner, j) => {
        if (typeof inner === "number") out.push({ id: inner, text: "" });
        // Only a text at offset 0 of the input is the input's first (Metaspace's "first").
        else out.push({ pieces: pretokenize(inner, i === 0 && j === 0 ? this.firstStages : this.laterStages, checkpoint) });
      });
    });
    return out;
  }

  encode(text: string, checkpoint?: () => void): number[] {
    const ids: number[] = [];
    for (const s of this.segments(text, checkpoint)) {
      if ("id" in s) ids.push(s.id);
      else for (const p of s.pieces) for (const id of this.encodePiece(p, checkpoint)) ids.push(id);
    }
    return ids;
  }

  /** The BPE ids of one pre-tokenized piece. */
  encodePiece(piece: string, checkpoint?: () => void): readonly number[] {
    const cached = this.cache.get(piece);
    if (cached !== undefined) return cached;
    const ids = this.bpe(piece, checkpoint);
    if (piece.length <= CACHE_MAX_PIECE) {
      if (this.cache.size >= CACHE_ENTRIES) this.cache.clear();
      this.cache.set(piece, ids);
    }
    return ids;
  }

  private bpe(piece: string, checkpoint?: () => void): number[] {
    if (this.ignoreMerges) {
      const whole = this.vocab.get(this.sentencePiece ? piece : vocabString(piece));
      if (whole !== undefined) return [whole];
    }
    const ids = this.symbols(piece);
    const n = ids.length;
    if (n < 2) return ids;
    if (n <= 8) return this.mergeShort(ids);
    try {
      return mergeByRank(ids, (l, r) => this.rankOf(l, r), (rank) => this.mergeResult[rank], checkpoint);
    } catch (e) {
      if (e instanceof PieceTooLongError) throw new HfTokenizerError(e.message);
      throw e;
    }
  }

  /**
   * A piece's symbols before merging, as the library's BPE makes them: one
   * per byte (byte-level) or character (SentencePiece-style); one the
   * vocabulary lacks becomes its bytes' <0xNN> tokens (byte_fallback, all of
   * them there), else the unknown token (one for a run of them with
   * fuse_unk), else nothing. A pending unknown token is written when the
   * next known symbol comes, not before byte tokens: the library's order.
   */
  private symbols(piece: string): number[] {
    const out: number[] = [];
    let pendingUnk = false;
    const known = (id: number) => {
      if (pendingUnk) out.push(this.unkId as number);
      pendingUnk = false;
      out.push(id);
    };
    const unknown = (bytes: Uint8Array) => {
      if (this.byteFallback) {
        const ids = Array.from(bytes, (b) => this.fallbackIds[b]);
        if (ids.every((id) => id >= 0)) return void out.push(...ids);
      }
      if (this.unkId === null) return;
      if (pendingUnk && !this.fuseUnk) out.push(this.unkId);
      pendingUnk = true;
    };
    const encoder = new TextEncoder();
    if (this.sentencePiece) {
      for (const ch of piece) {
        const id = this.vocab.get(ch);
        if (id !== undefined) known(id);
        else unknown(encoder.encode(ch));
      }
    } else {
      for (const b of encoder.encode(piece)) {
        const id = this.byteIds[b];
        if (id >= 0) known(id);
        else unknown(EMPTY);
      }
    }
    if (pendingUnk) out.push(this.unkId as number);
    return out;
  }

  private rankOf(left: number, right: number): number {
    return this.mergeRank.get(left * this.pairBase + right) ?? -1;
  }

  /** Lowest rank first, leftmost on ties: quadratic, fastest for short pieces. */
  private mergeShort(ids: number[]): number[] {
    for (;;) {
      let best = -1;
      let at = -1;
      for (let i = 0; i + 1 < ids.length; i++) {
        const r = this.rankOf(ids[i], ids[i + 1]);
        if (r >= 0 && (best < 0 || r < best)) {
          best = r;
          at = i;
        }
      }
      if (best < 0) return ids;
      ids.splice(at, 2, this.mergeResult[best]);
    }
  }
}
