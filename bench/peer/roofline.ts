// The machine's limits and what each result achieves of them.
//
// Probes (bench/peer/probes/*.c, compiled here with gcc -O3 -march=native):
//   membw  read bandwidth of a working set: DRAM (512 MiB) and the size of
//          the model's shared block (fits in L3 on this machine kind)
//   peak   fp32 FMA GFLOP/s and int8 VNNI GOP/s
// each single- and two-threaded.
//
// Bound models (stated in the report too):
//   decode, loopserve: per token the output head and one pass over the block
//     (a stack: over its layers) come from DRAM (streaming the fp16 head
//     evicts the L3 every token, so the first loop re-reads the block), the
//     other loops - 1 block passes and the KV cache come from the cache level
//     the block fits in, at the bandwidth measured for a working set of the
//     block's size (DRAM's, for a stack larger than the caches).
//   decode, llama.cpp: every layer is its own copy of the block, so all
//     layer weights and the head come from DRAM (token_embd: one row).
//   prefill: FLOPs / peak. fp16 weights are widened to fp32 and FMA'd, so
//     the fp32 FMA peak applies; int4/int2 dot int8 activations, so VNNI.
//     FLOPs = tokens x loops x (2 x block matmul params + causal attention
//     4 x mean context x q_dim) + 2 x head params (one logits row).
import { mkdirSync, openSync, readSync, closeSync, statSync } from "node:fs";
import { join } from "node:path";
import type { ModelConfig } from "../../src/model/format.ts";
import { DTYPE_SIZES, readSafetensors } from "../../src/model/safetensors.ts";
import { printTable, type Row } from "../../src/cli/bench/table.ts";
import { cacheDir, type Format } from "./llama.ts";
import { PeerBenchError, requireTool, run, waitForQuiet } from "./system.ts";

export interface Roofline {
  dramGBps: Record<number, number>; // by threads
  fmaGflops: Record<number, number>;
  vnniGops: Record<number, number> | null;
  cacheGBps: Map<string, number>; // `${bytes}/${threads}` -> GB/s
  fmaIsa: string;
  vnniIsa: string;
  l3Bytes: number;
}

export function compileProbe(name: string): string {
  requireTool("gcc", "Debian: apt-get install gcc");
  const dir = join(cacheDir(), "probes");
  mkdirSync(dir, { recursive: true });
  const out = join(dir, name);
  run(["gcc", "-O3", "-march=native", "-pthread", join(import.meta.dir, "probes", `${name}.c`), "-o", out]);
  return out;
}

export function probeJson(cmd: string[]): Record<string, number | string | boolean> {
  const r = run(cmd);
  try {
    return JSON.parse(r.stdout.trim().split("\n").pop() ?? "");
  } catch {
    throw new PeerBenchError(`${cmd[0]} printed no JSON: ${r.stdout.slice(0, 200)}`);
  }
}

function l3Bytes(): number {
  try {
    const s = Bun.spawnSync(["cat", "/sys/devices/system/cpu/cpu0/cache/index3/size"]).stdout.toString().trim();
    const m = /^(\d+)K$/.exec(s);
    return m ? Number(m[1]) * 1024 : NaN;
  } catch {
    return NaN;
  }
}

export class RooflineProbe {
  private membw: string;
  private peak: string;
  readonly r: Roofline;
  /** Working-set bandwidths measured before the latest measure(): taken again on next use. */
  private stale = new Set<string>();

  constructor() {
    this.membw = compileProbe("membw");
    this.peak = compileProbe("peak");
    this.r = {
      dramGBps: {},
      fmaGflops: {},
      vnniGops: null,
      cacheGBps: new Map(),
      fmaIsa: "?",
      vnniIsa: "none",
      l3Bytes: l3Bytes(),
    };
  }

  /**
   * Best of `tries` runs each (and of earlier calls): a bound is what the
   * machine can do, and on a shared machine a single run mostly measures the
   * neighbours. With `wait`, each try first waits (up to 10 s) for a quiet machine.
   */
  async measure(threads: number[], wait: boolean, tries = 3): Promise<void> {
    const best = (old: number | undefined, v: number) => (old === undefined || v > old ? v : old);
    for (const k of this.r.cacheGBps.keys()) this.stale.add(k);
    for (let i = 0; i < tries; i++) {
      for (const t of threads) {
        if (wait) await waitForQuiet(10);
        const bw = Number(probeJson([this.membw, String(512 << 20), String(t), "1"]).GBps);
        this.r.dramGBps[t] = best(this.r.dramGBps[t], bw);
        const fma = probeJson([this.peak, "fma", String(t), "0.5"]);
        this.r.fmaGflops[t] = best(this.r.fmaGflops[t], Number(fma.Gops));
        this.r.fmaIsa = String(fma.isa);
        const vnni = probeJson([this.peak, "vnni", String(t), "0.5"]);
        if (vnni.supported) {
          this.r.vnniGops ??= {};
          this.r.vnniGops[t] = best(this.r.vnniGops[t], Number(vnni.Gops));
          this.r.vnniIsa = String(vnni.isa);
        }
      }
    }
  }

