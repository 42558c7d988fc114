// `loopserve serve`: configuration → the model file's tokenizer → engine → HTTP server, then
// wait for SIGTERM/SIGINT. A model that cannot be loaded does not stop the
// process: it logs why and answers 503 on /healthz and every generation
// endpoint, so an orchestrator sees an unhealthy service with a reason
// rather than a crash loop. A bad configuration does stop it (exit 2).
import { type Config, ConfigError, type ConfigFlags, kvCacheBudgetMb, loadConfig, logFormatOf } from "../config.ts";
import { Engine } from "../engine/engine.ts";
import { frontDoor } from "../http/front_door.ts";
import { log } from "../log.ts";
import { quantMixNote } from "../model/format.ts";
import { ServiceMetrics } from "../metrics.ts";
import { Scheduler } from "../scheduler/scheduler.ts";
import { withAbsoluteUrl } from "../http/request_url.ts";
import { FormatCompiler } from "../grammar/formats.ts";
import { createApp } from "../http/app.ts";
import { ModelFormatError, readSafetensors } from "../model/safetensors.ts";
import { loadModelTokenizer, ModelTokenizerError } from "../tokenizer/from_metadata.ts";
import { Tokenizer, TokenizerError } from "../tokenizer/tokenizer.ts";

const USAGE = `usage: loopserve serve [--host HOST] [--port PORT]

Serves the model at SERVICE_MODEL_PATH over HTTP: OpenAI-compatible /v1, extended
/api/v0, native /generate, /healthz, /metrics and the web playground at /.

options:
  --host HOST   address to listen on (default: HOST, else 127.0.0.1)
  --port PORT   port to listen on (default: PORT, else 8000; 0 picks a free one)
  -h, --help    show this help

environment:
  SERVICE_MODEL_PATH            model .safetensors file (required to generate)
  SERVICE_MAX_SEQ_LEN           prompt + generated tokens limit (2048)
  SERVICE_MAX_QUEUE_DEPTH       queued requests before 503 (128)
  SERVICE_MAX_BATCH             requests running at once, their steps batched (8; 1 = one at a time)
  SERVICE_PREFILL_CHUNK         prompt tokens fed per step beside running streams (256)
  SERVICE_KV_CACHE_MB           key/value cache memory the running requests share (a quarter of RAM)
  SERVICE_MAX_BODY_BYTES        larger request bodies get 413 (8388608 = 8 MiB)
  SERVICE_BODY_TIMEOUT_MS       a request body that stalls this long gets 408 (30000)
  SERVICE_DEFAULT_SLO_MS        latency target in ms (unset)
  SERVICE_PREFIX_POOL_CAPACITY  shared prefix pool entries (16)
  SERVICE_BUILD_DIR             where libloopserve.so is found (./build)
  SERVICE_COMMIT                reported as runtime.commit (unset)
  SERVICE_THREADS               kernel threads, 0 = all cores (0)
  SERVICE_SIMD                  auto | portable | avx2 | avx512 (auto; a named path keeps a GPU host on the CPU)
  SERVICE_PROFILE               1: per-op kernel times in the log after each request
  SERVICE_KV_INT8, SERVICE_KV_INT4  key/value cache in int8 / int4 (at most one; default fp16)
  SERVICE_KV_H_MODE             rotate K/V (and q) per head by a Walsh-Hadamard transform
                                (kv_cache_mode fp16-h, int8-h, int4-h; power-of-two head_dim)
  SERVICE_H_MODE_FP16_ATTN_QKV  with H mode: round q, k, v to fp16 before the rotation
  SERVICE_ALLOWED_ORIGINS       browser origins served besides the server's own (comma-separated; * = any)
  SERVICE_ALLOWED_HOSTS         Host names served besides localhost names (comma-separated; * = any)
  SERVICE_API_KEY               require "Authorization: Bearer <key>" on the API routes (unset)
  SERVICE_API_KEY_FILE          ... the key read from this file instead
  SERVICE_API_KEY_PROTECT_METRICS  1: /metrics needs the key too
  SERVICE_LOG_FORMAT            text | json (text)
  TOKENIZER_HOME                directory holding a replacement gpt2.tiktoken (for models
                                without their own tokenizer)
`;

type Parsed = { help: true } | { help: false; flags: ConfigFlags };

function parseArgs(argv: string[]): Parsed {
  const flags: ConfigFlags = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "-h" || arg === "--help") return { help: true };
    const m = /^--(host|port)(?:=(.*))?$/.exec(arg);
    if (!m) throw new ConfigError(`unknown argument '${arg}'`);
    const value = m[2] ?? argv[++i];
    if (value === undefined) throw new ConfigError(`--${m[1]} needs a value`);
    flags[m[1] as "host" | "port"] = value;
  }
  return { help: false, flags };
}

interface Loaded {
  engine: Engine | null;
  loadError: string | null;
}

