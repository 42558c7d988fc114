// Service configuration: every environment variable loopserve reads is read
// here and nowhere else (the README's settings table lists them).
// loadConfig validates everything up front so a bad setting stops the start
// with a message naming the variable and the value, instead of surfacing
// later as a confusing request failure.
import { readFileSync } from "node:fs";
import { totalmem } from "node:os";
import pkg from "../package.json" with { type: "json" };
import { LS_BATCH_MAX_ROWS } from "./abi/abi.generated.ts";
import { SIMD_CHOICES, type SimdChoice } from "./engine/types.ts";
import { normalizeHostPattern, normalizeOrigin } from "./origins.ts";
import { LOG_FORMATS, type LogFormat } from "./log.ts";
import { KV_CACHE_MODES, type KvCacheMode } from "./model/kvcache.ts";

export type { KvCacheMode };

export class ConfigError extends Error {}

/** Cache modes the kernels implement (docs/kv-cache.md); any other mode stops the start. */
export const SUPPORTED_KV_CACHE_MODES: readonly KvCacheMode[] = KV_CACHE_MODES;

export interface Config {
  /** SERVICE_MODEL_PATH; null when unset (the server then answers 503). */
  readonly modelPath: string | null;
  readonly maxSeqLen: number;
  readonly maxQueueDepth: number;
  /** SERVICE_MAX_BATCH: requests running at once, their steps batched (1: one at a time). */
  readonly maxBatch: number;
  /** SERVICE_PREFILL_CHUNK: prompt tokens fed per step while other requests run. */
  readonly prefillChunk: number;
  /** SERVICE_KV_CACHE_MB: key/value cache memory all running requests share, in MiB; null: kvCacheBudgetMb's default. */
  readonly kvCacheMb: number | null;
  /** SERVICE_MAX_BODY_BYTES: larger request bodies get 413. */
  readonly maxBodyBytes: number;
  /** SERVICE_BODY_TIMEOUT_MS: a request body that sends nothing for this long gets 408 and its connection is closed. */
  readonly bodyTimeoutMs: number;
  /**
   * SERVICE_FORMAT_COMPILE_MS: a response format (JSON Schema or grammar) whose
   * compile takes longer than this is refused with a 400 (docs/structured-output.md).
   */
  readonly formatCompileMs: number;
  /** SERVICE_FORMAT_CACHE: compiled response formats kept, most recently used first. */
  readonly formatCache: number;
  /** Latency target inherited by every submission; null = none. */
  readonly defaultSloMs: number | null;
  readonly prefixPoolCapacity: number;
  readonly buildDir: string;
  /** Reported as runtime.commit. */
  readonly commit: string | null;
  /** Where a replacement GPT-2 rank file may be placed; null = bundled only. */
  readonly tokenizerHome: string | null;
  /** $XDG_CACHE_HOME: where the executable extracts its embedded kernel library. */
  readonly cacheHome: string | null;
  readonly kvCacheMode: KvCacheMode;
  /** SERVICE_H_MODE_FP16_ATTN_QKV: round q, k, v to fp16 before the rotation. */
  readonly hModeFp16AttnQkv: boolean;
  /** Kernel thread pool size; 0 = all online cores. */
  readonly threads: number;
  /** SERVICE_PROFILE=1: a per-op kernel time table in the log after each request. */
  readonly profile: boolean;
  /** SERVICE_PIPELINE_STEPS=1: each batched step runs on the kernel library's thread while the previous step's tokens stream. */
  readonly pipelineSteps: boolean;
  readonly simd: SimdChoice;
  readonly host: string;
  readonly port: number;
  /** SERVICE_ALLOWED_ORIGINS: origins (normalized) whose browser requests are served besides the server's own; "*" = any. */
  readonly allowedOrigins: readonly string[];
  /** SERVICE_ALLOWED_HOSTS: Host names served besides the loopback ones; empty = unset (docs/security.md). */
  readonly allowedHosts: readonly string[];
  /** SERVICE_API_KEY or the contents of SERVICE_API_KEY_FILE; null = no authentication. */
  readonly apiKey: string | null;
  /** SERVICE_API_KEY_PROTECT_METRICS=1: /metrics needs the key too. */
  readonly apiKeyProtectsMetrics: boolean;
  readonly logFormat: LogFormat;
  /** package.json version, reported as runtime.version. */
  readonly version: string;
}

