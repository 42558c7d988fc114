// Learned early exit on a trained looped model with an exit gate
// (docs/early-exit.md): held-out perplexity and single-stream decode speed
// at every fixed depth and under each exit policy at several thresholds,
// side by side in one run, beside every step computed and the exit step
// selected (what the published Ouro code does), a single-block model and
// the Kneser-Ney trigram counted on the same training split.
//
//   bun bench/exit.ts --model FILE [--head fp16|int4] [--compare FILE] [--thresholds 0.5,0.7,0.9]
//                     [--texts 16] [--len 256] [--prompts 8] [--decode 128] [--threads 2] [--rounds 3]
//
// --head int4 measures the models with their output head quantized to int4
// (made once beside each file, `model quantize --quant fp16 --head int4`).
// Perplexity is teacher-forced over the same held-out texts as bench/quality.ts
// (the KJV validation split): at a fixed depth each text runs in one call; under
// early exit every position is fed as a sampled token is (one step each, its
// logits from its exit step), which is what generation does. "Every step,
// select" takes each position's logits from the fixed-depth pass at its exit
// step (the exact policy's exit steps; the kernels' tests hold them equal to
// the gate's decisions over every step). Speed: greedy decoding of --decode
// tokens after each of --prompts held-out prompts, one ls_session_step per
// token (the kernels alone, no HTTP), every setting interleaved with the
// others in each of --rounds rounds: the median round is reported, and each
// ratio to fixed depth T is taken within a round.
import { kernelLibrary } from "../src/cli/bench/engine.ts";
import { printTable, type Row } from "../src/cli/bench/table.ts";
import { NativeModel } from "../src/engine/binding.ts";
import { EXIT_POLICIES, type ExitPlan, GREEDY } from "../src/engine/types.ts";
import { TRAINED_MODEL_PATH } from "../src/model/trained.ts";
import { kjvTokens } from "./kjv.ts";
import { kneserNeyPerplexity } from "./kneser_ney.ts";
import { row, Tally } from "./logits.ts";
import { quantizedPath } from "./quant.ts";
import { writeJson } from "./report.ts";

interface Options {
  model: string;
  head: "fp16" | "int4";
  compare: string;
  thresholds: number[];
  texts: number;
  len: number;
  prompts: number;
  decode: number;
  threads: number;
  rounds: number;
}

function parseArgs(argv: string[]): Options {
  const o: Options = { model: "", head: "fp16", compare: TRAINED_MODEL_PATH, thresholds: [0.5, 0.7, 0.9], texts: 16, len: 256, prompts: 8, decode: 128, threads: 2, rounds: 3 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    const int = () => {
      const n = Number(value);
      if (!Number.isInteger(n) || n < 1) throw new Error(`${flag} takes a positive integer, got ${value}`);
      return n;
    };
    if (flag === "--model") o.model = value;
    else if (flag === "--head") {
      if (value !== "fp16" && value !== "int4") throw new Error(`--head takes fp16 or int4, got ${value}`);
      o.head = value;
    }
    else if (flag === "--compare") o.compare = value;
    else if (flag === "--thresholds") o.thresholds = value.split(",").map(Number);
    else if (flag === "--texts") o.texts = int();
    else if (flag === "--len") o.len = int();
    else if (flag === "--prompts") o.prompts = int();
    else if (flag === "--decode") o.decode = int();
    else if (flag === "--threads") o.threads = int();
    else if (flag === "--rounds") o.rounds = int();
    else throw new Error(`unknown flag ${flag}`);
  }
  if (!o.model) throw new Error("--model FILE (a model with an exit gate) is required");
  if (o.thresholds.some((t) => !(t >= 0 && t < 1))) throw new Error("--thresholds are numbers in [0, 1)");
  return o;
}

/** `count` texts of `len` tokens spread evenly over `tokens`. */
function texts(tokens: Uint16Array, len: number, count: number): Int32Array[] {
  const stride = Math.floor(tokens.length / len / count);
  return Array.from({ length: count }, (_, i) => Int32Array.from(tokens.subarray(i * stride * len, (i * stride + 1) * len)));
}

