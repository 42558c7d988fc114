// Log-probabilities in each family's response shape (docs/openai-compat.md).
// The engine hands over ids and numbers (src/engine/logprobs.ts); this is
// where they get token texts, bytes and text offsets.
//
// A token's text is its bytes decoded on their own, so a token holding part
// of a UTF-8 character reads as U+FFFD while its `bytes` are exact (what
// OpenAI does).
import type { TokenLogprob } from "../engine/logprobs.ts";
import { IncrementalDetokenizer, type Tokenizer } from "../tokenizer/tokenizer.ts";
import type { ChatLogprobs, CompletionLogprobs, NativeLogprob } from "../wire/responses.ts";

const tokenText = (tok: Tokenizer, id: number): string => tok.tokenText(id);
const tokenBytes = (tok: Tokenizer, id: number): number[] => Array.from(tok.tokenBytes(id));

/** Characters as Python counts them (code points), so text_offset indexes the text as OpenAI's clients do. */
function codePoints(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0xdc00 || c > 0xdfff) n++; // a low surrogate finishes a pair already counted
  }
  return n;
}

// ---- chat completions: choices[].logprobs = {content: [...], refusal: null} ----

export function chatLogprobs(tok: Tokenizer, entries: readonly TokenLogprob[]): ChatLogprobs {
  const item = (id: number, logprob: number) => ({ token: tokenText(tok, id), logprob, bytes: tokenBytes(tok, id) });
  return {
    content: entries.map((e) => ({ ...item(e.id, e.logprob), top_logprobs: e.top.map((t) => item(t.id, t.logprob)) })),
    refusal: null,
  };
}

export function joinChatLogprobs(parts: readonly ChatLogprobs[]): ChatLogprobs {
  return { content: parts.flatMap((p) => p.content), refusal: null };
}

// ---- text completions: choices[].logprobs = {tokens, token_logprobs, top_logprobs, text_offset} ----

/**
 * Builds the sections of one response in token order, tracking where each
 * token's text starts: a token's offset is the length of the text whole
 * characters before it make (a character split over tokens starts where its
 * first token does). Prompt tokens (echo) count from 0, generated ones from
 * the end of the echoed text.
 */
export class CompletionLogprobWriter {
  private readonly prompt = new OffsetCursor(0, true);
  private readonly generated: OffsetCursor;

  constructor(
    private readonly tok: Tokenizer,
    echo: string,
  ) {
    this.generated = new OffsetCursor(codePoints(echo));
  }

  promptSection(ids: readonly number[], entries: readonly (TokenLogprob | null)[]): CompletionLogprobs {
    return this.section(ids, entries, this.prompt);
  }

  generatedSection(ids: readonly number[], entries: readonly TokenLogprob[]): CompletionLogprobs {
    return this.section(ids, entries, this.generated);
  }

  private section(ids: readonly number[], entries: readonly (TokenLogprob | null)[], at: OffsetCursor): CompletionLogprobs {
    const tok = this.tok;
    return {
      tokens: ids.map((id) => tokenText(tok, id)),
      token_logprobs: entries.map((e) => e?.logprob ?? null),
      top_logprobs: entries.map((e) => (e ? topByText(tok, e) : null)),
      text_offset: ids.map((id) => at.advance(tok, id)),
    };
  }
}

export function joinCompletionLogprobs(parts: readonly CompletionLogprobs[]): CompletionLogprobs {
  return {
    tokens: parts.flatMap((p) => p.tokens),
    token_logprobs: parts.flatMap((p) => p.token_logprobs),
    top_logprobs: parts.flatMap((p) => p.top_logprobs),
    text_offset: parts.flatMap((p) => p.text_offset),
  };
}

/** {text: logprob} of the alternatives and the token itself; of two tokens with the same text the likelier one is kept. */
function topByText(tok: Tokenizer, e: TokenLogprob): Record<string, number> {
  const pairs: [string, number][] = [];
  const seen = new Set<string>();
  const add = (id: number, logprob: number) => {
    const text = tokenText(tok, id);
    if (seen.has(text)) return;
    seen.add(text);
    pairs.push([text, logprob]);
  };
  for (const t of e.top) add(t.id, t.logprob);
  if (!e.top.some((t) => t.id === e.id)) add(e.id, e.logprob);
  return Object.fromEntries(pairs); // own properties even for a text like "__proto__"
}

/** The text offset of the next token: characters completed so far. */
class OffsetCursor {
  private detokenizer: IncrementalDetokenizer | null = null;

  constructor(
    private offset: number,
    private readonly startsSequence = false,
  ) {}

  /** The offset of token `id`, then moves past its text. */
  advance(tok: Tokenizer, id: number): number {
    const here = this.offset;
    this.detokenizer ??= new IncrementalDetokenizer(tok, this.startsSequence);
    this.offset += codePoints(this.detokenizer.push(id));
    return here;
  }
}

// ---- native family: logprobs = [{token_id, token, logprob, top_logprobs: [{token_id, token, logprob}]}] ----

export function nativeLogprobs(tok: Tokenizer, entries: readonly TokenLogprob[]): NativeLogprob[] {
  const item = (id: number, logprob: number) => ({ token_id: id, token: tokenText(tok, id), logprob });
  return entries.map((e) => ({ ...item(e.id, e.logprob), top_logprobs: e.top.map((t) => item(t.id, t.logprob)) }));
}
