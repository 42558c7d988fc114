// The side-by-side speed measurement: loopserve through the binding and
// llama-bench on the same model, in pairs taken alternately (the header of
// bench/peer.ts says why pairs, and why a contended pair is taken again).
import { NativeModel } from "../../src/engine/binding.ts";
import { GREEDY } from "../../src/engine/types.ts";
import { promptOf } from "../../src/cli/bench/models.ts";
import { firstThatRuns, LLAMA_TYPE, llamaBench, type LlamaTools, REPACK_OFF } from "./llama.ts";
import { CONTENDED, type Options } from "./options.ts";
import { type FormatModels, LIBRARY } from "./provision.ts";
import { ggufDecodeBytes } from "./roofline.ts";
import { LoadMeter, log, median, ownCpuS, waitForQuiet } from "./system.ts";

export interface Measured {
  ppTokS: number; // NaN where the engine crashed
  tgTokS: number;
  cpuS: number;
  othersCores: number;
  /** How llama.cpp's figure was taken: "" (its defaults), "repack off", or "crashed (...)" (loopserve: always ""). */
  ppWay: string;
  tgWay: string;
}

function measureLoopserve(model: NativeModel, loops: number, o: Options): Measured {
  const vocab = model.info.vocabSize;
  const prompt = promptOf(o.prefill, vocab);
  const one = new Int32Array(1);
  const meter = new LoadMeter();
  const c0 = ownCpuS();
  // Warm-up, as llama-bench does one: page in the weights, wake the pool.
  {
    const s = model.newSession(64, loops, 0);
    s.step(prompt.subarray(0, 16), loops, GREEDY);
    for (let i = 0; i < 4; i++) {
      one[0] = i + 1;
      s.step(one, loops, GREEDY);
    }
    s.close();
  }
  const pp: number[] = [];
  const tg: number[] = [];
  for (let r = 0; r < o.repeats; r++) {
    let s = model.newSession(o.prefill + 1, loops, 0);
    let t = performance.now();
    s.step(prompt, loops, GREEDY);
    pp.push((o.prefill * 1000) / (performance.now() - t));
    s.close();

    s = model.newSession(o.decode + 1, loops, 0);
    let next = 13;
    t = performance.now();
    for (let i = 0; i < o.decode; i++) {
      one[0] = next;
      next = s.step(one, loops, GREEDY);
    }
    tg.push((o.decode * 1000) / (performance.now() - t));
    s.close();
  }
  const cpuS = ownCpuS() - c0;
  return { ppTokS: median(pp), tgTokS: median(tg), cpuS, othersCores: meter.othersCores(cpuS), ppWay: "", tgWay: "" };
}

/** The median of the numbers that are not NaN (NaN when none is). */
function medianOfRun(xs: number[]): number {
  return median(xs.filter((x) => !Number.isNaN(x)));
}

/** Rounds of one engine's measurement: median tokens/s, total CPU time, the busiest round's load, the last round's ways. */
function mergeRounds(rs: Measured[]): Measured {
  return {
    ppTokS: medianOfRun(rs.map((r) => r.ppTokS)),
    tgTokS: medianOfRun(rs.map((r) => r.tgTokS)),
    cpuS: rs.reduce((a, r) => a + r.cpuS, 0),
    othersCores: Math.max(...rs.map((r) => r.othersCores || 0)),
    ppWay: rs[rs.length - 1].ppWay,
    tgWay: rs[rs.length - 1].tgWay,
  };
}

/**
 * llama-bench's prefill and decode, each its own process, so that a crash
 * in one (llama.cpp's repacked Q4_0 prefill crashes on some AMX hosts)
 * leaves the other; a crashed test is taken again with repacking off, and
 * failing that is a marked cell. Once a way had to be taken, later rounds
 * start from it.
 */
