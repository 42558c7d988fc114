// The playground's form fields read into request values: loop depths of the
// depth explorer, stop strings of the Generate view, reply timing.
import { describe, expect, test } from "bun:test";
import { defaultDepths, parseDepths } from "../../src/playground/depth.ts";
import { parseStops } from "../../src/playground/generate.ts";
import { ReplyTiming } from "../../src/playground/timing.ts";

describe("loop depths", () => {
  test("defaults: powers of two below the model's default depth, then the default", () => {
    expect(defaultDepths(8)).toEqual([1, 2, 4, 8]);
    expect(defaultDepths(12)).toEqual([1, 2, 4, 8, 12]);
    expect(defaultDepths(3)).toEqual([1, 2, 3]);
    expect(defaultDepths(1)).toEqual([1]);
  });

  test("commas or spaces, duplicates dropped, sorted", () => {
    expect(parseDepths(" 8, 1 2,,4 8 ")).toEqual([1, 2, 4, 8]);
  });

  test("refused with a message: empty, not whole, out of 1..64, more than 8", () => {
    expect(parseDepths(" ")).toMatch(/at least one/);
    expect(parseDepths("1, 2.5")).toMatch(/"2\.5"/);
    expect(parseDepths("0")).toMatch(/1 to 64/);
    expect(parseDepths("65")).toMatch(/1 to 64/);
    expect(parseDepths("x")).toMatch(/"x"/);
    expect(parseDepths("1 2 3 4 5 6 7 8 9")).toMatch(/at most 8/);
  });
});

describe("stop strings", () => {
  test("one per line, escapes for newline, tab and backslash, empty lines dropped", () => {
    expect(parseStops("\\n")).toEqual(["\n"]);
    expect(parseStops("Amen.\n\nUser:\\t\n\\\\n")).toEqual(["Amen.", "User:\t", "\\n"]);
    expect(parseStops("")).toEqual([]);
  });
});

describe("ReplyTiming", () => {
  test("time to first token and tokens per second, both from the request", () => {
    let t = 100;
    const timing = new ReplyTiming(() => t);
    expect(timing.firstTokenMs).toBeNull();
    expect(timing.tokensPerSecond).toBeNull();
    t = 150;
    timing.arrived();
    expect(timing.firstTokenMs).toBe(50);
    t = 300;
    timing.arrived(3);
    expect(timing.tokens).toBe(4);
    expect(timing.tokensPerSecond).toBe(20); // 4 tokens in 200 ms
    expect(timing.firstTokenMs).toBe(50);
  });
});
