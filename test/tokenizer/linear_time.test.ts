// Tokenization in time linear in the text (docs/limits.md): every prompt
// shape that used to cost the square of its length (a run of letters, of
// digits, of one repeated character, of GPT-2's longest token, of emoji, of
// spaces, and a model's own pattern written to backtrack) is encoded at 4n
// characters in about 4 times what n take, never 16. Measured as ratios of
// the fastest of five runs, so a slow machine slows both sides alike.
// Also: GPT-2's long pieces, merged here rather than by tiktoken, get
// tiktoken's own ids; and a model's pattern runs on an engine whose matches
// are RegExp's.
import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import wasmFile from "tiktoken/lite/tiktoken_bg.wasm" with { type: "file" };
import gpt2 from "tiktoken/encoders/gpt2.json" with { type: "json" };
import { init, Tiktoken } from "tiktoken/lite/init";
import { LinearRegex, PatternError } from "../../src/tokenizer/linear_regex.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { backtrackingTokenizerJson } from "../helpers/tokenizer_json.ts";

setDefaultTimeout(120_000); // five encodes of up to 256 K characters per shape

let gpt2Tok: Tokenizer;
let tiktoken: Tiktoken;


beforeAll(async () => {
  gpt2Tok = await Tokenizer.load();
  const bytes = await Bun.file(wasmFile as unknown as string).arrayBuffer();
  await init((imports) => WebAssembly.instantiate(bytes, imports));
  tiktoken = new Tiktoken(gpt2.bpe_ranks, gpt2.special_tokens, gpt2.pat_str);
});

/** The fastest of five encodes of `text`, in ms. */
function encodeMs(tok: Tokenizer, text: string): number {
  let best = Number.POSITIVE_INFINITY;
  for (let k = 0; k < 5; k++) {
    Bun.gc(true); // another test's garbage is not this encode's time
    const t0 = performance.now();
    tok.encodeWithin(text, Number.POSITIVE_INFINITY);
    best = Math.min(best, performance.now() - t0);
  }
  return best;
}

/** Time at 4n over time at n: about 4 when linear (n log n: up to 5.5 here), 16 when quadratic; under 12 leaves room for a busy machine. */
function growth(tok: Tokenizer, make: (n: number) => string, n: number): number {
  encodeMs(tok, make(n)); // warm the caches and the compiler
  return encodeMs(tok, make(4 * n)) / encodeMs(tok, make(n));
}

const SHAPES: Record<string, (n: number) => string> = {
  letters: (n) => "a".repeat(n),
  digits: (n) => "7".repeat(n),
  "one repeated character": (n) => "-".repeat(n),
  "GPT-2's longest token": (n) => "ÃÂ".repeat(n / 2),
  emoji: (n) => "😀".repeat(n / 2),
  spaces: (n) => `${" ".repeat(n)}x`,
  "mixed runs": (n) => "ab1 -😀\n".repeat(n / 8),
};

describe("linear in the text's length", () => {
  for (const [name, make] of Object.entries(SHAPES))
    test(`GPT-2: ${name}`, () => {
      expect(growth(gpt2Tok, make, 65_536)).toBeLessThan(12);
    });

  test("a model's own tokenizer, on every shape and on its pattern's worst case", async () => {
    const tok = await Tokenizer.fromSpec({ kind: "bpe", json: backtrackingTokenizerJson() });
    const shapes = { ...SHAPES, "spaces to the end": (n: number) => " ".repeat(n), "a run the pattern backtracks on": (n: number) => `${"a".repeat(n)}c` };
    for (const [name, make] of Object.entries(shapes)) expect(growth(tok, make, 65_536), name).toBeLessThan(12);
  });
});

describe("GPT-2's long pieces get tiktoken's ids", () => {
  const texts = [
    "ÃÂ".repeat(32 * 70),
    "a".repeat(5000),
    "😀".repeat(3000),
    `${" ".repeat(3000)}x`,
    "-".repeat(4000),
    "12345678901234567890".repeat(300),
    `It's ${"Ünïcödé速い茶色の狐".repeat(400)} 🦊🙂\n\t  spaces   and\r\nlines`,
    "你好，世界！这是一个测试。".repeat(1500),
    `${"word ".repeat(2000)}${"x".repeat(3000)} 've 's ${"\u3000".repeat(500)}z`,
  ];
  for (const text of texts)
    test(`${JSON.stringify(text.slice(0, 12))}... (${text.length} characters)`, () => {
      expect(gpt2Tok.encode(text)).toEqual(Array.from(tiktoken.encode_ordinary(text)));
    });
});

describe("a model's patterns run on a linear engine with RegExp's matches", () => {
  const patterns = [
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "(a+)+b",
    "a*?b|a",
    "(?<=a)b+|c",
    "(?<!x)y{2,3}?",
    "[a-c]{2}|(?=b)\\w",
    "x(?:ab|a)(?:bc|c)",
    "\\u{1F600}|😀+",
    "(?i:abc)D|É",
    ".+?x|.",
  ];
  const alphabet = ["a", "b", "c", "x", "y", "D", "d", "'", "s", "t", "S", " ", "\n", "\r", "1", "2", "😀", "é", "É", "\t", "-"];

  test("the same matches as RegExp with flags gu, on 20,000 random texts", () => {
    let seed = 12345;
    const rand = (k: number) => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return seed % k;
    };
    for (const p of patterns) {
      const linear = new LinearRegex(p);
      const native = new RegExp(p, "gu");
      for (let t = 0; t < 2000; t++) {
        let s = "";
        for (let i = rand(14); i > 0; i--) s += alphabet[rand(alphabet.length)];
        const want: [number, number][] = [];
        native.lastIndex = 0;
        for (let m = native.exec(s); m !== null; m = native.exec(s)) {
          want.push([m.index, m.index + m[0].length]);
          if (m[0] === "") native.lastIndex = m.index + ((s.codePointAt(m.index) ?? 0) > 0xffff ? 2 : 1);
        }
        expect([...linear.matches(s)].map((m) => [m.start, m.end]), `${p} on ${JSON.stringify(s)}`).toEqual(want);
      }
    }
  });

  test("what it cannot run the same way is refused, naming it", () => {
    for (const [p, why] of [
      ["\\bword", "word boundary"],
      ["(a)\\1", "back-references"],
      ["(a*)*b", "a repeated part that can match nothing"],
      ["\\p{L}{5000}", "too large"],
      ["(?s:.)", "modifiers"],
    ])
      expect(() => new LinearRegex(p)).toThrow(new RegExp(why));
    expect(() => new LinearRegex("(")).toThrow(PatternError);
  });

  test("a checkpoint may stop a long search", () => {
    let calls = 0;
    const stop = () => {
      if (++calls === 3) throw new Error("stopped");
    };
    expect(() => [...new LinearRegex("(a+)+b").matches("a".repeat(200_000), stop)]).toThrow("stopped");
  });
});