/**
 * Requests batched together by default: on the trained model with two
 * threads, 8 rows per step give 2.7x the tokens per second of 8 requests
 * one after another, and 16 rows no more (docs/batching.md).
 */
export const DEFAULT_MAX_BATCH = 8;
export const DEFAULT_PREFILL_CHUNK = 256;
/** The default cache budget on the CPU kernels: a quarter of the machine's memory. */
export const defaultKvCacheMb = (): number => Math.max(64, Math.floor(totalmem() / 4 / 2 ** 20));
/** Of a GPU's memory free once the weights are loaded, the share the default budget takes (the rest: scratch, graphs, other processes). */
export const DEVICE_KV_CACHE_SHARE = 0.9;

/** The cache budget in MiB: SERVICE_KV_CACHE_MB when set, else a share of the GPU's free memory, else a quarter of RAM. */
export function kvCacheBudgetMb(config: Config, device: { free: number } | null): number {
  if (config.kvCacheMb !== null) return config.kvCacheMb;
  return device ? Math.max(64, Math.floor((device.free * DEVICE_KV_CACHE_SHARE) / 2 ** 20)) : defaultKvCacheMb();
}

/** Command-line flags that override their environment variables. */
export interface ConfigFlags {
  host?: string;
  port?: string;
}

export const SERVICE_NAME = "loopserve";
export const VERSION: string = pkg.version;

// A loopback default like llama.cpp's server: exposing the (unauthenticated)
// service on every interface is a choice the operator makes with HOST=0.0.0.0.
const DEFAULT_HOST = "127.0.0.1";
const DEFAULT_PORT = 8000;
// 8 MiB: room for the largest prompt the default context admits (2048 tokens
// of at most 128 bytes each, even with every character \u-escaped in JSON).
const DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024;
const MIN_MAX_BODY_BYTES = 1024;
// 30 s without a byte: far longer than any pause of a client that is still
// sending (nginx waits 60 s between two reads of a body), short enough that
// connections holding half-sent bodies do not pile up memory and descriptors.
const DEFAULT_BODY_TIMEOUT_MS = 30_000;
/** Compile bounds of a response format (docs/structured-output.md#how-it-works). */
const DEFAULT_FORMAT_COMPILE_MS = 2000;
const DEFAULT_FORMAT_CACHE = 256;

type Env = Record<string, string | undefined>;

// ---- value parsers: each names the variable and the offending value ----

function describe(value: string): string {
  return JSON.stringify(value);
}

/** Empty strings count as unset, as shells make `VAR=` easy to write by accident. */
function read(env: Env, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v.trim() === "" ? undefined : v.trim();
}

function integer(env: Env, name: string, fallback: number, min: number, max = Number.MAX_SAFE_INTEGER): number {
  return parseInteger(name, read(env, name), fallback, min, max);
}

function parseInteger(name: string, raw: string | undefined, fallback: number, min: number, max: number): number {
  if (raw === undefined) return fallback;
  if (!/^[0-9]+$/.test(raw)) throw new ConfigError(`${name} must be an integer, got ${describe(raw)}`);
  const n = Number(raw);
  if (n < min || n > max) throw new ConfigError(`${name} must be between ${min} and ${max}, got ${raw}`);
  return n;
}

function positiveNumber(env: Env, name: string): number | null {
  const raw = read(env, name);
  if (raw === undefined) return null;
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0) throw new ConfigError(`${name} must be a positive number of milliseconds, got ${describe(raw)}`);
  return n;
}

const TRUE = new Set(["1", "true", "yes", "on"]);
const FALSE = new Set(["0", "false", "no", "off"]);

function flag(env: Env, name: string): boolean {
  const raw = read(env, name);
  if (raw === undefined) return false;
  const v = raw.toLowerCase();
  if (TRUE.has(v)) return true;
  if (FALSE.has(v)) return false;
  throw new ConfigError(`${name} must be 1 or 0 (or true/false), got ${describe(raw)}`);
}

// ---- key/value cache mode (docs/kv-cache.md) ----