  /** Read bandwidth for a working set of `bytes` (measured once per size and thread count). */
  cacheBandwidth(bytes: number, threads: number): number {
    const key = `${bytes}/${threads}`;
    let v = this.r.cacheGBps.get(key);
    if (v === undefined || this.stale.has(key)) {
      this.stale.delete(key);
      const run1 = () => Number(probeJson([this.membw, String(Math.max(bytes, 4096)), String(threads), "0.5"]).GBps);
      v = Math.max(v ?? 0, run1(), run1(), run1());
      this.r.cacheGBps.set(key, v);
    }
    return v;
  }

  /**
   * Every probe again, once the measured runs are done, the working sets of
   * `blockBytes` too: each bound keeps the best of both passes (a bound is
   * what the machine can do when nobody else runs).
   */
  async measureAgain(threads: number[], wait: boolean, blockBytes: number[]): Promise<void> {
    await this.measure(threads, wait);
    for (const bytes of blockBytes) {
      for (const t of threads) {
        if (wait) await waitForQuiet(10);
        this.cacheBandwidth(bytes, t);
      }
    }
  }
}

/** The probes' figures by thread count, printed with how the bounds use them; returns that explanation. */
export function rooflineTable(probe: RooflineProbe, models: { format: Format; cost: ModelCost }[], threads: number[]): string {
  const roof: Row[] = threads.map((t) => ({
    threads: t,
    "DRAM GB/s": probe.r.dramGBps[t],
    ...Object.fromEntries(
      models.map((m) => [`${m.format} block ${(m.cost.blockBytes / 2 ** 20).toFixed(1)} MiB GB/s`, probe.cacheBandwidth(m.cost.blockBytes, t)]),
    ),
    [`FMA fp32 GFLOP/s (${probe.r.fmaIsa})`]: probe.r.fmaGflops[t],
    [`VNNI int8 GOP/s (${probe.r.vnniIsa})`]: probe.r.vnniGops?.[t] ?? "n/a",
  }));
  printTable(`roofline probes (L3 ${(probe.r.l3Bytes / 2 ** 20).toFixed(0)} MiB)`, roof);
  const boundModel =
    "loop bound ms: one pass over the block at the bandwidth measured for its working set. " +
    "Above 100% of a bound means the model is pessimistic (e.g. part of the head survived in L3). " +
    "decode bound: loopserve reads the head + one block pass from DRAM per token and loops-1 block passes + the KV cache " +
    "at the bandwidth measured for the block's working set; llama.cpp reads every layer copy and the head from DRAM. " +
    "prefill bound: FLOPs (2 x matmul params x tokens x loops + causal attention + one head row) / peak " +
    "(fp32 FMA for fp16 weights, int8 VNNI for int4/int2).";
  console.log(`\n${boundModel}`);
  return boundModel;
}

// ---- what a model reads and computes ----

export interface ModelCost {
  blockBytes: number; // every layer's tensors as stored (block.*, or a stack's layers.*): one step's weights
  headBytes: number; // output.* (or tok_embeddings when tied)
  blockMatmulParams: number;
  headParams: number;
  qDim: number;
  kvDim: number;
  nLayers: number;
}

/** Bytes and parameters per component, from the safetensors file itself (any quant). */
export function modelCost(path: string, c: ModelConfig): ModelCost {
  const f = readSafetensors(path);
  let blockBytes = 0;
  let headBytes = 0;
  let embedBytes = 0;
  for (const [name, t] of f.tensors) {
    const bytes = t.shape.reduce((a, b) => a * b, 1) * DTYPE_SIZES[t.dtype];
    if (name.startsWith("block.") || name.startsWith("layers.")) blockBytes += bytes;
    else if (name.startsWith("output.")) headBytes += bytes;
    else if (name.startsWith("tok_embeddings.")) embedBytes += bytes;
  }
  if (c.tiedOutput) headBytes = embedBytes;
  const qDim = c.nHeads * c.headDim;
  const kvDim = c.nKvHeads * c.headDim;
  return {
    blockBytes,
    headBytes,
    blockMatmulParams: c.nLayers * (c.dim * qDim * 2 + c.dim * kvDim * 2 + 3 * c.dim * c.ffnDim),
    headParams: c.vocabSize * c.dim,
    qDim,
    kvDim,
    nLayers: c.nLayers,
  };
}

