// The single executable (docs/architecture.md#build): `bun run build` makes dist/loopserve;
// copied ALONE into an empty directory and run there with a bare environment
// (no node_modules, no build directory, no source tree), it writes a model,
// serves it, and answers a chat completion, a native generation (free and
// under a JSON Schema), /metrics and the playground page at /, imports a
// Hugging Face checkpoint and serves its chat through the model's own
// template (the Jinja engine it carries), using the kernel library it carries
// (extracted once to its cache directory under a content-hashed name,
// safely when two start at once).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import pkg from "../package.json" with { type: "json" };
import { ChatCompletion, GenerateResponse } from "../src/wire/responses.ts";
import { CPU_LIBRARY_NAME, cachedLibraryName, cacheDirCandidates, extractLibrary, findKernelLibrary, KernelLibraryError, resolveKernelLibrary } from "../src/engine/library.ts";
import { FIXTURE_SYSTEM_TURN, fixtureTokenizerJson, writeHfFixture } from "./helpers/hf_fixture.ts";
import { jsonBody } from "./helpers/http.ts";
import { Tokenizer } from "../src/tokenizer/tokenizer.ts";
import { startServer, type TestServer } from "./helpers/server.ts";

const ROOT = resolve(import.meta.dir, "..");
const DIST = join(ROOT, "dist", "loopserve");
const BUILT_LIB = join(ROOT, "build", CPU_LIBRARY_NAME);

let work = "";
let binary = "";

/** A bare host's environment: nothing from this repo or the test runner. */
function bareEnv(extra: Record<string, string> = {}): Record<string, string> {
  return {
    PATH: "/usr/bin:/bin",
    HOME: join(work, "home"),
    XDG_CACHE_HOME: join(work, "xdg-cache"),
    TMPDIR: join(work, "tmp"),
    LANG: "C.UTF-8",
    ...extra,
  };
}

function runBinary(args: string[], env: Record<string, string> = {}) {
  const p = Bun.spawnSync([binary, ...args], { cwd: work, env: bareEnv(env), stdout: "pipe", stderr: "pipe" });
  return { code: p.exitCode, out: p.stdout.toString(), err: p.stderr.toString() };
}

/** The executable serving `modelPath` from the empty directory, with a bare environment and no build directory. */
function serveBinary(modelPath: string): Promise<TestServer> {
  return startServer({
    command: [binary, "serve"],
    cwd: work,
    baseEnv: bareEnv(),
    modelPath,
    env: { SERVICE_BUILD_DIR: join(work, "no-such-build-dir") },
    requireModel: true,
  });
}

/** Extracted libraries (content-hashed names) anywhere under dir. */
function extractedLibraries(dir: string): string[] {
  const found: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/^libloopserve-[0-9a-f]{16}\.so$/.test(e.name)) found.push(p);
    }
  };
  walk(dir);
  return found;
}

