import { beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { IncrementalDetokenizer, RANK_FILE_NAME, TokenLimitExceeded, Tokenizer, TokenizerCancelledError, TokenizerClosedError, TokenizerError } from "../../src/tokenizer/tokenizer.ts";

let tok: Tokenizer;
beforeAll(async () => {
  tok = await Tokenizer.load();
});

function detokenize(ids: number[]): { pieces: string[]; tail: string } {
  const d = new IncrementalDetokenizer(tok);
  const pieces = ids.map((id) => d.push(id));
  return { pieces, tail: d.flush() };
}

describe("GPT-2 encoding", () => {
  test("known ids for mixed ASCII, accents and an emoji", () => {
    expect(tok.encode("Hello world ünïcödé 🙂")).toEqual([15496, 995, 6184, 120, 77, 26884, 66, 9101, 67, 2634, 32485]);
  });

  test("end-of-text is id 50256 and a literal <|endoftext|> in text stays text", () => {
    expect(tok.endOfTextId).toBe(50256);
    const ids = tok.encode("a<|endoftext|>b");
    expect(ids).not.toContain(50256);
    expect(tok.decode(ids)).toBe("a<|endoftext|>b");
    expect(tok.decode([50256])).toBe("<|endoftext|>");
  });

  test("decode inverts encode", () => {
    const text = "The quick brown fox — 速い茶色の狐 — jumps 🦊🙂 over\n\tthe lazy dog.";
    expect(tok.decode(tok.encode(text))).toBe(text);
  });

  test("ids outside the rank table decode to no bytes", () => {
    expect(tok.vocabSize).toBe(50257);
    expect(tok.decodeBytes([50257, 60000, -1])).toEqual(new Uint8Array(0));
  });
});

describe("incremental detokenizer", () => {
  test("a character split across tokens is emitted only when whole", () => {
    // " ü" is two tokens: 6184 = " \xc3", 120 = "\xbc".
    const { pieces, tail } = detokenize([6184, 120]);
    expect(pieces).toEqual([" ", "ü"]);
    expect(tail).toBe("");
  });

  test("an emoji whose four bytes span tokens appears at its last byte", () => {
    const ids = tok.encode("🦊");
    expect(ids.length).toBeGreaterThan(1);
    const { pieces } = detokenize(ids);
    expect(pieces.slice(0, -1).every((p) => p === "")).toBe(true);
    expect(pieces.at(-1)).toBe("🦊");
  });

  test("flush turns an incomplete tail into U+FFFD", () => {
    const { pieces, tail } = detokenize([6184]);
    expect(pieces).toEqual([" "]);
    expect(tail).toBe("\uFFFD");
  });

  test("pieces plus tail always equal the whole-sequence decode", () => {
    let seed = 7;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed % n;
    };
    for (let trial = 0; trial < 50; trial++) {
      // Half byte-level ids (many are lone UTF-8 lead/continuation bytes).
      const ids = Array.from({ length: 1 + rand(20) }, () => (rand(2) ? rand(256) : rand(50257)));
      const { pieces, tail } = detokenize(ids);
      expect(pieces.join("") + tail).toBe(tok.decode(ids));
    }
  });
});

