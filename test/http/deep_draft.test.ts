// draft_loops and verify_loops are independent (1-32 and 1-64): a draft
// deeper than its verifier used to be refused with a 400. Served now on
// every speculative route, and on the shipped trained model greedy output
// is /generate's at loops = verify_loops, token for token.
import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { ExtendedTextCompletion, GenerateResponse, SpeculativeResponse } from "../../src/wire/responses.ts";
import { TRAINED_MODEL_PATH } from "../../src/model/trained.ts";
import { jsonBody } from "../helpers/http.ts";
import { serverForTests } from "../helpers/server.ts";

setDefaultTimeout(120_000);

const PROMPTS = ["And God said unto Moses,", "The LORD is my shepherd;"];
const DEPTHS: [number, number][] = [
  [8, 4], // the model's default depth drafting for a shallower verifier
  [12, 2],
  [32, 8],
];

const server = serverForTests({ modelPath: TRAINED_MODEL_PATH, env: { SERVICE_MAX_SEQ_LEN: "512" } });


async function tokens(path: string, body: Record<string, unknown>): Promise<{ tokens: number[]; loops_used: number }> {
  const schema = path === "/generate" ? GenerateResponse : SpeculativeResponse;
  const json = await jsonBody(await server.post(path, { max_tokens: 40, temperature: 0, ...body }), schema);
  return { tokens: json.tokens, loops_used: json.stats.loops_used };
}

describe("a draft deeper than the verifier, on the trained model", () => {
  for (const [draft_loops, verify_loops] of DEPTHS)
    test(`draft_loops ${draft_loops}, verify_loops ${verify_loops}: /generate's tokens at loops ${verify_loops}`, async () => {
      for (const prompt of PROMPTS) {
        const plain = await tokens("/generate", { prompt, loops: verify_loops });
        const knobs = { prompt, draft_loops, verify_loops, draft_ahead: 4 };
        const chain = await tokens("/generate/speculative", knobs);
        expect(chain.tokens).toEqual(plain.tokens);
        expect(chain.loops_used).toBe(verify_loops);
        const tree = await tokens("/generate/tree_speculative", { ...knobs, K_branches: 3 });
        expect(tree.tokens).toEqual(plain.tokens);
      }
    });

  test("/api/v0 mode speculative and tree_speculative: the plain text at verify_loops", async () => {
    const base = { model: "kjv", prompt: PROMPTS[1], max_tokens: 40, temperature: 0 };
    const plain = await server.post("/api/v0/completions", { ...base, loops: 3 });
    const plainText = (await jsonBody(plain, ExtendedTextCompletion)).choices[0].text;
    for (const mode of ["speculative", "tree_speculative"]) {
      const res = await server.post("/api/v0/completions", { ...base, mode, draft_loops: 10, verify_loops: 3, K_branches: 2 });
      const body = await jsonBody(res, ExtendedTextCompletion);
      expect(body.choices[0].text).toBe(plainText);
      expect(body.stats.loops_used).toBe(3);
    }
  });
});