/** Weight bytes one decoded token reads at `loops` steps: the head and every step's layers (a layer copy each, unrolled). */
export function decodeWeightBytes(m: ModelCost, loops: number): number {
  return m.headBytes + loops * m.blockBytes;
}

/** Seconds per decoded token at the bound (see the header). */
export function loopserveDecodeBoundS(
  m: ModelCost,
  loops: number,
  meanPos: number,
  dramGBps: number,
  cacheGBps: number,
): number {
  const kvBytes = loops * m.nLayers * 2 * m.kvDim * 2 * meanPos; // fp16 K and V rows read per token
  const fromDram = m.headBytes + m.blockBytes;
  const fromCache = (loops - 1) * m.blockBytes + kvBytes;
  return fromDram / (dramGBps * 1e9) + fromCache / (cacheGBps * 1e9);
}

/** FLOPs of a prefill of `tokens` tokens (logits for the last one only). */
export function prefillFlops(m: ModelCost, loops: number, tokens: number): number {
  const meanCtx = (tokens + 1) / 2;
  return tokens * loops * (2 * m.blockMatmulParams + 4 * meanCtx * m.qDim) + 2 * m.headParams;
}

// ---- GGUF tensor bytes, for llama.cpp's decode bound ----

/** Bytes per block and elements per block of the ggml types llama-quantize writes here. */
const GGML_BLOCK: Record<number, [number, number]> = {
  0: [4, 1], // F32
  1: [2, 1], // F16
  2: [18, 32], // Q4_0
  3: [20, 32], // Q4_1
  6: [22, 32], // Q5_0
  7: [24, 32], // Q5_1
  8: [34, 32], // Q8_0
  10: [84, 256], // Q2_K
  11: [110, 256], // Q3_K
  12: [144, 256], // Q4_K
  13: [176, 256], // Q5_K
  14: [210, 256], // Q6_K
  15: [292, 256], // Q8_K
  30: [2, 1], // BF16
};

/**
 * Bytes a llama.cpp decode step reads: every tensor but token_embd (of
 * which it reads one row). NaN if the file holds a type not in the table.
 */
export function ggufDecodeBytes(path: string): number {
  const size = statSync(path).size;
  const fd = openSync(path, "r");
  try {
    // The header (metadata + tensor infos) is a few MB at most: the vocabulary.
    const len = Math.min(size, 16 << 20);
    const buf = new Uint8Array(len);
    readSync(fd, buf, 0, len, 0);
    const dv = new DataView(buf.buffer);
    let p = 0;
    const u32 = () => ((p += 4), dv.getUint32(p - 4, true));
    const u64 = () => ((p += 8), Number(dv.getBigUint64(p - 8, true)));
    const skipString = () => {
      const n = u64(); // not `p += u64()`: that reads p before u64 advances it
      p += n;
    };
    const scalarSize = [1, 1, 2, 2, 4, 4, 4, 1, -1, -1, 8, 8, 8];
    const skipValue = (type: number): void => {
      if (type === 8) return skipString();
      if (type === 9) {
        const elem = u32();
        const n = u64();
        if (elem === 8) for (let i = 0; i < n; i++) skipString();
        else p += n * scalarSize[elem];
        return;
      }
      p += scalarSize[type];
    };
    if (u32() !== 0x46554747) return NaN;
    u32();
    const nTensors = u64();
    const nKv = u64();
    for (let i = 0; i < nKv; i++) {
      skipString();
      skipValue(u32());
    }
    let total = 0;
    const dec = new TextDecoder();
    for (let i = 0; i < nTensors; i++) {
      if (p > len - 64) return NaN; // a header this tool cannot walk
      const n = u64();
      const name = dec.decode(buf.subarray(p, p + n));
      p += n;
      const nd = u32();
      if (nd < 1 || nd > 4) return NaN;
      const ne: number[] = [];
      for (let d = 0; d < nd; d++) ne.push(u64());
      const type = u32();
      u64();
      const blk = GGML_BLOCK[type];
      if (!blk) return NaN;
      const elems = ne.reduce((a, b) => a * b, 1);
      const bytes = (elems / blk[1]) * blk[0];
      total += name === "token_embd.weight" ? bytes / ne[1] : bytes;
    }
    return total;
  } finally {
    closeSync(fd);
  }
}