export function measureLlama(tools: LlamaTools, gguf: string, threads: number, o: Options, start: { pp: string; tg: string }): Measured & { bytes: number } {
  const meter = new LoadMeter();
  let cpuS = 0;
  const test = (kind: "pp" | "tg", tokens: number) => {
    const bench = (extra: string[]) => {
      const r = llamaBench(tools, gguf, { test: kind, tokens, threads, repeats: o.repeats, extra });
      cpuS += r.cpuS;
      return r.tokS;
    };
    const ways: [string, () => number][] = [
      ["", () => bench([])],
      ["repack off", () => bench(REPACK_OFF.bench)],
    ];
    const r = firstThatRuns(`llama-bench ${kind}${tokens}`, ways.slice(Math.max(0, ways.findIndex(([w]) => w === start[kind]))), log);
    return "crashed" in r ? { tokS: NaN, way: `crashed (${r.crashed})` } : { tokS: r.value, way: r.way };
  };
  const pp = test("pp", o.prefill);
  const tg = test("tg", o.decode);
  return { ppTokS: pp.tokS, tgTokS: tg.tokS, cpuS, othersCores: meter.othersCores(cpuS), ppWay: pp.way, tgWay: tg.way, bytes: ggufDecodeBytes(gguf) };
}

/** One point of the grid: each engine's medians over the rounds, and the median of the per-pair ratios. */
export interface SpeedPoint {
  m: FormatModels;
  threads: number;
  loops: number;
  simd: string;
  attempts: number;
  ls: Measured;
  ll: Measured & { bytes: number };
  ppX: number; // median over rounds of loopserve / llama.cpp
  tgX: number;
}

/** Every format, thread count and loop depth, each in o.rounds pairs. */
export async function measureSpeed(tools: LlamaTools, models: FormatModels[], o: Options): Promise<SpeedPoint[]> {
  const measured: SpeedPoint[] = [];
  let turn = 0;
  for (const m of models) {
    for (const threads of o.threads) {
      const model = NativeModel.load(LIBRARY, m.loopserve, threads, "auto");
      const simd = model.info.simd;
      for (const loops of o.loops) {
        const gguf = m.gguf.get(loops)!;
        log(`${m.format}/${LLAMA_TYPE[m.format]} threads ${threads} loops ${loops}`);
        const doLs = async () => {
          if (o.wait) await waitForQuiet(10);
          return measureLoopserve(model, loops, o);
        };
        // A way llama.cpp had to be run in (repack off) is where its next rounds start.
        const start = { pp: "", tg: "" };
        const doLl = async () => {
          if (o.wait) await waitForQuiet(10);
          const r = measureLlama(tools, gguf, threads, o, start);
          if (!r.ppWay.startsWith("crashed")) start.pp = r.ppWay;
          if (!r.tgWay.startsWith("crashed")) start.tg = r.tgWay;
          return r;
        };
        const pair = async () => {
          if (turn++ % 2 === 0) {
            const a = await doLs();
            return { ls: a, ll: await doLl() };
          }
          const b = await doLl();
          return { ls: await doLs(), ll: b };
        };
        const load = (p: Awaited<ReturnType<typeof pair>>) => Math.max(p.ls.othersCores, p.ll.othersCores) || 0;
        const pairs: Awaited<ReturnType<typeof pair>>[] = [];
        let attempts = 0;
        for (let round = 0; round < o.rounds; round++) {
          let best = await pair();
          attempts++;
          for (let retry = 0; load(best) > CONTENDED && retry < o.retries; retry++) {
            log(`  others used ${load(best).toFixed(2)} cores: measuring again`);
            const next = await pair();
            attempts++;
            if (load(next) < load(best)) best = next;
          }
          pairs.push(best);
        }
        measured.push({
          m,
          threads,
          loops,
          simd,
          attempts,
          ls: mergeRounds(pairs.map((p) => p.ls)),
          ll: { ...mergeRounds(pairs.map((p) => p.ll)), bytes: pairs[0].ll.bytes },
          ppX: medianOfRun(pairs.map((p) => p.ls.ppTokS / p.ll.ppTokS)),
          tgX: medianOfRun(pairs.map((p) => p.ls.tgTokS / p.ll.tgTokS)),
        });
      }
      model.close();
    }
  }
  return measured;
}
