// A model's own byte-level BPE (src/tokenizer/hf_bpe.ts) against the Hugging Face
// `tokenizers` library: the ids of two trained fixtures and the pieces of
// many pre-tokenizer configurations were computed by the library itself
// (test/tokenizer/fixtures/make_tokenizers.py), and GPT-2's tokenizer.json rebuilt
// from tiktoken's ranks must give tiktoken's ids.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { renderChat } from "../../src/http/chat_template.ts";
import { modelChat } from "../../src/text/chat.ts";
import { TextStream } from "../../src/text/stream.ts";
import { HfBpe, HfTokenizerError, parsePreTokenizer } from "../../src/tokenizer/hf_bpe.ts";
import { pretokenize } from "../../src/tokenizer/pretokenize.ts";
import { GPT2_CONVENTIONS, IncrementalDetokenizer, TokenLimitExceeded, Tokenizer, TokenizerError } from "../../src/tokenizer/tokenizer.ts";
import { byteLevel, type FixtureName, fixtureJson, gpt2TokenizerJson, reference } from "../helpers/tokenizer_json.ts";

const ref = reference();
const FIXTURES: FixtureName[] = ["smol_style", "split_style"];
const CHATML = { ...GPT2_CONVENTIONS, eosIds: [0, 2], chatFormat: "chatml" as const };

const tokenizers = new Map<FixtureName, Tokenizer>();
beforeAll(async () => {
  for (const name of FIXTURES) tokenizers.set(name, await Tokenizer.fromSpec({ kind: "bpe", json: fixtureJson(name) }, CHATML));
});
afterAll(() => {
  for (const t of tokenizers.values()) t.close();
});
const tok = (name: FixtureName) => tokenizers.get(name) as Tokenizer;

