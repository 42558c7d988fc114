// Text <-> token ids for every endpoint. One Tokenizer class holds what all
// tokenizers share (the length bounds, encoding long texts in worker
// threads, byte-level decoding) over an Encoding, the part that differs:
// - GPT-2's byte-pair encoding (the default: a model file without its own
//   tokenizer), via tiktoken's WASM build, bundled so nothing is ever
//   downloaded and the same code works under `bun run` and inside the
//   `bun build --compile` executable (there the package's default import
//   cannot find its WASM: it must be imported as a file from tiktoken/lite and
//   instantiated from its bytes);
// - a model's own BPE (byte-level, or SentencePiece-style with byte
//   fallback) from the Hugging Face tokenizer.json its file carries
//   (src/tokenizer/hf_bpe.ts, docs/tokenizers.md).
// The tokenizer also carries the model's text conventions: the ids that end
// generation, the id put before every text prompt, the chat format.
//
// GPT-2 choices:
// - Text is encoded as ordinary text: a literal "<|endoftext|>" in a prompt
//   is the 7 tokens of that string, never the special id 50256, so no client
//   text can inject an end-of-text marker. Clients that want the special id
//   send pre-tokenised ids. (A model's own tokenizer matches its added tokens
//   in text, as its `tokenizers` library does: its chat template needs that.)
// - Ids the rank table does not know (a model vocabulary padded beyond
//   50257) decode to no bytes: they have no text.
// - TOKENIZER_HOME: if `$TOKENIZER_HOME/gpt2.tiktoken` exists (tiktoken's rank
//   file format: one `base64-bytes rank` line per token) it replaces the
//   bundled ranks; the special token <|endoftext|> keeps id 50256.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import wasmFile from "tiktoken/lite/tiktoken_bg.wasm" with { type: "file" };
import gpt2 from "tiktoken/encoders/gpt2.json" with { type: "json" };
import { init, Tiktoken } from "tiktoken/lite/init";
import { TokenCountBound } from "./count_bound.ts";
import { HfBpe, HfTokenizerError } from "./hf_bpe.ts";
import { isWhiteSpace } from "./pretokenize.ts";
import { RankBpe } from "./rank_bpe.ts";
import { type LimitedIds, TokenizerCancelledError, TokenizerClosedError, TokenizerPool, type TokenizerSpec } from "./pool.ts";

export const RANK_FILE_NAME = "gpt2.tiktoken";
export const END_OF_TEXT = "<|endoftext|>";

export class TokenizerError extends Error {}

export { TokenizerCancelledError, TokenizerClosedError, type TokenizerSpec };

/** A text that encodes to more tokens than the limit it was encoded under: it has at least `atLeast`. */
export class TokenLimitExceeded extends Error {
  constructor(
    readonly atLeast: number,
    readonly limit: number,
  ) {
    super(`at least ${atLeast} tokens, more than ${limit}`);
  }
}

export interface EncodeOptions {
  /** Stop as soon as the text is known to have more tokens than this: TokenLimitExceeded (long texts only). */
  limit?: number;
  /** Aborting it (the client went away) stops the encode: TokenizerCancelledError. */
  signal?: AbortSignal;
}

const EMPTY = new Uint8Array(0);
const SPACE = 0x20;

// Texts this short are encoded on the calling thread (a few ms at worst,
// tiktoken's square of a 2048-character run included); longer ones go to the
// worker pool. A model's patterns cost up to their size per character: a
// text is kept inline only while that makes at most INLINE_PATTERN_STEPS.
const INLINE_MAX_CHARS = 2048;
const INLINE_PATTERN_STEPS = 2048 * 128;
// Two workers: a long text in one leaves the other free. Each holds its own
// copy of the BPE tables.
const POOL_SIZE = 2;
// A text this long takes tens of ms to encode: such texts may take only one
// worker, so the other stays free for ordinary prompts.
const HEAVY_CHARS = 16_384;
// Long texts are encoded in pieces of about this many characters (steps of
// about this many bytes), the count checked against the limit after each.
const CHUNK_CHARS = 4096;
const STEP_BYTES = 4096;
// The bound on a long prompt's tokens is computed on the event loop this
// many bytes at a time (about 2 ms each), so other requests go on meanwhile.
const BOUND_SLICE_BYTES = 16_384;
// tiktoken merges a piece in the square of its length: a chunk with a piece
// longer than this (UTF-16 units, at most 3 bytes each), or a chunk longer
// than TIKTOKEN_MAX_CHUNK (one WASM call cannot be stopped midway), is
// encoded by src/tokenizer/rank_bpe.ts instead, in n log n.
const TIKTOKEN_MAX_PIECE = 128;
const TIKTOKEN_MAX_CHUNK = 4 * CHUNK_CHARS;
// A boundary of GPT-2's pre-tokenizer whatever the fine print of its regex:
// before a space that follows a printable ASCII character and precedes an
// ASCII letter (that space starts the next word's piece, " word"). Encoding
// the text cut there gives exactly the ids of encoding it whole.
const PIECE_BOUNDARY = /(?<=[!-~]) (?=[A-Za-z])/g;

