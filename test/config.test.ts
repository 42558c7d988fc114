import { describe, expect, test } from "bun:test";
import { chmodSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pkg from "../package.json" with { type: "json" };
import { ConfigError, DEFAULT_MAX_BATCH, DEFAULT_PREFILL_CHUNK, DEVICE_KV_CACHE_SHARE, defaultKvCacheMb, kvCacheBudgetMb, loadConfig } from "../src/config.ts";

describe("configuration", () => {
  test("the cache budget: SERVICE_KV_CACHE_MB when set, else most of a GPU's free memory, else a quarter of RAM", () => {
    const gpu = { free: 40 * 2 ** 30 };
    expect(kvCacheBudgetMb(loadConfig({ SERVICE_KV_CACHE_MB: "512" }), gpu)).toBe(512);
    expect(kvCacheBudgetMb(loadConfig({ SERVICE_KV_CACHE_MB: "512" }), null)).toBe(512);
    expect(kvCacheBudgetMb(loadConfig({}), gpu)).toBe(Math.floor(40 * 1024 * DEVICE_KV_CACHE_SHARE));
    expect(kvCacheBudgetMb(loadConfig({}), null)).toBe(defaultKvCacheMb());
  });

  test("defaults match the README's settings table", () => {
    const c = loadConfig({});
    expect(c).toMatchObject({
      modelPath: null,
      maxSeqLen: 2048,
      maxQueueDepth: 128,
      maxBatch: DEFAULT_MAX_BATCH,
      prefillChunk: DEFAULT_PREFILL_CHUNK,
      kvCacheMb: null,
      maxBodyBytes: 8 * 1024 * 1024,
      defaultSloMs: null,
      prefixPoolCapacity: 16,
      buildDir: "./build",
      commit: null,
      tokenizerHome: null,
      kvCacheMode: "fp16",
      threads: 0,
      simd: "auto",
      host: "127.0.0.1",
      port: 8000,
      version: pkg.version,
    });
    expect(Object.isFrozen(c)).toBe(true);
  });

  test("every variable is read", () => {
    const c = loadConfig({
      SERVICE_MODEL_PATH: "/m.safetensors",
      SERVICE_MAX_SEQ_LEN: "512",
      SERVICE_MAX_QUEUE_DEPTH: "4",
      SERVICE_MAX_BATCH: "16",
      SERVICE_PREFILL_CHUNK: "64",
      SERVICE_KV_CACHE_MB: "512",
      SERVICE_MAX_BODY_BYTES: "65536",
      SERVICE_BODY_TIMEOUT_MS: "5000",
      SERVICE_DEFAULT_SLO_MS: "250.5",
      SERVICE_PREFIX_POOL_CAPACITY: "0",
      SERVICE_BUILD_DIR: "/b",
      SERVICE_COMMIT: "abc123",
      TOKENIZER_HOME: "/tok",
      SERVICE_THREADS: "3",
      SERVICE_SIMD: "portable",
      HOST: "0.0.0.0",
      PORT: "9000",
    });
    expect(c).toMatchObject({
      modelPath: "/m.safetensors",
      maxSeqLen: 512,
      maxQueueDepth: 4,
      maxBatch: 16,
      prefillChunk: 64,
      kvCacheMb: 512,
      maxBodyBytes: 65536,
      bodyTimeoutMs: 5000,
      defaultSloMs: 250.5,
      prefixPoolCapacity: 0,
      buildDir: "/b",
      commit: "abc123",
      tokenizerHome: "/tok",
      threads: 3,
      simd: "portable",
      host: "0.0.0.0",
      port: 9000,
    });
  });

  test("SERVICE_MAX_BODY_BYTES must be an integer of at least 1024", () => {
    expect(() => loadConfig({ SERVICE_MAX_BODY_BYTES: "8M" })).toThrow("SERVICE_MAX_BODY_BYTES must be an integer, got \"8M\"");
    expect(() => loadConfig({ SERVICE_MAX_BODY_BYTES: "100" })).toThrow("SERVICE_MAX_BODY_BYTES must be between 1024 and");
  });

  test("SERVICE_BODY_TIMEOUT_MS: 30 s by default, an integer of at least 100 ms", () => {
    expect(loadConfig({}).bodyTimeoutMs).toBe(30_000);
    expect(() => loadConfig({ SERVICE_BODY_TIMEOUT_MS: "30s" })).toThrow("SERVICE_BODY_TIMEOUT_MS must be an integer, got \"30s\"");
    expect(() => loadConfig({ SERVICE_BODY_TIMEOUT_MS: "50" })).toThrow("SERVICE_BODY_TIMEOUT_MS must be between 100 and");
  });

  test("flags override HOST and PORT", () => {
    const c = loadConfig({ HOST: "0.0.0.0", PORT: "9000" }, { host: "::1", port: "0" });
    expect(c.host).toBe("::1");
    expect(c.port).toBe(0);
  });

  test("an empty variable counts as unset", () => {
    expect(loadConfig({ SERVICE_MAX_SEQ_LEN: "", SERVICE_COMMIT: " " })).toMatchObject({ maxSeqLen: 2048, commit: null });
  });

  test.each([
    ["SERVICE_MAX_SEQ_LEN", "lots"],
    ["SERVICE_MAX_SEQ_LEN", "-5"],
    ["SERVICE_MAX_SEQ_LEN", "1.5"],
    ["SERVICE_MAX_QUEUE_DEPTH", "0"],
    ["SERVICE_MAX_BATCH", "0"],
    ["SERVICE_MAX_BATCH", "257"],
    ["SERVICE_PREFILL_CHUNK", "0"],
    ["SERVICE_KV_CACHE_MB", "0"],
    ["SERVICE_KV_CACHE_MB", "2GB"],
    ["SERVICE_DEFAULT_SLO_MS", "-1"],
    ["SERVICE_DEFAULT_SLO_MS", "soon"],
    ["SERVICE_THREADS", "many"],
    ["SERVICE_SIMD", "sse4"],
    ["PORT", "70000"],
    ["SERVICE_KV_INT8", "maybe"],
  ])("%s=%s is a ConfigError naming the variable and the value", (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrow(name);
    expect(() => loadConfig({ [name]: value })).toThrow(value);
  });

  test("a bad --port flag names the flag", () => {
    expect(() => loadConfig({}, { port: "http" })).toThrow("--port");
  });

  test("INT4 and INT8 together conflict", () => {
    expect(() => loadConfig({ SERVICE_KV_INT4: "1", SERVICE_KV_INT8: "1" })).toThrow(/conflict/);
  });

  test("the fp16 attention switch without H mode is rejected", () => {
    expect(() => loadConfig({ SERVICE_H_MODE_FP16_ATTN_QKV: "1" })).toThrow(/SERVICE_KV_H_MODE/);
  });

  test("switches set to 0 leave the fp16 cache", () => {
    expect(loadConfig({ SERVICE_KV_INT4: "0", SERVICE_KV_H_MODE: "false" }).kvCacheMode).toBe("fp16");
  });

  test.each<[Record<string, string>, string]>([
    [{ SERVICE_KV_INT8: "1" }, "int8"],
    [{ SERVICE_KV_INT4: "1" }, "int4"],
    [{ SERVICE_KV_H_MODE: "1" }, "fp16-h"],
    [{ SERVICE_KV_INT4: "1", SERVICE_KV_H_MODE: "1" }, "int4-h"],
    [{ SERVICE_KV_INT8: "1", SERVICE_KV_H_MODE: "1", SERVICE_H_MODE_FP16_ATTN_QKV: "1" }, "int8-h"],
  ])("%o derives kv_cache_mode %s", (env, mode) => {
    const config = loadConfig(env);
    expect(config.kvCacheMode as string).toBe(mode);
    expect(config.hModeFp16AttnQkv).toBe(env.SERVICE_H_MODE_FP16_ATTN_QKV === "1");
  });

  test("INT8 with INT4 conflicts whatever the H switches say", () => {
    expect(() => loadConfig({ SERVICE_KV_INT4: "1", SERVICE_KV_INT8: "1", SERVICE_KV_H_MODE: "1" })).toThrow(/conflict/);
  });
});

describe("browser protection, API key and log settings", () => {
  const keyDir = mkdtempSync(join(tmpdir(), "loopserve-config-"));
  const keyFile = (name: string, contents: string) => {
    const path = join(keyDir, name);
    writeFileSync(path, contents);
    return path;
  };

  test("defaults: no extra origins or hosts, no key, text logs", () => {
    expect(loadConfig({})).toMatchObject({
      allowedOrigins: [],
      allowedHosts: [],
      apiKey: null,
      apiKeyProtectsMetrics: false,
      logFormat: "text",
    });
  });

  test("origins are normalized as browsers send them; * stays *", () => {
    const c = loadConfig({ SERVICE_ALLOWED_ORIGINS: "https://App.Example.com/, http://localhost:3000 ,http://x.test:80, *" });
    expect(c.allowedOrigins).toEqual(["https://app.example.com", "http://localhost:3000", "http://x.test", "*"]);
  });

  test.each(["app.example.com", "https://app.example.com/path", "ftp://files.example.com", "null", "https://user@app.example.com", "https://a.com?x=1"])(
    "SERVICE_ALLOWED_ORIGINS=%s is refused, naming the variable and the entry",
    (entry) => {
      expect(() => loadConfig({ SERVICE_ALLOWED_ORIGINS: `https://ok.example.com,${entry}` })).toThrow(ConfigError);
      expect(() => loadConfig({ SERVICE_ALLOWED_ORIGINS: entry })).toThrow("SERVICE_ALLOWED_ORIGINS");
      expect(() => loadConfig({ SERVICE_ALLOWED_ORIGINS: entry })).toThrow(JSON.stringify(entry));
    },
  );

  test("host names: lower-cased, wildcards for subdomains, addresses", () => {
    const c = loadConfig({ SERVICE_ALLOWED_HOSTS: "API.Example.com, *.internal.example, 10.0.0.5, [fd00::1], loopserve.example." });
    expect(c.allowedHosts).toEqual(["api.example.com", "*.internal.example", "10.0.0.5", "[fd00::1]", "loopserve.example"]);
    expect(loadConfig({ SERVICE_ALLOWED_HOSTS: "*" }).allowedHosts).toEqual(["*"]);
  });

  test.each(["api.example.com:8000", "http://api.example.com", "a b", "*.", "api.*.com", "", "[fd00::1"])(
    "SERVICE_ALLOWED_HOSTS entry %p is refused, naming the variable",
    (entry) => {
      expect(() => loadConfig({ SERVICE_ALLOWED_HOSTS: `ok.example.com,${entry}` })).toThrow(ConfigError);
      expect(() => loadConfig({ SERVICE_ALLOWED_HOSTS: `ok.example.com,${entry}` })).toThrow("SERVICE_ALLOWED_HOSTS");
    },
  );

  test("SERVICE_API_KEY is read and trimmed", () => {
    expect(loadConfig({ SERVICE_API_KEY: "  sk-local-123 " }).apiKey).toBe("sk-local-123");
  });

  test("SERVICE_API_KEY_FILE: the file's contents, trimmed (a trailing newline is usual)", () => {
    const c = loadConfig({ SERVICE_API_KEY_FILE: keyFile("key", "sk-from-file\n"), SERVICE_API_KEY_PROTECT_METRICS: "1" });
    expect(c.apiKey).toBe("sk-from-file");
    expect(c.apiKeyProtectsMetrics).toBe(true);
  });

  test("both key variables set: refused", () => {
    expect(() => loadConfig({ SERVICE_API_KEY: "a", SERVICE_API_KEY_FILE: keyFile("both", "b") })).toThrow(
      "SERVICE_API_KEY and SERVICE_API_KEY_FILE are both set",
    );
  });

  test("an empty key is refused, never taken as 'no authentication'", () => {
    expect(() => loadConfig({ SERVICE_API_KEY: "" })).toThrow(/SERVICE_API_KEY is empty/);
    expect(() => loadConfig({ SERVICE_API_KEY: "   " })).toThrow(/SERVICE_API_KEY is empty/);
    expect(() => loadConfig({ SERVICE_API_KEY_FILE: keyFile("blank", " \n\n") })).toThrow(/SERVICE_API_KEY_FILE .* is empty/);
    expect(() => loadConfig({ SERVICE_API_KEY_FILE: "" })).toThrow(/SERVICE_API_KEY_FILE is set but empty/);
  });

  test("an unreadable key file is refused, naming the variable and the path", () => {
    const missing = join(keyDir, "does-not-exist");
    expect(() => loadConfig({ SERVICE_API_KEY_FILE: missing })).toThrow(ConfigError);
    expect(() => loadConfig({ SERVICE_API_KEY_FILE: missing })).toThrow(`SERVICE_API_KEY_FILE: cannot read "${missing}"`);
    expect(() => loadConfig({ SERVICE_API_KEY_FILE: keyDir })).toThrow(/SERVICE_API_KEY_FILE: cannot read/);
    if (process.getuid?.() !== 0) {
      const locked = keyFile("locked", "secret");
      chmodSync(locked, 0o000);
      expect(() => loadConfig({ SERVICE_API_KEY_FILE: locked })).toThrow(/SERVICE_API_KEY_FILE: cannot read/);
    }
  });

  test("a key that cannot travel in an Authorization header is refused", () => {
    expect(() => loadConfig({ SERVICE_API_KEY: "two words" })).toThrow(/printable ASCII without spaces/);
    expect(() => loadConfig({ SERVICE_API_KEY: "clé" })).toThrow(/printable ASCII without spaces/);
  });

  test("protecting /metrics without a key is refused", () => {
    expect(() => loadConfig({ SERVICE_API_KEY_PROTECT_METRICS: "1" })).toThrow(/needs SERVICE_API_KEY/);
    expect(() => loadConfig({ SERVICE_API_KEY_PROTECT_METRICS: "sometimes", SERVICE_API_KEY: "k" })).toThrow("SERVICE_API_KEY_PROTECT_METRICS");
  });

  test("SERVICE_LOG_FORMAT: text or json", () => {
    expect(loadConfig({ SERVICE_LOG_FORMAT: "json" }).logFormat).toBe("json");
    expect(loadConfig({ SERVICE_LOG_FORMAT: "text" }).logFormat).toBe("text");
    expect(() => loadConfig({ SERVICE_LOG_FORMAT: "logfmt" })).toThrow('SERVICE_LOG_FORMAT must be one of text, json, got "logfmt"');
  });
});
