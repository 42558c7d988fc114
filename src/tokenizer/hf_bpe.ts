// A model's own byte-level BPE tokenizer, read from the Hugging Face
// tokenizer.json text a model file carries (docs/tokenizers.md). Encoding
// gives the ids of the `tokenizers` library's `encode(text)` (what
// `tokenizer(text)` gives in transformers): added tokens (special or not,
// <|im_start|> included) are matched in the text first, the text between
// them is normalized, pre-tokenized (src/tokenizer/pretokenize.ts) and each piece
// BPE-merged by merge rank.
//
// Only the configurations byte-level BPE models use are accepted; any other
// normalizer, pre-tokenizer, model option, decoder or post-processor is
// refused at load with the reason (HfTokenizerError), so that no prompt is
// silently tokenized otherwise than the model was trained on.
//
// Decoding is bytes: a token's bytes undo the byte-to-character mapping
// (an added token's are its content's UTF-8), so a character split across
// tokens is put together by the caller's streaming UTF-8 decoder.

import type { LinearRegex } from "./linear_regex.ts";
import {
  byteLevelStage,
  digitsStage,
  gpt2Pattern,
  literalPattern,
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

/** The normalizer: none, NFC, or a Sequence of those. Returns whether text is NFC-normalized. */
function parseNormalizer(node: unknown, where = "normalizer"): boolean {
  if (node === null || node === undefined) return false;
  if (!isObject(node)) fail(where, "must be an object or null");
  const type = typeOf(node, where);
  if (type === "NFC") return true;
  if (type === "Sequence") {
    if (!Array.isArray(node.normalizers)) fail(where, "Sequence needs a normalizers array");
    return node.normalizers.map((n, i) => parseNormalizer(n, `${where}.normalizers[${i}]`)).some((x) => x);
  }
  return fail(where, `type ${JSON.stringify(type)} is not supported (only NFC, or a Sequence of NFC)`);
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

function checkPostProcessor(node: unknown, where = "post_processor"): void {
  if (node === null || node === undefined) return;
  if (!isObject(node)) fail(where, "must be an object or null");
  const type = typeOf(node, where);
  // ByteLevel's post-processing only trims offsets: the ids are unchanged.
  if (type === "ByteLevel") return;
  if (type === "Sequence" && Array.isArray(node.processors)) {
    node.processors.forEach((p, i) => checkPostProcessor(p, `${where}.processors[${i}]`));
    return;
  }
  fail(
    where,
    `type ${JSON.stringify(type)} is not supported: it adds tokens around every text; ` +
      "a model states its beginning-of-sequence token in the bos_token_id metadata instead",
  );
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

export class HfByteLevelBpe {
  /** One past the highest id of the vocabulary and the added tokens. */
  readonly vocabSize: number;
  /** Texts are NFC-normalized before pre-tokenization. */
  readonly nfc: boolean;
  /** A Split stage removes text (its ids then cover less than the text). */
  readonly removesText: boolean;
  /** The steps of its pre-tokenizers' patterns together: pre-tokenizing costs at most this many per character. */
  readonly patternSteps: number;
  /** Each id's bytes; holes for ids neither the vocabulary nor the added tokens have. */
  private readonly bytesById: (Uint8Array | undefined)[] = [];
  private readonly vocab: Map<string, number>;
  /** The vocabulary id of each byte's character, -1 when it has none. */
  private readonly byteIds = new Int32Array(256).fill(-1);
  /** Merge rank by pair key (left * pairBase + right). */
  private readonly mergeRank = new Map<number, number>();
  /** The id a merge of that rank makes. */
  private readonly mergeResult: Int32Array;
  private readonly pairBase: number;
  private readonly unkId: number | null;
  private readonly fuseUnk: boolean;
  private readonly ignoreMerges: boolean;
  private readonly stages: Stage[];
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
    this.nfc = parseNormalizer(root.normalizer);
    ({ stages: this.stages, removesText: this.removesText, patternSteps: this.patternSteps } = parsePreTokenizer(root.pre_tokenizer));
    checkDecoder(root.decoder);
    checkPostProcessor(root.post_processor);
    this.added = parseAddedTokens(root.added_tokens);

    const model = root.model;
    if (!isObject(model)) fail("model", "must be an object");
    if (typeOf(model, "model") !== "BPE") fail("model", `type ${JSON.stringify(model.type)} is not supported (only BPE)`);
    only(model, "dropout", [null, 0], "model");
    only(model, "continuing_subword_prefix", [null, ""], "model");
    only(model, "end_of_word_suffix", [null, ""], "model");
    only(model, "byte_fallback", [false], "model");
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
    for (let b = 0; b < 256; b++) this.byteIds[b] = this.vocab.get(BYTE_CHARS[b]) ?? -1;
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

    this.rawMatcher = alternation(this.added.filter((t) => !t.normalized || !this.nfc));
    this.normalizedMatcher = this.nfc ? alternation(this.added.filter((t) => t.normalized)) : null;
    for (const [s, id] of this.vocab) this.bytesById[id] = vocabStringBytes(s);
    for (const t of this.added) this.bytesById[t.id] = new TextEncoder().encode(t.content);
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

  /** The text cut into added tokens and pre-tokenized pieces, in order; `checkpoint` may throw to stop. */
  segments(text: string, checkpoint?: () => void): EncodedSegment[] {
    const out: EncodedSegment[] = [];
    for (const part of splitAdded(text, this.added, this.rawMatcher)) {
      if (typeof part === "number") {
        out.push({ id: part, text: "" });
        continue;
      }
      const normalized = this.nfc ? part.normalize("NFC") : part;
      for (const inner of splitAdded(normalized, this.added, this.normalizedMatcher)) {
        if (typeof inner === "number") out.push({ id: inner, text: "" });
        else out.push({ pieces: pretokenize(inner, this.stages, checkpoint) });
      }
    }
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
    const bytes = new TextEncoder().encode(piece);
    if (this.ignoreMerges) {
      let mapped = "";
      for (const b of bytes) mapped += BYTE_CHARS[b];
      const whole = this.vocab.get(mapped);
      if (whole !== undefined) return [whole];
    }
    // Symbols: one per byte, a byte without a vocabulary entry becomes the
    // unknown token or is dropped (the library's behaviour without unk).
    const ids: number[] = [];
    let lastUnk = false;
    for (const b of bytes) {
      const id = this.byteIds[b];
      if (id >= 0) {
        ids.push(id);
        lastUnk = false;
      } else if (this.unkId !== null && !(lastUnk && this.fuseUnk)) {
        ids.push(this.unkId);
        lastUnk = true;
      }
    }
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
