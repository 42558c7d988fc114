// Response formats for the server: a JSON Schema, JSON at all, or an EBNF
// grammar, checked and compiled once per distinct source and kept (most
// recently used first), each an OutputFormat the engine constrains a
// generation to (docs/structured-output.md).
//
// A new source is compiled twice: first by a worker thread's engine, with a
// time bound, then by the server's own. The grammar engine's compile cannot
// be interrupted, takes seconds on some real-world schemas and aborts its
// WASM module on a few: a source the worker does not finish in time (the
// worker is then ended) or fails on is refused with the reason, and only a
// source the worker compiled reaches the server's engine, where it costs
// what it cost there. Refusals are kept too, so a repeated bad source costs
// nothing.
import type { OutputFormat, TokenConstraint } from "../engine/types.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import type { CompileReply, CompileRequest } from "./compile_worker.ts";
import { type CompiledFormat, GrammarEngine, GrammarEngineError, type GrammarSource } from "./engine.ts";
import { checkSchema, SchemaError } from "./schema_check.ts";
import { grammarVocabulary } from "./vocabulary.ts";
import { workerUrl } from "../worker_url.ts";

/** A format the server cannot constrain output to; the message says what and where. */
export class FormatError extends Error {}

/** What a request asks its output to be (src/http parses it from the body). */
export type FormatRequest = { kind: "json_object" } | { kind: "json_schema"; schema: unknown; strict: boolean } | { kind: "ebnf"; grammar: string };

/** Largest schema (as JSON) or grammar text taken. */
export const MAX_FORMAT_BYTES = 65_536;

// Bun's Worker has unref(); the DOM typing lacks it.
type BunWorker = Worker & { unref(): void };

const WORKER_URL = workerUrl("grammar/compile_worker.ts");

export interface FormatCompilerOptions {
  /** Longest a compile may take (SERVICE_FORMAT_COMPILE_MS). */
  compileMs: number;
  /** Compiled formats (and refusals) kept (SERVICE_FORMAT_CACHE). */
  cacheSize: number;
}

export class FormatCompiler {
  private readonly cache = new Map<string, Promise<OutputFormat>>();
  private worker: BunWorker | null = null;
  private nextId = 0;
  /** Compiles wait for the worker one at a time. */
  private queue: Promise<unknown> = Promise.resolve();

  private constructor(
    private readonly engine: GrammarEngine,
    private readonly vocab: string[],
    private readonly opts: FormatCompilerOptions,
  ) {}

  /** The compiler for a model's vocabulary: `vocabSize` logits per step, `endIds` the ids that end a value. */
  static async create(tokenizer: Tokenizer, vocabSize: number, endIds: readonly number[], opts: FormatCompilerOptions): Promise<FormatCompiler> {
    const vocab = grammarVocabulary(tokenizer, endIds);
    const compiler = new FormatCompiler(await GrammarEngine.create(vocab, vocabSize, endIds), vocab, opts);
    compiler.startWorker();
    return compiler;
  }

  /** The output format of a request; FormatError (naming what is wrong and where) when it cannot be honoured. */
  format(request: FormatRequest): Promise<OutputFormat> {
    const source = sourceOf(request);
    const key = JSON.stringify(source);
    const kept = this.cache.get(key);
    if (kept) {
      this.cache.delete(key);
      this.cache.set(key, kept);
      return kept;
    }
    const made = this.compile(source);
    this.cache.set(key, made);
    made.catch(() => {}); // a refusal is kept and rethrown to each asker
    while (this.cache.size > this.opts.cacheSize) this.cache.delete(this.cache.keys().next().value as string);
    return made;
  }

  close(): void {
    this.worker?.terminate();
    this.worker = null;
  }

  private async compile(source: GrammarSource): Promise<OutputFormat> {
    await this.tryInWorker(source);
    let compiled: CompiledFormat;
    try {
      compiled = await this.engine.compile(source);
    } catch (e) {
      if (e instanceof GrammarEngineError) throw new FormatError(e.message);
      throw e;
    }
    return { endIds: compiled.endIds, matcher: async (): Promise<TokenConstraint> => compiled.matcher() };
  }

  private startWorker(): BunWorker {
    const worker = new Worker(WORKER_URL) as BunWorker;
    worker.unref();
    const init: CompileRequest = { kind: "init", vocab: this.vocab, vocabSize: this.engine.vocabSize, endIds: [...this.engine.endIds] };
    worker.postMessage(init);
    this.worker = worker;
    return worker;
  }

  /** The worker's compile of `source`, in turn: resolves when it compiled, FormatError when it failed or ran out of time. */
  private tryInWorker(source: GrammarSource): Promise<void> {
    const run = this.queue.then(() => this.workerCompile(source));
    this.queue = run.catch(() => {});
    return run;
  }

  private workerCompile(source: GrammarSource): Promise<void> {
    const worker = this.worker ?? this.startWorker();
    const id = this.nextId++;
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        // The engine cannot be stopped mid-compile: the worker goes, and the next compile gets a fresh one.
        settle();
        worker.terminate();
        if (this.worker === worker) this.worker = null;
        reject(new FormatError(`compiling it took longer than ${this.opts.compileMs} ms (SERVICE_FORMAT_COMPILE_MS): it is too large or complex`));
      }, this.opts.compileMs);
      const settle = () => {
        clearTimeout(timer);
        worker.removeEventListener("message", onReply);
        worker.removeEventListener("error", onError);
      };
      // A worker that cannot run at all is the server's fault, not the format's: a plain error (500).
      const onError = (event: ErrorEvent) => {
        settle();
        worker.terminate();
        if (this.worker === worker) this.worker = null;
        reject(new Error(`the format compiler's worker failed: ${event.message}`));
      };
      const onReply = (event: MessageEvent<CompileReply>) => {
        if (event.data.id !== id) return;
        settle();
        if ("ok" in event.data) return resolve();
        // An abort leaves the worker's engine unusable: a fresh one for the next compile.
        if (event.data.aborted) {
          worker.terminate();
          if (this.worker === worker) this.worker = null;
        }
        reject(new FormatError(event.data.error));
      };
      worker.addEventListener("message", onReply);
      worker.addEventListener("error", onError);
      const request: CompileRequest = { kind: "compile", id, source };
      worker.postMessage(request);
    });
  }
}

/** A request's source for the engine, after the checks made before any compile. */
function sourceOf(request: FormatRequest): GrammarSource {
  if (request.kind === "json_object") return { kind: "json_object" };
  if (request.kind === "ebnf") {
    if (Buffer.byteLength(request.grammar, "utf8") > MAX_FORMAT_BYTES) throw new FormatError(`the grammar is longer than ${MAX_FORMAT_BYTES} bytes`);
    return { kind: "ebnf", grammar: request.grammar };
  }
  try {
    checkSchema(request.schema);
  } catch (e) {
    if (e instanceof SchemaError) throw new FormatError(`${e.message} (at ${e.pointer === "" ? "the schema's root" : `#${e.pointer}`})`);
    throw e;
  }
  const schema = JSON.stringify(request.schema);
  if (Buffer.byteLength(schema, "utf8") > MAX_FORMAT_BYTES) throw new FormatError(`the schema is longer than ${MAX_FORMAT_BYTES} bytes as JSON`);
  return { kind: "json_schema", schema, strict: request.strict };
}