/** `text` cut at pre-tokenizer boundaries into pieces of about `size` characters (longer where no boundary comes). */
function* pieceAlignedChunks(text: string, size: number): Generator<string> {
  const boundary = new RegExp(PIECE_BOUNDARY);
  let start = 0;
  while (text.length - start > size) {
    boundary.lastIndex = start + size;
    const m = boundary.exec(text);
    if (m === null) break;
    yield text.slice(start, m.index);
    start = m.index;
  }
  yield text.slice(start);
}

/**
 * A bound on the longest piece GPT-2's pattern cuts from `text` (UTF-16
 * units): a piece is a run of White_Space characters, or of others after at
 * most one space.
 */
function longestPiece(text: string): number {
  let longest = 0;
  let run = 0;
  let white = false;
  for (let i = 0; i < text.length; i++) {
    const w = isWhiteSpace(text.charCodeAt(i));
    run = w === white ? run + 1 : 1;
    white = w;
    if (run > longest) longest = run;
  }
  return longest + 1;
}

/** tiktoken costs little on `chunk`: it is short, or no piece of it is long. */
function tiktokenFits(chunk: string): boolean {
  return chunk.length <= INLINE_MAX_CHARS || (chunk.length <= TIKTOKEN_MAX_CHUNK && longestPiece(chunk) <= TIKTOKEN_MAX_PIECE);
}

// A `type: "file"` import is the file's path (inside a compiled binary, a path
// into its embedded files); tiktoken's typings describe the module instead.
const WASM_PATH = wasmFile as unknown as string;

// ---- one-time WASM initialisation ----

let wasmReady: Promise<void> | null = null;

function initWasm(): Promise<void> {
  wasmReady ??= (async () => {
    const bytes = await Bun.file(WASM_PATH).arrayBuffer();
    await init((imports) => WebAssembly.instantiate(bytes, imports));
  })();
  return wasmReady;
}

// ---- rank sources ----

interface Ranks {
  bpeRanks: string;
  vocabSize: number; // one past the highest rank or special id
  /** Ids with bytes; null when every id below vocabSize has them. */
  known: Set<number> | null;
  source: string;
}

function bundledRanks(): Ranks {
  return { bpeRanks: gpt2.bpe_ranks, vocabSize: gpt2.explicit_n_vocab, known: null, source: "bundled" };
}

// tiktoken's WASM aborts (and may be left unusable) on a malformed table, so
// a replacement file is checked line by line here first.
function replacementRanks(path: string): Ranks {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new TokenizerError(`cannot read tokenizer rank file ${path}: ${(e as Error).message}`);
  }
  const lines = text.split("\n").filter((l) => l.trim() !== "");
  if (lines.length === 0) throw new TokenizerError(`tokenizer rank file ${path} is empty`);
  let maxRank = -1;
  const eot = gpt2.special_tokens[END_OF_TEXT];
  const known = new Set([eot]);
  const singleBytes = new Set<number>();
  lines.forEach((line, i) => {
    const m = /^([A-Za-z0-9+/]+={0,2}) ([0-9]+)$/.exec(line.trim());
    if (!m) throw new TokenizerError(`${path}:${i + 1}: expected "<base64 token bytes> <rank>", got ${JSON.stringify(line.slice(0, 80))}`);
    maxRank = Math.max(maxRank, Number(m[2]));
    known.add(Number(m[2]));
    const bytes = Buffer.from(m[1], "base64");
    if (bytes.length === 1) singleBytes.add(bytes[0]);
  });
  if (maxRank >= eot) throw new TokenizerError(`${path}: rank ${maxRank} collides with the special token ${END_OF_TEXT} (${eot})`);
  // Every text is merged up from single bytes: one without a rank could not be encoded.
  const missing = Array.from({ length: 256 }, (_, b) => b).find((b) => !singleBytes.has(b));
  if (missing !== undefined) throw new TokenizerError(`${path}: the single byte 0x${missing.toString(16).padStart(2, "0")} has no rank (every byte needs one)`);
  return { bpeRanks: lines.join("\n"), vocabSize: eot + 1, known, source: path };
}

