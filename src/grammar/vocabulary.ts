// The model's vocabulary as the grammar engine reads it: each token's bytes
// in GPT-2's byte-to-character encoding (byte-level BPE; the engine maps the
// characters back to bytes), so a token that holds part of a character
// still matches the bytes it stands for. GPT-2's ranks and a model's own BPE
// alike: both give every id's bytes (Tokenizer.tokenBytes).
import { BYTE_CHARS } from "../tokenizer/byte_chars.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";

/**
 * The encoded token of every id the tokenizer has; "" for the ids that only
 * end a value (the end ids) and for ids without bytes, which the engine
 * then never allows inside one.
 */
export function grammarVocabulary(tokenizer: Tokenizer, endIds: readonly number[]): string[] {
  const ends = new Set(endIds);
  const vocab: string[] = [];
  for (let id = 0; id < tokenizer.vocabSize; id++) {
    if (ends.has(id)) {
      vocab.push("");
      continue;
    }
    let s = "";
    for (const b of tokenizer.tokenBytes(id)) s += BYTE_CHARS[b];
    vocab.push(s);
  }
  return vocab;
}
