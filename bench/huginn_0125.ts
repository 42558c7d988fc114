// Huginn-0125 at 32 steps beside Ouro-1.4B at its 4, one stream on this CPU:
// random-weight checkpoints of each one's published shape (Huginn-0125:
// hidden 5280, 55 heads, ffn 17920, vocabulary 65536, 2 prelude + 4 core +
// 2 coda layers, 3.5 billion parameters; Ouro-1.4B: test/helpers/
// hf_fixture.ts OURO_1_4B) are written in their Hugging Face layouts,
// imported, and decoded greedily by the kernels (fp16 weights, fp16 cache),
// the two models' speeds interleaved over rounds (medians) so that both see
// the same load on a shared machine.
// Reported per model: the bytes a token reads (its weights, from the file's
// tensor sizes: the prelude, coda and head once, the core and the adapter
// once per step) and holds (key/value cache per position,
// ls_session_cache_bytes), tokens/s; for Huginn also with the bounded cache
// (cache_steps 4, the published compress-s16) and its cost: the same
// teacher-forced tokens decoded with and without it, the KL divergence of
// the bounded run's next-token distribution from the unbounded one's and
// how often their argmax agrees; and the zero-shot KL exit at the published
// default threshold (5e-4). Prints a table, writes
// bench/results/huginn_0125.json, deletes the big files unless --keep.
//
//   bun bench/huginn_0125.ts [--dir DIR] [--keep] [--threads N] [--tokens N] [--rounds N] [--small]
//
// --small: the same on models of the same layouts at dim 64 (a smoke test).
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { type KvCacheSettings, NativeModel } from "../src/engine/binding.ts";
import { type ExitPlan, GREEDY } from "../src/engine/types.ts";
import { importHfCheckpoint } from "../src/model/import_hf.ts";
import { readSafetensors } from "../src/model/safetensors.ts";
import { type HfFixtureOptions, OURO_1_4B, writeHfFixture } from "../test/helpers/hf_fixture.ts";
import { logSoftmax } from "../test/reference/forward.ts";

