// What bench:peer measures: the kernel library, llama.cpp's tools, and the
// benchmark model in each format, loopserve's file beside llama.cpp's GGUF
// export at each loop depth.
import { existsSync, mkdirSync } from "node:fs";
import { basename, join } from "node:path";
import { NativeModel } from "../../src/engine/binding.ts";
import { type ModelConfig, parseModelConfig } from "../../src/model/format.ts";
import { defaultHead } from "../../src/model/quantize.ts";
import { readSafetensors } from "../../src/model/safetensors.ts";
import { runModelCommand } from "../../src/cli/model.ts";
import { benchModel } from "../../src/cli/bench/models.ts";
import { QUANTIZER_SOURCE } from "../quant.ts";
import { BUNDLE, cacheDir, fresh, type Format, ggufFor, LLAMA_TYPE, type LlamaTools, llamaTools } from "./llama.ts";
import { type Options, PEER_MODELS } from "./options.ts";
import { type ModelCost, modelCost } from "./roofline.ts";
import { log, PeerBenchError, run } from "./system.ts";

const REPO = join(import.meta.dir, "..", "..");
export const LIBRARY = join(REPO, "build", "libloopserve.so");

/** The kernel library, built from this checkout: every number is of the code as it stands. */
export function buildLibrary(): void {
  log("building the kernel library (bun build.ts --lib)");
  run([process.execPath, join(REPO, "build.ts"), "--lib"], { stderrToTerminal: true });
  if (!existsSync(LIBRARY)) throw new PeerBenchError(`${LIBRARY} missing after the build`);
}

/** llama.cpp's tools, built on the first run (minutes), found in the cache afterwards. */
export function buildLlama(): LlamaTools {
  log(`llama.cpp from ${BUNDLE} (cached under ${cacheDir()})`);
  const tools = llamaTools();
  log(`llama.cpp ${tools.version}`);
  return tools;
}

export interface FormatModels {
  format: Format;
  loopserve: string; // safetensors
  config: ModelConfig;
  cost: ModelCost;
  gguf: Map<number, string>; // loops -> llama.cpp file of the matching type
}

/** `loopserve model quantize` (its default head) into the cache; `skip` says why when unavailable. */
export async function loopserveQuantized(fp16: string, format: "int4" | "int2"): Promise<{ path: string } | { skip: string }> {
  const head = defaultHead(parseModelConfig(readSafetensors(fp16)).dim);
  const out = join(cacheDir(), "models", `${basename(fp16, ".safetensors")}-${format}-head${head}.safetensors`);
  if (!fresh(out, fp16, QUANTIZER_SOURCE)) {
    const err: string[] = [];
    let code: number;
    try {
      code = await runModelCommand(["quantize", fp16, out, "--quant", format, "--head", head], { out: () => {}, err: (l) => err.push(l) });
    } catch (e) {
      return { skip: `loopserve model quantize failed: ${(e as Error).message}` };
    }
    if (code !== 0) return { skip: `loopserve model quantize --quant ${format}: ${err[0] ?? `exit ${code}`}` };
  }
  try {
    NativeModel.load(LIBRARY, out, 1, "auto").close();
  } catch (e) {
    return { skip: `the engine cannot load the ${format} model: ${(e as Error).message}` };
  }
  return { path: out };
}

/** The model of o.model in each of o.formats; `skipped` says why a format loopserve cannot quantize or load is left out. */
export async function benchModels(tools: LlamaTools, o: Options): Promise<{ fp16: string; models: FormatModels[]; skipped: string[] }> {
  mkdirSync(join(cacheDir(), "models"), { recursive: true });
  const fp16 = await benchModel(PEER_MODELS[o.model].shape);
  log(`${PEER_MODELS[o.model].label}: ${fp16}`);
  const models: FormatModels[] = [];
  const skipped: string[] = [];
  for (const format of o.formats) {
    let path = fp16;
    if (format !== "fp16") {
      const q = await loopserveQuantized(fp16, format);
      if ("skip" in q) {
        skipped.push(`${format} vs ${LLAMA_TYPE[format]}: ${q.skip}`);
        log(`skipping ${format}: ${q.skip}`);
        continue;
      }
      path = q.path;
    }
    const config = parseModelConfig(readSafetensors(path));
    const gguf = new Map<number, string>();
    for (const L of o.loops) gguf.set(L, ggufFor(tools, fp16, L, format, log));
    models.push({ format, loopserve: path, config, cost: modelCost(path, config), gguf });
  }
  return { fp16, models, skipped };
}
