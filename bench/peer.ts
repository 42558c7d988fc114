// `bun run bench:peer`: loopserve against llama.cpp on the same model, same
// machine, same run.
//
//   1. builds the kernel library, llama.cpp (cached outside the repo, from
//      node-llama-cpp's source bundle, which bench/peer/package.json pins and
//      the first run installs into bench/peer/node_modules) and the roofline probes
//   2. the model (--model, below), exported to GGUF once per loop depth
//      (unrolled: a stack's layers once per step), quantized by
//      llama-quantize to Q4_0 / Q2_K, and by `loopserve model quantize` to
//      int4 / int2
//   3. prefill and decode at each thread count, loop depth and format:
//      loopserve through the binding and llama-bench alternately, with each
//      decode's effective GB/s (the weight bytes a token reads, head and
//      every step's layers, times tokens/s) beside the DRAM probe's
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
// Prints tables, writes bench/results/peer.json (peer-dim2048.json,
// peer-ouro.json for the real sizes).
//
// --model (bench/peer/options.ts, PEER_MODELS):
//   bench    the benchmark model: dim 768, 12/12 heads, ffn 2048, vocab
//            50257, untied head; loops 1, 4, 8, 16; 1 and 2 threads; every
//            section (the default)
//   dim2048  dim 2048, 16 heads over 4 kv heads, ffn 5632, vocab 50257;
//            loops 1 and 8; 2 threads; fp16 and int4; prefill 64, decode 64
//   ouro     Ouro-1.4B's dimensions: 24 layers of dim 2048 (16/16 heads,
//            ffn 5632), vocab 49152, pre-norm (llama.cpp's Llama graph has no
//            sandwich norms, so both engines run the same model); steps 1
//            and 4; 2 threads; fp16 and int4; prefill 64, decode 32
// The real sizes skip sections 4 and 7 (both are about the benchmark
// model); section 6 runs on the trained model whatever --model is.
//
// Decode is measured as llama-bench's tg test defines it: single-token
// steps from an empty cache, for both engines. Prefill is one call of the
// prompt (loopserve) and llama-bench's pp test (one batch). llama-bench
// runs each test in its own process: when llama.cpp crashes (its repacked
// Q4_0 kernels crash on some AMX hosts), the test is taken again with
// weight repacking off, marked "(repack off)" in the table, and failing
// that the cell says "crashed (...)"; every other cell still runs. The
// quality section's llama-perplexity is retried the same way (--no-repack).
//
// Each point is measured in --rounds pairs (loopserve and llama-bench
// alternately, the order swapped every pair): a shared machine's speed
// drifts by tens of percent over minutes, so a ratio is the median of the
// per-pair ratios, each taken from two runs seconds apart, and tokens/s are
// medians too. A pair measured while other processes used more than a
// quarter of a core is measured again (up to --retries times) and the
// quietest attempt kept; the "others" column is the busiest pair's load.
//
// options: --model bench|dim2048|ouro  --threads 1,2  --loops 1,4,8,16
//          --formats fp16,int4,int2  --prefill N  --decode N
//          --rounds 3  --repeats 2  --retries 2  --no-equivalence  --no-wait  --quick
//          --spec-ahead 4,8 (tokens drafted per cycle)  --no-speculative
//          --no-quality  --quality-chunks 16 (512-token chunks scored)
//
// Each step lives in bench/peer/: options.ts, provision.ts (builds, models),
// quality_section.ts, speed.ts and speed_tables.ts, speculative.ts,
// equivalence.ts, roofline.ts.
import { writeJson } from "./report.ts";
import { equivalenceSection } from "./peer/equivalence.ts";
import { PEER_MODELS, parseOptions } from "./peer/options.ts";
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
  const targets = targetTable(raw, quality, o);

  const specRows = o.speculative ? await speculativeSection(tools, formats, o) : [];
  const equiv = o.equivalence ? await equivalenceSection(tools, fp16) : null;

  const notes = [rooflineTable(probe, models, o.threads), ...speedNotes(rows, o)];
  for (const s of skipped) console.log(`skipped: ${s}`);

  const file = writeJson(o.model === "bench" ? "peer" : `peer-${o.model}`, {
    llamaCpp: tools.version,
    machine: { cores: CORES, l3Bytes: probe.r.l3Bytes },
    options: o,
    model: { name: o.model, path: fp16, shape: PEER_MODELS[o.model].shape },
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
