// Pipelined steps (SERVICE_PIPELINE_STEPS, src/engine/batcher.ts): each
// batched step runs on the library's thread while the tokens of the step
// before are handed on, every continuing decode row predicted. Two dozen
// concurrent requests of every kind (greedy and sampled, log-probabilities,
// learned early exit, stop ids, windows, a sink that stops early, a client
// that goes away) get exactly what each gets alone; the steps really were
// begun on the library's thread; no session is left behind. A prompt beside
// a running stream goes in a chunk a step; one whose client left before its
// first chunk ends cancelled.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { NativeModel } from "../../src/engine/binding.ts";
import { Engine } from "../../src/engine/engine.ts";
import type { GenerateRequest, GenerateResult, SamplingParams, TokenLogprob } from "../../src/engine/types.ts";
import { BUILD_DIR, ensureLibrary } from "../helpers/kernels.ts";
import { tinyModelPath } from "../helpers/models.ts";

const VOCAB = 4096;
const MODEL = { seed: 41, loops: 4, vocabSize: VOCAB, exitGate: true };

let solo: Engine;
let piped: Engine;
let steps = 0;
const calls = { begin: 0, step: 0 };

beforeAll(() => {
  ensureLibrary();
  const path = tinyModelPath(MODEL);
  solo = Engine.load({ modelPath: path, threads: 2, simd: "auto", buildDir: BUILD_DIR, gpu: false });
  piped = Engine.load({
    modelPath: path,
    threads: 2,
    simd: "auto",
    buildDir: BUILD_DIR,
    gpu: false,
    prefillChunk: 8,
    pipelineSteps: true,
    onBatchStep: () => steps++,
  });
  // Count how the pipelined engine reaches the library.
  const model = (piped as unknown as { model: NativeModel }).model;
  const begin = model.pipelineBegin.bind(model);
  const step = model.batchStep.bind(model);
  model.pipelineBegin = (rows) => (calls.begin++, begin(rows));
  model.batchStep = (rows) => (calls.step++, step(rows));
});

afterAll(() => {
  solo.close();
  piped.close();
});

const GREEDY: SamplingParams = { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1, seed: 0 };

interface Job {
  req: GenerateRequest;
  /** The sink says stop after this many tokens (a stop string's effect). */
  stopAfter?: number;
  /** The client goes away after this many tokens. */
  abortAfter?: number;
}

function jobs(): Job[] {
  return Array.from({ length: 24 }, (_, i) => {
    const prompt = Array.from({ length: 3 + ((i * 5) % 29) }, (_, k) => (i * 131 + k * 7919 + 5) % VOCAB);
    const req: GenerateRequest = {
      promptTokens: prompt,
      maxTokens: 5 + ((i * 7) % 23),
      loops: 1 + (i % 4),
      sampling: i % 3 === 1 ? { temperature: 0.8, topK: 40, topP: 0.95, repetitionPenalty: 1.1, seed: 900 + i } : GREEDY,
      stopTokenIds: i % 5 === 2 ? [(i * 37) % VOCAB, 7] : [],
      cacheWindow: i % 6 === 3 ? 8 : 0,
    };
    if (i % 4 === 0) req.logprobs = 3;
    if (i % 4 === 2) req.exit = { threshold: 0.6, policy: "exact" };
    const job: Job = { req };
    if (i % 7 === 5) job.stopAfter = 3;
    if (i === 11) job.abortAfter = 4;
    return job;
  });
}

interface Outcome {
  result: GenerateResult;
  logprobs: (TokenLogprob | undefined)[];
}

async function run(engine: Engine, job: Job): Promise<Outcome> {
  const logprobs: (TokenLogprob | undefined)[] = [];
  const abort = new AbortController();
  const result = await engine.generate(
    job.req,
    (_id, logprob) => {
      logprobs.push(logprob);
      if (job.abortAfter !== undefined && logprobs.length >= job.abortAfter) abort.abort();
      return job.stopAfter === undefined || logprobs.length < job.stopAfter;
    },
    abort.signal,
  );
  return { result, logprobs };
}

