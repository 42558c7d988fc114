// GPT-2 byte-pair encoding via tiktoken's WASM build, bundled so nothing is
// ever downloaded and the same code works under `bun run` and inside the
// `bun build --compile` executable (there the package's default import
// cannot find its WASM: it must be imported as a file from tiktoken/lite and
// instantiated from its bytes).
//
// Choices:
// - Text is encoded as ordinary text: a literal "<|endoftext|>" in a prompt
//   is the 7 tokens of that string, never the special id 50256, so no client
//   text can inject an end-of-text marker. Clients that want the special id
//   send pre-tokenised ids.
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
import { TokenCountBound } from "./tokenizer_bound.ts";
import { type LimitedIds, TokenizerCancelledError, TokenizerClosedError, TokenizerPool } from "./tokenizer_pool.ts";

export const RANK_FILE_NAME = "gpt2.tiktoken";
export const END_OF_TEXT = "<|endoftext|>";

export class TokenizerError extends Error {}

export { TokenizerCancelledError, TokenizerClosedError };

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

// BPE time grows with the square of the longest run without spaces (64 KB of
// emoji take about 1 s), so only texts this short are encoded on the calling
// thread (a few ms at worst); longer ones go to the worker pool.
const INLINE_MAX_CHARS = 2048;
// Two workers: a long text in one leaves the other free. Each holds its own
// copy of the BPE tables.
const POOL_SIZE = 2;
// A run this long without whitespace is one pre-tokenized piece costing tens
// of ms or more of BPE (its square): such texts may take only one worker, so
// the other stays free for ordinary prompts.
const HEAVY_RUN_CHARS = 2048;
// Long texts are encoded in pieces of about this many characters, the count
// checked against the limit after each.
const CHUNK_CHARS = 4096;
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

function isWhitespace(c: number): boolean {
  return c === 0x20 || (c >= 0x09 && c <= 0x0d);
}

function longestRunWithoutSpace(text: string): number {
  let longest = 0;
  let run = 0;
  for (let i = 0; i < text.length; i++) {
    run = isWhitespace(text.charCodeAt(i)) ? 0 : run + 1;
    if (run > longest) longest = run;
  }
  return longest;
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
  lines.forEach((line, i) => {
    const m = /^([A-Za-z0-9+/]+={0,2}) ([0-9]+)$/.exec(line.trim());
    if (!m) throw new TokenizerError(`${path}:${i + 1}: expected "<base64 token bytes> <rank>", got ${JSON.stringify(line.slice(0, 80))}`);
    maxRank = Math.max(maxRank, Number(m[2]));
    known.add(Number(m[2]));
  });
  if (maxRank >= eot) throw new TokenizerError(`${path}: rank ${maxRank} collides with the special token ${END_OF_TEXT} (${eot})`);
  return { bpeRanks: lines.join("\n"), vocabSize: eot + 1, known, source: path };
}

// ---- tokenizer ----

export class Tokenizer {
  private readonly bytesById: (Uint8Array | undefined)[] = [];
  private longestToken: number | null = null;
  private countBound: TokenCountBound | null = null;
  private pool: TokenizerPool | null = null;
  private closed = false;

  private constructor(
    private readonly bpe: Tiktoken,
    /** Ids [0, vocabSize) have bytes; the special token is the last one. */
    readonly vocabSize: number,
    /** "bundled" or the path of the replacement rank file. */
    readonly source: string,
    /** What load() was given: the pool's workers load the same ranks. */
    private readonly tokenizerHome: string | null,
    /** Ids the rank table has (null: all below vocabSize). */
    private readonly known: Set<number> | null,
  ) {}

  /** Initialises the WASM once and builds the BPE tables (~100-250 ms): call at start-up. */
  static async load(tokenizerHome: string | null = null): Promise<Tokenizer> {
    const replacement = tokenizerHome ? join(tokenizerHome, RANK_FILE_NAME) : null;
    const ranks = replacement && existsSync(replacement) ? replacementRanks(replacement) : bundledRanks();
    await initWasm();
    let bpe: Tiktoken;
    try {
      bpe = new Tiktoken(ranks.bpeRanks, gpt2.special_tokens, gpt2.pat_str);
    } catch (e) {
      throw new TokenizerError(`cannot build the tokenizer from ${ranks.source}: ${(e as Error).message}`);
    }
    return new Tokenizer(bpe, ranks.vocabSize, ranks.source, tokenizerHome, ranks.known);
  }