beforeAll(() => {
  // The full build: kernels (CUDA too when nvcc is here) and the executable.
  const build = Bun.spawnSync([process.execPath, join(ROOT, "build.ts")], { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
  if (build.exitCode !== 0) throw new Error(`bun build.ts failed:\n${build.stdout}\n${build.stderr}`);
  work = mkdtempSync(join(tmpdir(), "loopserve-binary-"));
  for (const d of ["home", "xdg-cache", "tmp"]) mkdirSync(join(work, d));
  binary = join(work, "loopserve");
  copyFileSync(DIST, binary);
  Bun.spawnSync(["chmod", "755", binary]);
}, 300_000);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

describe("the compiled executable, alone in an empty directory", () => {
  test("--version prints the package version; --help works for each command", () => {
    const v = runBinary(["--version"]);
    expect(v.code).toBe(0);
    expect(v.out.trim()).toBe(pkg.version);
    for (const args of [["--help"], ["serve", "--help"], ["model", "--help"], ["model", "new", "--help"], ["model", "inspect", "--help"]]) {
      const h = runBinary(args);
      expect({ args, code: h.code }).toEqual({ args, code: 0 });
      expect(h.out).toContain("usage");
    }
    const bad = runBinary(["no-such-command"]);
    expect(bad.code).toBe(2);
  });

  test("is one file: the directory holds nothing else before it runs", () => {
    expect(readdirSync(work).sort()).toEqual(["home", "loopserve", "tmp", "xdg-cache"]);
    expect(existsSync(join(work, "node_modules"))).toBe(false);
  });

  test("writes a model, serves it, and answers chat, native generation, /metrics and the playground", async () => {
    const made = runBinary(["model", "new", "model.safetensors", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128", "--loops", "2"]);
    expect(made.err).toBe("");
    expect(made.code).toBe(0);
    const modelPath = join(work, "model.safetensors");
    expect(statSync(modelPath).size).toBeGreaterThan(0);
    expect(runBinary(["model", "inspect", "model.safetensors"]).code).toBe(0);

    // Two processes at once on an empty cache: both extract, both start.
    const [a, b] = await Promise.all([serveBinary(modelPath), serveBinary(modelPath)]);
    try {
      // One start-up line with model, quant, kv mode, threads, SIMD path, address.
      expect(a.output()).toContain(`listening on ${a.url}`);
      for (const field of ["quant fp16", "kv fp16", "threads", "simd"]) expect(a.output()).toContain(field);

      const chat = await a.post("/v1/chat/completions", { model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 4, temperature: 0 });
      const c = await jsonBody(chat, ChatCompletion);
      expect(c.object).toBe("chat.completion");
      expect(c.choices[0].message.role).toBe("assistant");
      expect(typeof c.choices[0].message.content).toBe("string");
      expect(c.usage.total_tokens).toBe(c.usage.prompt_tokens + c.usage.completion_tokens);

      const gen = await a.post("/generate", { prompt: "Hello world", max_tokens: 5, temperature: 0 });
      const g = await jsonBody(gen, GenerateResponse);
      expect(g.tokens.length).toBeGreaterThan(0);
      expect(g.tokens.length).toBeLessThanOrEqual(5);
      expect(typeof g.text).toBe("string");
      // The same request on the other process: same kernels, same greedy tokens.
      const again = await jsonBody(await b.post("/generate", { prompt: "Hello world", max_tokens: 5, temperature: 0 }), GenerateResponse);
      expect(again.tokens).toEqual(g.tokens);

      // A prompt past the inline limit is tokenized by the worker thread the executable embeds.
      const long = await a.post("/generate", { prompt: "ÃÂ".repeat(32 * 300), max_tokens: 1 }); // GPT-2 token 35496, 300 times
      expect((await jsonBody(long, GenerateResponse)).stats.prompt_tokens).toBe(300);

      // Structured output: the grammar engine's WebAssembly and the format compiler's worker are in the executable too.
      const schema = { type: "object", properties: { answer: { enum: ["yes", "no"] } }, required: ["answer"] };
      const format = await a.post("/generate", { prompt: "Hello", max_tokens: 20, response_format: { type: "json_schema", json_schema: { name: "a", schema, strict: true } } });
      const f = await jsonBody(format, GenerateResponse);
      expect(f.finish_reason).toBe("stop");
      expect(["yes", "no"]).toContain(JSON.parse(f.text).answer);

      const metrics = await fetch(`${a.url}/metrics`);
      expect(metrics.status).toBe(200);
      const text = await metrics.text();
      expect(text).toContain("# TYPE service_requests_completed_total counter");
      const completed = Number(/^service_requests_completed_total(?:\{[^}]*\})? ([0-9.e+]+)$/m.exec(text)?.[1]);
      expect(completed).toBeGreaterThanOrEqual(2);

      // The web playground is built into the executable: the whole page, its script inline.
      const home = await fetch(`${a.url}/`);
      expect(home.status).toBe(200);
      expect(home.headers.get("content-type")).toBe("text/html; charset=utf-8");
      const html = await home.text();
      expect(html).toContain("<title>loopserve playground</title>");
      expect(/<script type="module">([\s\S]*)<\/script>/.exec(html)?.[1].length ?? 0).toBeGreaterThan(1000);
      expect(html).toContain('id="depth-columns"');
    } finally {
      expect(await a.stop()).toBe(0);
      expect(await b.stop()).toBe(0);
    }

    // The library came from the binary, not from a build directory: one
    // extracted copy, with the content-hashed name of the embedded bytes.
    const libs = extractedLibraries(work);
    expect(libs.length).toBe(1);
    expect(libs[0].endsWith(cachedLibraryName(CPU_LIBRARY_NAME, new Uint8Array(readFileSync(libs[0]))))).toBe(true);
    expect(readdirSync(join(libs[0], "..")).filter((f) => f.endsWith(".tmp"))).toEqual([]);
  }, 120_000);

  test("imports a Hugging Face checkpoint and serves its chat through the model's own template", async () => {
    writeHfFixture(join(work, "ouro"), { dim: 64, nHeads: 4, ffnDim: 128, vocabSize: 300, nLayers: 2, totalUtSteps: 2, seed: 1 });
    const imported = runBinary(["model", "import-hf", "ouro", "ouro.safetensors"]);
    expect({ code: imported.code, out: imported.out }).toEqual({ code: 0, out: expect.stringContaining("wrote ouro.safetensors") });
    const s = await serveBinary(join(work, "ouro.safetensors"));
    try {
      const chat = await s.post("/v1/chat/completions", { model: "ouro", messages: [{ role: "user", content: "Hello" }], max_tokens: 2, temperature: 0 });
      const tok = await Tokenizer.fromSpec({ kind: "bpe", json: fixtureTokenizerJson() });
      const rendered = `${FIXTURE_SYSTEM_TURN}<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n`;
      expect((await jsonBody(chat, ChatCompletion)).usage.prompt_tokens).toBe(tok.encode(rendered).length);
    } finally {
      expect(await s.stop()).toBe(0);
    }
  }, 120_000);
});

// ---- src/engine/library.ts, the part of the above that runs under `bun test` ----

describe("kernel library resolution", () => {
  test("SERVICE_BUILD_DIR is searched first and returned as an absolute path", () => {
    const found = findKernelLibrary(join(ROOT, "build"), CPU_LIBRARY_NAME, []);
    expect(found).toEqual({ path: BUILT_LIB, source: "build-dir" });
  });

  test("without a build dir or an embedded copy the error says what to do", () => {
    expect(() => resolveKernelLibrary(join(work, "nowhere"))).toThrow(KernelLibraryError);
    expect(() => resolveKernelLibrary(join(work, "nowhere"))).toThrow(/SERVICE_BUILD_DIR .*bun run build:lib/);
  });

  test("cache directories: $XDG_CACHE_HOME, then ~/.cache, then $TMPDIR per user", () => {
    const uid = process.getuid?.() ?? 0;
    expect(cacheDirCandidates({ xdgCacheHome: "/x", home: "/h", tmpDir: "/t" })).toEqual(["/x/loopserve", "/h/.cache/loopserve", `/t/loopserve-${uid}`]);
    expect(cacheDirCandidates({ xdgCacheHome: null, home: null, tmpDir: "/t" })).toEqual([`/t/loopserve-${uid}`]);
  });

  test("extraction writes once, reuses an intact copy and replaces a damaged one", () => {
    const bytes = new Uint8Array(readFileSync(BUILT_LIB));
    const dir = join(work, "extract-once");
    const first = extractLibrary(CPU_LIBRARY_NAME, bytes, [dir]);
    expect(first.source).toBe("extracted");
    expect(first.path).toBe(join(dir, cachedLibraryName(CPU_LIBRARY_NAME, bytes)));
    expect(statSync(first.path).mode & 0o777).toBe(0o755);
    expect(extractLibrary(CPU_LIBRARY_NAME, bytes, [dir]).source).toBe("cache");
    writeFileSync(first.path, bytes.subarray(0, 100)); // a truncated copy
    expect(extractLibrary(CPU_LIBRARY_NAME, bytes, [dir]).source).toBe("extracted");
    expect(new Uint8Array(readFileSync(first.path))).toEqual(bytes);
  });

  test("an unusable cache directory falls through to the next; none usable is a clear error", () => {
    const bytes = new Uint8Array(readFileSync(BUILT_LIB));
    const file = join(work, "a-file");
    writeFileSync(file, "not a directory");
    const fallback = join(work, "fallback");
    expect(extractLibrary(CPU_LIBRARY_NAME, bytes, [join(file, "sub"), fallback]).path.startsWith(fallback)).toBe(true);
    expect(() => extractLibrary(CPU_LIBRARY_NAME, bytes, [join(file, "sub")])).toThrow(/no writable cache directory .*TMPDIR/);
  });

  test("a cache directory writable by others is refused (its files get dlopened)", () => {
    const bytes = new Uint8Array(readFileSync(BUILT_LIB));
    const open = join(work, "world-writable");
    mkdirSync(open, { mode: 0o777 });
    Bun.spawnSync(["chmod", "777", open]);
    expect(() => extractLibrary(CPU_LIBRARY_NAME, bytes, [open])).toThrow(/writable by group or others/);
  });

  test("eight processes extracting into the same directories at once all get intact copies", async () => {
    const bytes = new Uint8Array(readFileSync(BUILT_LIB));
    const shared = join(work, "race");
    const script = join(work, "race.ts");
    writeFileSync(
      script,
      `import { readFileSync } from "node:fs";
import { extractLibrary } from ${JSON.stringify(join(ROOT, "src/engine/library.ts"))};
const bytes = new Uint8Array(readFileSync(${JSON.stringify(BUILT_LIB)}));
const paths = [];
for (let i = 0; i < 25; i++) paths.push(extractLibrary("libloopserve.so", bytes, [${JSON.stringify(shared)} + "/" + i]).path);
console.log(JSON.stringify(paths));
`,
    );
    const procs = Array.from({ length: 8 }, () => Bun.spawn([process.execPath, script], { stdout: "pipe", stderr: "pipe" }));
    const outputs = await Promise.all(procs.map(async (p) => ({ code: await p.exited, out: await new Response(p.stdout).text(), err: await new Response(p.stderr).text() })));
    for (const o of outputs) expect({ code: o.code, err: o.err }).toEqual({ code: 0, err: "" });
    const expected = Array.from({ length: 25 }, (_, i) => join(shared, String(i), cachedLibraryName(CPU_LIBRARY_NAME, bytes)));
    for (const o of outputs) expect(JSON.parse(o.out)).toEqual(expected);
    for (let i = 0; i < 25; i++) {
      expect(readdirSync(join(shared, String(i)))).toEqual([cachedLibraryName(CPU_LIBRARY_NAME, bytes)]);
      expect(new Uint8Array(readFileSync(expected[i]))).toEqual(bytes);
    }
  }, 60_000);
});
