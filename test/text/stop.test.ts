import { describe, expect, test } from "bun:test";
import { StopStringMatcher } from "../../src/text/stop.ts";

/** Feeds the deltas; returns the emitted text and whether a stop matched. */
function run(stops: string[], deltas: string[]): { text: string; stopped: boolean; perDelta: string[] } {
  const m = new StopStringMatcher(stops);
  const perDelta: string[] = [];
  let stopped = false;
  for (const d of deltas) {
    const r = m.push(d);
    perDelta.push(r.text);
    stopped = r.stopped;
    if (stopped) break;
  }
  const text = perDelta.join("") + m.flush();
  return { text, stopped, perDelta };
}

describe("stop string matcher", () => {
  test("without stop strings text passes straight through", () => {
    expect(run([], ["a", "b"]).perDelta).toEqual(["a", "b"]);
  });

  test("a stop inside one delta cuts the text before it", () => {
    expect(run(["END"], ["abcENDxyz"])).toEqual({ text: "abc", stopped: true, perDelta: ["abc"] });
  });

  test("a stop spanning several deltas is matched and never emitted", () => {
    const r = run(["<end>"], ["Hello <e", "n", "d> more"]);
    expect(r.stopped).toBe(true);
    expect(r.text).toBe("Hello ");
    expect(r.perDelta.join("")).not.toContain("<");
  });

  test("text that only looked like a stop's beginning is released", () => {
    const r = run(["abc"], ["xab", "d"]);
    expect(r.perDelta).toEqual(["x", "abd"]);
    expect(r.stopped).toBe(false);
  });

  test("held text is released by flush when generation ends", () => {
    const m = new StopStringMatcher(["STOP"]);
    expect(m.push("go ST").text).toBe("go ");
    expect(m.flush()).toBe("ST");
  });

  test("the earliest occurrence wins among several stop strings", () => {
    expect(run(["world", "lo w"], ["hello world"]).text).toBe("hel");
  });

  test("a stop following a repeated prefix is found (aab in aaab)", () => {
    expect(run(["aab"], ["a", "a", "a", "b", "c"]).text).toBe("a");
  });

  test("pushes after the stop return nothing", () => {
    const m = new StopStringMatcher(["x"]);
    expect(m.push("ax").stopped).toBe(true);
    expect(m.push("more")).toEqual({ text: "", stopped: true });
    expect(m.flush()).toBe("");
  });

  test("empty stop strings are ignored", () => {
    expect(run([""], ["abc"]).text).toBe("abc");
  });

  test("any split of any text gives the text up to the first stop", () => {
    let seed = 11;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed % n;
    };
    const alphabet = "ab c";
    for (let trial = 0; trial < 500; trial++) {
      const text = Array.from({ length: rand(30) }, () => alphabet[rand(alphabet.length)]).join("");
      const stops = Array.from({ length: 1 + rand(3) }, () =>
        Array.from({ length: 1 + rand(4) }, () => alphabet[rand(alphabet.length)]).join(""),
      );
      const deltas: string[] = [];
      for (let i = 0; i < text.length; ) {
        const n = 1 + rand(4);
        deltas.push(text.slice(i, i + n));
        i += n;
      }
      const first = Math.min(...stops.map((s) => text.indexOf(s)).filter((i) => i >= 0));
      const expected = Number.isFinite(first) ? text.slice(0, first) : text;
      const r = run(stops, deltas);
      expect(r.text).toBe(expected);
      expect(r.stopped).toBe(Number.isFinite(first));
      for (const s of stops) expect(r.text.includes(s)).toBe(false);
    }
  });
});
