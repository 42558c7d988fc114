// The pre-tokenizers of a Hugging Face tokenizer.json that BPE models use
// (byte-level: ByteLevel, Split, Digits and Sequences of them;
// SentencePiece-style: Metaspace), with the
// semantics of the `tokenizers` library: a text is cut into pieces, each
// stage cutting every piece of the previous one, and BPE then runs on each
// piece alone. Anything else in the configuration is refused by the loader
// (src/tokenizer/hf_bpe.ts), never approximated.
//
// The library runs its regular expressions with Oniguruma; they are
// translated here into JavaScript ones of the same meaning where the two
// differ for these patterns: `\s` is Unicode White_Space (JavaScript's adds
// U+FEFF and lacks U+0085), `.` stops only at "\n", and `\d` `\w` are
// Unicode classes. A construct without a faithful translation (anchors,
// possessive quantifiers, atomic groups) is refused. The translated pattern
// runs on src/tokenizer/linear_regex.ts, never on RegExp's backtracking:
// a tokenizer.json is untrusted, and its pattern meets every prompt.

import { LinearRegex, PatternError } from "./linear_regex.ts";

export { PatternError };

// ---- regex translation ----

/** Unicode White_Space, the meaning of Oniguruma's `\s`, as class content. */
const WHITE_SPACE = "\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";

/** Whether a UTF-16 unit is Unicode White_Space (every such character is one unit). */
export function isWhiteSpace(c: number): boolean {
  return (
    (c >= 0x09 && c <= 0x0d) || c === 0x20 || c === 0x85 || c === 0xa0 || c === 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
    c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000
  );
}
const DIGIT = "\\p{Nd}";
// Oniguruma's `\w` differs inside a class (Unicode's word characters) and
// outside (every number too: "x²" is one word), as the library runs it.
const WORD = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
const WORD_IN_CLASS = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
/** Characters that keep their backslash in a `u`-mode pattern. */
const SYNTAX = new Set("^$\\.*+?()[]{}|/-".split(""));

/** An Oniguruma pattern of a tokenizer.json, translated to JavaScript's syntax (flags `u`) with the same matches, compiled. */
export function translatePattern(pattern: string): LinearRegex {
  let out = "";
  let inClass = false;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === "\\") {
      const e = pattern[++i];
      if (e === undefined) throw new PatternError("the pattern ends in a lone backslash");
      const cls = { s: WHITE_SPACE, d: DIGIT, w: inClass ? WORD_IN_CLASS : WORD }[e.toLowerCase()];
      if (cls !== undefined) {
        const negated = e !== e.toLowerCase();
        if (inClass && negated) throw new PatternError(`\\${e} inside a character class is not supported`);
        out += inClass ? cls : `[${negated ? "^" : ""}${cls}]`;
      } else if (e === "p" || e === "P") {
        const end = pattern.indexOf("}", i);
        if (pattern[i + 1] !== "{" || end < 0) throw new PatternError(`\\${e} must be followed by {Property}`);
        out += pattern.slice(i - 1, end + 1);
        i = end;
      } else if (/[A-Za-z0-9]/.test(e)) {
        // \r \n \t \f \v \x.. \u.... mean the same in both; others (\A, \z, \h, \K, \G, back-references) are refused.
        if (!/[rntfvxu]/.test(e)) throw new PatternError(`the escape \\${e} is not supported`);
        out += `\\${e}`;
      } else {
        out += SYNTAX.has(e) ? `\\${e}` : e;
      }
      continue;
    }
    if (inClass) {
      if (c === "]") inClass = false;
      else if (c === "[") throw new PatternError("nested character classes are not supported");
      out += c;
      continue;
    }
    if (c === "[") {
      inClass = true;
      out += c;
      if (pattern[i + 1] === "^") out += pattern[++i];
      // A "]" first in a class is a literal in Oniguruma.
      if (pattern[i + 1] === "]") {
        out += "\\]";
        i++;
      }
    } else if (c === "^" || c === "$") {
      throw new PatternError(`the anchor ${c} is not supported`);
    } else if (c === ".") {
      out += "[^\\n]";
    } else if (c === "(" && pattern[i + 1] === "?" && pattern[i + 2] === ">") {
      throw new PatternError("atomic groups (?>...) are not supported");
    } else if ((c === "+" || c === "*" || c === "?" || c === "}") && pattern[i + 1] === "+") {
      throw new PatternError("possessive quantifiers are not supported");
    } else {
      out += c;
    }
  }
  if (inClass) throw new PatternError("unterminated character class");
  return new LinearRegex(out);
}

/** A literal String pattern of a tokenizer.json, compiled. */
export function literalPattern(text: string): LinearRegex {
  return new LinearRegex(text.replace(/[\\^$.*+?()[\]{}|/]/g, "\\$&"));
}

// ---- splitting ----

/** How the matches of a split stage become pieces (the library's SplitDelimiterBehavior). */
export type SplitBehavior = "Removed" | "Isolated" | "MergedWithPrevious" | "MergedWithNext" | "Contiguous";
export const SPLIT_BEHAVIORS: readonly SplitBehavior[] = ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"];

/** [start, end, isMatch] in UTF-16 units; the segments cover the text in order. */
type Segment = [number, number, boolean];

