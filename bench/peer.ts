// `bun run bench:peer`: loopserve against llama.cpp on the same model, same
// machine, same run.
//
//   1. builds the kernel library, llama.cpp (cached outside the repo, from
//      node-llama-cpp's source bundle, which bench/peer/package.json pins and
//      the first run installs into bench/peer/node_modules) and the roofline probes
//   2. the benchmark model (dim 768, 12/12 heads, ffn 2048, vocab 50257,
//      untied head, loops 8), exported to GGUF once per loop depth, quantized
//      by llama-quantize to Q4_0 / Q2_K, and by `loopserve model quantize` to
//      int4 / int2 when that command exists
//   3. prefill 512 / decode 128, 1 and 2 threads, loops 1, 4, 8, 16, each
//      format: loopserve through the binding and llama-bench alternately
//   4. equivalence: greedy tokens and logits of both on the F16 export
//   5. the roofline: probes, and each result as % of its bound
//   6. equal quality (bench/peer/quality.ts): on the trained model's
//      held-out text, each format's perplexity and KL divergence to its own
//      fp16 for both engines (llama.cpp's from llama-perplexity
//      --kl-divergence), printed beside the speed ratios: a speed ratio is
//      claimed only where loopserve's KL is at most llama.cpp's
//   7. self-speculative greedy decoding (draft at loop 1, verify at 8) on the
//      benchmark shape with small residual updates per loop (shallow loops
//      agree with deep ones), against llama-bench's plain decode of the
//      same model exported, checked token for token against plain decoding
// Prints tables, writes bench/results/peer.json.
//
// Decode is measured as llama-bench's tg test defines it: 128 single-token
// steps from an empty cache, for both engines. Prefill is one call of 512
// tokens (loopserve) and llama-bench's pp512 (one batch of 512).
//
// Each point is measured in --rounds pairs (loopserve and llama-bench
// alternately, the order swapped every pair): a shared machine's speed
// drifts by tens of percent over minutes, so a ratio is the median of the
// per-pair ratios, each taken from two runs seconds apart, and tokens/s are
// medians too. A pair measured while other processes used more than a
// quarter of a core is measured again (up to --retries times) and the
// quietest attempt kept; the "others" column is the busiest pair's load.
//
// options: --threads 1,2  --loops 1,4,8,16  --formats fp16,int4,int2
//          --rounds 3  --repeats 2  --retries 2  --no-equivalence  --no-wait  --quick
//          --spec-ahead 4,8 (tokens drafted per cycle)  --no-speculative
//          --no-quality  --quality-chunks 16 (512-token chunks scored)
//
// Each step lives in bench/peer/: options.ts, provision.ts (builds, models),
// quality_section.ts, speed.ts and speed_tables.ts, speculative.ts,
// equivalence.ts, roofline.ts.
import { BENCH_SHAPE } from "../src/cli/bench/models.ts";
import { writeJson } from "./report.ts";
import { equivalenceSection } from "./peer/equivalence.ts";
import { parseOptions } from "./peer/options.ts";
import { benchModels, buildLibrary, buildLlama } from "./peer/provision.ts";
import { qualitySection } from "./peer/quality_section.ts";
import { RooflineProbe, rooflineTable } from "./peer/roofline.ts";
import { speculativeSection } from "./peer/speculative.ts";
import { measureSpeed } from "./peer/speed.ts";
import { slopeTable, speedNotes, speedTable, targetTable } from "./peer/speed_tables.ts";
import { CORES, log, PeerBenchError } from "./peer/system.ts";

async function main(): Promise<number> {
  const o = parseOptions(Bun.argv.slice(2));
  const t0 = performance.now();

  buildLibrary();
  const tools = buildLlama();
  log("roofline probes");
  const probe = new RooflineProbe();
  await probe.measure(o.threads, o.wait);
  const { fp16, models, skipped } = await benchModels(tools, o);
  const formats = models.map((m) => m.format);

  // Equal quality first: the speed tables print its verdict beside their ratios.
  const quality = o.quality ? await qualitySection(tools, formats, o) : null;

  const points = await measureSpeed(tools, models, o);
  log("roofline probes, second pass");
  await probe.measureAgain(o.threads, o.wait, models.map((m) => m.cost.blockBytes));
  const { rows, raw } = speedTable(points, probe, quality, tools.version, o);
  const slopes = slopeTable(raw, models, probe, o);
  const targets = targetTable(raw, quality);

  const specRows = o.speculative ? await speculativeSection(tools, formats, o) : [];
  const equiv = o.equivalence ? await equivalenceSection(tools, fp16) : null;

  const notes = [rooflineTable(probe, models, o.threads), ...speedNotes(rows, o)];
  for (const s of skipped) console.log(`skipped: ${s}`);

  const file = writeJson("peer", {
    llamaCpp: tools.version,
    machine: { cores: CORES, l3Bytes: probe.r.l3Bytes },
    options: o,
    model: { path: fp16, shape: BENCH_SHAPE },
    roofline: { ...probe.r, cacheGBps: Object.fromEntries(probe.r.cacheGBps) },
    rows: raw,
    table: rows,
    slopes,
    targets,
    speculative: specRows,
    equivalence: equiv,
    quality,
    skipped,
    notes,
    seconds: (performance.now() - t0) / 1000,
  });
  console.log(`\nwrote ${file} in ${((performance.now() - t0) / 1000).toFixed(0)} s`);
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    if (e instanceof PeerBenchError) {
      process.stderr.write(`bench:peer: ${e.message}\n`);
      process.exit(1);
    }
    throw e;
  },
);