  get endOfTextId(): number {
    return gpt2.special_tokens[END_OF_TEXT];
  }

  encode(text: string): number[] {
    return Array.from(this.bpe.encode_ordinary(text));
  }

  /**
   * encode(), stopped as soon as the text is known to have more than `limit`
   * tokens: refused at once when even the fewest tokens its bytes could make
   * are too many (src/tokenizer_bound.ts), else encoded chunk by chunk until
   * the ids so far plus the fewest the rest could make pass the limit.
   */
  encodeWithin(text: string, limit: number): LimitedIds {
    if (!Number.isFinite(limit)) return { ids: this.encode(text) };
    const rest = this.bound().suffixMinima(new TextEncoder().encode(text));
    if (rest[0] > limit) return { atLeast: rest[0] };
    const ids: number[] = [];
    let byteAt = 0;
    for (const chunk of pieceAlignedChunks(text, CHUNK_CHARS)) {
      for (const id of this.bpe.encode_ordinary(chunk)) ids.push(id);
      byteAt += Buffer.byteLength(chunk, "utf8");
      const atLeast = ids.length + rest[byteAt];
      if (atLeast > limit) return { atLeast };
    }
    return { ids };
  }

  /** The vocabulary as a trie, for the lower bound on a text's token count (built on first use: ~0.3 s). */
  bound(): TokenCountBound {
    if (this.countBound === null) {
      const tokens: Uint8Array[] = [];
      for (let id = 0; id < this.vocabSize; id++) if (id !== this.endOfTextId) tokens.push(this.tokenBytes(id));
      this.countBound = TokenCountBound.build(tokens);
    }
    return this.countBound;
  }

  /**
   * encode() without holding up the event loop: a text longer than
   * INLINE_MAX_CHARS is encoded by a worker thread (the same ranks, so the
   * same ids), within `limit` (encodeWithin: TokenLimitExceeded beyond it)
   * and cancelled when `signal` aborts (TokenizerCancelledError). A text with
   * a long run without spaces may take only one of the workers. Rejects with
   * TokenizerClosedError after close().
   */
  async encodeAsync(text: string, opts: EncodeOptions = {}): Promise<number[]> {
    if (this.closed) throw new TokenizerClosedError("the tokenizer is closed");
    if (text.length <= INLINE_MAX_CHARS) return this.encode(text);
    this.pool ??= new TokenizerPool(this.tokenizerHome, POOL_SIZE);
    const limit = opts.limit ?? Number.POSITIVE_INFINITY;
    const heavy = longestRunWithoutSpace(text) > HEAVY_RUN_CHARS;
    const out = await this.pool.encode(text, { limit, heavy, signal: opts.signal });
    if ("atLeast" in out) throw new TokenLimitExceeded(out.atLeast, limit);
    return out.ids;
  }

  /** Stops the worker threads; encodes in progress there reject with TokenizerClosedError. */
  close(): void {
    this.closed = true;
    this.pool?.close();
  }

  /**
   * Bytes of the longest token text can encode to (128 for GPT-2's ranks): a
   * text of n tokens is never longer than n times this. Computed once, on
   * first use; the special token is left out (text never encodes to it).
   */
  get maxTokenBytes(): number {
    if (this.longestToken === null) {
      let longest = 0;
      for (let id = 0; id < this.vocabSize; id++)
        if (id !== this.endOfTextId) longest = Math.max(longest, this.tokenBytes(id).length);
      this.longestToken = longest;
    }
    return this.longestToken;
  }

  /** Raw bytes of one token: a token may hold part of a UTF-8 character. */
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

  decodeBytes(ids: readonly number[]): Uint8Array {
    const parts = ids.map((id) => this.tokenBytes(id));
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  /** Whole-sequence decode; invalid or incomplete UTF-8 becomes U+FFFD. */
  decode(ids: readonly number[]): string {
    return utf8Decoder().decode(this.decodeBytes(ids));
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
 * Concatenating every push() and the flush() equals Tokenizer.decode(all ids).
 */
export class IncrementalDetokenizer {
  private readonly decoder = utf8Decoder();

  constructor(private readonly tokenizer: Tokenizer) {}

  push(id: number): string {
    return this.decoder.decode(this.tokenizer.tokenBytes(id), { stream: true });
  }

  flush(): string {
    return this.decoder.decode();
  }
}
