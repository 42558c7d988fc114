import { describe, expect, test } from "bun:test";
import { opensReasoning, ReasoningSplitter, splitReasoning } from "../../src/text/reasoning.ts";

/** What a reply means, written the obvious way on the whole text. */
function meaning(text: string, startsInside: boolean): { reasoning: string; content: string } {
  let rest = text;
  if (!startsInside) {
    if (!text.trimStart().startsWith("<think>")) return { reasoning: "", content: text };
    rest = text.trimStart().slice("<think>".length);
  }
  const at = rest.indexOf("</think>");
  return at < 0 ? { reasoning: rest, content: "" } : { reasoning: rest.slice(0, at), content: rest.slice(at + "</think>".length) };
}

/** The reply fed in the given pieces: the sorted text joined. */
function streamed(pieces: string[], startsInside: boolean): { reasoning: string; content: string } {
  const s = new ReasoningSplitter(startsInside);
  const out = { reasoning: "", content: "" };
  for (const p of [...pieces.map((t) => s.push(t)), s.finish()]) {
    out.reasoning += p.reasoning;
    out.content += p.content;
  }
  return out;
}

const REPLIES = [
  "<think>\nTwo apples and one.\n</think>\n\nThree.",
  "  \n<think>a</think>b</think>c<think>d",
  "<think></think>",
  "<think>never closed",
  "Plain answer with </think> in it",
  "Answer first <think>then this</think>",
  "<thinking>is not the tag</thinking>",
  "<thi",
  "   ",
  "",
  "reasoning only</think>the answer",
  "</thi",
];

describe("reasoning apart from the answer", () => {
  test("every reply means what it says, whole and cut at every place into two and three pieces (a tag split across tokens is one tag)", () => {
    for (const text of REPLIES)
      for (const startsInside of [false, true]) {
        const want = meaning(text, startsInside);
        const whole = splitReasoning(text, startsInside);
        expect({ text, startsInside, reasoning: whole.reasoning, content: whole.content }).toEqual({ text, startsInside, ...want });
        for (let i = 0; i <= text.length; i++) {
          expect({ text, i, ...streamed([text.slice(0, i), text.slice(i)], startsInside) }).toEqual({ text, i, ...want });
          for (let j = i; j <= text.length; j++)
            expect(streamed([text.slice(0, i), text.slice(i, j), text.slice(j)], startsInside)).toEqual(want);
        }
        expect(streamed([...text], startsInside)).toEqual(want); // one character at a time
      }
  });

  test("text is let out as soon as it cannot be a tag: reasoning before a partial </think>, an answer at once", () => {
    const s = new ReasoningSplitter(false);
    expect(s.push("<thi")).toEqual({ reasoning: "", content: "" });
    expect(s.push("nk>Let me see</th")).toEqual({ reasoning: "Let me see", content: "" });
    expect(s.push("ink>Yes")).toEqual({ reasoning: "", content: "Yes" });
    expect(s.push(" and <think>")).toEqual({ reasoning: "", content: " and <think>" });
    expect(s.hadReasoning).toBe(true);
    const plain = new ReasoningSplitter(false);
    expect(plain.push("Hello")).toEqual({ reasoning: "", content: "Hello" });
    expect(plain.hadReasoning).toBe(false);
  });

  test("a prompt opens the reasoning when it ends with <think> and whitespace", () => {
    expect(opensReasoning("<|im_start|>assistant\n<think>\n")).toBe(true);
    expect(opensReasoning("<|im_start|>assistant\n<think>")).toBe(true);
    expect(opensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")).toBe(false);
    expect(opensReasoning("<|im_start|>user\n<think> me<|im_end|>\n<|im_start|>assistant\n")).toBe(false);
    expect(opensReasoning("<|im_start|>assistant\n")).toBe(false);
  });
});