/** Every position's logits at a fixed depth, one call per text. */
function fixedLogits(m: NativeModel, text: Int32Array, loops: number): Float32Array {
  const out = new Float32Array(text.length * m.info.vocabSize);
  const s = m.newSession(text.length, loops, 0);
  try {
    s.forward(text, loops, out, text.length);
  } finally {
    s.close();
  }
  return out;
}

/** Teacher-forced perplexity at a fixed depth. */
function fixedPerplexity(m: NativeModel, evalTexts: Int32Array[], loops: number): number {
  const tally = new Tally();
  for (const text of evalTexts) tally.add(fixedLogits(m, text, loops), text, m.info.vocabSize, null);
  return tally.perplexity;
}

/** Teacher-forced perplexity under an exit rule, the mean steps the positions ran, and each text's exit steps. */
function exitPerplexity(m: NativeModel, evalTexts: Int32Array[], loops: number, exit: ExitPlan) {
  const V = m.info.vocabSize;
  const tally = new Tally();
  const exitSteps: Int32Array[] = [];
  let steps = 0;
  let n = 0;
  for (const text of evalTexts) {
    const out = new Float32Array(text.length * V);
    const ran = new Int32Array(text.length);
    const s = m.newSession(text.length, loops, 0);
    try {
      for (let t = 0; t < text.length; t++) {
        s.step(text.subarray(t, t + 1), loops, GREEDY, row(out, t, V), exit);
        ran[t] = s.lastSteps;
        steps += s.lastSteps;
        n++;
      }
    } finally {
      s.close();
    }
    tally.add(out, text, V, null);
    exitSteps.push(ran);
  }
  return { perplexity: tally.perplexity, meanSteps: steps / n, exitSteps };
}

/** Every step for every position, each position's logits from the fixed-depth pass at its exit step. */
function everyStepSelectPerplexity(m: NativeModel, evalTexts: Int32Array[], exitSteps: Int32Array[]): number {
  const V = m.info.vocabSize;
  const tally = new Tally();
  evalTexts.forEach((text, i) => {
    const selected = new Float32Array(text.length * V);
    for (const d of new Set(exitSteps[i])) {
      const at = fixedLogits(m, text, d);
      exitSteps[i].forEach((steps, t) => steps === d && row(selected, t, V).set(row(at, t, V)));
    }
    tally.add(selected, text, V, null);
  });
  return tally.perplexity;
}

/** One decode setting of the speed comparison. */
interface SpeedSetting {
  m: NativeModel;
  loops: number;
  exit?: ExitPlan;
}

/** Greedy decode of n tokens after `prompt` (prefill not counted): milliseconds. */
function decodeMs(x: SpeedSetting, prompt: Int32Array, n: number): number {
  const s = x.m.newSession(prompt.length + n + 1, x.loops, 0);
  try {
    let next = s.step(prompt, x.loops, GREEDY, null, x.exit);
    const t0 = performance.now();
    for (let i = 0; i < n; i++) next = s.step(Int32Array.of(next), x.loops, GREEDY, null, x.exit);
    return performance.now() - t0;
  } finally {
    s.close();
  }
}

const median = (xs: number[]) => xs.toSorted((a, b) => a - b)[xs.length >> 1];

/**
 * Decode tokens/s of every setting, interleaved: each round decodes every
 * prompt under every setting in turn (the order rotating from prompt to
 * prompt), so a change in the machine's load falls on all settings alike.
 * Per setting, the median over rounds of its tokens/s and of its ratio to
 * `base`'s in the same round.
 */