// ---- encodings ----

/** One step of an encode within a limit: the ids it added and the offset in `tiled` bytes it reached. */
export interface EncodeStep {
  ids: Iterable<number>;
  end: number;
}

/** What differs between tokenizers: ids <-> bytes. */
export interface Encoding {
  /** Ids [0, vocabSize) may have bytes; ids past it never do. */
  readonly vocabSize: number;
  /** "bundled", a rank file's path, or "model" (the model file's own tokenizer). */
  readonly source: string;
  /**
   * How many bytes of prompt text one byte of a token can stand for at most:
   * 1, more where normalization shortens text, Infinity where pre-tokenization
   * removes text (no length bound from bytes).
   */
  readonly textBytesPerTokenByte: number;
  /** Raw bytes of one token; none for an id the encoding lacks. */
  tokenBytes(id: number): Uint8Array;
  /** True for the ids text can encode to (the length bounds count only those). */
  isTextToken(id: number): boolean;
  /** The id of the added token whose content text matches as a whole ("<|im_start|>"), if any. */
  addedTokenId(content: string): number | undefined;
  /** A decoded text loses one leading space (SentencePiece's decoder: the space its pre-tokenizer put first). */
  readonly stripsLeadingSpace: boolean;
  /** `tiled` (below) is always the text's UTF-8: a bound over it can be computed before any encoding. */
  readonly tilesText: boolean;
  encode(text: string): number[];
  /**
   * The encode in steps, for stopping at a limit: `tiled` are the bytes the
   * ids cover in order (a token count bound is computed over them), and each
   * step's ids end at byte `end` of them. The steps' ids together equal
   * encode(text). `checkpoint` is called often; it may throw to stop.
   */
  steps(text: string, checkpoint?: () => void): { tiled: Uint8Array; steps: Iterable<EncodeStep> };
  /** Builds what encoding long texts needs, ahead of the first one. */
  prepare(): void;
  /** The longest text encoded on the calling thread. */
  readonly inlineMaxChars: number;
}

class Gpt2Encoding implements Encoding {
  private readonly bytesById: (Uint8Array | undefined)[] = [];
  private rankBpe: RankBpe | null = null;
  readonly textBytesPerTokenByte = 1;
  readonly tilesText = true;
  readonly stripsLeadingSpace = false;
  readonly inlineMaxChars = INLINE_MAX_CHARS;

  constructor(
    private readonly bpe: Tiktoken,
    readonly vocabSize: number,
    readonly source: string,
    /** Ids the rank table has (null: all below vocabSize). */
    private readonly known: Set<number> | null,
  ) {}

  isTextToken(id: number): boolean {
    return id !== gpt2.special_tokens[END_OF_TEXT];
  }

  /** Text is always ordinary text here: no token is matched whole. */
  addedTokenId(): undefined {
    return undefined;
  }

  encode(text: string): number[] {
    const ids: number[] = [];
    for (const chunk of this.chunks(text)) for (const id of chunk.ids) ids.push(id);
    return ids;
  }

  steps(text: string, checkpoint?: () => void): { tiled: Uint8Array; steps: Iterable<EncodeStep> } {
    const chunks = this.chunks(text, checkpoint);
    function* steps(): Generator<EncodeStep> {
      let end = 0;
      for (const chunk of chunks) {
        end += chunk.bytes;
        yield { ids: chunk.ids, end };
      }
    }
    return { tiled: new TextEncoder().encode(text), steps: steps() };
  }

  prepare(): void {
    this.ranked();
  }

