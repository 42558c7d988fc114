import { beforeAll, describe, expect, test } from "bun:test";
import { TextStream } from "../../src/text/stream.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";

let tok: Tokenizer;
beforeAll(async () => {
  tok = await Tokenizer.load();
});

describe("text stream (detokenizer + stop strings)", () => {
  test("without stops the deltas and tail are exactly the decoded text", () => {
    const ids = tok.encode("Grüße, 世界 🙂!");
    const s = new TextStream(tok);
    const deltas = ids.map((id) => s.push(id).text);
    const tail = s.finish();
    expect(deltas.join("") + tail).toBe(tok.decode(ids));
    expect(s.text).toBe(tok.decode(ids));
    expect(s.stopped).toBe(false);
  });

  test("a stop string spanning several tokens stops generation and is not returned", () => {
    const ids = tok.encode("alpha beta gamma delta");
    const s = new TextStream(tok, ["ta gam"]);
    const out: { text: string; stopped: boolean }[] = [];
    for (const id of ids) {
      const d = s.push(id);
      out.push(d);
      if (d.stopped) break;
    }
    expect(out.at(-1)?.stopped).toBe(true);
    expect(out.length).toBe(3); // "alpha", " beta", " gamma": the stop ends inside the third token
    expect(out.map((d) => d.text).join("") + s.finish()).toBe("alpha be");
    expect(s.text).toBe("alpha be");
  });

  test("a stop string made of a multi-byte character matches once the character is whole", () => {
    const ids = tok.encode("ab ü cd"); // " ü" spans two tokens
    const s = new TextStream(tok, ["ü"]);
    let stopped = false;
    for (const id of ids) if ((stopped = s.push(id).stopped)) break;
    expect(stopped).toBe(true);
    expect(s.text).toBe("ab ");
  });

  test("an incomplete character at the end is flushed as U+FFFD", () => {
    const s = new TextStream(tok, ["zzz"]);
    expect(s.push(6184).text).toBe(" ");
    expect(s.finish()).toBe("\uFFFD");
    expect(s.text).toBe(" \uFFFD");
  });
});