function interleavedSpeeds(settings: SpeedSetting[], base: number, prompts: Int32Array[], n: number, rounds: number) {
  const perRound = settings.map(() => [] as number[]);
  for (let r = 0; r < rounds; r++) {
    const ms = settings.map(() => 0);
    prompts.forEach((prompt, p) => {
      for (let k = 0; k < settings.length; k++) {
        const i = (k + p) % settings.length;
        ms[i] += decodeMs(settings[i], prompt, n);
      }
    });
    ms.forEach((t, i) => perRound[i].push((prompts.length * n) / (t / 1000)));
  }
  return perRound.map((tps) => ({ tokPerS: median(tps), vsBase: median(tps.map((t, r) => t / perRound[base][r])) }));
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  const lib = kernelLibrary();
  const withHead = (path: string) => (o.head === "fp16" ? path : quantizedPath(path, { quant: "fp16", head: o.head }, 32));
  const m = NativeModel.load(lib, withHead(o.model), o.threads, "auto");
  const base = NativeModel.load(lib, withHead(o.compare), o.threads, "auto");
  try {
    if (!m.info.exitGate) throw new Error(`${o.model} has no exit gate`);
    const held = await kjvTokens("val");
    const evalTexts = texts(held, o.len, o.texts);
    const prompts = texts(held.subarray(held.length >> 1), 48, o.prompts);
    const T = m.info.defaultLoops;
    const rows: Row[] = [];
    const record: Record<string, unknown>[] = [];
    // quality first, then the speeds of every setting interleaved
    const settings: SpeedSetting[] = [];
    const lines: { setting: string; steps: number; perplexity: number; meanSteps: number; speed: number | null }[] = [];
    const line = (setting: string, steps: number, perplexity: number, meanSteps: number, speed: SpeedSetting | null) => {
      lines.push({ setting, steps, perplexity, meanSteps, speed: speed ? settings.push(speed) - 1 : null });
    };
    for (let d = 1; d <= T; d++) line("fixed depth", d, fixedPerplexity(m, evalTexts, d), d, { m, loops: d });
    const fixedT = T - 1; // the speed index of fixed depth T
    for (const threshold of o.thresholds)
      for (const policy of EXIT_POLICIES) {
        const exit = { threshold, policy };
        const q = exitPerplexity(m, evalTexts, T, exit);
        line(`exit_threshold ${threshold}, ${policy}`, T, q.perplexity, q.meanSteps, { m, loops: T, exit });
        if (policy === "exact") line(`exit_threshold ${threshold}, every step, select`, T, everyStepSelectPerplexity(m, evalTexts, q.exitSteps), q.meanSteps, null);
      }
    const B = base.info.defaultLoops;
    line(`single block (${o.compare.split("/").pop()})`, B, fixedPerplexity(base, evalTexts, B), B, { m: base, loops: B });
    const speeds = interleavedSpeeds(settings, fixedT, prompts, o.decode, o.rounds);
    for (const l of lines) {
      const sp = l.speed === null ? null : speeds[l.speed];
      rows.push({
        model: l.setting,
        steps: l.steps,
        "mean steps": l.meanSteps.toFixed(2),
        perplexity: l.perplexity.toFixed(2),
        "decode tok/s": sp ? sp.tokPerS.toFixed(0) : "-",
        [`vs T=${T}`]: sp ? `${sp.vsBase.toFixed(2)}x` : "-",
      });
      record.push({ setting: l.setting, steps: l.steps, perplexity: l.perplexity, meanSteps: l.meanSteps, tokPerS: sp?.tokPerS ?? null, vsFixedT: sp?.vsBase ?? null });
    }
    const kn = kneserNeyPerplexity(await kjvTokens("train"), evalTexts, m.info.vocabSize, 3);
    rows.push({ model: "Kneser-Ney trigram, training split counts", steps: "-", "mean steps": "-", perplexity: kn.toFixed(2), "decode tok/s": "-", [`vs T=${T}`]: "-" });
    printTable(
      `Early exit on ${o.model.split("/").pop()}, ${o.head} head (${o.texts} held-out texts of ${o.len} tokens; decode: ${o.prompts} prompts x ${o.decode} tokens, ` +
        `${o.threads} threads, the median of ${o.rounds} interleaved rounds)`,
      rows,
    );
    console.log(`\nwrote ${writeJson("exit", { model: o.model, options: o, rows: record, kneserNeyTrigram: kn })}`);
  } finally {
    m.close();
    base.close();
  }
}

await main();