function flag(name: string, dflt: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

const ROOT = resolve(import.meta.dir, "..");
const LIB = join(ROOT, "build", "libloopserve.so");
const small = process.argv.includes("--small");
const keep = process.argv.includes("--keep");
const threads = Number(flag("--threads", "2"));
const decodeTokens = Number(flag("--tokens", small ? "8" : "3"));
const rounds = Number(flag("--rounds", "3"));
const dir = process.argv.includes("--dir") ? flag("--dir", "") : mkdtempSync(join(tmpdir(), "loopserve-huginn-"));
mkdirSync(dir, { recursive: true });

/** Huginn-0125's published config: n_embd 5280, 55 heads of 96, ffn 17920, vocabulary 65536, 2 + 4 + 2 layers, 32 steps. */
const HUGINN_0125: HfFixtureOptions = { arch: "huginn", dim: 5280, nHeads: 55, ffnDim: 17920, vocabSize: 65536, nLayers: 4, nPrelude: 2, nCoda: 2, totalUtSteps: 32, seed: 1, shards: 4, maxPositionEmbeddings: 4096 };
const HUGINN_SMALL: HfFixtureOptions = { ...HUGINN_0125, dim: 64, nHeads: 4, ffnDim: 128, vocabSize: 512, shards: 2 };
const OURO: HfFixtureOptions = { ...OURO_1_4B, seed: 1, shards: 3 };
const OURO_SMALL: HfFixtureOptions = { dim: 64, nHeads: 4, nKvHeads: 4, ffnDim: 128, vocabSize: 512, nLayers: 3, totalUtSteps: 4, seed: 1 };

const STEPS = 32;
const SHARED = 4; // cache_steps: 4 steps x 4 core layers = the published compress-s16
const KL_EXIT = 5e-4; // the published code's default for its "kl" criterion
const PROMPT = [300, 17, 42, 99, 400, 7, 256, 511];
const TEACHER = 16; // teacher-forced positions the bounded cache's cost is measured on

const t0All = performance.now();
const secs = (t0: number) => (performance.now() - t0) / 1000;
const log = (s: string) => console.log(`[${secs(t0All).toFixed(0).padStart(5)} s] ${s}`);
const results: Record<string, unknown> = { threads, small };
const rows: [string, string, string][] = [];

/** Writes a checkpoint, imports it, deletes the checkpoint; returns the model file. */
function prepare(name: string, o: HfFixtureOptions): string {
  const ckpt = join(dir, `${name}-hf`);
  let t0 = performance.now();
  const fx = writeHfFixture(ckpt, o);
  log(`${name}: ${fx.parameters} parameters, ${(fx.bytes / 1e9).toFixed(2)} GB bf16 written in ${secs(t0).toFixed(0)} s`);
  const out = join(dir, `${name}.safetensors`);
  t0 = performance.now();
  importHfCheckpoint(ckpt, out);
  log(`${name}: imported in ${secs(t0).toFixed(0)} s`);
  rmSync(ckpt, { recursive: true, force: true });
  return out;
}

/** Weight bytes one token reads at `steps` steps: the fixed layers and the head once, the core (and the adapter) every step. */
function weightBytesPerToken(path: string, steps: number): { fixed: number; perStep: number; head: number; total: number } {
  const f = readSafetensors(path);
  let fixed = 0;
  let perStep = 0;
  let head = 0;
  for (const [name, t] of f.tensors) {
    const bytes = t.data.byteLength;
    if (name.startsWith("prelude.") || name.startsWith("coda.")) fixed += bytes;
    else if (name.startsWith("layers.") || name.startsWith("block.") || name === "adapter.weight") perStep += bytes;
    else if (name === "output.weight" || (name === "tok_embeddings.weight" && !f.tensors.has("output.weight"))) head += bytes;
  }
  return { fixed, perStep, head, total: fixed + steps * perStep + head };
}

/** Greedy decode of `n` tokens after the prompt: tokens, steps each ran, decode tokens/s (the prompt call excluded). */
function decode(m: NativeModel, steps: number, n: number, kv: KvCacheSettings, exit?: ExitPlan) {
  const s = m.newSession(PROMPT.length + n + 1, steps, 0, kv);
  try {
    const out = { tokens: [] as number[], steps: [] as number[], decodeSeconds: 0, promptSeconds: 0 };
    let feed = PROMPT;
    while (out.tokens.length < n + 1) {
      const t0 = performance.now();
      const t = s.step(Int32Array.from(feed), steps, GREEDY, null, out.tokens.length === 0 ? undefined : exit);
      if (out.tokens.length === 0) out.promptSeconds = secs(t0);
      else out.decodeSeconds += secs(t0);
      out.tokens.push(t);
      out.steps.push(s.lastSteps);
      feed = [t];
    }
    return { ...out, tokensPerSecond: n / out.decodeSeconds, meanSteps: out.steps.slice(1).reduce((a, b) => a + b, 0) / n };
  } finally {
    s.close();
  }
}

/** Next-token distributions of `tokens` fed one per call after the prompt (teacher forcing), as log-probabilities. */
function teacherForced(m: NativeModel, steps: number, tokens: number[], kv: KvCacheSettings): Float64Array[] {
  const s = m.newSession(PROMPT.length + tokens.length, steps, 0, kv);
  const V = m.info.vocabSize;
  const logits = new Float32Array(V);
  try {
    s.forward(Int32Array.from(PROMPT), steps, null, 0);
    return tokens.map((t) => {
      s.forward(Int32Array.of(t), steps, logits, 1);
      return logSoftmax(logits);
    });
  } finally {
    s.close();
  }
}

function klDivergence(p: Float64Array, q: Float64Array): number {
  let kl = 0;
  for (let i = 0; i < p.length; i++) kl += Math.exp(p[i]) * (p[i] - q[i]);
  return kl;
}

const argmax = (a: Float64Array) => a.reduce((best, v, i) => (v > a[best] ? i : best), 0);
const mb = (b: number) => `${(b / 2 ** 20).toFixed(2)} MiB`;
const gb = (b: number) => `${(b / 1e9).toFixed(2)} GB`;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** Decode speeds of every setting interleaved over rounds (the machine is shared: each round sees the same load), medians reported. */
function speeds(runs: { label: string; run: () => number }[]): Map<string, number> {
  const seen = new Map<string, number[]>(runs.map((r) => [r.label, []]));
  for (let round = 0; round < rounds; round++) {
    for (const r of runs) {
      const v = r.run();
      seen.get(r.label)!.push(v);
      log(`round ${round + 1}: ${r.label} ${v.toFixed(3)} tok/s`);
    }
  }
  return new Map([...seen].map(([k, v]) => [k, median(v)]));
}

try {
  log(`dir ${dir}, threads ${threads}, ${decodeTokens} decoded tokens per measurement, ${rounds} rounds`);
  const huginnPath = prepare("huginn-0125", small ? HUGINN_SMALL : HUGINN_0125);
  const ouroPath = prepare("ouro-1.4b", small ? OURO_SMALL : OURO);
  const huginn = NativeModel.load(LIB, huginnPath, threads, "auto");
  const ouro = NativeModel.load(LIB, ouroPath, threads, "auto");
  try {
    const full: KvCacheSettings = { mode: "fp16" };
    const shared: KvCacheSettings = { mode: "fp16", cacheSteps: SHARED };
    const perPosition = (m: NativeModel, steps: number, kv: KvCacheSettings) => m.sessionCacheBytes(4096, steps, 0, kv) / 4096;
    const hw = weightBytesPerToken(huginnPath, STEPS);
    const ow = weightBytesPerToken(ouroPath, 4);
    const kv = { huginn: perPosition(huginn, STEPS, full), shared: perPosition(huginn, STEPS, shared), ouro: perPosition(ouro, 4, full) };
    let exitSteps = 0;
    const tps = speeds([
      { label: "Huginn-0125, 32 steps", run: () => decode(huginn, STEPS, decodeTokens, full).tokensPerSecond },
      { label: `Huginn-0125, 32 steps, cache_steps ${SHARED}`, run: () => decode(huginn, STEPS, decodeTokens, shared).tokensPerSecond },
      {
        label: `Huginn-0125, 32 steps, exit_rule kl < ${KL_EXIT}`,
        run: () => {
          const r = decode(huginn, STEPS, decodeTokens, full, { rule: "kl", threshold: KL_EXIT, policy: "exact" });
          exitSteps = r.meanSteps;
          return r.tokensPerSecond;
        },
      },
      { label: "Ouro-1.4B, 4 steps", run: () => decode(ouro, 4, decodeTokens, full).tokensPerSecond },
    ]);
    const [tH, tS, tE, tO] = [...tps.values()];
    rows.push(["Huginn-0125", "32 steps, fp16", `${gb(hw.total)} weights read (${gb(hw.perStep)} a step) + ${mb(kv.huginn)} cache held per token; ${tH.toFixed(3)} tok/s`]);
    rows.push(["Huginn-0125", `32 steps, cache_steps ${SHARED}`, `${mb(kv.shared)} cache per token (${((100 * kv.shared) / kv.huginn).toFixed(1)}% of unbounded); ${tS.toFixed(3)} tok/s`]);
    rows.push(["Ouro-1.4B", "4 steps, fp16", `${gb(ow.total)} weights read + ${mb(kv.ouro)} cache held per token; ${tO.toFixed(3)} tok/s`]);
    Object.assign(results, {
      huginn: { steps: STEPS, simd: huginn.info.simd, weightBytesPerToken: hw, kvBytesPerPosition: kv.huginn, tokensPerSecond: tH },
      bounded: { cacheSteps: SHARED, kvBytesPerPosition: kv.shared, ratio: kv.shared / kv.huginn, tokensPerSecond: tS },
      ouro: { steps: 4, weightBytesPerToken: ow, kvBytesPerPosition: kv.ouro, tokensPerSecond: tO },
    });

    // the bounded cache's cost: the unbounded run's greedy tokens fed to both
    const forced = decode(huginn, STEPS, TEACHER, full).tokens.slice(0, TEACHER);
    const p = teacherForced(huginn, STEPS, forced, full);
    const q = teacherForced(huginn, STEPS, forced, shared);
    const kls = p.map((r, i) => klDivergence(r, q[i]));
    const agree = p.filter((r, i) => argmax(r) === argmax(q[i])).length;
    const klMean = kls.reduce((a, v) => a + v, 0) / kls.length;
    log(`bounded cache: KL mean ${klMean.toExponential(2)}, max ${Math.max(...kls).toExponential(2)}; argmax agrees ${agree}/${TEACHER}`);
    rows.push(["Huginn-0125", `cache_steps ${SHARED}: its cost`, `KL from the unbounded distribution mean ${klMean.toExponential(2)} nats, max ${Math.max(...kls).toExponential(2)}; argmax equal ${agree}/${TEACHER} (teacher-forced)`]);
    Object.assign(results.bounded as object, { klMean, klMax: Math.max(...kls), argmaxAgree: agree, positions: TEACHER });

    // the zero-shot exit at the published default: its steps, and its probes' cost when no token exits
    rows.push(["Huginn-0125", `exit_rule kl < ${KL_EXIT}`, `${tE.toFixed(3)} tok/s at ${exitSteps.toFixed(2)} mean steps (exact policy; a probe after every step)`]);
    results.klExit = { threshold: KL_EXIT, tokensPerSecond: tE, meanSteps: exitSteps };
  } finally {
    huginn.close();
    ouro.close();
  }
} finally {
  if (!keep) rmSync(dir, { recursive: true, force: true });
}

console.log("\n| model | setting | measured |\n|---|---|---|");
for (const [a, b, c] of rows) console.log(`| ${a} | ${b} | ${c} |`);
if (!small) writeFileSync(join(ROOT, "bench", "results", "huginn_0125.json"), `${JSON.stringify(results, null, 2)}\n`);