/**
 * The tokenizer the model file names in its metadata (GPT-2's unless it
 * carries its own, docs/tokenizers.md). A file that cannot be read gets
 * GPT-2's (the engine's load then says what is wrong with it); one whose
 * tokenizer is refused gets GPT-2's and that refusal as the load error.
 */
async function loadTokenizer(config: Config): Promise<{ tokenizer: Tokenizer; loadError: string | null }> {
  let meta: Record<string, string> | null = null;
  try {
    if (config.modelPath !== null) meta = readSafetensors(config.modelPath).metadata;
  } catch (e) {
    if (!(e instanceof ModelFormatError)) throw e;
  }
  if (meta !== null && config.modelPath !== null) {
    try {
      return { tokenizer: await loadModelTokenizer(meta, config.modelPath, config.tokenizerHome), loadError: null };
    } catch (e) {
      if (!(e instanceof ModelTokenizerError)) throw e;
      return { tokenizer: await Tokenizer.load(config.tokenizerHome), loadError: e.message };
    }
  }
  return { tokenizer: await Tokenizer.load(config.tokenizerHome), loadError: null };
}

function loadEngine(config: Config, metrics: ServiceMetrics, tokenizerError: string | null): Loaded {
  if (config.modelPath === null) return { engine: null, loadError: "SERVICE_MODEL_PATH is not set" };
  if (tokenizerError !== null) return { engine: null, loadError: tokenizerError };
  try {
    const engine = Engine.load({
      modelPath: config.modelPath,
      threads: config.threads,
      simd: config.simd,
      buildDir: config.buildDir,
      cacheHome: config.cacheHome,
      profile: config.profile,
      kvCacheMode: config.kvCacheMode,
      hModeFp16AttnQkv: config.hModeFp16AttnQkv,
      // With one request at a time there is nothing to interleave a prompt with.
      prefillChunk: config.maxBatch > 1 ? config.prefillChunk : null,
      pipelineSteps: config.pipelineSteps,
      onBatchStep: (st) => {
        metrics.batchRows.observe(st.rows);
        metrics.generatedTokens.inc(st.sampled);
        metrics.promptTokensRun.inc(st.promptTokens);
        metrics.engineStepSeconds.inc(st.seconds);
      },
    });
    metrics.watchKvCacheAllocated(() => engine.kvCacheBytesHeld());
    return { engine, loadError: null };
  } catch (e) {
    return { engine: null, loadError: (e as Error).message };
  }
}

function startupLine(config: Config, loaded: Loaded, kvBudgetMb: number, url: string): string {
  const base = `version ${config.version}, listening on ${url}`;
  const { engine, loadError } = loaded;
  if (!engine) return `${base} — model NOT LOADED (${loadError}); /healthz and generation answer 503`;
  const i = engine.info;
  return (
    `${base} — model ${config.modelPath} (quant ${i.quant}${quantMixNote(i.quantMix)}, kv ${config.kvCacheMode}, threads ${i.threads}, simd ${i.simd}); ` +
    `batching up to ${config.maxBatch} requests, key/value cache budget ${kvBudgetMb} MiB${config.kvCacheMb === null && engine.deviceMemory() ? " (of the GPU's free memory)" : ""}`
  );
}

/**
 * The response formats' compiler over the model's vocabulary (structured
 * output, docs/structured-output.md), or why there is none: a kernel
 * library without token masks.
 */
async function formatCompiler(config: Config, tokenizer: Tokenizer, engine: Engine): Promise<{ formats: FormatCompiler | null; formatsUnavailable?: string }> {
  if (!engine.supportsFormats) return { formats: null, formatsUnavailable: "the kernel library in use (the CUDA one) has no token masks" };
  const vocab = engine.info.vocabSize;
  const endIds = tokenizer.conventions.eosIds.filter((id) => id < vocab);
  const formats = await FormatCompiler.create(tokenizer, vocab, endIds, { compileMs: config.formatCompileMs, cacheSize: config.formatCache });
  return { formats };
}

/** How long a second signal leaves the halted streams to write their last events. */
const HALT_FLUSH_MS = 100;

