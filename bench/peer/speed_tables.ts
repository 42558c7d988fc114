// bench:peer's speed tables, from the side-by-side points: each point beside
// its roofline bound, the cost of one more loop against one more layer, the
// speed targets, and the notes that say how to read them.
import { printTable, type Row } from "../../src/cli/bench/table.ts";
import { type Format, LLAMA_TYPE } from "./llama.ts";
import { CONTENDED, type Options } from "./options.ts";
import type { FormatModels } from "./provision.ts";
import { qualityHolds } from "./quality_section.ts";
import type { QualityResult } from "./quality.ts";
import { loopserveDecodeBoundS, prefillFlops, type RooflineProbe } from "./roofline.ts";
import type { Measured, SpeedPoint } from "./speed.ts";
import { linearFit } from "./system.ts";

/** A point as peer.json records it. */
export interface SpeedRecord {
  format: Format;
  llamaType: string;
  threads: number;
  loops: number;
  simd: string;
  attempts: number;
  loopserve: Measured;
  llama: Measured & { bytes: number };
  ratios: { prefill: number; decode: number };
  bounds: {
    loopserveDecodeTokS: number;
    llamaDecodeTokS: number;
    llamaDecodeBytes: number;
    prefillGflop: number;
    peakGops: number;
    loopservePrefillGflops: number;
    llamaPrefillGflops: number;
  };
}

/** Each point with its bounds (the probes' best figures), printed; the rows and their records. */
export function speedTable(
  points: SpeedPoint[],
  probe: RooflineProbe,
  quality: QualityResult | null,
  llamaVersion: string,
  o: Options,
): { rows: Row[]; raw: SpeedRecord[] } {
  const rows: Row[] = [];
  const raw: SpeedRecord[] = [];
  for (const { m, threads, loops, simd, attempts, ls, ll, ppX, tgX } of points) {
    const dram = probe.r.dramGBps[threads];
    const cacheBw = probe.cacheBandwidth(m.cost.blockBytes, threads);
    const peak = m.format === "fp16" ? probe.r.fmaGflops[threads] : probe.r.vnniGops?.[threads] ?? NaN;
    const meanPos = (o.decode - 1) / 2;
    const lsBound = loopserveDecodeBoundS(m.cost, loops, meanPos, dram, cacheBw);
    const llBound = ll.bytes / (dram * 1e9);
    const flops = prefillFlops(m.cost, loops, o.prefill);
    const lsPpGflops = (flops * ls.ppTokS) / o.prefill / 1e9;
    const llPpGflops = (flops * ll.ppTokS) / o.prefill / 1e9;
    const others = Math.max(ls.othersCores, ll.othersCores);
    rows.push({
      format: `${m.format}/${LLAMA_TYPE[m.format]}`,
      thr: threads,
      loops,
      "ls pp t/s": ls.ppTokS,
      "llama pp t/s": ll.ppTokS,
      "pp x": ppX,
      "ls tg t/s": ls.tgTokS,
      "llama tg t/s": ll.tgTokS,
      "tg x": tgX,
      "KL ok": qualityHolds(quality, m.format),
      "ls tg %bnd": 100 * ls.tgTokS * lsBound,
      "llama tg %bnd": 100 * ll.tgTokS * llBound,
      "ls pp %peak": (100 * lsPpGflops) / peak,
      "llama pp %peak": (100 * llPpGflops) / peak,
      "others (cores)": Number.isFinite(others) ? others : "?",
    });
    raw.push({
      format: m.format,
      llamaType: LLAMA_TYPE[m.format],
      threads,
      loops,
      simd,
      attempts,
      loopserve: ls,
      llama: ll,
      ratios: { prefill: ppX, decode: tgX },
      bounds: {
        loopserveDecodeTokS: 1 / lsBound,
        llamaDecodeTokS: 1 / llBound,
        llamaDecodeBytes: ll.bytes,
        prefillGflop: flops / 1e9,
        peakGops: peak,
        loopservePrefillGflops: lsPpGflops,
        llamaPrefillGflops: llPpGflops,
      },
    });
  }
  printTable(
    `loopserve (ls) vs llama.cpp ${llamaVersion}: prefill ${o.prefill} / decode ${o.decode} tokens/s, same GGUF-exported model`,
    rows,
  );
  return { rows, raw };
}