/** The text cut at every match of `re`, as the library's find_matches does for a regex. */
function regexSegments(text: string, re: LinearRegex, checkpoint?: () => void): Segment[] {
  const out: Segment[] = [];
  let prev = 0;
  for (const { start, end } of re.matches(text, checkpoint)) {
    // An empty match makes no piece (empty pieces are dropped).
    if (end === start) continue;
    if (start > prev) out.push([prev, start, false]);
    out.push([start, end, true]);
    prev = end;
  }
  if (prev < text.length) out.push([prev, text.length, false]);
  return out;
}

/** Every character of `re`'s class a match of its own, as the library's find_matches does for a char predicate. */
function charSegments(text: string, isMatch: RegExp): Segment[] {
  const out: Segment[] = [];
  let prev = 0;
  let at = 0;
  for (const ch of text) {
    const end = at + ch.length;
    if (isMatch.test(ch)) {
      if (prev < at) out.push([prev, at, false]);
      out.push([at, end, true]);
      prev = end;
    }
    at = end;
  }
  if (prev < text.length) out.push([prev, text.length, false]);
  return out;
}

/** The pieces of `text` given its segments, under `behavior` (the library's NormalizedString::split). */
function applyBehavior(text: string, segments: Segment[], behavior: SplitBehavior): string[] {
  let spans: [number, number][];
  switch (behavior) {
    case "Removed":
      spans = segments.filter((s) => !s[2]).map(([a, b]) => [a, b]);
      break;
    case "Isolated":
      spans = segments.map(([a, b]) => [a, b]);
      break;
    case "MergedWithPrevious": {
      spans = [];
      let previousMatch = false;
      for (const [a, b, isMatch] of segments) {
        if (isMatch && !previousMatch && spans.length > 0) spans[spans.length - 1][1] = b;
        else spans.push([a, b]);
        previousMatch = isMatch;
      }
      break;
    }
    case "MergedWithNext": {
      spans = [];
      let nextMatch = false;
      for (let i = segments.length - 1; i >= 0; i--) {
        const [a, b, isMatch] = segments[i];
        if (isMatch && !nextMatch && spans.length > 0) spans[spans.length - 1][0] = a;
        else spans.push([a, b]);
        nextMatch = isMatch;
      }
      spans.reverse();
      break;
    }
    case "Contiguous": {
      spans = [];
      let previousMatch = false;
      for (const [a, b, isMatch] of segments) {
        if (isMatch === previousMatch && spans.length > 0) spans[spans.length - 1][1] = b;
        else spans.push([a, b]);
        previousMatch = isMatch;
      }
      break;
    }
  }
  return spans.filter(([a, b]) => b > a).map(([a, b]) => text.slice(a, b));
}

// ---- stages ----

/** One pre-tokenizer stage: a piece to the pieces it is cut into; `checkpoint` may throw to stop a long one. */
export type Stage = (piece: string, checkpoint?: () => void) => string[];

/** The regex ByteLevel runs when use_regex is set: GPT-2's. */
export const GPT2_PATTERN = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

export function splitStage(re: LinearRegex, behavior: SplitBehavior, invert: boolean): Stage {
  return (piece, checkpoint) => {
    const segments = regexSegments(piece, re, checkpoint);
    if (invert) for (const s of segments) s[2] = !s[2];
    return applyBehavior(piece, segments, behavior);
  };
}

// Rust's char::is_numeric: the general categories Nd, Nl and No.
const NUMERIC = /^\p{N}$/u;

export function digitsStage(individual: boolean): Stage {
  return (piece) => applyBehavior(piece, charSegments(piece, NUMERIC), individual ? "Isolated" : "Contiguous");
}

let gpt2Regex: LinearRegex | null = null;

/** GPT-2's pattern compiled, once: every ByteLevel stage shares it. */
export function gpt2Pattern(): LinearRegex {
  gpt2Regex ??= translatePattern(GPT2_PATTERN);
  return gpt2Regex;
}

/** ByteLevel's own cutting (its byte-to-character mapping is the BPE's first step). */
export function byteLevelStage(addPrefixSpace: boolean, useRegex: boolean): Stage {
  const re = useRegex ? gpt2Pattern() : null;
  return (piece, checkpoint) => {
    const p = addPrefixSpace && !piece.startsWith(" ") ? ` ${piece}` : piece;
    return re === null ? [p] : applyBehavior(p, regexSegments(p, re, checkpoint), "Isolated");
  };
}

/** SentencePiece's word-boundary character, Metaspace's replacement for a space. */
export const METASPACE = "\u2581";

/**
 * Metaspace: every space becomes METASPACE, one is put first when `prepend`
 * and the piece does not already start with one, and (`split`) the piece is
 * cut before every METASPACE (the library's MergedWithNext).
 */
export function metaspaceStage(prepend: boolean, split: boolean): Stage {
  const boundary = new RegExp(METASPACE);
  return (piece) => {
    let p = piece.replaceAll(" ", METASPACE);
    if (prepend && !p.startsWith(METASPACE)) p = METASPACE + p;
    return split ? applyBehavior(p, charSegments(p, boundary), "MergedWithNext") : [p];
  };
}

/** The pieces of `text` after every stage in turn. */
export function pretokenize(text: string, stages: readonly Stage[], checkpoint?: () => void): string[] {
  let pieces = text.length > 0 ? [text] : [];
  for (const stage of stages) pieces = pieces.flatMap((piece) => stage(piece, checkpoint));
  return pieces;
}