function kvCacheMode(env: Env): { mode: KvCacheMode; fp16AttnQkv: boolean } {
  const hMode = flag(env, "SERVICE_KV_H_MODE");
  const int4 = flag(env, "SERVICE_KV_INT4");
  const int8 = flag(env, "SERVICE_KV_INT8");
  const fp16AttnQkv = flag(env, "SERVICE_H_MODE_FP16_ATTN_QKV");
  if (int4 && int8)
    throw new ConfigError("SERVICE_KV_INT4=1 and SERVICE_KV_INT8=1 conflict: choose at most one cache quantization");
  if (fp16AttnQkv && !hMode)
    throw new ConfigError("SERVICE_H_MODE_FP16_ATTN_QKV=1 only applies with SERVICE_KV_H_MODE=1, which is not set");
  const base = int4 ? "int4" : int8 ? "int8" : "fp16";
  const mode = (hMode ? `${base}-h` : base) as KvCacheMode;
  if (!SUPPORTED_KV_CACHE_MODES.includes(mode)) {
    const switches = [hMode && "SERVICE_KV_H_MODE=1", int4 && "SERVICE_KV_INT4=1", int8 && "SERVICE_KV_INT8=1"].filter(Boolean);
    throw new ConfigError(
      `${switches.join(" with ")} selects kv_cache_mode ${mode}, which is not supported by this build yet ` +
        `(supported: ${SUPPORTED_KV_CACHE_MODES.join(", ")}); unset the switch to run with the fp16 cache`,
    );
  }
  return { mode, fp16AttnQkv };
}

// ---- browser protection and the API key (docs/security.md) ----

/** A comma-separated list, each entry checked by `normalize` (null = not allowed). */
function list(env: Env, name: string, normalize: (entry: string) => string | null, expected: string): string[] {
  const raw = read(env, name);
  if (raw === undefined) return [];
  return raw.split(",").map((entry) => {
    const value = entry.trim() === "*" ? "*" : normalize(entry.trim());
    if (value === null) throw new ConfigError(`${name}: ${describe(entry.trim())} is not ${expected}`);
    return value;
  });
}

const KEY_CHARACTERS = /^[\x21-\x7e]+$/;

// Unlike other settings, a key variable that is present but empty stops the
// start: an operator who meant to require a key must not get an open server.
function apiKey(env: Env): string | null {
  const direct = env.SERVICE_API_KEY;
  const file = env.SERVICE_API_KEY_FILE;
  if (direct !== undefined && file !== undefined)
    throw new ConfigError("SERVICE_API_KEY and SERVICE_API_KEY_FILE are both set: choose one");
  let key: string;
  let source: string;
  if (direct !== undefined) {
    key = direct.trim();
    source = "SERVICE_API_KEY";
  } else if (file !== undefined) {
    if (file.trim() === "") throw new ConfigError("SERVICE_API_KEY_FILE is set but empty: name the key file, or unset it");
    try {
      key = readFileSync(file.trim(), "utf8").trim();
    } catch (e) {
      throw new ConfigError(`SERVICE_API_KEY_FILE: cannot read ${describe(file.trim())}: ${(e as Error).message}`);
    }
    source = `SERVICE_API_KEY_FILE (${file.trim()})`;
  } else return null;
  if (key === "") throw new ConfigError(`${source} is empty: set a key, or unset the variable to run without authentication`);
  if (!KEY_CHARACTERS.test(key))
    throw new ConfigError(`${source}: the key must be printable ASCII without spaces (it is sent as "Authorization: Bearer <key>")`);
  return key;
}

// ---- the kernel library's location (also read by `loopserve model inspect`) ----

export function libraryConfig(env: Env = process.env): Pick<Config, "buildDir" | "cacheHome"> {
  return { buildDir: read(env, "SERVICE_BUILD_DIR") ?? "./build", cacheHome: read(env, "XDG_CACHE_HOME") ?? null };
}

/** TOKENIZER_HOME, also for the commands that read a model's tokenizer without serving it (model inspect). */
export function tokenizerHomeOf(env: Env = process.env): string | null {
  return read(env, "TOKENIZER_HOME") ?? null;
}

// ---- the whole configuration ----

/**
 * SERVICE_LOG_FORMAT as far as it can be read ahead of the rest, so that an
 * error in any other setting is reported in the format the collector
 * expects (text when the format is itself the error).
 */
export function logFormatOf(env: Env = process.env): LogFormat {
  const raw = read(env, "SERVICE_LOG_FORMAT");
  return LOG_FORMATS.includes(raw as LogFormat) ? (raw as LogFormat) : "text";
}

