// The grammar engine: xgrammar's WebAssembly build (@mlc-ai/web-xgrammar),
// the one place that touches it (docs/structured-output.md says why this
// library). A JSON Schema, the JSON grammar or an EBNF grammar is compiled
// against the model's vocabulary into a CompiledGrammar; each generation
// runs its own matcher over it, which gives the token mask of each step and
// accepts and rolls back tokens.
//
// The package's WASM is inlined in its JavaScript, so it works the same
// under `bun run` and inside the compiled executable. Two things its
// TypeScript surface does not offer are reached here, with the version
// pinned in package.json (test/grammar/engine.test.ts checks both against
// the package's public answers):
// - the token mask synchronously: the package's getNextTokenBitmask is
//   async, but the kernels ask for masks inside a synchronous FFI call (a
//   speculative cycle's paths) and while a pipelined step runs. The
//   matcher's binding computes it synchronously into a std::vector, whose
//   words are read straight from the module's memory (captured as the
//   module instantiates);
// - the engine's messages: a schema feature it cannot honour is reported on
//   the module's output and otherwise ignored, and an error it cannot go on
//   from is printed before the module aborts, so the module's console.log
//   and console.error are captured: a warning becomes a refusal, and an
//   abort is reported with what was printed before it.
import xgrammar from "@mlc-ai/web-xgrammar";

type CompiledGrammar = Awaited<ReturnType<typeof xgrammar.GrammarCompiler.prototype.compileBuiltinJSONGrammar>>;

/** What a grammar compiles from (src/grammar/format_spec.ts makes them). */
export type GrammarSource = { kind: "json_schema"; schema: string; strict: boolean } | { kind: "json_object" } | { kind: "ebnf"; grammar: string };

/** JSON output is one line with `, ` and `: ` between items, no other whitespace: a model cannot loop on whitespace (docs/structured-output.md). */
const SEPARATORS: [string, string] = [", ", ": "];

/** A compile the engine refused or could not do, with what it printed; `aborted`: its module aborted and cannot be used again. */
export class GrammarEngineError extends Error {
  constructor(
    message: string,
    readonly aborted: boolean,
  ) {
    super(message);
  }
}

let memory: WebAssembly.Memory | null = null;
const warnings: string[] = [];
let ready: Promise<void> | null = null;

/** Loads the module once, capturing its memory and its error output. */
function load(): Promise<void> {
  ready ??= (async () => {
    const instantiate = WebAssembly.instantiate;
    const { log: consoleLog, error: consoleError } = console;
    // The module binds console.log and console.error and instantiates its WASM on first use.
    console.log = console.error = (...args: unknown[]) => {
      warnings.push(args.map(String).join(" "));
    };
    (WebAssembly as { instantiate: unknown }).instantiate = async (...args: Parameters<typeof WebAssembly.instantiate>) => {
      const result = (await (instantiate as (...a: unknown[]) => Promise<WebAssembly.WebAssemblyInstantiatedSource>)(...args)) as WebAssembly.WebAssemblyInstantiatedSource;
      memory = Object.values(result.instance.exports).find((e): e is WebAssembly.Memory => e instanceof WebAssembly.Memory) ?? null;
      return result;
    };
    try {
      await xgrammar.Testings._jsonSchemaToEBNF("{}");
    } finally {
      WebAssembly.instantiate = instantiate;
      console.log = consoleLog;
      console.error = consoleError;
    }
    if (!memory) throw new GrammarEngineError("the grammar engine's memory was not found", false);
  })();
  return ready;
}