describe("pipelined steps", () => {
  test("24 concurrent requests of every kind equal their solo runs, token by token", async () => {
    const all = jobs();
    const reference: Outcome[] = [];
    for (const job of all) reference.push(await run(solo, job));
    const got = await Promise.all(all.map(async (job, i) => (await Bun.sleep((i * 3) % 20), run(piped, job))));
    all.forEach((job, i) => {
      const want = reference[i];
      const have = got[i];
      const what = `request ${i}`;
      if (job.abortAfter !== undefined) {
        // Gone mid-run: what it got is a prefix of the solo run.
        expect(have.result.finishReason, what).toBe("cancelled");
        expect(want.result.tokens.slice(0, have.result.tokens.length), what).toEqual(have.result.tokens);
        return;
      }
      expect(have.result.tokens, what).toEqual(want.result.tokens);
      expect(have.result.finishReason, what).toBe(want.result.finishReason);
      expect(have.result.exitSteps, what).toEqual(want.result.exitSteps);
      expect(have.logprobs, what).toEqual(want.logprobs);
    });
    // Early exit really varied the steps, and log-probabilities came through.
    expect(new Set(got.flatMap((o) => o.result.exitSteps ?? [])).size).toBeGreaterThan(1);
    expect(got.some((o) => o.logprobs.some((l) => l !== undefined))).toBe(true);
    // The last step (predictions nobody claimed) ends at the batcher's next turn.
    await Bun.sleep(10);
    // Every step was begun on the library's thread; none had to run alone.
    expect(calls.begin).toBe(steps);
    expect(calls.step).toBe(0);
    // Fewer steps than tokens: requests shared them.
    const tokens = got.reduce((n, o) => n + o.result.tokens.length, 0);
    expect(steps).toBeLessThan(tokens);
    // Every session is freed, those whose last predicted step was dropped included.
    expect((piped as unknown as { model: NativeModel }).model.openSessions).toBe(0);
  });

  test("a prompt whose client goes away before its first chunk ends cancelled, with or without pipelining", async () => {
    for (const engine of [solo, piped]) {
      const abort = new AbortController();
      const running = engine.generate(jobs()[3].req, () => true, abort.signal);
      abort.abort(); // the prompt is queued in the batcher by now
      const result = await running;
      expect(result.finishReason).toBe("cancelled");
      expect(result.tokens).toEqual([]);
      await Bun.sleep(10);
      expect((engine as unknown as { model: NativeModel }).model.openSessions).toBe(0);
    }
  });

  test("beside a running stream, a prompt goes in a chunk a step: the next chunk is begun as soon as one ends", async () => {
    const model = (piped as unknown as { model: NativeModel }).model;
    const chunked: boolean[] = []; // per begun step: does it carry a prompt chunk (a row of several tokens)?
    const begin = model.pipelineBegin;
    model.pipelineBegin = (rows) => (chunked.push(rows.some((r) => r.tokens.length > 1)), begin(rows));
    try {
      const prompt = (n: number, salt: number) => Array.from({ length: n }, (_, k) => (k * 97 + salt) % VOCAB);
      const stream = piped.generate({ promptTokens: prompt(3, 1), maxTokens: 400, loops: 2, sampling: GREEDY, stopTokenIds: [], cacheWindow: 0 }, () => true);
      await Bun.sleep(5); // the stream is decoding
      const first = await piped.generate({ promptTokens: prompt(40, 3), maxTokens: 1, loops: 2, sampling: GREEDY, stopTokenIds: [], cacheWindow: 0 }, () => true);
      await stream;
      expect(first.tokens.length).toBe(1);
      const at = chunked.flatMap((c, i) => (c ? [i] : []));
      const prompt40 = at.slice(-5); // 40 tokens in chunks of 8
      expect(prompt40.length).toBe(5);
      expect(prompt40.at(-1)! - prompt40[0]).toBe(4); // five steps in a row
    } finally {
      model.pipelineBegin = begin;
    }
  });
});
