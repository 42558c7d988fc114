// Tokenizer fixtures for the tests of a model's own tokenizer
// (src/tokenizer/hf_bpe.ts): the committed tokenizer.json files and their
// reference ids from the Hugging Face `tokenizers` library
// (test/tokenizer/fixtures/make_tokenizers.py), GPT-2's tokenizer.json rebuilt from
// tiktoken's ranks, and a model file that carries a tokenizer.
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { readSafetensors, writeSafetensors } from "../../src/model/safetensors.ts";
import { BYTE_CHARS } from "../../src/tokenizer/byte_chars.ts";
import type { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { testTempDir } from "./models.ts";

const FIXTURES = resolve(import.meta.dir, "../tokenizer/fixtures");

export type FixtureName = "smol_style" | "split_style";

/** A committed tokenizer.json's text. */
export function fixtureJson(name: FixtureName): string {
  return readFileSync(join(FIXTURES, `${name}.json`), "utf8");
}

export interface Reference {
  corpus: string[];
  /** The library's encode(text).ids of each fixture for each corpus text. */
  ids: Record<FixtureName, number[][]>;
  /** Pre-tokenizer configurations and the library's pieces (byte-level characters) for each corpus text. */
  pre_tokenizers: Record<string, { config: unknown; pieces: string[][] }>;
}

export function reference(): Reference {
  return JSON.parse(readFileSync(join(FIXTURES, "reference.json"), "utf8")) as Reference;
}

/** Bytes as a byte-level vocabulary string. */
export function byteLevel(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += BYTE_CHARS[b];
  return s;
}

/**
 * GPT-2's tokenizer.json rebuilt from tiktoken's ranks (the tokenizer `gpt2`
 * holds): the vocabulary is the ranks in byte-level characters; each merge is
 * found the standard way, by running BPE on a token's bytes with only the
 * ranks below its own, which must leave exactly two parts. Merges are in the
 * order of the ranks they make, so merge order equals tiktoken's rank order.
 */
export function gpt2TokenizerJson(gpt2: Tokenizer): string {
  const eot = gpt2.endOfTextId;
  const latin1 = (b: Uint8Array) => String.fromCharCode(...b);
  const rank = new Map<string, number>();
  for (let id = 0; id < eot; id++) rank.set(latin1(gpt2.tokenBytes(id)), id);
  const vocab: Record<string, number> = {};
  const merges: [string, string][] = [];
  for (let id = 0; id < eot; id++) {
    const bytes = gpt2.tokenBytes(id);
    vocab[byteLevel(bytes)] = id;
    if (bytes.length < 2) continue;
    const parts = Array.from(bytes, (b) => String.fromCharCode(b));
    for (;;) {
      let best = -1;
      let at = -1;
      for (let i = 0; i + 1 < parts.length; i++) {
        const r = rank.get(parts[i] + parts[i + 1]);
        if (r !== undefined && r < id && (best < 0 || r < best)) {
          best = r;
          at = i;
        }
      }
      if (best < 0) break;
      parts.splice(at, 2, parts[at] + parts[at + 1]);
    }
    if (parts.length !== 2) throw new Error(`token ${id} does not split into two lower-ranked tokens`);
    const toLevel = (s: string) => byteLevel(Uint8Array.from(s, (c) => c.charCodeAt(0)));
    merges.push([toLevel(parts[0]), toLevel(parts[1])]);
  }
  const byteLevelStep = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
  return JSON.stringify({
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [{ id: eot, content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }],
    normalizer: null,
    pre_tokenizer: byteLevelStep,
    post_processor: byteLevelStep,
    decoder: byteLevelStep,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, vocab, merges },
  });
}

/**
 * The smol_style tokenizer with a Split pattern written to backtrack: RegExp
 * takes 2^n steps on n letters without a "b" and the square of a run of
 * spaces (the linear engine, src/tokenizer/linear_regex.ts, neither).
 */
export function backtrackingTokenizerJson(): string {
  const tok = JSON.parse(fixtureJson("smol_style"));
  tok.pre_tokenizer = {
    type: "Sequence",
    pretokenizers: [
      { type: "Split", pattern: { Regex: "(a+)+b|\\s*[\\r\\n]+" }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    ],
  };
  return JSON.stringify(tok);
}

/** The metadata that gives a model file the smol_style tokenizer with ChatML, as the importer writes it. */
export function bpeMetadata(overrides: Record<string, string> = {}): Record<string, string> {
  return {
    format_version: "2",
    tokenizer: "bpe",
    tokenizer_json: fixtureJson("smol_style"),
    chat_format: "chatml",
    eos_token_ids: "0,2",
    ...overrides,
  };
}

/** A copy of the model file `path` with `metadata` laid over its own (a key set to "" is removed). */
export function withMetadata(path: string, metadata: Record<string, string>, name: string): string {
  const file = readSafetensors(path);
  const meta: Record<string, string> = { ...file.metadata };
  for (const [k, v] of Object.entries(metadata)) {
    if (v === "") delete meta[k];
    else meta[k] = v;
  }
  const out = join(testTempDir(), name);
  const tensors = [...file.tensors].map(([tensorName, t]) => ({ name: tensorName, dtype: t.dtype, shape: t.shape, data: t.data }));
  writeSafetensors(out, meta, tensors);
  return out;
}
