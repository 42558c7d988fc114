// The Ouro-1.4B target end to end: a random-weight checkpoint of Ouro-1.4B's
// shape in Hugging Face layout (24 layers, hidden 2048, ffn 5632, 16 heads,
// T = 4, vocab 49152, bf16, 3 shards) is written, imported, checked against
// the float64 reference (test/reference/forward.ts), served by a real server
// process to the official openai client, quantized to int4 and decoded at
// kernel level. Prints a summary table; deletes the big files at the end.
//
//   bun bench/ouro_1_4b.ts [--dir DIR] [--keep] [--threads N] [--small]
//
// --small: a 3-layer, dim-64 checkpoint of the same layout (a smoke test of the script).
//
// Order (memory): the kernels first (their logits kept, a few MB), then the
// server, the int4 file, and last the reference (5.7 GB of fp32 weights), so
// no two large things are held at once. Each phase's failure is recorded
// verbatim and the next phase still runs.
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import OpenAI from "openai";
import { NativeModel } from "../src/engine/binding.ts";
import { type ExitPlan, GREEDY } from "../src/engine/types.ts";
import { OURO_1_4B, writeHfFixture } from "../test/helpers/hf_fixture.ts";
import { argmax, ReferenceModel, relErr } from "../test/reference/forward.ts";