  /** The text's ids a chunk at a time, each with how many bytes of the text it covers. */
  private *chunks(text: string, checkpoint?: () => void): Generator<{ ids: Iterable<number>; bytes: number }> {
    for (const chunk of pieceAlignedChunks(text, CHUNK_CHARS)) {
      if (tiktokenFits(chunk)) {
        yield { ids: this.bpe.encode_ordinary(chunk), bytes: Buffer.byteLength(chunk, "utf8") };
        continue;
      }
      const ranked = this.ranked();
      let ids: number[] = [];
      let bytes = 0;
      for (const piece of ranked.pieces(chunk, checkpoint)) {
        for (const id of ranked.encodePiece(piece, checkpoint)) ids.push(id);
        bytes += Buffer.byteLength(piece, "utf8");
        if (bytes >= STEP_BYTES) {
          yield { ids, bytes };
          ids = [];
          bytes = 0;
        }
      }
      if (bytes > 0) yield { ids, bytes };
    }
  }

  /** GPT-2's encoding for long pieces, built on first use (~50 ms; each worker builds it at start). */
  private ranked(): RankBpe {
    this.rankBpe ??= new RankBpe((rank) => this.tokenBytes(rank), gpt2.special_tokens[END_OF_TEXT]);
    return this.rankBpe;
  }

  tokenBytes(id: number): Uint8Array {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) return EMPTY;
    let bytes = this.bytesById[id];
    if (bytes === undefined) {
      // Never ask the WASM for an id it lacks (a gap in a replacement rank
      // file): its error escapes mid-call and leaves its memory corrupt.
      bytes = this.known === null || this.known.has(id) ? this.bpe.decode_single_token_bytes(id) : EMPTY;
      this.bytesById[id] = bytes;
    }
    return bytes;
  }
}

/** A model's own BPE as an Encoding. */
class HfEncoding implements Encoding {
  readonly source = "model";
  readonly tilesText = false;

  constructor(private readonly bpe: HfBpe) {}

  get vocabSize(): number {
    return this.bpe.vocabSize;
  }

  get stripsLeadingSpace(): boolean {
    return this.bpe.stripsLeadingSpace;
  }

  get inlineMaxChars(): number {
    return Math.min(INLINE_MAX_CHARS, Math.floor(INLINE_PATTERN_STEPS / Math.max(1, this.bpe.patternSteps)));
  }

  get textBytesPerTokenByte(): number {
    // NFC composes at most three UTF-8 bytes into one (Hangul jamo L V T into a syllable).
    return this.bpe.removesText ? Number.POSITIVE_INFINITY : this.bpe.nfc ? 3 : 1;
  }

  tokenBytes(id: number): Uint8Array {
    return this.bpe.tokenBytes(id);
  }

  /** Added tokens are matched in text, so every id may come from text. */
  isTextToken(): boolean {
    return true;
  }

  addedTokenId(content: string): number | undefined {
    return this.bpe.addedTokenId(content);
  }

  encode(text: string): number[] {
    return this.bpe.encode(text);
  }

  prepare(): void {}

  steps(text: string, checkpoint?: () => void): { tiled: Uint8Array; steps: Iterable<EncodeStep> } {
    // The units the ids cover: added tokens and pre-tokenized pieces (these
    // may hold a prefix space the text lacks, and lack removed text), as
    // the bytes their tokens decode to.
    const units: (number | string)[] = [];
    for (const s of this.bpe.segments(text, checkpoint)) {
      if ("id" in s) units.push(s.id);
      else for (const piece of s.pieces) units.push(piece);
    }
    const unitBytes = units.map((u) => (typeof u === "number" ? this.bpe.tokenBytes(u) : this.bpe.pieceBytes(u)));
    const tiled = new Uint8Array(unitBytes.reduce((n, b) => n + b.length, 0));
    let at = 0;
    for (const b of unitBytes) {
      tiled.set(b, at);
      at += b.length;
    }
    const bpe = this.bpe;
    function* steps(): Generator<EncodeStep> {
      let ids: number[] = [];
      let end = 0;
      let since = 0;
      for (let i = 0; i < units.length; i++) {
        const u = units[i];
        if (typeof u === "number") ids.push(u);
        else for (const id of bpe.encodePiece(u, checkpoint)) ids.push(id);
        end += unitBytes[i].length;
        since += unitBytes[i].length;
        if (since >= STEP_BYTES || i === units.length - 1) {
          yield { ids, end };
          ids = [];
          since = 0;
        }
      }
    }
    return { tiled, steps: steps() };
  }
}

// ---- what a tokenizer is built from ----

/** How a model without a chat template renders chat messages as one prompt (src/text/chat.ts). */
export type ChatFormat = "plain" | "chatml";