export function loadConfig(env: Env = process.env, flags: ConfigFlags = {}): Config {
  const simdRaw = read(env, "SERVICE_SIMD") ?? "auto";
  if (!SIMD_CHOICES.includes(simdRaw as SimdChoice))
    throw new ConfigError(`SERVICE_SIMD must be one of ${SIMD_CHOICES.join(", ")}, got ${describe(simdRaw)}`);

  const host = flags.host ?? read(env, "HOST") ?? DEFAULT_HOST;
  if (host.trim() === "") throw new ConfigError("--host must not be empty");
  const port =
    flags.port !== undefined
      ? parseInteger("--port", flags.port, DEFAULT_PORT, 0, 65535)
      : integer(env, "PORT", DEFAULT_PORT, 0, 65535);

  const kv = kvCacheMode(env);
  const logFormat = read(env, "SERVICE_LOG_FORMAT") ?? "text";
  if (!LOG_FORMATS.includes(logFormat as LogFormat))
    throw new ConfigError(`SERVICE_LOG_FORMAT must be one of ${LOG_FORMATS.join(", ")}, got ${describe(logFormat)}`);
  const key = apiKey(env);
  const protectMetrics = flag(env, "SERVICE_API_KEY_PROTECT_METRICS");
  if (protectMetrics && key === null)
    throw new ConfigError("SERVICE_API_KEY_PROTECT_METRICS=1 needs SERVICE_API_KEY or SERVICE_API_KEY_FILE, which is not set");
  return Object.freeze({
    modelPath: read(env, "SERVICE_MODEL_PATH") ?? null,
    maxSeqLen: integer(env, "SERVICE_MAX_SEQ_LEN", 2048, 2),
    maxQueueDepth: integer(env, "SERVICE_MAX_QUEUE_DEPTH", 128, 1),
    maxBatch: integer(env, "SERVICE_MAX_BATCH", DEFAULT_MAX_BATCH, 1, LS_BATCH_MAX_ROWS),
    prefillChunk: integer(env, "SERVICE_PREFILL_CHUNK", DEFAULT_PREFILL_CHUNK, 1, 1 << 20),
    kvCacheMb: read(env, "SERVICE_KV_CACHE_MB") === undefined ? null : integer(env, "SERVICE_KV_CACHE_MB", 0, 1, 1 << 30),
    maxBodyBytes: integer(env, "SERVICE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, MIN_MAX_BODY_BYTES),
    bodyTimeoutMs: integer(env, "SERVICE_BODY_TIMEOUT_MS", DEFAULT_BODY_TIMEOUT_MS, 100, 3_600_000),
    formatCompileMs: integer(env, "SERVICE_FORMAT_COMPILE_MS", DEFAULT_FORMAT_COMPILE_MS, 10, 600_000),
    formatCache: integer(env, "SERVICE_FORMAT_CACHE", DEFAULT_FORMAT_CACHE, 1, 100_000),
    defaultSloMs: positiveNumber(env, "SERVICE_DEFAULT_SLO_MS"),
    prefixPoolCapacity: integer(env, "SERVICE_PREFIX_POOL_CAPACITY", 16, 0),
    buildDir: libraryConfig(env).buildDir,
    commit: read(env, "SERVICE_COMMIT") ?? null,
    tokenizerHome: tokenizerHomeOf(env),
    cacheHome: libraryConfig(env).cacheHome,
    kvCacheMode: kv.mode,
    hModeFp16AttnQkv: kv.fp16AttnQkv,
    threads: integer(env, "SERVICE_THREADS", 0, 0, 4096),
    profile: flag(env, "SERVICE_PROFILE"),
    pipelineSteps: flag(env, "SERVICE_PIPELINE_STEPS"),
    simd: simdRaw as SimdChoice,
    host,
    port,
    allowedOrigins: list(env, "SERVICE_ALLOWED_ORIGINS", normalizeOrigin, "an origin such as https://app.example.com or *"),
    allowedHosts: list(env, "SERVICE_ALLOWED_HOSTS", normalizeHostPattern, "a host name such as api.example.com, *.example.com or *"),
    apiKey: key,
    apiKeyProtectsMetrics: protectMetrics,
    logFormat: logFormat as LogFormat,
    version: VERSION,
  });
}
