import { describe, expect, test } from "bun:test";
import pkg from "../package.json" with { type: "json" };
import { ConfigError, loadConfig } from "../src/config.ts";

describe("configuration", () => {
  test("defaults match SPEC.md", () => {
    const c = loadConfig({});
    expect(c).toMatchObject({
      modelPath: null,
      maxSeqLen: 2048,
      maxQueueDepth: 128,
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
      SERVICE_MAX_BODY_BYTES: "65536",
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
      maxBodyBytes: 65536,
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