/** tokenizer_config.json's special tokens by name, as a chat template reads them: "<|endoftext|>", or a list (additional_special_tokens). */
export type SpecialTokens = Record<string, string | string[]>;

/** A model's text conventions beside its tokenizer. */
export interface TextConventions {
  /** Ids that end generation (GPT-2: <|endoftext|>). */
  eosIds: readonly number[];
  /** Put before every text prompt when set. */
  bosId: number | null;
  /** The rendering of chat messages when the model has no chat template. */
  chatFormat: ChatFormat;
  /** The model's own chat template (Jinja), run for chat prompts (src/text/chat.ts); null: none. */
  chatTemplate: string | null;
  /** The special tokens the template reads. */
  specialTokens: SpecialTokens;
}

export const GPT2_CONVENTIONS: TextConventions = {
  eosIds: [gpt2.special_tokens[END_OF_TEXT]],
  bosId: null,
  chatFormat: "plain",
  chatTemplate: null,
  specialTokens: {},
};

async function loadEncoding(spec: TokenizerSpec): Promise<Encoding> {
  if (spec.kind === "bpe") {
    try {
      return new HfEncoding(new HfBpe(spec.json));
    } catch (e) {
      if (e instanceof HfTokenizerError) throw new TokenizerError(e.message);
      throw e;
    }
  }
  const replacement = spec.tokenizerHome ? join(spec.tokenizerHome, RANK_FILE_NAME) : null;
  const ranks = replacement && existsSync(replacement) ? replacementRanks(replacement) : bundledRanks();
  await initWasm();
  let bpe: Tiktoken;
  try {
    bpe = new Tiktoken(ranks.bpeRanks, gpt2.special_tokens, gpt2.pat_str);
  } catch (e) {
    throw new TokenizerError(`cannot build the tokenizer from ${ranks.source}: ${(e as Error).message}`);
  }
  return new Gpt2Encoding(bpe, ranks.vocabSize, ranks.source, ranks.known);
}

// ---- tokenizer ----

export class Tokenizer {
  private longestToken: number | null = null;
  private countBound: TokenCountBound | null = null;
  private pool: TokenizerPool | null = null;
  private closed = false;

  private constructor(
    private readonly encoding: Encoding,
    /** What the pool's workers build their own copy from. */
    readonly spec: TokenizerSpec,
    readonly conventions: TextConventions,
  ) {}

  /** GPT-2's tokenizer: initialises the WASM once and builds the BPE tables (~100-250 ms): call at start-up. */
  static async load(tokenizerHome: string | null = null): Promise<Tokenizer> {
    return Tokenizer.fromSpec({ kind: "gpt2", tokenizerHome }, GPT2_CONVENTIONS);
  }

  /** The tokenizer `spec` describes; TokenizerError when it cannot be built (a refused tokenizer.json). */
  static async fromSpec(spec: TokenizerSpec, conventions: TextConventions = GPT2_CONVENTIONS): Promise<Tokenizer> {
    return new Tokenizer(await loadEncoding(spec), spec, conventions);
  }

  /** Ids [0, vocabSize) may have bytes. */
  get vocabSize(): number {
    return this.encoding.vocabSize;
  }

  /** "bundled" or the path of the replacement rank file (GPT-2), "model" for a model's own tokenizer. */
  get source(): string {
    return this.encoding.source;
  }

  /** The first end-of-sequence id (GPT-2: <|endoftext|>, 50256). */
  get endOfTextId(): number {
    return this.conventions.eosIds[0];
  }

  /** The id text containing `content` gets for it, when `content` is an added token ("<|im_start|>") text matches whole. */
  addedTokenId(content: string): number | undefined {
    return this.encoding.addedTokenId(content);
  }

  encode(text: string): number[] {
    return this.encoding.encode(text);
  }