/** Runs the server until SIGTERM/SIGINT; resolves to the process exit code. */
export async function runServe(argv: string[]): Promise<number> {
  let config: Config;
  let tokenizer: Tokenizer;
  let tokenizerError: string | null;
  log.setFormat(logFormatOf(process.env));
  try {
    const parsed = parseArgs(argv);
    if (parsed.help) {
      console.log(USAGE);
      return 0;
    }
    config = loadConfig(process.env, parsed.flags);
    log.setFormat(config.logFormat);
    ({ tokenizer, loadError: tokenizerError } = await loadTokenizer(config));
    // The prompt-length bound's trie (~0.3 s), built before the first long prompt needs it.
    tokenizer.bound();
  } catch (e) {
    if (!(e instanceof ConfigError || e instanceof TokenizerError)) throw e;
    log.error(e instanceof ConfigError ? `${e.message} (run 'loopserve serve --help' for the settings)` : e.message);
    return 2;
  }

  const metrics = new ServiceMetrics({ maxSeqLen: config.maxSeqLen, defaultLoops: 0 });
  const loaded = loadEngine(config, metrics, tokenizerError);
  if (loaded.engine) metrics.defaultLoops.set(loaded.engine.info.defaultLoops);
  if (loaded.loadError) log.error(`model not loaded: ${loaded.loadError}`);
  const longestPrompt = config.maxSeqLen * tokenizer.maxTokenBytes;
  if (Number.isFinite(longestPrompt) && config.maxBodyBytes < longestPrompt)
    log.warn(
      `SERVICE_MAX_BODY_BYTES=${config.maxBodyBytes} is below the longest prompt ` +
        `SERVICE_MAX_SEQ_LEN=${config.maxSeqLen} admits (${longestPrompt} bytes of text): such prompts get 413`,
    );
  if (loaded.engine && config.maxSeqLen > loaded.engine.info.maxSeqLen)
    log.warn(
      `SERVICE_MAX_SEQ_LEN=${config.maxSeqLen} exceeds the model's max_seq_len ` +
        `${loaded.engine.info.maxSeqLen}; output beyond it may degrade`,
    );

  // The cache budget, unless set: most of the GPU's memory left free by the weights, else a quarter of RAM.
  const kvBudgetMb = kvCacheBudgetMb(config, loaded.engine?.deviceMemory() ?? null);
  let draining = false;
  const loadedEngine = loaded.engine;
  const scheduler = loadedEngine
    ? new Scheduler(loadedEngine, {
        metrics,
        maxQueueDepth: config.maxQueueDepth,
        defaultSloMs: config.defaultSloMs,
        prefixPoolCapacity: config.prefixPoolCapacity,
        cacheMode: config.kvCacheMode,
        maxBatch: config.maxBatch,
        kvCache: { budgetBytes: kvBudgetMb * 2 ** 20, bytesFor: (req) => loadedEngine.kvCacheBytes(req) },
      })
    : null;
  const engine =
    loaded.engine && scheduler
      ? { info: loaded.engine.info, enqueue: scheduler.enqueue.bind(scheduler) }
      : null;
  const formats = loadedEngine ? await formatCompiler(config, tokenizer, loadedEngine) : { formats: null };
  const app = createApp({
    config,
    tokenizer,
    engine,
    loadError: loaded.loadError,
    metrics,
    draining: () => draining,
    ...formats,
  });
  // Aborted by a second signal: open streams end with an error event and [DONE].
  const halt = new AbortController();
  let server: ReturnType<typeof Bun.serve>;
  try {
    // idleTimeout 0: no server-side timeout once the body is in (docs/http.md);
    // a long non-streaming generation sends nothing until it is done. A body
    // that stalls is timed out as it is read (SERVICE_BODY_TIMEOUT_MS). Bun answers a body over
    // maxRequestBodySize itself with an empty 413, so its limit is kept above
    // SERVICE_MAX_BODY_BYTES and the app answers 413 in the error shape.
    const door = frontDoor(config, (req) => app.handle(req), halt.signal);
    server = Bun.serve({
      hostname: config.host,
      port: config.port,
      idleTimeout: 0,
      maxRequestBodySize: Number.MAX_SAFE_INTEGER,
      fetch: (req) => door(withAbsoluteUrl(req, server.url.origin)),
    });
  } catch (e) {
    log.error(`cannot listen on ${config.host}:${config.port}: ${(e as Error).message}`);
    loaded.engine?.close();
    return 1;
  }
  log.info(startupLine(config, loaded, kvBudgetMb, server.url.href.replace(/\/$/, "")));

  return new Promise<number>((resolve) => {
    const shutdown = async (signal: string) => {
      if (draining) {
        // A second signal: stop waiting for in-flight requests. Streams are
        // told why and closed first; the rest of the connections are dropped
        // once their closing events have been written.
        halt.abort();
        await Bun.sleep(HALT_FLUSH_MS);
        server.stop(true);
        return;
      }
      draining = true;
      log.info(`${signal}: finishing the running request, refusing queued ones, then exiting`);
      // Prompts still being tokenized would only be refused afterwards: 503 now.
      tokenizer.close();
      // Queued requests get 503; the running one finishes. The engine is not
      // closed: the process exits right after anyway.
      await scheduler?.shutdown();
      await server.stop();
      resolve(0);
    };
    process.on("SIGTERM", () => void shutdown("SIGTERM"));
    process.on("SIGINT", () => void shutdown("SIGINT"));
  });
}

if (import.meta.main) process.exit(await runServe(process.argv.slice(2)));