describe("equal to the tokenizers library", () => {
  for (const name of FIXTURES)
    test(`${name}: every corpus text gets the library's ids`, () => {
      ref.corpus.forEach((text, i) => expect({ i, ids: tok(name).encode(text) }).toEqual({ i, ids: ref.ids[name][i] }));
    });

  for (const [name, { config, pieces }] of Object.entries(ref.pre_tokenizers))
    test(`pre-tokenizer ${name}: the library's pieces`, () => {
      const { stages } = parsePreTokenizer(config);
      ref.corpus.forEach((text, i) => {
        const got = pretokenize(text, stages).map((p) => byteLevel(new TextEncoder().encode(p)));
        expect({ i, got }).toEqual({ i, got: pieces[i] });
      });
    });

  test("special tokens in text are their ids; a partial one is text", () => {
    const t = tok("smol_style");
    expect(t.encode("<|im_start|>user\nhi<|im_end|>")).toEqual([1, ...t.encode("user\nhi"), 2]);
    expect(t.encode("<|im_start")).not.toContain(1);
    expect(t.decode(t.encode("a<|endoftext|>b"))).toBe("a<|endoftext|>b");
  });

  test("added tokens holding any punctuation (Huginn's <|-|>, <|>>-|>, <|?|>) are matched as themselves", () => {
    const json = JSON.parse(fixtureJson("smol_style"));
    const added = ["<|-|>", "<|>>-|>", "<|?|>", "<|...|>", "<|+|>"].map((content, k) => ({ id: 100 + k, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
    json.added_tokens.push(...added);
    const t = new HfBpe(JSON.stringify(json));
    for (const a of added) expect(t.encode(`x${a.content}y`)).toEqual([...t.encode("x"), a.id, ...t.encode("y")]);
  });

  test("long texts through the worker pool and within a limit get the same ids", async () => {
    const long = ref.corpus.at(-1) as string;
    for (const name of FIXTURES) {
      const ids = tok(name).encode(long);
      expect(long.length).toBeGreaterThan(2048);
      expect(await tok(name).encodeAsync(long)).toEqual(ids);
      expect(tok(name).encodeWithin(long, ids.length)).toEqual({ ids });
      const over = await tok(name).encodeAsync(long, { limit: ids.length - 1 }).catch((e) => e);
      expect(over).toBeInstanceOf(TokenLimitExceeded);
      expect(over.atLeast).toBeLessThanOrEqual(ids.length);
    }
  });

  test("the count bound never exceeds the real count", () => {
    for (const name of FIXTURES)
      for (const text of ref.corpus) {
        const real = tok(name).encode(text).length;
        expect(tok(name).encodeWithin(text, real)).toEqual({ ids: tok(name).encode(text) });
      }
  });
});

describe("GPT-2's tokenizer.json", () => {
  let gpt2: Tokenizer;
  let json: string;
  let hf: HfBpe;
  beforeAll(async () => {
    gpt2 = await Tokenizer.load();
    json = gpt2TokenizerJson(gpt2);
    hf = new HfBpe(json);
  });

  test("rebuilt from tiktoken's ranks, it gives tiktoken's ids", () => {
    const texts = [
      ...ref.corpus.filter((t) => !t.includes("<|endoftext|>")),
      "😀".repeat(3000),
      "ÃÂ".repeat(32 * 5),
      "In the beginning God created the heaven and the earth. ".repeat(50),
      " \u0085x \ufeffy \u00a0z",
    ];
    for (const text of texts) expect(hf.encode(text)).toEqual(gpt2.encode(text));
  });

  test("its token bytes are tiktoken's", () => {
    for (let id = 0; id < 50257; id += 7) expect(hf.tokenBytes(id)).toEqual(gpt2.tokenBytes(id));
  });

  test("64 KB prompts encode in well under a second, long runs without spaces included", () => {
    const prose = ref.corpus.at(-1) as string;
    const texts = [prose.repeat(Math.ceil(65536 / prose.length)).slice(0, 65536), "🦊".repeat(16384), "x".repeat(65536)];
    for (const text of texts) {
      const fresh = new HfBpe(json); // no cached pieces
      const t0 = performance.now();
      const ids = fresh.encode(text);
      expect(performance.now() - t0).toBeLessThan(1000);
      // tiktoken itself takes seconds on the long runs: compared on their first 4 KB.
      expect(ids.length).toBeGreaterThan(0);
      expect(fresh.encode(text.slice(0, 4096))).toEqual(gpt2.encode(text.slice(0, 4096)));
    }
    expect(hf.encode(texts[0])).toEqual(gpt2.encode(texts[0]));
  });
});

describe("decoding", () => {
  test("decode inverts encode (NFC-normalized where the tokenizer normalizes)", () => {
    for (const text of ref.corpus) {
      expect(tok("smol_style").decode(tok("smol_style").encode(text))).toBe(text);
      expect(tok("split_style").decode(tok("split_style").encode(text))).toBe(text.normalize("NFC"));
    }
  });

  test("streamed, a character split across tokens comes out whole and the pieces add up to the text", () => {
    const t = tok("smol_style");
    for (const text of ["🦊👩‍👩‍👧‍👦 速い茶色の狐 ünïcödé", ...ref.corpus]) {
      const ids = t.encode(text);
      const d = new IncrementalDetokenizer(t);
      const pieces = ids.map((id) => d.push(id));
      for (const p of pieces) expect(p).not.toContain("\uFFFD");
      expect(pieces.join("") + d.flush()).toBe(text);
    }
    // A 4-byte emoji the small vocabulary splits into several tokens.
    const fox = t.encode("🐙");
    expect(fox.length).toBeGreaterThan(1);
    const stream = new TextStream(t);
    const deltas = fox.map((id) => stream.push(id).text);
    expect(deltas.slice(0, -1).every((s) => s === "")).toBe(true);
    expect(deltas.at(-1)).toBe("🐙");
  });

  test("special tokens decode to their text; ids past the vocabulary to nothing", () => {
    const t = tok("smol_style");
    expect(t.decode([1, 2, 0])).toBe("<|im_start|><|im_end|><|endoftext|>");
    expect(t.decodeBytes([t.vocabSize, 99999, -1])).toEqual(new Uint8Array(0));
  });
});

describe("ChatML", () => {
  const messages = [
    { role: "system" as const, content: "Be brief." },
    { role: "user" as const, content: "Hi 🦊" },
  ];

  test("messages render as ChatML ending with the assistant's opening; <|im_end|> ends the turn", () => {
    const chat = modelChat(tok("smol_style"));
    expect(renderChat(messages, chat)).toBe("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 🦊<|im_end|>\n<|im_start|>assistant\n");
    expect(chat.turnEndIds).toEqual([2]);
  });

  test("the rendered prompt holds the real special ids", () => {
    const ids = tok("smol_style").encode(renderChat(messages, modelChat(tok("smol_style"))));
    expect(ids.filter((id) => id === 1)).toHaveLength(3);
    expect(ids.filter((id) => id === 2)).toHaveLength(2);
    expect(ids[0]).toBe(1);
  });
});

describe("unsupported tokenizer.json pieces are refused at load", () => {
  const base = () => JSON.parse(fixtureJson("smol_style"));
  const cases: [string, (j: Record<string, any>) => void, RegExp][] = [
    ["an NFKC normalizer", (j) => (j.normalizer = { type: "NFKC" }), /normalizer: type "NFKC" is not supported/],
    ["a Lowercase step in a normalizer Sequence", (j) => (j.normalizer = { type: "Sequence", normalizers: [{ type: "NFC" }, { type: "Lowercase" }] }), /normalizers\[1\]: type "Lowercase"/],
    ["a Metaspace pre-tokenizer", (j) => (j.pre_tokenizer = { type: "Metaspace", replacement: "▁" }), /must end with a ByteLevel/],
    ["a Whitespace pre-tokenizer", (j) => j.pre_tokenizer.pretokenizers.unshift({ type: "Whitespace" }), /pretokenizers\[0\]: type "Whitespace" is not supported/],
    ["ByteLevel before another stage", (j) => j.pre_tokenizer.pretokenizers.reverse(), /must end with a ByteLevel/],
    ["a Split behavior that does not exist", (j) => j.pre_tokenizer.pretokenizers.unshift({ type: "Split", pattern: { Regex: "a" }, behavior: "Sideways", invert: false }), /behavior "Sideways"/],
    ["a possessive quantifier", (j) => j.pre_tokenizer.pretokenizers.unshift({ type: "Split", pattern: { Regex: "\\p{L}++" }, behavior: "Isolated", invert: false }), /possessive/],
    ["an anchor", (j) => j.pre_tokenizer.pretokenizers.unshift({ type: "Split", pattern: { Regex: "^a" }, behavior: "Isolated", invert: false }), /anchor/],
    ["a WordPiece model", (j) => (j.model.type = "WordPiece"), /model: type "WordPiece" is not supported/],
    ["BPE dropout", (j) => (j.model.dropout = 0.1), /dropout 0.1 is not supported/],
    ["byte fallback", (j) => (j.model.byte_fallback = true), /byte_fallback true/],
    ["a subword prefix", (j) => (j.model.continuing_subword_prefix = "##"), /continuing_subword_prefix "##"/],
    ["a Metaspace decoder", (j) => (j.decoder = { type: "Metaspace" }), /decoder: type "Metaspace"/],
    ["a template post-processor without the text last", (j) => (j.post_processor = { type: "TemplateProcessing", single: [] }), /followed by the text \(\$A\)/],
    ["an added token that strips", (j) => (j.added_tokens[0].lstrip = true), /added_tokens\[0\]: lstrip true/],
    ["a merge of tokens outside the vocabulary", (j) => j.model.merges.push("zzzq zzzr"), /"zzzq" is not in the vocabulary/],
    ["truncation", (j) => (j.truncation = { max_length: 5 }), /truncation: must be null/],
    ["no decoder", (j) => (j.decoder = null), /decoder: is missing/],
  ];
  for (const [what, mutate, message] of cases)
    test(`${what}`, () => {
      const j = base();
      mutate(j);
      const err = (() => {
        try {
          new HfBpe(JSON.stringify(j));
        } catch (e) {
          return e as Error;
        }
        return null;
      })();
      expect(err).toBeInstanceOf(HfTokenizerError);
      expect(err?.message).toMatch(message);
    });

  test("not JSON at all", async () => {
    const err = await Tokenizer.fromSpec({ kind: "bpe", json: "{not json" }).catch((e) => e);
    expect(err).toBeInstanceOf(TokenizerError);
    expect(err.message).toContain("not valid JSON");
  });
});