/** Least-squares cost of one more loop (loopserve) and one more layer (llama.cpp), printed; none under two loop depths. */
export function slopeTable(raw: SpeedRecord[], models: FormatModels[], probe: RooflineProbe, o: Options): Row[] {
  const slopes: Row[] = [];
  if (o.loops.length < 2) return slopes;
  for (const m of models) {
    for (const threads of o.threads) {
      const sel = raw.filter((r) => r.format === m.format && r.threads === threads);
      const x = sel.map((r) => r.loops);
      const ls = linearFit(x, sel.map((r) => 1000 / r.loopserve.tgTokS));
      const ll = linearFit(x, sel.map((r) => 1000 / r.llama.tgTokS));
      const lsPp = linearFit(x, sel.map((r) => 1000 / r.loopserve.ppTokS));
      const loopBoundMs = (m.cost.blockBytes / (probe.cacheBandwidth(m.cost.blockBytes, threads) * 1e9)) * 1000;
      const llPp = linearFit(x, sel.map((r) => 1000 / r.llama.ppTokS));
      slopes.push({
        format: `${m.format}/${LLAMA_TYPE[m.format]}`,
        thr: threads,
        "ls tg ms/loop": ls.slope,
        "llama tg ms/layer": ll.slope,
        "ls/llama": ls.slope / ll.slope,
        "target <= 0.25": ls.slope / ll.slope <= 0.25 ? "met" : "MISSED",
        "loop bound ms": loopBoundMs,
        "ls tg ms @0 loops": ls.intercept,
        "llama tg ms @0 layers": ll.intercept,
        "ls pp us/tok/loop": lsPp.slope * 1000,
        "llama pp us/tok/layer": llPp.slope * 1000,
      });
    }
  }
  printTable(`decode cost per extra loop (loopserve) vs per extra layer (llama.cpp), least squares over loops ${o.loops.join(", ")}`, slopes);
  return slopes;
}

/**
 * Decode >= 2.0x at loops 8 and >= 1.3x at loops 1; prefill >= 1.3x (fp16)
 * and >= 2.0x (int4) at loops 8, >= 1.0x at loops 1; a quantized format's
 * ratios count only where its quality holds against llama.cpp's. Printed.
 */
export function targetTable(raw: SpeedRecord[], quality: QualityResult | null): Row[] {
  const targets: Row[] = [];
  const verdict = (x: number, target: number | null, holds: string) =>
    target === null ? "-" : x < target ? "MISSED" : holds === "NO" ? "not claimed (quality)" : holds === "?" ? "met (quality unmeasured)" : "met";
  for (const r of raw.filter((r) => r.threads === 2 && (r.loops === 8 || r.loops === 1))) {
    const x = r.ratios;
    const format = r.format;
    const deep = r.loops === 8;
    const decodeTarget = deep ? 2.0 : 1.3;
    const prefillTarget = deep ? ({ fp16: 1.3, int4: 2.0, int2: null } as const)[format] : 1.0;
    const holds = qualityHolds(quality, format);
    targets.push({
      format: `${format}/${r.llamaType}`,
      loops: r.loops,
      "decode x": x.decode,
      "decode target": decodeTarget,
      decode: verdict(x.decode, decodeTarget, holds),
      "prefill x": x.prefill,
      "prefill target": prefillTarget ?? "-",
      prefill: verdict(x.prefill, prefillTarget, holds),
      "ls KL <= llama": holds,
    });
  }
  printTable("speed targets against llama.cpp at 2 threads", targets);
  return targets;
}

/** How the speed rows were taken; a note on the noisy ones is printed too. */
export function speedNotes(rows: Row[], o: Options): string[] {
  const notes = [
    `decode is ${o.decode} steps from an empty cache for both engines (llama-bench's tg${o.decode}); prefill is one ${o.prefill}-token batch`,
    "both engines' default recipes, as users get them: llama-quantize's Q4_0 and Q2_K keep some tensors at higher precision " +
      "(Q2_K: attn_v, attn_output, ffn_down at Q3_K), loopserve's int2 keeps wv, wo and w2 at int4 (model quantize's default mix)",
  ];
  const noisy = rows.filter((r) => typeof r["others (cores)"] === "number" && (r["others (cores)"] as number) > CONTENDED);
  if (noisy.length > 0) {
    const msg = `${noisy.length} of ${rows.length} rows ran while other processes used > ${CONTENDED} cores even after ${o.retries} retries (column "others"): their numbers are noisy, 2-thread llama.cpp worst of all (its threads spin at every op barrier)`;
    console.log(`note: ${msg}`);
    notes.push(msg);
  }
  return notes;
}
