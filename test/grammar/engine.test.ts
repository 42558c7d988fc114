// The grammar engine's wrapper (src/grammar/engine.ts) leans on two things
// the package's TypeScript surface does not offer; both are checked here
// against the package's own public answers, so a new version that moves
// them fails: the synchronous token mask read from the module's memory, and
// the engine's printed messages turned into refusals.
import { beforeAll, describe, expect, test } from "bun:test";
import xgrammar from "@mlc-ai/web-xgrammar";
import { GrammarEngine, GrammarEngineError } from "../../src/grammar/engine.ts";
import { grammarVocabulary } from "../../src/grammar/vocabulary.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";

const EOT = 50256;
const VOCAB = 50304; // a model vocabulary padded past the tokenizer's
const SCHEMA = { type: "object", properties: { name: { type: "string" }, n: { type: "integer" } }, required: ["name", "n"] };

let tokenizer: Tokenizer;
let engine: GrammarEngine;

beforeAll(async () => {
  tokenizer = await Tokenizer.load();
  engine = await GrammarEngine.create(grammarVocabulary(tokenizer, [EOT]), VOCAB, [EOT]);
});

describe("the grammar engine", () => {
  test("the synchronous mask equals the package's own, token by token along a value", async () => {
    const compiled = await engine.compile({ kind: "json_schema", schema: JSON.stringify(SCHEMA), strict: true });
    const ours = await compiled.matcher();
    // The package's public matcher over the same compiled grammar.
    const theirs = await xgrammar.GrammarMatcher.createGrammarMatcher((compiled as unknown as { compiled: Parameters<typeof xgrammar.GrammarMatcher.createGrammarMatcher>[0] }).compiled, [EOT]);
    const mask = new Uint32Array(Math.ceil(VOCAB / 32));
    for (const id of tokenizer.encode('{"name": "Ada", "n": 42}')) {
      expect(ours.fillMask(mask)).toBe(true);
      expect([...mask]).toEqual([...new Uint32Array((await theirs.getNextTokenBitmask()).buffer)]);
      expect(ours.accept(id)).toBe(true);
      expect(theirs.acceptToken(id)).toBe(true);
    }
    // Complete: only the end id may follow; after it nothing.
    expect(ours.fillMask(mask)).toBe(true);
    const allowed = [...Array(VOCAB).keys()].filter((t) => (mask[t >>> 5] >>> (t & 31)) & 1);
    expect(allowed).toEqual([EOT]);
    expect(ours.accept(EOT)).toBe(true);
    expect(ours.fillMask(mask)).toBe(false);
    ours.dispose();
    theirs.dispose();
  });

  test("padding past the tokenizer and the end id are never allowed inside a value", async () => {
    const compiled = await engine.compile({ kind: "json_object" });
    const m = await compiled.matcher();
    const mask = new Uint32Array(Math.ceil(VOCAB / 32));
    m.fillMask(mask);
    const allowed = (t: number) => ((mask[t >>> 5] >>> (t & 31)) & 1) === 1;
    expect(allowed(tokenizer.encode("{")[0])).toBe(true);
    for (const t of [EOT, 50257, VOCAB - 1]) expect(allowed(t)).toBe(false);
    m.dispose();
  });

  test("a feature the engine would drop is refused with the engine's own words, and the engine goes on", async () => {
    const allOf = engine.compile({ kind: "json_schema", schema: JSON.stringify({ allOf: [{ type: "object" }, { required: ["a"] }] }), strict: true });
    await expect(allOf).rejects.toThrow(/allOf with multiple options/);
    await allOf.catch((e) => expect(e instanceof GrammarEngineError && !e.aborted).toBe(true));
    await engine.compile({ kind: "ebnf", grammar: 'root ::= "a"' });
  });

  // Last: an error the engine cannot go on from aborts its module (the server's format compiler meets it in a worker).
  test("a grammar with an error is refused naming its place, and says the module aborted", async () => {
    const bad = engine.compile({ kind: "ebnf", grammar: 'root ::= "a" b' });
    await expect(bad).rejects.toThrow(/line 1, column \d+: Rule "b" is not defined/);
    await bad.catch((e) => expect(e instanceof GrammarEngineError && e.aborted).toBe(true));
  });
});
