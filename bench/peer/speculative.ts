// Self-speculative greedy decoding (draft at loop 1, verify at the
// benchmark's depth) on a model whose shallow loops agree with its deep ones,
// against llama-bench's plain decode of the same model exported, each run
// checked token for token against loopserve's plain decoding.
import { NativeModel } from "../../src/engine/binding.ts";
import { BENCH_SHAPE, benchModel, promptOf } from "../../src/cli/bench/models.ts";
import { printTable, type Row } from "../../src/cli/bench/table.ts";
import { decode, same } from "../speculative.ts";
import { type Format, ggufFor, LLAMA_TYPE, type LlamaTools } from "./llama.ts";
import type { Options } from "./options.ts";
import { LIBRARY, loopserveQuantized } from "./provision.ts";
import { type Measured, measureLlama } from "./speed.ts";
import { LoadMeter, log, median, ownCpuS, waitForQuiet } from "./system.ts";

interface SpecMeasured {
  plainTokS: number;
  specTokS: number;
  perCycle: number;
  exact: boolean;
  cpuS: number;
  othersCores: number;
}

/** residualScale of the model whose shallow loops agree with its deep ones. */
const AGREEING_SCALE = 0.01;
const SPEC_DRAFT_LOOPS = 1;

const SPEC_PROMPT = 32; // tokens before the timed decode, as in bench/speculative.ts

/** Plain and speculative runs interleaved repeat by repeat; medians, and whether every speculative run equals plain decoding. */
function measureSpeculative(model: NativeModel, loops: number, ahead: number, o: Options): SpecMeasured {
  const meter = new LoadMeter();
  const c0 = ownCpuS();
  const prompt = promptOf(SPEC_PROMPT, model.info.vocabSize);
  const spec = { D: SPEC_DRAFT_LOOPS, k: ahead, K: 1 };
  decode(model, prompt, loops, 8, spec); // warm-up: pages in the weights, builds the draft head
  const plain: number[] = [];
  const fast: number[] = [];
  let exact = true;
  let perCycle = 0;
  for (let r = 0; r < o.repeats; r++) {
    // o.decode timed tokens after the prompt's own
    const a = decode(model, prompt, loops, o.decode + 1, null);
    const b = decode(model, prompt, loops, o.decode + 1, spec);
    plain.push(a.tokensPerSecond);
    fast.push(b.tokensPerSecond);
    exact &&= same(a.tokens, b.tokens);
    perCycle = b.perCycle;
  }
  const cpuS = ownCpuS() - c0;
  return { plainTokS: median(plain), specTokS: median(fast), perCycle, exact, cpuS, othersCores: meter.othersCores(cpuS) };
}

/** The speculative table's rows, one per format and --spec-ahead, printed. */
export async function speculativeSection(tools: LlamaTools, formats: Format[], o: Options): Promise<Row[]> {
  const specRows: Row[] = [];
  const agreeing = await benchModel({ residualScale: AGREEING_SCALE });
  const threads = Math.max(...o.threads);
  const loops = BENCH_SHAPE.loops;
  for (const format of formats) {
    let path = agreeing;
    if (format !== "fp16") {
      const q = await loopserveQuantized(agreeing, format);
      if ("skip" in q) continue;
      path = q.path;
    }
    const gguf = ggufFor(tools, agreeing, loops, format, log);
    const model = NativeModel.load(LIBRARY, path, threads, "auto");
    for (const ahead of o.specAhead) {
      log(`speculative ${format}/${LLAMA_TYPE[format]} threads ${threads} draft ${SPEC_DRAFT_LOOPS}/${loops} ahead ${ahead}`);
      const rounds: { ls: SpecMeasured; ll: Measured }[] = [];
      for (let round = 0; round < o.rounds; round++) {
        if (o.wait) await waitForQuiet(10);
        const ls = measureSpeculative(model, loops, ahead, o);
        if (o.wait) await waitForQuiet(10);
        rounds.push({ ls, ll: measureLlama(tools, gguf, threads, o, { pp: "", tg: "" }) });
      }
      const ls = {
        plainTokS: median(rounds.map((r) => r.ls.plainTokS)),
        specTokS: median(rounds.map((r) => r.ls.specTokS)),
        perCycle: median(rounds.map((r) => r.ls.perCycle)),
        exact: rounds.every((r) => r.ls.exact),
        othersCores: Math.max(...rounds.map((r) => Math.max(r.ls.othersCores, r.ll.othersCores) || 0)),
      };
      const llTg = median(rounds.map((r) => r.ll.tgTokS));
      const x = median(rounds.map((r) => r.ls.specTokS / r.ll.tgTokS));
      specRows.push({
        format: `${format}/${LLAMA_TYPE[format]}`,
        thr: threads,
        "draft/verify": `${SPEC_DRAFT_LOOPS}/${loops}`,
        ahead,
        "ls plain t/s": ls.plainTokS,
        "ls spec t/s": ls.specTokS,
        "tokens/cycle": ls.perCycle,
        "spec/plain": ls.specTokS / ls.plainTokS,
        "llama tg t/s": llTg,
        "spec/llama x": x,
        "target >= 2.5": x >= 2.5 ? "met" : "MISSED",
        "bit-exact": ls.exact ? "yes" : "NO",
        "others (cores)": ls.othersCores,
      });
    }
    model.close();
  }
  printTable(
    `self-speculative greedy decoding (residualScale ${AGREEING_SCALE} model: shallow loops agree), ${o.decode} tokens after a ${SPEC_PROMPT}-token prompt, against llama.cpp's plain decode (tg${o.decode}) of the same model`,
    specRows,
  );
  return specRows;
}
