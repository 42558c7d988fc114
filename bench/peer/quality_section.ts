// The equal-quality section of bench:peer: the trained model quantized by
// each engine (bench/peer/quality.ts scores them), its table, and the verdict
// the speed tables print beside each ratio.
import { parseModelConfig } from "../../src/model/format.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { TRAINED_MODEL_PATH } from "../../src/model/trained.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { printTable } from "../../src/cli/bench/table.ts";
import { kjvText } from "../kjv.ts";
import type { Format, LlamaTools } from "./llama.ts";
import type { Options } from "./options.ts";
import { LIBRARY, loopserveQuantized } from "./provision.ts";
import { equalQuality, type QualityResult, type QualityVariant } from "./quality.ts";
import { log, PeerBenchError } from "./system.ts";

/** The trained model in each format (loopserve's `model quantize`, llama-quantize), scored on the same held-out tokens. */
async function scoreTrainedModel(tools: LlamaTools, formats: Format[], o: Options): Promise<QualityResult> {
  const config = parseModelConfig(readSafetensors(TRAINED_MODEL_PATH));
  const variants: QualityVariant[] = [{ format: "fp16", loopserve: TRAINED_MODEL_PATH }];
  for (const format of formats) {
    if (format === "fp16") continue;
    const q = await loopserveQuantized(TRAINED_MODEL_PATH, format);
    if ("skip" in q) throw new PeerBenchError(`equal quality, ${format}: ${q.skip}`);
    variants.push({ format, loopserve: q.path });
  }
  const tok = await Tokenizer.load();
  try {
    return equalQuality(tools, {
      library: LIBRARY,
      fp16: TRAINED_MODEL_PATH,
      text: kjvText("val"),
      tokenize: (text) => Int32Array.from(tok.encode(text)),
      variants,
      loops: config.defaultLoops,
      nCtx: config.maxSeqLen,
      chunks: o.qualityChunks,
      threads: Math.max(...o.threads),
      log,
    });
  } finally {
    tok.close();
  }
}

/** "yes" where loopserve's KL to its fp16 is at most llama.cpp's (fp16: nothing to hold), "NO" where not, "?" unmeasured. */
export function qualityHolds(quality: QualityResult | null, format: Format): string {
  if (format === "fp16") return "-";
  const r = quality?.rows.find((x) => x.format === format);
  return r && r.holds !== null ? (r.holds ? "yes" : "NO") : "?";
}

/** Equal quality on the trained model, its table printed. */
export async function qualitySection(tools: LlamaTools, formats: Format[], o: Options): Promise<QualityResult> {
  log("equal quality on the trained model");
  const quality = await scoreTrainedModel(tools, formats, o);
  const L = parseModelConfig(readSafetensors(TRAINED_MODEL_PATH)).defaultLoops;
  printTable(
    `equal quality: trained model (loops ${L}), held-out text, ${quality.positions} positions per engine and format, scored as llama-perplexity scores (the second half of each chunk); KL (by llama-perplexity's rule for both; loopserve's exact sum beside) and top-1 against each engine's own fp16/F16` +
      (quality.sameTokens ? "; both tokenizers give the same tokens" : "; llama.cpp's tokens differ from loopserve's tokenizer's: both engines scored llama.cpp's"),
    quality.rows.map((r) => ({
      format: `${r.format}/${r.llamaType}`,
      "ls ppl": r.loopserve.perplexity,
      "llama ppl": r.llama.way?.startsWith("crashed") ? r.llama.way : r.llama.way ? `${r.llama.perplexity.toFixed(2)} (${r.llama.way})` : r.llama.perplexity,
      "ls KL": r.loopserve.kl.toExponential(2),
      "llama KL": Number.isNaN(r.llama.kl) ? "-" : r.llama.kl.toExponential(2),
      "ls KL exact": (r.loopserve.klExact ?? 0).toExponential(2),
      "ls top-1": `${(100 * r.loopserve.top1).toFixed(1)}%`,
      "llama top-1": Number.isNaN(r.llama.top1) ? "-" : `${(100 * r.llama.top1).toFixed(1)}%`,
      "ls KL <= llama": qualityHolds(quality, r.format),
    })),
  );
  return quality;
}
