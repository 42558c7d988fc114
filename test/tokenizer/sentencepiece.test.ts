// A model's own SentencePiece-style BPE (src/tokenizer/hf_bpe.ts: Llama's,
// TinyLlama's, Nanbeige4.2's tokenizer.json: Metaspace or the older
// Prepend + Replace normalizer, byte fallback, the Replace / ByteFallback /
// Fuse / Strip decoder) against Hugging Face's tokenizers.js on a recorded
// corpus (test/tokenizer/fixtures/make_sentencepiece_reference.mjs), and
// against ids worked out by hand from the library's algorithm where
// tokenizers.js departs from the Rust library (Metaspace's `split`).
import { afterAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { HfBpe, HfTokenizerError } from "../../src/tokenizer/hf_bpe.ts";
import { IncrementalDetokenizer, TokenLimitExceeded, Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { TextStream } from "../../src/text/stream.ts";
import { type SentencePieceForm, SENTENCEPIECE_SPECIALS, sentencePieceTokenizerJson, tokenIdsOf } from "../helpers/hf_fixture.ts";

interface Reference {
  corpus: string[];
  cases: { form: SentencePieceForm; byteFallback: boolean; ids: number[][]; decoded: string[] }[];
}
const ref = JSON.parse(readFileSync(join(import.meta.dir, "fixtures/sentencepiece_reference.json"), "utf8")) as Reference;
const describeForm = (form: SentencePieceForm) => (form === "normalizer" ? "Prepend + Replace normalizer" : `Metaspace ${form.prepend}, split ${form.split}`);

const opened: Tokenizer[] = [];
afterAll(() => {
  for (const t of opened) t.close();
});
async function tokenizer(json: string): Promise<Tokenizer> {
  const t = await Tokenizer.fromSpec({ kind: "bpe", json });
  opened.push(t);
  return t;
}

describe("equal to tokenizers.js on the recorded corpus", () => {
  for (const c of ref.cases)
    test(`${describeForm(c.form)}, byte fallback ${c.byteFallback}: ids and decoded text`, async () => {
      const json = sentencePieceTokenizerJson(c.form, SENTENCEPIECE_SPECIALS, c.byteFallback);
      const t = await tokenizer(json);
      ref.corpus.forEach((text, i) => {
        const ids = t.encode(text);
        expect({ text, ids }).toEqual({ text, ids: c.ids[i] });
        expect({ text, decoded: t.decode(ids) }).toEqual({ text, decoded: c.decoded[i] });
      });
    });

  test("with byte fallback every text without added tokens, a leading space or a literal ▁ decodes back to itself", async () => {
    for (const form of [{ prepend: "first", split: true } as const, "normalizer" as const]) {
      const t = await tokenizer(sentencePieceTokenizerJson(form, SENTENCEPIECE_SPECIALS));
      for (const text of ref.corpus.filter((s) => !s.startsWith(" ") && !/<s>|<\/s>|<unk>|<\|im_|▁/.test(s))) expect(t.decode(t.encode(text))).toBe(text);
    }
  });
});

describe("worked out by hand from the library's algorithm", () => {
  const json = sentencePieceTokenizerJson({ prepend: "first", split: true }, SENTENCEPIECE_SPECIALS);
  const bpe = new HfBpe(json);

  test("a space first is put before the first word only (prepend_scheme first), runs of spaces are one ▁ each, unknown characters are their bytes", () => {
    expect(bpe.encode("Hello world")).toEqual(tokenIdsOf(json, ["▁Hello", "▁world"]));
    expect(bpe.encode("Hi  there")).toEqual(tokenIdsOf(json, ["▁Hi", "▁", "▁there"]));
    expect(bpe.encode("<s>Hi there")).toEqual(tokenIdsOf(json, ["<s>", "H", "i", "▁there"]));
    expect(bpe.encode("a😀\n")).toEqual(tokenIdsOf(json, ["▁a", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "<0x0A>"]));
    expect(bpe.encode("你好世界")).toEqual(tokenIdsOf(json, ["▁你好", "世界"]));
    const always = new HfBpe(sentencePieceTokenizerJson({ prepend: "always", split: true }, SENTENCEPIECE_SPECIALS));
    expect(always.encode("<s>Hi there")).toEqual(tokenIdsOf(json, ["<s>", "▁Hi", "▁there"]));
  });

  test("without byte fallback a run of unknown characters is one <unk> (fuse_unk)", () => {
    const noFallback = new HfBpe(sentencePieceTokenizerJson({ prepend: "first", split: true }, SENTENCEPIECE_SPECIALS, false));
    expect(noFallback.encode("a😀✓b")).toEqual(tokenIdsOf(json, ["▁a", "<unk>", "b"]));
  });

  test("split cuts before every ▁, so no merge crosses one; without split one does (a merge of ! and ▁ added)", () => {
    const crossing = (split: boolean) => {
      const j = JSON.parse(sentencePieceTokenizerJson({ prepend: "first", split }, SENTENCEPIECE_SPECIALS));
      j.model.vocab["!▁"] = 399;
      j.model.merges.unshift("! ▁");
      return JSON.stringify(j);
    };
    const j = crossing(true);
    expect(new HfBpe(j).encode("Hi! there")).toEqual(tokenIdsOf(j, ["▁Hi", "!", "▁there"]));
    expect(new HfBpe(crossing(false)).encode("Hi! there")).toEqual(tokenIdsOf(j, ["▁Hi", "!▁", "t", "he", "re"]));
  });

  test("the older normalizer form puts ▁ before every text between added tokens (the library's Prepend)", () => {
    const legacy = new HfBpe(sentencePieceTokenizerJson("normalizer", SENTENCEPIECE_SPECIALS));
    expect(legacy.encode("<|im_end|>\nHi")).toEqual(tokenIdsOf(json, ["<|im_end|>", "▁", "<0x0A>", "H", "i"]));
  });

  test("decoding: ▁ is a space, byte tokens bytes, one leading space stripped; streamed text equals the whole decode and holds a character until it is whole", async () => {
    const t = await tokenizer(json);
    expect(t.stripsLeadingSpace).toBe(true);
    expect(t.decode(tokenIdsOf(json, ["▁Hello", "▁world"]))).toBe("Hello world");
    expect(t.decode(tokenIdsOf(json, ["▁", "▁Hello"]))).toBe(" Hello");
    expect(t.decode(tokenIdsOf(json, ["<s>", "▁Hello"]))).toBe("<s> Hello");
    // the token's own text keeps its space (logprobs show it)
    expect(t.tokenText(tokenIdsOf(json, ["▁Hello"])[0])).toBe(" Hello");
    const ids = tokenIdsOf(json, ["▁Hi", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "▁world", "<0xE4>"]);
    const stream = new IncrementalDetokenizer(t, true); // a stream that starts the sequence
    const pushed = ids.map((id) => stream.push(id));
    expect(pushed).toEqual(["Hi", "", "", "", "😀", " world", ""]);
    expect(pushed.join("") + stream.flush()).toBe(t.decode(ids));
    expect(t.decode(ids)).toBe("Hi😀 world\uFFFD");
    // a reply continuing its prompt keeps its first token's space: prompt + reply reads as the whole decode
    const reply = new IncrementalDetokenizer(t);
    expect(ids.map((id) => reply.push(id)).join("") + reply.flush()).toBe(" Hi😀 world\uFFFD");
    // the generation path every endpoint family uses: prompt text + reply text = the whole sequence's decode
    const prompt = tokenIdsOf(json, ["▁Hello"]);
    const generated = new TextStream(t);
    const replyText = tokenIdsOf(json, ["▁world"]).map((id) => generated.push(id).text).join("") + generated.finish();
    expect(t.decode(prompt) + replyText).toBe(t.decode([...prompt, ...tokenIdsOf(json, ["▁world"])]));
    expect(replyText).toBe(" world");
  });
});

describe("hostile input", () => {
  test("a long text without spaces is one piece in the normalizer form: merged in n log n, the same ids through the worker pool, stopped at a limit", async () => {
    const t = await tokenizer(sentencePieceTokenizerJson("normalizer", SENTENCEPIECE_SPECIALS));
    const text = "thethere你好😀".repeat(20_000);
    const started = performance.now();
    const ids = t.encode(text);
    expect(performance.now() - started).toBeLessThan(5000);
    expect(t.decode(ids)).toBe(text);
    expect(await t.encodeAsync(text)).toEqual(ids);
    const over = await t.encodeAsync(text, { limit: ids.length - 1 }).catch((e) => e);
    expect(over).toBeInstanceOf(TokenLimitExceeded);
    expect(over.atLeast).toBeLessThanOrEqual(ids.length);
    expect(t.encodeWithin(text, ids.length)).toEqual({ ids });
  });
});

describe("what stays unsupported is refused by name", () => {
  const base = () => JSON.parse(sentencePieceTokenizerJson({ prepend: "first", split: true }));
  const cases: [string, (j: Record<string, any>) => void, RegExp][] = [
    ["a Unigram model", (j) => (j.model.type = "Unigram"), /model: type "Unigram" is not supported \(only BPE\)/],
    ["a Metaspace replacement other than ▁", (j) => (j.pre_tokenizer.replacement = "_"), /pre_tokenizer: replacement "_" is not supported/],
    ["an unknown prepend scheme", (j) => (j.pre_tokenizer.prepend_scheme = "sometimes"), /prepend_scheme "sometimes" is not one of always, first, never/],
    ["a Whitespace pre-tokenizer", (j) => (j.pre_tokenizer = { type: "Whitespace" }), /pre_tokenizer: type "Whitespace" is not supported \(SentencePiece-style BPE takes one Metaspace/],
    ["an NFKC normalizer", (j) => (j.normalizer = { type: "NFKC" }), /normalizer: type "NFKC" is not supported/],
    ["a Replace of other text", (j) => (j.normalizer = { type: "Replace", pattern: { String: "a" }, content: "b" }), /normalizer: Replace .* is not supported/],
    ["a Metaspace decoder", (j) => (j.decoder = { type: "Metaspace", replacement: "▁" }), /decoder: must be the SentencePiece decoder/],
    ["Strip before Fuse", (j) => j.decoder.decoders.splice(2, 1), /decoders\[2\]: type "Strip" is not supported here/],
    ["Strip of two spaces", (j) => (j.decoder.decoders[3].start = 2), /Strip " " start 2 stop 0 is not supported/],
    ["a template post-processor without the text last", (j) => (j.post_processor = { type: "TemplateProcessing", single: [] }), /followed by the text \(\$A\)/],
    ["BPE dropout", (j) => (j.model.dropout = 0.1), /dropout 0.1 is not supported/],
  ];
  for (const [what, mutate, message] of cases)
    test(what, () => {
      const j = base();
      mutate(j);
      let err: unknown = null;
      try {
        new HfBpe(JSON.stringify(j));
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(HfTokenizerError);
      expect((err as Error).message).toMatch(message);
    });

  test("byte fallback stays refused for byte-level BPE (every byte has its token there)", () => {
    const j = JSON.parse(sentencePieceTokenizerJson());
    j.pre_tokenizer = { type: "ByteLevel", add_prefix_space: false, use_regex: true };
    j.decoder = { type: "ByteLevel" };
    expect(() => new HfBpe(JSON.stringify(j))).toThrow(/byte_fallback true is not supported/);
  });
});