  /**
   * encode(), stopped as soon as the text is known to have more than `limit`
   * tokens: refused at once when even the fewest tokens its bytes could make
   * are too many (src/tokenizer/count_bound.ts; `rest` when already computed
   * over the text's UTF-8), else encoded step by step until the ids so far
   * plus the fewest the rest could make pass the limit. `checkpoint` is
   * called often; it may throw to stop the encode.
   */
  encodeWithin(text: string, limit: number, opts: { checkpoint?: () => void; rest?: Int32Array } = {}): LimitedIds {
    const { tiled, steps } = this.encoding.steps(text, opts.checkpoint);
    const rest = Number.isFinite(limit) ? (opts.rest ?? this.bound().suffixMinima(tiled)) : null;
    if (rest !== null && rest[0] > limit) return { atLeast: rest[0] };
    const ids: number[] = [];
    for (const step of steps) {
      opts.checkpoint?.();
      for (const id of step.ids) ids.push(id);
      const atLeast = rest === null ? 0 : ids.length + rest[step.end];
      if (atLeast > limit) return { atLeast };
    }
    return { ids };
  }

  /** The vocabulary as a trie, for the lower bound on a text's token count (built on first use: ~0.3 s). */
  bound(): TokenCountBound {
    if (this.countBound === null) {
      const tokens: Uint8Array[] = [];
      for (let id = 0; id < this.vocabSize; id++) if (this.encoding.isTextToken(id)) tokens.push(this.tokenBytes(id));
      this.countBound = TokenCountBound.build(tokens);
    }
    return this.countBound;
  }

  /** Builds what long texts need (the count bound's trie, GPT-2's long-piece tables) ahead of the first. */
  prepare(): void {
    this.bound();
    this.encoding.prepare();
  }

  /**
   * encode() without holding up the event loop: a text longer than the
   * encoding's inlineMaxChars is encoded by a worker thread (the same tokenizer, so
   * the same ids), within `limit` (encodeWithin: TokenLimitExceeded beyond
   * it) and cancelled when `signal` aborts (TokenizerCancelledError). A text
   * whose count bound is over `limit` (GPT-2's, computed here a slice per
   * turn of the event loop; a model's tokenizer must pre-tokenize first, so
   * there the bound from its bytes alone) is refused before it reaches a
   * worker. A long text may
   * take only one of the workers. Rejects with TokenizerClosedError after
   * close().
   */
  async encodeAsync(text: string, opts: EncodeOptions = {}): Promise<number[]> {
    if (this.closed) throw new TokenizerClosedError("the tokenizer is closed");
    if (text.length <= this.encoding.inlineMaxChars) return this.encode(text);
    const limit = opts.limit ?? Number.POSITIVE_INFINITY;
    let rest: Int32Array | undefined;
    if (Number.isFinite(limit) && this.encoding.tilesText) {
      rest = await this.boundInSlices(text, opts.signal);
      if (rest[0] > limit) throw new TokenLimitExceeded(rest[0], limit);
    } else {
      // No token stands for more than maxTokenBytes of text: a bound without encoding.
      const fewest = Math.ceil(Buffer.byteLength(text, "utf8") / this.maxTokenBytes);
      if (fewest > limit) throw new TokenLimitExceeded(fewest, limit);
    }
    this.pool ??= new TokenizerPool(this.spec, POOL_SIZE);
    const out = await this.pool.encode(text, { limit, heavy: text.length > HEAVY_CHARS, signal: opts.signal, rest });
    if ("atLeast" in out) throw new TokenLimitExceeded(out.atLeast, limit);
    return out.ids;
  }

  /** The count bound's suffix minima over the text's UTF-8, a slice per turn of the event loop. */
  private async boundInSlices(text: string, signal: AbortSignal | undefined): Promise<Int32Array> {
    const bytes = new TextEncoder().encode(text);
    const minima = this.bound().minima(bytes);
    for (let from = bytes.length; from > 0; ) {
      from = Math.max(0, from - BOUND_SLICE_BYTES);
      minima.fillTo(from);
      if (from > 0) await new Promise((resolve) => setImmediate(resolve));
      if (signal?.aborted) throw new TokenizerCancelledError("the encode was cancelled");
      if (this.closed) throw new TokenizerClosedError("the tokenizer was closed");
    }
    return minima.fewest;
  }

  /** Stops the worker threads; encodes in progress there reject with TokenizerClosedError. */
  close(): void {
    this.closed = true;
    this.pool?.close();
  }

  /**
   * Bytes of prompt text one token can stand for at most (128 for GPT-2's
   * ranks): a text of n tokens is never longer than n times this (Infinity
   * when the tokenizer removes text). Computed once, on first use; ids text
   * never encodes to are left out.
   */
  get maxTokenBytes(): number {
    if (this.longestToken === null) {
      let longest = 0;
      for (let id = 0; id < this.vocabSize; id++)
        if (this.encoding.isTextToken(id)) longest = Math.max(longest, this.tokenBytes(id).length);
      this.longestToken = longest * this.encoding.textBytesPerTokenByte;
    }
    return this.longestToken;
  }