/** The warnings the engine printed during `run`, which is refused when there are any. */
async function refusingWarnings<T>(run: () => Promise<T>): Promise<T> {
  warnings.length = 0;
  let out: T;
  try {
    out = await run();
  } catch (e) {
    const message = e instanceof Error ? e.message : String(e);
    throw new GrammarEngineError(printed() || message, /^Aborted\(/.test(message));
  }
  const said = printed();
  if (said) throw new GrammarEngineError(said, false);
  return out;
}

/** What the engine printed, each line once, without its source paths ("[WARNING] /x/y.cc:10: text" -> "text"). */
function printed(): string {
  const lines = warnings.map((w) => w.replace(/^\s*\[\w+\]\s*\S+:\d+:\s*/, "").trim()).filter((w) => w !== "" && !w.startsWith("Aborted("));
  return [...new Set(lines)].join("; ");
}

/** The model's vocabulary as the engine knows it, and a compiler over it. */
export class GrammarEngine {
  private constructor(
    private readonly compiler: Awaited<ReturnType<typeof xgrammar.GrammarCompiler.createGrammarCompiler>>,
    /** Logits per step: the mask's length in bits. */
    readonly vocabSize: number,
    readonly endIds: readonly number[],
  ) {}

  /**
   * `vocab[id]`: token id's bytes in GPT-2's byte-to-character encoding
   * (byte-level BPE), "" for an id with no text (an end id, padding) that
   * only ends a value. Ids from vocab.length to vocabSize have no text.
   */
  static async create(vocab: string[], vocabSize: number, endIds: readonly number[]): Promise<GrammarEngine> {
    await load();
    const info = await refusingWarnings(() => xgrammar.TokenizerInfo.createTokenizerInfo(vocab, "byte_level", false, vocabSize, [...endIds]));
    const compiler = await xgrammar.GrammarCompiler.createGrammarCompiler(info, false);
    return new GrammarEngine(compiler, vocabSize, endIds);
  }

  /** Compiles a source; GrammarEngineError with the engine's reason (a syntax error, a feature it would ignore). */
  async compile(source: GrammarSource): Promise<CompiledFormat> {
    const compiled = await refusingWarnings((): Promise<CompiledGrammar> => {
      if (source.kind === "ebnf") return this.compiler.compileGrammar(source.grammar, "root");
      // json_object: any object, whatever its properties.
      if (source.kind === "json_object") return this.compiler.compileJSONSchema('{"type": "object"}', false, -1, SEPARATORS, false);
      return this.compiler.compileJSONSchema(source.schema, false, -1, SEPARATORS, source.strict);
    });
    return new CompiledFormat(compiled, this.vocabSize, this.endIds);
  }
}

/** One compiled grammar; a matcher per generation. */
export class CompiledFormat {
  constructor(
    private readonly compiled: CompiledGrammar,
    private readonly vocabSize: number,
    readonly endIds: readonly number[],
  ) {}

  async matcher(): Promise<Matcher> {
    const m = await xgrammar.GrammarMatcher.createGrammarMatcher(this.compiled, [...this.endIds]);
    return new Matcher(m as unknown as MatcherInternals, this.vocabSize);
  }

  dispose(): void {
    this.compiled.dispose();
  }
}

/** The parts of the package's GrammarMatcher used here: its binding handle. */
interface MatcherInternals {
  handle: {
    AcceptToken(id: number, verbose: boolean): boolean;
    GetNextTokenBitmask(vocabSize: number): EmbindVector;
    IsTerminated(): boolean;
    Rollback(n: number): void;
    delete(): void;
  };
}

/** An embind std::vector<int32_t>: its C++ object's address is $$.ptr. */
interface EmbindVector {
  $$: { ptr: number };
  size(): number;
  delete(): void;
}

/** One generation's matcher (src/engine/types.ts TokenConstraint). */
export class Matcher {
  constructor(
    private readonly m: MatcherInternals,
    private readonly vocabSize: number,
  ) {}

  accept(token: number): boolean {
    return this.m.handle.AcceptToken(token, false);
  }

  fillMask(out: Uint32Array): boolean {
    if (this.m.handle.IsTerminated()) return false;
    const v = this.m.handle.GetNextTokenBitmask(this.vocabSize);
    try {
      // libc++'s std::vector is {begin, end, capacity} pointers.
      const heap = new Uint32Array((memory as WebAssembly.Memory).buffer);
      const begin = heap[v.$$.ptr >>> 2] >>> 2;
      const words = Math.min(out.length, v.size());
      out.set(heap.subarray(begin, begin + words));
    } finally {
      v.delete();
    }
    for (let w = 0; w < out.length; w++) if (out[w] !== 0) return true;
    return false;
  }

  rollback(n: number): void {
    this.m.handle.Rollback(n);
  }

  dispose(): void {
    this.m.handle.delete();
  }
}