describe("encoding off the event loop", () => {
  // Texts past the inline limit go to the worker pool; every kind of long run
  // (the quadratic cases: emoji, letters, punctuation) and ordinary text must
  // come back with exactly the ids tiktoken gives on this thread.
  const texts = {
    emoji: "😀".repeat(3000),
    letters: "a".repeat(5000),
    dashes: "-".repeat(4000),
    "longest tokens": "ÃÂ".repeat(32 * 40), // 40 times token 35496, 128 bytes each
    prose: "In the beginning God created the heaven and the earth. ".repeat(200),
    mixed: "Ünïcödé 速い茶色の狐 🦊🙂\n\t  spaces   and\r\nlines ".repeat(300),
  };

  for (const [name, text] of Object.entries(texts))
    test(`${name}: the same ids as encode()`, async () => {
      expect(text.length).toBeGreaterThan(2048);
      expect(await tok.encodeAsync(text)).toEqual(tok.encode(text));
    });

  test("concurrent encodes each get their own ids", async () => {
    const all = Object.values(texts);
    const got = await Promise.all(all.map((t) => tok.encodeAsync(t)));
    got.forEach((ids, i) => expect(ids).toEqual(tok.encode(all[i])));
  });

  test("within a limit the fits get the same ids as encode(); the rest are refused with how many tokens they have at least", async () => {
    for (const text of Object.values(texts)) {
      const ids = tok.encode(text);
      expect(await tok.encodeAsync(text, { limit: ids.length })).toEqual(ids);
      const over = await tok.encodeAsync(text, { limit: ids.length - 1 }).catch((e) => e);
      expect(over).toBeInstanceOf(TokenLimitExceeded);
      expect(over.atLeast).toBeGreaterThan(ids.length - 1);
      expect(over.atLeast).toBeLessThanOrEqual(ids.length);
    }
  });

  test("encodeWithin cuts long prose into chunks and gets exactly the ids of encoding it whole", () => {
    const prose = `${texts.prose}${texts.mixed} it's  a  test,\tand "quotes" 's 've  ${"word ".repeat(3000)}`;
    expect(tok.encodeWithin(prose, 1e9)).toEqual({ ids: tok.encode(prose) });
  });

  test("the count bound is never above the real count, and equal on ordinary text", () => {
    for (const text of [...Object.values(texts), "Hello world ünïcödé 🙂", "  \n\n  x", "😀😀😀 a😀b"]) {
      const real = tok.encode(text).length;
      const bound = tok.bound().suffixMinima(new TextEncoder().encode(text))[0];
      expect(bound).toBeLessThanOrEqual(real);
    }
    expect(tok.bound().suffixMinima(new TextEncoder().encode(texts.prose))[0]).toBe(tok.encode(texts.prose).length);
  });

  test("an aborted signal cancels the encode; its worker stops and takes the next text", async () => {
    const abort = new AbortController();
    // A million characters in one piece: seconds of work, none of it done after the abort.
    const running = tok.encodeAsync("ÃÂ".repeat(1 << 19), { signal: abort.signal });
    const other = tok.encodeAsync("ÃÂ".repeat(1 << 19));
    await Bun.sleep(100);
    abort.abort();
    expect(await running.catch((e) => e)).toBeInstanceOf(TokenizerCancelledError);
    expect(await tok.encodeAsync(texts.prose)).toEqual(tok.encode(texts.prose));
    // The long text queued behind the cancelled one (one long text at a time) runs once its worker has stopped.
    expect(await other).toHaveLength(1 << 14);
  }, 60_000);

  test("a replacement rank file reaches the workers", async () => {
    const home = mkdtempSync(join(tmpdir(), "tok-"));
    const lines = Array.from({ length: 256 }, (_, b) => `${Buffer.from([b]).toString("base64")} ${b}`);
    writeFileSync(join(home, RANK_FILE_NAME), `${lines.join("\n")}\n`);
    const t = await Tokenizer.load(home);
    const text = "Hi!".repeat(1000);
    expect(await t.encodeAsync(text)).toEqual([...Buffer.from(text)]);
    t.close();
  });

  test("after close() an encode is refused with TokenizerClosedError", async () => {
    const t = await Tokenizer.load();
    const running = t.encodeAsync("😀".repeat(20000));
    t.close();
    expect(await running.catch((e) => e)).toBeInstanceOf(TokenizerClosedError);
    expect(await t.encodeAsync("short").catch((e) => e)).toBeInstanceOf(TokenizerClosedError);
  });

  test("the longest token is 128 bytes in GPT-2's ranks", () => {
    expect(tok.maxTokenBytes).toBe(128);
    expect(tok.decode([35496])).toBe("ÃÂ".repeat(32));
    expect(tok.tokenBytes(35496)).toHaveLength(128);
  });
});