  /** Raw bytes of one token: a token may hold part of a UTF-8 character. */
  tokenBytes(id: number): Uint8Array {
    return this.encoding.tokenBytes(id);
  }

  private readonly wholeTexts: (string | null)[] = [];

  /**
   * The token's text when its bytes end on a character boundary (a decoder
   * fed them holds nothing back), else null. Made once per id: streaming
   * decodes most tokens through this instead of a decoder call.
   */
  wholeText(id: number): string | null {
    const known = this.wholeTexts[id];
    if (known !== undefined) return known;
    const decoder = utf8Decoder();
    const text = decoder.decode(this.tokenBytes(id), { stream: true });
    const whole = decoder.decode() === "" ? text : null;
    if (Number.isInteger(id) && id >= 0 && id < this.vocabSize) this.wholeTexts[id] = whole;
    return whole;
  }

  /** A decoded text loses one leading space (SentencePiece's decoder). */
  get stripsLeadingSpace(): boolean {
    return this.encoding.stripsLeadingSpace;
  }

  /** The bytes of decoding `ids`: the tokens' bytes, less one leading space where the decoder strips it. */
  decodeBytes(ids: readonly number[]): Uint8Array {
    const parts = ids.map((id) => this.tokenBytes(id));
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return this.stripsLeadingSpace && out[0] === SPACE ? out.subarray(1) : out;
  }

  /** Whole-sequence decode; invalid or incomplete UTF-8 becomes U+FFFD. */
  decode(ids: readonly number[]): string {
    return utf8Decoder().decode(this.decodeBytes(ids));
  }

  /** One token's bytes decoded on their own (no space stripped): a token's text as logprobs show it. */
  tokenText(id: number): string {
    return utf8Decoder().decode(this.tokenBytes(id));
  }
}

// ignoreBOM keeps a generated U+FEFF instead of silently dropping it.
function utf8Decoder(): TextDecoder {
  return new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
}

/**
 * Turns a token stream into text without ever splitting a character: push()
 * returns only the characters its token completed (a multi-byte character
 * split across tokens appears once its last byte arrives), flush() returns
 * the held tail with U+FFFD for bytes that never formed a character.
 * Concatenating every push() and the flush() equals Tokenizer.decode(all ids)
 * for a stream that starts the sequence (the leading space a SentencePiece
 * decoder strips included); a stream that continues one (a reply after its
 * prompt) keeps its first token's space, as the text it adds to the prompt.
 */
export class IncrementalDetokenizer {
  private readonly decoder = utf8Decoder();
  /** The bytes the decoder holds: the start of a character a later token completes. */
  private held: Uint8Array = EMPTY;
  /** No byte has come yet, the stream starts the sequence and the decoder strips a leading space. */
  private atStart: boolean;

  constructor(
    private readonly tokenizer: Tokenizer,
    startsSequence = false,
  ) {
    this.atStart = startsSequence && tokenizer.stripsLeadingSpace;
  }

  push(id: number): string {
    let bytes = this.tokenizer.tokenBytes(id);
    if (this.atStart && bytes.length > 0) {
      this.atStart = false;
      if (bytes[0] === SPACE) bytes = bytes.subarray(1);
    } else if (this.held.length === 0) {
      const whole = this.tokenizer.wholeText(id);
      if (whole !== null) return whole;
    }
    const text = this.decoder.decode(bytes, { stream: true });
    this.held = incompleteTail(concatBytes(this.held, bytes));
    return text;
  }

  flush(): string {
    this.held = EMPTY;
    return this.decoder.decode();
  }
}

function concatBytes(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/**
 * The bytes a streaming UTF-8 decoder holds after `bytes`: the suffix that
 * starts a character and does not finish it (at most 3 bytes; a decoder
 * always begins a new character at a lead byte, so such a suffix is never
 * part of an earlier one).
 */
function incompleteTail(bytes: Uint8Array): Uint8Array {
  for (let k = Math.min(3, bytes.length); k > 0; k--) {
    const suffix = bytes.subarray(bytes.length - k);
    if (utf8Decoder().decode(suffix, { stream: true }) === "") return suffix.slice();
  }
  return EMPTY;
}
