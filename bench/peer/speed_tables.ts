// bench:peer's speed tables, from the side-by-side points: each point beside
// its roofline bound, the cost of one more loop against one more layer, the
// speed targets, and the notes that say how to read them.
import { printTable, type Row } from "../../src/cli/bench/table.ts";
import { type Format, LLAMA_TYPE } from "./llama.ts";
import { CONTENDED, type Options, PEER_MODELS } from "./options.ts";
import type { FormatModels } from "./provision.ts";
import { qualityHolds } from "./quality_section.ts";
import type { QualityResult } from "./quality.ts";
import { decodeWeightBytes, loopserveDecodeBoundS, prefillFlops, type RooflineProbe } from "./roofline.ts";
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
    /** Weight bytes a decoded token reads (both engines: the head and every step's layers) times tokens/s. */
    loopserveDecodeGBps: number;
    llamaDecodeGBps: number;
    dramGBps: number;
  };
}

/** A llama.cpp figure's cell: the number, marked when taken another way than its defaults, or why there is none. */
function llamaCell(x: number, way: string): string | number {
  if (way.startsWith("crashed")) return way;
  return way ? `${x.toFixed(2)} (${way})` : x;
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
    const lsGBps = (ls.tgTokS * decodeWeightBytes(m.cost, loops)) / 1e9;
    const llGBps = (ll.tgTokS * ll.bytes) / 1e9;
    rows.push({
      format: `${m.format}/${LLAMA_TYPE[m.format]}`,
      thr: threads,
      loops,
      "ls pp t/s": ls.ppTokS,
      "llama pp t/s": llamaCell(ll.ppTokS, ll.ppWay),
      "pp x": Number.isNaN(ppX) ? "-" : ppX,
      "ls tg t/s": ls.tgTokS,
      "llama tg t/s": llamaCell(ll.tgTokS, ll.tgWay),
      "tg x": Number.isNaN(tgX) ? "-" : tgX,
      "ls tg GB/s": lsGBps,
      "llama tg GB/s": Number.isNaN(llGBps) ? "-" : llGBps,
      "DRAM GB/s": dram,
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
        loopserveDecodeGBps: lsGBps,
        llamaDecodeGBps: llGBps,
        dramGBps: dram,
      },
    });
  }
  printTable(
    `loopserve (ls) vs llama.cpp ${llamaVersion}, ${PEER_MODELS[o.model].label}: prefill ${o.prefill} / decode ${o.decode} tokens/s, the same model exported to GGUF (unrolled); decode GB/s = weight bytes a token reads x tokens/s`,
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

/** A speed target: a ratio (or, `share`, the decode GB/s over the DRAM probe's) at or above `min`. */
interface Target {
  format: Format;
  loops: number;
  what: "decode" | "prefill" | "decode GB/s of DRAM";
  min: number;
}

/**
 * Each model's targets at 2 threads. bench: decode >= 2.0x at loops 8 and
 * >= 1.3x at loops 1; prefill >= 1.3x (fp16) and >= 2.0x (int4) at loops 8,
 * >= 1.0x at loops 1. dim2048, loops 8: decode fp16 >= 2.0x, int4 >= 2.5x,
 * prefill fp16 >= 1.5x. ouro, 4 steps: fp16 decode's effective GB/s within
 * 15% of the DRAM probe's.
 */
function targetsOf(model: Options["model"]): Target[] {
  if (model === "dim2048")
    return [
      { format: "fp16", loops: 8, what: "decode", min: 2.0 },
      { format: "int4", loops: 8, what: "decode", min: 2.5 },
      { format: "fp16", loops: 8, what: "prefill", min: 1.5 },
    ];
  if (model === "ouro") return [{ format: "fp16", loops: 4, what: "decode GB/s of DRAM", min: 0.85 }];
  return (["fp16", "int4", "int2"] as const).flatMap((format): Target[] => [
    { format, loops: 8, what: "decode", min: 2.0 },
    { format, loops: 1, what: "decode", min: 1.3 },
    ...(format === "int2" ? [] : [{ format, loops: 8, what: "prefill" as const, min: format === "fp16" ? 1.3 : 2.0 }]),
    { format, loops: 1, what: "prefill", min: 1.0 },
  ]);
}

/** The model's targets against the measured points (2 threads); a quantized format's ratios count only where its quality holds. Printed. */
export function targetTable(raw: SpeedRecord[], quality: QualityResult | null, o: Options): Row[] {
  const targets: Row[] = [];
  for (const t of targetsOf(o.model)) {
    const r = raw.find((x) => x.threads === 2 && x.format === t.format && x.loops === t.loops);
    if (!r) continue;
    const x =
      t.what === "decode" ? r.ratios.decode : t.what === "prefill" ? r.ratios.prefill : r.bounds.loopserveDecodeGBps / r.bounds.dramGBps;
    const holds = t.what === "decode GB/s of DRAM" ? "-" : qualityHolds(quality, t.format);
    const verdict = Number.isNaN(x)
      ? "unmeasured (llama.cpp crashed)"
      : x < t.min
        ? "MISSED"
        : holds === "NO"
          ? "not claimed (quality)"
          : holds === "?"
            ? "met (quality unmeasured)"
            : "met";
    targets.push({ format: `${t.format}/${r.llamaType}`, loops: t.loops, target: `${t.what} >= ${t.min}`, measured: Number.isNaN(x) ? "-" : x, verdict, "ls KL <= llama": holds });
  }
  printTable(`speed targets at 2 threads, ${PEER_MODELS[o.model].label}`, targets);
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