function flag(name: string, dflt: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

const ROOT = resolve(import.meta.dir, "..");
const CLI = join(ROOT, "src", "cli.ts");
const LIB = join(ROOT, "build", "libloopserve.so");
const keep = process.argv.includes("--keep");
const threads = Number(flag("--threads", "2"));
const dir = process.argv.includes("--dir") ? flag("--dir", "") : mkdtempSync(join(tmpdir(), "loopserve-ouro14-"));
const ckpt = join(dir, "ouro-1.4b-random");
const fp16Path = join(dir, "ouro-1.4b.safetensors");
const int4Path = join(dir, "ouro-1.4b-int4.safetensors");

const STEPS = 4;
const EXIT = 0.5;
const EXIT_PLAN: ExitPlan = { threshold: EXIT, policy: "exact" };
const SMALL = { dim: 64, nHeads: 4, nKvHeads: 4, ffnDim: 128, vocabSize: 512, nLayers: 3, totalUtSteps: 4 };
const PROMPT = process.argv.includes("--small") ? [300, 17, 42, 99, 400, 7] : [300, 17, 42, 99, 40000, 7];
const GEN = 3;
const INT4_GEN = 8;

const t0All = performance.now();
const now = () => (performance.now() - t0All) / 1000;
const log = (s: string) => console.log(`[${now().toFixed(0).padStart(5)} s] ${s}`);
const secs = (t0: number) => (performance.now() - t0) / 1000;
const summary: [string, string][] = [];
const note = (k: string, v: string) => {
  summary.push([k, v]);
  log(`${k}: ${v}`);
};
const failures: string[] = [];

async function phase(name: string, fn: () => Promise<void> | void): Promise<void> {
  log(`== ${name}`);
  try {
    await fn();
  } catch (e) {
    const msg = e instanceof Error ? `${e.constructor.name}: ${e.message}\n${e.stack ?? ""}` : String(e);
    failures.push(`${name}: ${msg}`);
    log(`FAILED ${name}: ${msg}`);
  }
}


const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;

function runCli(args: string[]): { seconds: number; maxRssMiB: number; stdout: string } {
  Bun.spawnSync(["sync"]);
  const t0 = performance.now();
  const p = Bun.spawnSync([process.execPath, CLI, ...args], { stdout: "pipe", stderr: "pipe", cwd: ROOT });
  const seconds = secs(t0);
  if (p.exitCode !== 0) throw new Error(`${args.join(" ")} exited ${p.exitCode}:\n${p.stderr.toString()}\n${p.stdout.toString()}`);
  return { seconds, maxRssMiB: p.resourceUsage ? p.resourceUsage.maxRSS / 2 ** 20 : NaN, stdout: p.stdout.toString() };
}

/** Greedy decode at kernel level: tokens, steps, each sampled token's logits, decode seconds (after the prompt call). */
function kernelGreedy(m: NativeModel, prompt: number[], n: number, exit?: ExitPlan) {
  const s = m.newSession(prompt.length + n + 1, STEPS, 0);
  try {
    const out = { tokens: [] as number[], steps: [] as number[], logits: [] as Float32Array[], promptSeconds: 0, decodeSeconds: 0 };
    let feed = prompt;
    while (out.tokens.length < n) {
      const logits = new Float32Array(m.info.vocabSize);
      const t0 = performance.now();
      const t = s.step(Int32Array.from(feed), STEPS, GREEDY, logits, exit);
      if (out.tokens.length === 0) out.promptSeconds = secs(t0);
      else out.decodeSeconds += secs(t0);
      out.tokens.push(t);
      out.steps.push(s.lastSteps);
      out.logits.push(logits);
      feed = [t];
    }
    return out;
  } finally {
    s.close();
  }
}

async function serveAndAsk(modelPath: string, label: string): Promise<void> {
  const probe = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const port = probe.port;
  probe.stop(true);
  const url = `http://127.0.0.1:${port}`;
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !/^(SERVICE_|HOST$|PORT$)/.test(k)) env[k] = v;
  Object.assign(env, {
    SERVICE_BUILD_DIR: join(ROOT, "build"),
    SERVICE_MODEL_PATH: modelPath,
    SERVICE_MAX_SEQ_LEN: "256",
    SERVICE_THREADS: String(threads),
    HOST: "127.0.0.1",
    PORT: String(port),
    CUDA_VISIBLE_DEVICES: "",
  });
  const t0 = performance.now();
  const proc = Bun.spawn([process.execPath, CLI, "serve"], { cwd: ROOT, env, stdout: "pipe", stderr: "pipe" });
  const out: string[] = [];
  const collect = async (st: ReadableStream<Uint8Array>) => {
    const d = new TextDecoder();
    for await (const c of st) out.push(d.decode(c, { stream: true }));
  };
  void collect(proc.stdout);
  void collect(proc.stderr);
  const rss = () => {
    try {
      const st = readFileSync(`/proc/${proc.pid}/status`, "utf8");
      return `VmRSS ${/VmRSS:\s+(.*)/.exec(st)?.[1]}, VmHWM ${/VmHWM:\s+(.*)/.exec(st)?.[1]}`;
    } catch {
      return "n/a";
    }
  };
  try {
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`server exited ${proc.exitCode} before answering:\n${out.join("")}`);
      const h = await fetch(`${url}/healthz`).catch(() => null);
      if (h?.status === 200) break;
      if (h && h.status !== 503) throw new Error(`/healthz ${h.status}: ${await h.text()}`);
      if (secs(t0) > 600) throw new Error(`no healthy /healthz in 600 s:\n${out.join("")}`);
      await Bun.sleep(200);
    }
    note(`${label} server ready`, `${secs(t0).toFixed(1)} s after spawn; ${rss()}`);
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", timeout: 900_000, maxRetries: 0 });
    const models = await client.models.list();
    const id = models.data[0].id;
    note(`${label} /v1/models`, `${models.data.length} model(s), id ${id}`);

    let t1 = performance.now();
    const chat = await client.chat.completions.create({ model: id, messages: [{ role: "user", content: "Hi there" }], max_tokens: 4, temperature: 0 });
    let sec = secs(t1);
    const cu = chat.usage;
    note(
      `${label} /v1 chat (max_tokens 4, temperature 0)`,
      `${sec.toFixed(2)} s client wall; usage prompt ${cu?.prompt_tokens} completion ${cu?.completion_tokens}; ` +
        `${((cu?.completion_tokens ?? 0) / sec).toFixed(2)} completion tok/s (client wall, prompt included); finish ${chat.choices[0].finish_reason}; ` +
        `role ${chat.choices[0].message.role}; content ${JSON.stringify(chat.choices[0].message.content)}`,
    );
    t1 = performance.now();
    const text = await client.completions.create({ model: id, prompt: "In the beginning", max_tokens: 4, temperature: 0 });
    sec = secs(t1);
    const tu = text.usage;
    note(
      `${label} /v1 text completion (max_tokens 4, temperature 0)`,
      `${sec.toFixed(2)} s client wall; usage prompt ${tu?.prompt_tokens} completion ${tu?.completion_tokens}; ` +
        `${((tu?.completion_tokens ?? 0) / sec).toFixed(2)} completion tok/s (client wall); finish ${text.choices[0].finish_reason}; text ${JSON.stringify(text.choices[0].text)}`,
    );

    for (const exit of [0, EXIT]) {
      t1 = performance.now();
      const res = await fetch(`${url}/api/v0/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: id, prompt: "In the beginning", max_tokens: 8, temperature: 0, ...(exit > 0 ? { exit_threshold: exit } : {}) }),
      });
      sec = secs(t1);
      const body = (await res.json()) as Record<string, any>;
      if (res.status !== 200) throw new Error(`/api/v0/completions ${res.status}: ${JSON.stringify(body)}`);
      note(`${label} /api/v0/completions (max_tokens 8, exit_threshold ${exit || "none"})`, `${sec.toFixed(2)} s client wall; stats ${JSON.stringify(body.stats)}`);
      if (exit > 0) {
        const mi = body.model_info ?? {};
        note(`${label} model_info`, `n_layers ${mi.n_layers}, exit_gate ${mi.exit_gate}, exit_threshold ${mi.exit_threshold}, default_loops ${mi.default_loops}, quant ${mi.quant}`);
      }
    }
    note(`${label} server memory after requests`, rss());
  } finally {
    if (proc.exitCode === null) proc.kill("SIGTERM");
    const code = await proc.exited;
    log(`server exited ${code}`);
    const tail = out.join("").trim().split("\n").slice(-8).join("\n");
    log(`server log tail:\n${tail}`);
  }
}

// Kept between phases.
const kernel = {
  steps4: [] as Float32Array[],
  steps1: [] as Float32Array[],
  greedy: null as ReturnType<typeof kernelGreedy> | null,
};

try {
  log(`dir ${dir}, threads ${threads}, prompt ${JSON.stringify(PROMPT)}`);

  await phase("(1) write the checkpoint", () => {
    const t0 = performance.now();
    const shape = process.argv.includes("--small") ? SMALL : OURO_1_4B;
    const fx = writeHfFixture(ckpt, { ...shape, seed: 1, shards: 3 });
    note("checkpoint", `${fx.parameters} parameters, ${fx.bytes} bytes bf16 in ${fx.files.length} shards, written in ${secs(t0).toFixed(1)} s`);
  });

  await phase("(2) import-hf", () => {
    const r = runCli(["model", "import-hf", ckpt, fp16Path]);
    note("import-hf", `${r.seconds.toFixed(1)} s wall (fresh CLI process), peak RSS ${r.maxRssMiB.toFixed(0)} MiB, output ${statSync(fp16Path).size} bytes`);
  });

  await phase("(3a) fp16 kernels: logits and greedy", () => {
    const t0 = performance.now();
    const m = NativeModel.load(LIB, fp16Path, threads, "auto");
    note("fp16 load", `${secs(t0).toFixed(1)} s; simd ${m.info.simd}, threads ${m.info.threads}, n_layers ${m.info.nLayers}, dim ${m.info.dim}, vocab ${m.info.vocabSize}, default_loops ${m.info.defaultLoops}, exit_gate ${m.info.exitGate}`);
    try {
      const V = m.info.vocabSize;
      for (const steps of [STEPS, 1]) {
        const s = m.newSession(PROMPT.length, steps, 0);
        const logits = new Float32Array(PROMPT.length * V);
        const t1 = performance.now();
        s.forward(Int32Array.from(PROMPT), steps, logits, PROMPT.length);
        const sec = secs(t1);
        s.close();
        const rows = PROMPT.map((_, i) => logits.slice(i * V, (i + 1) * V));
        if (steps === STEPS) kernel.steps4 = rows;
        else kernel.steps1 = rows;
        note(`fp16 forward, ${PROMPT.length}-token prompt, steps ${steps}`, `${sec.toFixed(2)} s (${(PROMPT.length / sec).toFixed(2)} tok/s prefill)`);
      }
      const g = kernelGreedy(m, PROMPT, GEN, EXIT_PLAN);
      kernel.greedy = g;
      note(`fp16 kernel greedy, exit ${EXIT}`, `tokens ${JSON.stringify(g.tokens)}, steps ${JSON.stringify(g.steps)}`);
      const g0 = kernelGreedy(m, PROMPT, 6);
      note(
        "fp16 kernel decode, steps 4, no exit",
        `tokens ${JSON.stringify(g0.tokens)}; ${(5 / g0.decodeSeconds).toFixed(2)} tok/s over 5 decoded tokens (prompt call ${g0.promptSeconds.toFixed(2)} s)`,
      );
      const ge = kernelGreedy(m, PROMPT, 6, EXIT_PLAN);
      note(`fp16 kernel decode, exit ${EXIT}`, `steps ${JSON.stringify(ge.steps)}; ${(5 / ge.decodeSeconds).toFixed(2)} tok/s over 5 decoded tokens`);
    } finally {
      m.close();
    }
  });

  await phase("(4) server + openai client (fp16)", () => serveAndAsk(fp16Path, "fp16"));

  await phase("(5) int4", async () => {
    const args = (inp: string) => ["model", "quantize", inp, int4Path, "--quant", "int4", "--head", "int8", "--group-size", "32"];
    const r = runCli(args(fp16Path));
    note("quantize int4 (head int8, group 32)", `${r.seconds.toFixed(1)} s wall (fresh CLI process), peak RSS ${r.maxRssMiB.toFixed(0)} MiB, output ${statSync(int4Path).size} bytes`);
    const t0 = performance.now();
    const m = NativeModel.load(LIB, int4Path, threads, "auto");
    note("int4 load", `${secs(t0).toFixed(1)} s; quant ${m.info.quant}, head ${m.info.headQuant}, simd ${m.info.simd}`);
    try {
      for (const exit of [0, EXIT]) {
        const g = kernelGreedy(m, PROMPT, INT4_GEN, exit ? EXIT_PLAN : undefined);
        const decoded = INT4_GEN - 1;
        note(
          `int4 kernel greedy, steps 4, exit ${exit || "none"}`,
          `tokens ${JSON.stringify(g.tokens)}, steps ${JSON.stringify(g.steps)}; ${(decoded / g.decodeSeconds).toFixed(2)} tok/s over ${decoded} decoded tokens (prompt call ${g.promptSeconds.toFixed(2)} s)`,
        );
        if (exit === 0 && kernel.steps4.length > 0) {
          const last = kernel.steps4[PROMPT.length - 1];
          note("int4 vs fp16 kernel, last prompt position logits", `relErr ${relErr(g.logits[0], last).toExponential(3)}, argmax ${argmax(g.logits[0])} vs ${argmax(last)}`);
        }
      }
    } finally {
      m.close();
    }
    if (!process.argv.includes("--no-int4-server")) await serveAndAsk(int4Path, "int4");
    rmSync(int4Path, { force: true });
  });

  await phase("(3b) float64 reference vs fp16 kernels", () => {
    let t0 = performance.now();
    const ref = ReferenceModel.load(fp16Path);
    note("reference load", `${secs(t0).toFixed(1)} s, process RSS ${mib(process.memoryUsage().rss)}`);
    // steps 1 (cheap)
    t0 = performance.now();
    const s1 = ref.session(1);
    const errs1: string[] = [];
    PROMPT.forEach((tok, i) => {
      const r = s1.feed(tok);
      const k = kernel.steps1[i];
      errs1.push(`${relErr(k, r).toExponential(2)}${argmax(k) === argmax(r) ? "" : `(argmax ${argmax(k)}!=${argmax(r)})`}`);
    });
    note("steps 1: relErr per position (argmax all equal unless noted)", `${errs1.join(", ")}  [reference ${secs(t0).toFixed(0)} s]`);
    // steps 4
    t0 = performance.now();
    const s4 = ref.session(STEPS);
    const errs4: string[] = [];
    let allArgmax = true;
    PROMPT.forEach((tok, i) => {
      const t1 = performance.now();
      const r = s4.feed(tok);
      const k = kernel.steps4[i];
      const same = argmax(k) === argmax(r);
      allArgmax &&= same;
      errs4.push(`${relErr(k, r).toExponential(2)}${same ? "" : `(argmax ${argmax(k)}!=${argmax(r)})`}`);
      log(`  reference steps 4, position ${i}: ${secs(t1).toFixed(1)} s`);
    });
    note("steps 4: relErr per position", `${errs4.join(", ")}; argmax all equal: ${allArgmax}  [reference ${secs(t0).toFixed(0)} s]`);
    // greedy with the exit gate: positions 0..4 ran all 4 steps in s4 too, so a
    // new session takes s4's cache of them and feeds the last prompt token at the threshold.
    t0 = performance.now();
    const sg = ref.session(STEPS);
    for (let u = 0; u < sg.keys.length; u++) {
      sg.keys[u].push(...s4.keys[u].slice(0, PROMPT.length - 1));
      sg.values[u].push(...s4.values[u].slice(0, PROMPT.length - 1));
    }
    const want = { tokens: [] as number[], steps: [] as number[], errs: [] as string[] };
    let r = sg.feed(PROMPT[PROMPT.length - 1], EXIT_PLAN);
    const kg = kernel.greedy;
    while (want.tokens.length < GEN) {
      const t = argmax(r);
      const i = want.tokens.length;
      want.tokens.push(t);
      want.steps.push(sg.lastSteps);
      if (kg && kg.logits[i]) want.errs.push(relErr(kg.logits[i], r).toExponential(2));
      // feed the kernel's token (the same unless they diverged) so positions stay comparable
      if (want.tokens.length < GEN) r = sg.feed(kg ? kg.tokens[i] : t, EXIT_PLAN);
    }
    note(
      `greedy ${GEN} tokens, exit ${EXIT}: reference`,
      `tokens ${JSON.stringify(want.tokens)}, steps ${JSON.stringify(want.steps)}; kernel tokens ${JSON.stringify(kg?.tokens)}, steps ${JSON.stringify(kg?.steps)}; ` +
        `tokens equal ${JSON.stringify(kg?.tokens) === JSON.stringify(want.tokens)}, steps equal ${JSON.stringify(kg?.steps) === JSON.stringify(want.steps)}; relErr ${want.errs.join(", ")}  [reference ${secs(t0).toFixed(0)} s]`,
    );
  });
} finally {
  console.log("\n==== summary ====");
  const w = Math.max(...summary.map(([k]) => k.length));
  for (const [k, v] of summary) console.log(`${k.padEnd(w)} | ${v}`);
  if (failures.length) {
    console.log(`\n${failures.length} failure(s):`);
    for (const f of failures) console.log(`- ${f}`);
  } else console.log("\nno failures");
  if (keep) console.log(`kept ${dir}`);
  else {
    rmSync(dir, { recursive: true, force: true });
    console.log(`deleted ${dir} (exists now: ${existsSync(dir)})`);
  }
  console.log(`total ${now().toFixed(0)} s`);
}