describe("TOKENIZER_HOME", () => {
  test("without a rank file there the bundled ranks are used", async () => {
    const home = mkdtempSync(join(tmpdir(), "tok-"));
    const t = await Tokenizer.load(home);
    expect(t.source).toBe("bundled");
    expect(t.encode("Hello world")).toEqual([15496, 995]);
  });

  test("a replacement gpt2.tiktoken there is used", async () => {
    // Byte-level ranks only: every byte becomes its own token.
    const home = mkdtempSync(join(tmpdir(), "tok-"));
    const lines = Array.from({ length: 256 }, (_, b) => `${Buffer.from([b]).toString("base64")} ${b}`);
    writeFileSync(join(home, RANK_FILE_NAME), `${lines.join("\n")}\n`);
    const t = await Tokenizer.load(home);
    expect(t.source).toBe(join(home, RANK_FILE_NAME));
    expect(t.encode("Hi!")).toEqual([72, 105, 33]);
    expect(t.decode([72, 105, 33])).toBe("Hi!");
    // Ids between the file's ranks and the special token have no bytes.
    expect(t.decodeBytes([300, 50000])).toEqual(new Uint8Array(0));
    expect(t.maxTokenBytes).toBe(1); // text never encodes to <|endoftext|>
  });

  test("a malformed replacement file is a clear error naming the line", async () => {
    const home = mkdtempSync(join(tmpdir(), "tok-"));
    writeFileSync(join(home, RANK_FILE_NAME), "IQ== 0\nnot a rank line\n");
    const err = await Tokenizer.load(home).catch((e) => e);
    expect(err).toBeInstanceOf(TokenizerError);
    expect(String(err.message)).toContain(`${RANK_FILE_NAME}:2`);
    // Every byte needs a rank of its own: text holding one without could not be encoded.
    const lines = Array.from({ length: 256 }, (_, b) => `${Buffer.from([b]).toString("base64")} ${b}`).filter((_, b) => b !== 0x41);
    writeFileSync(join(home, RANK_FILE_NAME), `${lines.join("\n")}\n`);
    expect(String((await Tokenizer.load(home).catch((e) => e)).message)).toContain("the single byte 0x41 has no rank");
  });
});

describe("incremental detokenization", () => {
  /** What a plain streaming decoder makes of the same ids, token by token. */
  function reference(ids: number[]): { pieces: string[]; tail: string } {
    const d = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
    return { pieces: ids.map((id) => d.decode(tok.tokenBytes(id), { stream: true })), tail: d.decode() };
  }

  test("every delta equals a streaming decoder's, split characters and stray bytes included", () => {
    // Tokens that hold part of a character (lead bytes, continuation bytes), whole ones, and ids of no bytes.
    const partial: number[] = [];
    for (let id = 0; id < tok.vocabSize && partial.length < 200; id++) if (tok.wholeText(id) === null) partial.push(id);
    expect(partial.length).toBeGreaterThan(50);
    const whole = tok.encode("Hello world ünïcödé 🙂 速い茶色の狐 \uFEFF done");
    const pool = [...partial, ...whole, ...tok.encode("🦊🙂"), 50256, 50257];
    let seed = 7;
    const next = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed);
    for (let run = 0; run < 300; run++) {
      const ids = Array.from({ length: 1 + (next() % 24) }, () => pool[next() % pool.length]);
      expect(detokenize(ids), `ids ${ids.join(",")}`).toEqual(reference(ids));
    }
  });

  test("a character split across tokens appears once whole", () => {
    const ids = tok.encode("🙂");
    expect(ids.length).toBeGreaterThan(1);
    const { pieces, tail } = detokenize(ids);
    expect(pieces.slice(0, -1).every((p) => p === "")).toBe(true);
    expect(pieces.at(-1)).toBe("🙂");
    expect(tail).toBe("");
  });
});
