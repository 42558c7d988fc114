// Equivalence: greedy tokens and logits of loopserve and llama.cpp on the
// benchmark model's F16 export, free-running and forced onto llama.cpp's own
// sequence (so that one near-tie does not make every later position differ).
import { basename } from "node:path";
import { NativeModel } from "../../src/engine/binding.ts";
import { GREEDY } from "../../src/engine/types.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { BENCH_SHAPE } from "../../src/cli/bench/models.ts";
import { printTable, type Row } from "../../src/cli/bench/table.ts";
import { ggufFor, llamaGreedy, type LlamaTools } from "./llama.ts";
import { LIBRARY } from "./provision.ts";
import { CORES, log } from "./system.ts";

const PROMPTS = [
  "The quick brown fox jumps over the lazy dog.",
  "Once upon a time, in a land far away, there lived",
  "def fibonacci(n):\n    return n if n < 2 else",
  "Weight-shared looped transformers reuse one block for every loop.",
  "Q: What is the capital of France?\nA:",
];

interface EquivalenceRow extends Row {
  prompt: number;
  "prompt tokens": number;
  "free-run agree": string;
  "first diff": number | string;
  "forced agree": string;
  "max |dlogit|": number;
  "logit std": number;
}

async function equivalence(
  tools: LlamaTools,
  fp16: string,
  gguf: string,
  loops: number,
  n: number,
): Promise<{ rows: EquivalenceRow[]; summary: Row }> {
  const tok = await Tokenizer.load();
  const model = NativeModel.load(LIBRARY, fp16, Math.min(2, CORES), "auto");
  const vocab = model.info.vocabSize;
  const rows: EquivalenceRow[] = [];
  let free = 0;
  let forced = 0;
  let total = 0;
  let maxDiff = 0;
  PROMPTS.forEach((text, pi) => {
    const prompt = tok.encode(text);
    // loopserve, free-running greedy
    const s = model.newSession(prompt.length + n + 1, loops, 0);
    const mine: number[] = [s.step(Int32Array.from(prompt), loops, GREEDY)];
    const one = new Int32Array(1);
    while (mine.length < n) {
      one[0] = mine[mine.length - 1];
      mine.push(s.step(one, loops, GREEDY));
    }
    s.close();
    // llama.cpp, free-running greedy, with the logits it chose from
    const theirs = llamaGreedy(tools, gguf, prompt, n, Math.min(2, CORES), vocab);
    // loopserve on llama.cpp's sequence: same contexts, comparable logits
    const seq = Int32Array.from([...prompt, ...theirs.tokens.slice(0, n - 1)]);
    const forcedLogits = new Float32Array(n * vocab);
    const f = model.newSession(seq.length + 1, loops, 0);
    f.forward(seq, loops, forcedLogits, n);
    f.close();

    let agreeFree = 0;
    let firstDiff = -1;
    let agreeForced = 0;
    let diff = 0;
    let sq = 0;
    for (let k = 0; k < n; k++) {
      if (mine[k] === theirs.tokens[k]) agreeFree++;
      else if (firstDiff < 0) firstDiff = k;
      let best = 0;
      for (let v = 0; v < vocab; v++) {
        const a = forcedLogits[k * vocab + v];
        const b = theirs.logits[k * vocab + v];
        if (a > forcedLogits[k * vocab + best]) best = v;
        diff = Math.max(diff, Math.abs(a - b));
        sq += b * b;
      }
      if (best === theirs.tokens[k]) agreeForced++;
    }
    free += agreeFree;
    forced += agreeForced;
    total += n;
    maxDiff = Math.max(maxDiff, diff);
    rows.push({
      prompt: pi,
      "prompt tokens": prompt.length,
      "free-run agree": `${agreeFree}/${n}`,
      "first diff": firstDiff < 0 ? "-" : firstDiff,
      "forced agree": `${agreeForced}/${n}`,
      "max |dlogit|": diff,
      "logit std": Math.sqrt(sq / (n * vocab)),
    });
  });
  model.close();
  const summary: Row = {
    loops,
    positions: total,
    "free-run agree %": (100 * free) / total,
    "forced agree %": (100 * forced) / total,
    "max |dlogit|": maxDiff,
    // Per position, on the same context: after one near-tie flips in a free
    // run, every later position compares different contexts.
    "target: forced >= 95%": (100 * forced) / total >= 95 ? "met" : "MISSED",
  };
  return { rows, summary };
}

/** The equivalence tables on the F16 export at the benchmark's loop depth, printed. */
export async function equivalenceSection(tools: LlamaTools, fp16: string): Promise<{ rows: EquivalenceRow[]; summary: Row }> {
  const loops = BENCH_SHAPE.loops;
  const gguf = ggufFor(tools, fp16, loops, "fp16");
  log(`equivalence on ${basename(gguf)}`);
  const equiv = await equivalence(tools, fp16, gguf, loops, 32);
  printTable(`equivalence: greedy on the F16 export, loops ${loops}, ${PROMPTS.length} prompts x 32 tokens`, equiv.rows);
  printTable("equivalence summary (forced = loopserve's argmax on llama.cpp's own sequence)", [equiv.summary]);
  return equiv;
}
