// The one place that touches libloopserve.so through bun:ffi. Everything
// above works with NativeModel / NativeSession and never sees a pointer.
// One FFI call per engine step: forward/step take whole token batches.
import { dlopen, FFIType, JSCallback, type Pointer, toArrayBuffer } from "bun:ffi";
import { type KvCacheMode, kvModeCode, kvModeSpec } from "../model/kvcache.ts";
import { type BlockQuant, NORM_LAYOUTS, QUANT_MATRICES, type QuantMix } from "../model/format.ts";
import type { ModelFamily } from "../model/family.ts";
import type { MatrixFormat, QuantRows, RowQuantizer, SourceDtype } from "../model/quantize.ts";
import { ModelFormatError } from "../model/safetensors.ts";
import {
  LS_ABI_VERSION,
  LS_BATCH_MAX_ROWS,
  LS_ERR_ARG,
  LS_ERR_NOMEM,
  LS_ERR_STATE,
  LS_ERR_UNSUPPORTED,
  LS_EXIT_COPY,
  LS_EXIT_EXACT,
  LS_EXIT_NONE,
  LS_EXIT_RULE_ENTROPY,
  LS_EXIT_RULE_KL,
  LS_FEATURE_PROFILE,
  LS_FEATURE_RECURRENT,
  LS_INJECT_ADAPTER,
  LS_FEATURE_SPECULATIVE,
  LS_FEATURE_TOKEN_MASK,
  LS_PROFILE_OPS,
  LS_QUANT_FP16,
  LS_QUANT_INT2,
  LS_QUANT_INT4,
  LS_QUANTIZE_BF16,
  LS_QUANTIZE_F16,
  LS_QUANTIZE_F32,
  LS_SIMD_AUTO,
  LS_SIMD_AVX2,
  LS_SIMD_AVX512,
  LS_SIMD_PORTABLE,
  LS_SPEC_EXACT_DRAFT_HEAD,
  LS_STRUCTS,
} from "../abi/abi.generated.ts";
import { type FieldName, StructView } from "../abi/abi_struct.ts";
import { describeModelFile } from "./model_descriptor.ts";
import type { ExitPlan, ExitPolicy, ExitRule, ModelFileInfo, ModelInfo, SamplingParams, SimdChoice } from "./types.ts";

const { i32, i64_fast, u64, ptr, void: none, cstring } = FFIType;

// Every entry point of kernels/loopserve.h: a library defines them all and
// says which optional ones work through ls_features.
const symbols = {
  ls_abi_version: { args: [], returns: i32 },
  ls_status_str: { args: [i32], returns: cstring },
  ls_features: { args: [], returns: i32 },
  ls_simd_name: { args: [i32], returns: cstring },
  ls_model_load: { args: [ptr, ptr, i32, i32, ptr, i32], returns: ptr },
  ls_model_free: { args: [ptr], returns: none },
  ls_model_info_get: { args: [ptr, ptr], returns: none },
  ls_model_device_memory: { args: [ptr, ptr, ptr], returns: i32 },
  ls_model_check: { args: [ptr, ptr, ptr, ptr, i32], returns: i32 },
  ls_model_set_profile: { args: [ptr, i32], returns: none },
  ls_model_profile_read: { args: [ptr, ptr, i32, i32], returns: i32 },
  ls_session_new: { args: [ptr, ptr, ptr, i32], returns: ptr },
  ls_session_free: { args: [ptr], returns: none },
  ls_session_pos: { args: [ptr], returns: i32 },
  ls_session_last_steps: { args: [ptr], returns: i32 },
  ls_session_rollback: { args: [ptr, i32], returns: i32 },
  ls_session_copy_prefix: { args: [ptr, ptr, i32], returns: i32 },
  ls_session_forward: { args: [ptr, ptr, i32, i32, ptr, i32], returns: i32 },
  ls_session_step: { args: [ptr, ptr, i32, ptr, ptr], returns: i32 },
  ls_batch_step: { args: [ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr], returns: i32 },
  ls_pipeline_begin: { args: [ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr], returns: i32 },
  ls_pipeline_masks_ready: { args: [ptr], returns: i32 },
  ls_pipeline_end: { args: [ptr], returns: i32 },
  ls_session_cache_bytes: { args: [ptr, ptr], returns: i64_fast },
  ls_session_cache_bytes_held: { args: [ptr], returns: i64_fast },
  ls_sample: { args: [ptr, i32, ptr, i32, ptr, u64], returns: i32 },
  ls_spec_cycle_masked: { args: [ptr, i32, ptr, ptr, ptr, ptr, ptr, ptr], returns: i32 },
  ls_quantizer_new: { args: [i32, i32, ptr, i32], returns: ptr },
  ls_quantizer_free: { args: [ptr], returns: none },
  ls_quantizer_simd: { args: [ptr], returns: i32 },
  ls_quantize: { args: [ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr, i32], returns: i32 },
} as const;

export const SIMD_CODES: Record<SimdChoice, number> = { auto: LS_SIMD_AUTO, portable: LS_SIMD_PORTABLE, avx2: LS_SIMD_AVX2, avx512: LS_SIMD_AVX512 };

const QUANT_NAMES: Record<number, ModelFileInfo["quant"]> = { [LS_QUANT_FP16]: "fp16", [LS_QUANT_INT4]: "int4", [LS_QUANT_INT2]: "int2" };
const BLOCK_NAMES: Record<number, BlockQuant> = { 4: "int4", 2: "int2" };
const HEAD_NAMES: Record<number, ModelFileInfo["headQuant"]> = { 0: "fp16", 8: "int8", 6: "int6", 4: "int4" };

export class NativeError extends Error {
  constructor(
    message: string,
    /** An ls_status (LS_ERR_*). */
    readonly code: number,
  ) {
    super(message);
  }
}

type Lib = ReturnType<typeof dlopen<typeof symbols>>["symbols"];

const ERR_LEN = 1024;
/** Where a batch row's token count sits in its ls_batch_row. */
const N_TOKENS_OFFSET = LS_STRUCTS.ls_batch_row.fields.n_tokens.offset;
const MASKED_OFFSET = LS_STRUCTS.ls_batch_row.fields.step.offset + LS_STRUCTS.ls_step_params.fields.masked.offset;

/** uint32 words of a token mask over `vocab` ids (loopserve.h, token masks). */
export const maskWords = (vocab: number): number => Math.ceil(vocab / 32);
const cString = (s: string) => Buffer.from(`${s}\0`, "utf8");
function readError(buf: Uint8Array): string {
  const end = buf.indexOf(0);
  return new TextDecoder().decode(buf.subarray(0, end < 0 ? buf.length : end));
}
function check(lib: Lib, rc: number, what: string): number {
  if (rc < 0) throw new NativeError(`${what}: ${lib.ls_status_str(rc)}`, rc);
  return rc;
}

const opened = new Map<string, Lib>();

/** The per-op profile's ops, in LS_PROF_* order (kernels/loopserve.h LS_PROFILE_OPS). */
export const PROFILE_OPS = LS_PROFILE_OPS;
export type OpProfile = Record<(typeof PROFILE_OPS)[number], number>; // seconds

/** The profile as a table: op, ms, share of the total. */
export function formatProfile(p: OpProfile, title = "profile"): string {
  const total = PROFILE_OPS.reduce((a, k) => a + p[k], 0);
  const lines = [`${title}: total ${(total * 1000).toFixed(2)} ms`];
  for (const k of PROFILE_OPS)
    lines.push(`  ${k.padEnd(15)} ${(p[k] * 1000).toFixed(2).padStart(10)} ms ${total > 0 ? ((100 * p[k]) / total).toFixed(1).padStart(5) : "  0.0"}%`);
  return lines.join("\n");
}

/** Opens (once per path) the kernel library and checks its ABI version. */
export function openKernelLibrary(path: string): Lib {
  let lib = opened.get(path);
  if (!lib) {
    // The version first, on its own: a library of another version may lack
    // a symbol, and the version says why better than the missing name.
    const probe = dlopen(path, { ls_abi_version: symbols.ls_abi_version });
    const abi = probe.symbols.ls_abi_version();
    probe.close();
    if (abi !== LS_ABI_VERSION) throw new NativeError(`${path}: ABI version ${abi}, expected ${LS_ABI_VERSION}`, LS_ERR_STATE);
    lib = dlopen(path, symbols).symbols;
    opened.set(path, lib);
  }
  return lib;
}

/** Devices the CUDA library can use (0 without a driver or GPU). */
export function cudaDeviceCount(path: string): number {
  return dlopen(path, { ls_cuda_device_count: { args: [], returns: i32 } }).symbols.ls_cuda_device_count();
}

/** A session's key/value cache mode (ls_session_params.kv_mode). */
export interface KvCacheSettings {
  mode: KvCacheMode;
  /** With an H mode: q, k, v rounded to fp16 before the rotation (SERVICE_H_MODE_FP16_ATTN_QKV). */
  fp16AttnQkv?: boolean;
  /** 0 / absent: every step its own cache; S: the core's units share S steps of caches (ls_session_params.cache_steps). */
  cacheSteps?: number;
}

export const FP16_CACHE: KvCacheSettings = { mode: "fp16" };

/** ls_model_info without the runtime's simd and threads, and the file's default exit threshold. */
/** What the file says beside the library's description of it. */
type FromFile = { exitThreshold: number | null; family: ModelFamily };

function fileInfo(raw: StructView<"ls_model_info">, { exitThreshold, family }: FromFile): ModelFileInfo {
  const field = (f: FieldName<"ls_model_info">) => raw.get(f) as number;
  return {
    arch: "looped-llama",
    family,
    dim: field("dim"),
    nHeads: field("n_heads"),
    nKvHeads: field("n_kv_heads"),
    headDim: field("head_dim"),
    ffnDim: field("ffn_dim"),
    vocabSize: field("vocab_size"),
    defaultLoops: field("default_loops"),
    maxSeqLen: field("max_seq_len"),
    ropeTheta: field("rope_theta"),
    normEps: field("norm_eps"),
    quant: QUANT_NAMES[field("quant")] ?? "fp16",
    groupSize: field("group_size"),
    tiedOutput: field("tied_output") === 1,
    headQuant: HEAD_NAMES[field("head_bits")] ?? "fp16",
    headGroupSize: field("head_group"),
    embeddingFromHead: field("embed_from_head") === 1,
    quantMix: quantMixOf(raw),
    nLayers: field("n_layers"),
    normLayout: NORM_LAYOUTS[field("sandwich_norm")] ?? "pre",
    stepNorm: field("step_norm") === 1,
    exitGate: field("exit_gate") === 1,
    exitThreshold,
    nPrelude: field("n_prelude"),
    nCoda: field("n_coda"),
    injection: field("injection") === LS_INJECT_ADAPTER ? "adapter" : "none",
    embedScale: field("embed_scale"),
    stateStd: field("state_std"),
    midNorm: field("mid_norm") === 1,
    ropeLayout: field("rope_interleaved") === 1 ? "interleaved" : "half",
    qkBias: field("qk_bias") === 1,
  };
}

/** The block matrices ls_model_info.block_bits puts in another format than its quant. */
function quantMixOf(raw: StructView<"ls_model_info">): QuantMix {
  const quant = QUANT_NAMES[raw.get("quant") as number];
  const mix: QuantMix = {};
  QUANT_MATRICES.forEach((m, k) => {
    const format = BLOCK_NAMES[raw.get("block_bits", k) as number];
    if (format !== undefined && format !== quant) mix[m] = format;
  });
  return mix;
}

/**
 * The descriptor the library loads the model file by (src/model/format.ts
 * validates the file); a file that is not a valid model is a NativeError
 * with the validator's reason, like the library's own refusals.
 */
function modelDescriptor(modelPath: string): { descriptor: Uint8Array; fromFile: FromFile } {
  try {
    const { model, descriptor, family } = describeModelFile(modelPath);
    return { descriptor, fromFile: { exitThreshold: model.config.exitThreshold, family } };
  } catch (e) {
    if (e instanceof ModelFormatError) throw new NativeError(e.reason, LS_ERR_ARG);
    throw e;
  }
}

/**
 * Validates a model file exactly as NativeModel.load does, without starting
 * a runtime (the TypeScript validator, then ls_model_check); throws
 * NativeError with the loader's message.
 */
export function checkModelFile(libraryPath: string, modelPath: string): ModelFileInfo {
  const lib = openKernelLibrary(libraryPath);
  const { descriptor, fromFile } = modelDescriptor(modelPath);
  const info = new StructView("ls_model_info");
  const err = new Uint8Array(ERR_LEN);
  if (lib.ls_model_check(cString(modelPath), descriptor, info.bytes, err, ERR_LEN) < 0)
    throw new NativeError(readError(err) || `cannot load ${modelPath}`, LS_ERR_ARG);
  return fileInfo(info, fromFile);
}

export class NativeModel {
  readonly info: ModelInfo;
  /** The library's LS_FEATURE_* bits. */
  readonly features: number;
  private handle: Pointer | null;

  private constructor(
    readonly lib: Lib,
    handle: Pointer,
    fromFile: FromFile,
  ) {
    this.handle = handle;
    const info = new StructView("ls_model_info");
    lib.ls_model_info_get(handle, info.bytes);
    this.info = { ...fileInfo(info, fromFile), simd: String(lib.ls_simd_name(info.get("simd") as number)), threads: info.get("n_threads") as number };
    this.features = lib.ls_features();
  }

  /** Loads a model file; throws NativeError with the loader's message. */
  static load(libraryPath: string, modelPath: string, threads: number, simd: SimdChoice): NativeModel {
    const lib = openKernelLibrary(libraryPath);
    const { descriptor, fromFile } = modelDescriptor(modelPath);
    const err = new Uint8Array(ERR_LEN);
    const handle = lib.ls_model_load(cString(modelPath), descriptor, threads, SIMD_CODES[simd], err, ERR_LEN);
    if (!handle) throw new NativeError(readError(err) || `cannot load ${modelPath}`, LS_ERR_ARG);
    return new NativeModel(lib, handle as Pointer, fromFile);
  }

  get pointer(): Pointer {
    if (!this.handle) throw new NativeError("model is closed", LS_ERR_STATE);
    return this.handle;
  }

  /** A session with its own key/value cache in the given mode (default fp16; docs/kv-cache.md). */
  newSession(maxSeq: number, loops: number, cacheWindow: number, kv: KvCacheSettings = FP16_CACHE): NativeSession {
    const params = sessionParams(maxSeq, loops, cacheWindow, kv);
    const err = new Uint8Array(ERR_LEN);
    const s = this.lib.ls_session_new(this.pointer, params.bytes, err, ERR_LEN);
    if (!s) throw new NativeError(readError(err) || "cannot create session", LS_ERR_NOMEM);
    const session = new NativeSession(this, s as Pointer);
    this.open.add(session);
    return session;
  }

  /** Sessions not yet closed: the library needs them freed before the model. */
  private readonly open = new Set<NativeSession>();

  /** How many sessions are not yet freed (a closed one in a begun step counts until the step ends). */
  get openSessions(): number {
    return this.open.size;
  }

  /** @internal NativeSession.close's notice. */
  forget(session: NativeSession): void {
    this.open.delete(session);
  }

  /** The device's memory, bytes free and in all, with the weights loaded; null for a library whose models live in host memory. */
  deviceMemory(): { free: number; total: number } | null {
    const free = new BigUint64Array(1);
    const total = new BigUint64Array(1);
    const rc = this.lib.ls_model_device_memory(this.pointer, free, total);
    if (rc === LS_ERR_UNSUPPORTED) return null;
    check(this.lib, rc, "ls_model_device_memory");
    return { free: Number(free[0]), total: Number(total[0]) };
  }

  /** Bytes of key/value cache newSession(...) would allocate (ls_session_cache_bytes); throws for parameters it would refuse. */
  sessionCacheBytes(maxSeq: number, loops: number, cacheWindow: number, kv: KvCacheSettings = FP16_CACHE): number {
    const params = sessionParams(maxSeq, loops, cacheWindow, kv);
    return check(this.lib, Number(this.lib.ls_session_cache_bytes(this.pointer, params.bytes)), "ls_session_cache_bytes");
  }

  /** True when the kernel library implements recurrent depth: its layouts, the zero-shot exit rules, cache_steps (LS_FEATURE_RECURRENT). */
  get hasRecurrent(): boolean {
    return (this.features & LS_FEATURE_RECURRENT) !== 0;
  }

  /** True when the kernel library implements speculative decoding (LS_FEATURE_SPECULATIVE). */
  get hasSpeculative(): boolean {
    return (this.features & LS_FEATURE_SPECULATIVE) !== 0;
  }

  /** True when the kernel library draws under token masks (LS_FEATURE_TOKEN_MASK). */
  get hasTokenMasks(): boolean {
    return (this.features & LS_FEATURE_TOKEN_MASK) !== 0;
  }

  private batchLogits = new Float32Array(0);
  private begunLogits = new Float32Array(0);
  /** A sampling row's ls_batch_row bytes (n_tokens aside) by its sampling settings: a request's rows differ only in their tokens from step to step. */
  private readonly sampledRowBytes = new WeakMap<SamplingParams, { loops: number; exit: ExitPlan | undefined; bytes: Uint8Array }>();

  /** ls_batch_row of `r` with n_tokens left 0; SamplingParams are never changed once made, so their bytes are kept. */
  private rowBytes(r: BatchRow): Uint8Array {
    const exit = r.exit;
    const kept = r.sampling ? this.sampledRowBytes.get(r.sampling) : undefined;
    if (kept && kept.loops === r.loops && kept.exit === exit) return kept.bytes;
    const row = new StructView("ls_batch_row").fill({ sample: r.sampling ? 1 : 0 });
    fillStepParams(row.member("step", "ls_step_params"), r.loops, r.sampling, exit);
    if (r.sampling) this.sampledRowBytes.set(r.sampling, { loops: r.loops, exit, bytes: row.bytes });
    return row.bytes;
  }

  /** The call's arrays for `rows`: what ls_batch_step and ls_pipeline_begin take. */
  private batchCall(rows: BatchRow[], begun: boolean): BatchCall {
    const n = rows.length;
    if (n < 1 || n > LS_BATCH_MAX_ROWS) throw new NativeError(`a batch takes 1 to ${LS_BATCH_MAX_ROWS} rows, got ${n}`, LS_ERR_ARG);
    const size = LS_STRUCTS.ls_batch_row.size;
    const params = new Uint8Array(n * size);
    const paramView = new DataView(params.buffer);
    const sessions = new BigUint64Array(n);
    const vocab = this.info.vocabSize;
    let nTokens = 0;
    let wantLogits = false;
    const masked = rows.some((r) => r.sampling !== null && r.mask);
    for (let i = 0; i < n; i++) {
      const r = rows[i];
      if (r.session.model !== this) throw new NativeError(`batch row ${i}: the session belongs to another model`, LS_ERR_ARG);
      if (r.logitsOut && r.logitsOut.length < vocab) throw new NativeError(`batch row ${i}: logits buffer too small`, LS_ERR_ARG);
      params.set(this.rowBytes(r), i * size);
      paramView.setInt32(i * size + N_TOKENS_OFFSET, r.tokens.length, true);
      if (r.sampling && r.mask) paramView.setInt32(i * size + MASKED_OFFSET, 1, true);
      sessions[i] = BigInt(r.session.pointer);
      nTokens += r.tokens.length;
      wantLogits ||= r.sampling !== null && !!r.logitsOut;
    }
    // A begun step's logits wait for pipelineEnd in their own buffer, whatever batchStep does meanwhile.
    const buffer = begun ? "begunLogits" : "batchLogits";
    if (wantLogits && this[buffer].length < n * vocab) this[buffer] = new Float32Array(n * vocab);
    const tokens = new Int32Array(nTokens);
    for (let i = 0, at = 0; i < n; at += rows[i].tokens.length, i++) tokens.set(rows[i].tokens, at);
    // On an ArrayBuffer of its own: the storage of a small typed array made
    // directly may move when a view of it is first taken (fillMasks does,
    // after a pipelined step has its pointer).
    const masks = masked ? new Uint32Array(new ArrayBuffer(n * maskWords(vocab) * 4)) : null;
    return { rows, sessions, params, tokens, masks, logits: wantLogits ? this[buffer] : null, out: new Int32Array(n), rc: null };
  }

  /** Each masked row's mask, written into the call's masks. */
  private fillMasks(c: BatchCall): void {
    if (!c.masks) return;
    const words = maskWords(this.info.vocabSize);
    c.rows.forEach((r, i) => {
      if (r.sampling && r.mask) r.mask.fill(c.masks!.subarray(i * words, (i + 1) * words));
    });
  }

  /** After the library wrote a call's outputs: its status (a bad row named), each sampling row's logits, the tokens. */
  private batchResult(call: BatchCall): Int32Array {
    const { rows, out, logits } = call;
    const rc = call.rc ?? LS_ERR_STATE;
    if (rc < 0) {
      const bad = [...out.keys()].filter((i) => out[i] < 0);
      const rowsSaid = bad.map((i) => `row ${i}: ${this.lib.ls_status_str(out[i])}`).join(", ");
      throw new NativeError(`ls_batch_step: ${this.lib.ls_status_str(rc)}${rowsSaid ? ` (${rowsSaid})` : ""}`, rc);
    }
    const vocab = this.info.vocabSize;
    rows.forEach((r, i) => {
      if (r.sampling && logits && r.logitsOut) r.logitsOut.set(logits.subarray(i * vocab, (i + 1) * vocab));
    });
    return out;
  }

  /** Each sampling row's steps, read while its session is as the call left it. */
  private recordSteps(call: BatchCall): void {
    for (const r of call.rows) if (r.sampling) r.steps = r.exit ? r.session.lastStepsNow() : r.loops;
  }

  /**
   * Advances every row's session by one call (ls_batch_step): each row's
   * logits and token are bit-identical to running it alone. Returns each
   * row's sampled token (0 for a forward-only row). A bad row throws
   * NativeError naming it, and no session changes.
   */
  batchStep(rows: BatchRow[]): Int32Array {
    this.settle();
    const c = this.batchCall(rows, false);
    this.fillMasks(c);
    c.rc = this.lib.ls_batch_step(this.pointer, c.sessions, c.params, rows.length, c.tokens, c.masks, c.logits, c.out);
    if (c.rc >= 0) this.recordSteps(c);
    return this.batchResult(c);
  }

  /** The step pipelineBegin handed to the library's thread, until pipelineEnd takes its results. */
  private begun: BatchCall | null = null;

  /**
   * batchStep in two halves, pipelined (ls_pipeline_begin, ls_pipeline_end):
   * the step runs on the library's own thread and this one is free until
   * pipelineEnd. Meanwhile any other call on this model or its sessions
   * first waits for the step (settle), and a session closed meanwhile is
   * freed once the step is done. Masked rows' masks are filled after the
   * step has begun, while its forward pass runs, and then made ready for
   * its draws.
   */
  pipelineBegin(rows: BatchRow[]): void {
    if (this.begun) throw new NativeError("a begun batch step has not been ended", LS_ERR_STATE);
    const c = this.batchCall(rows, true);
    check(this.lib, this.lib.ls_pipeline_begin(this.pointer, c.sessions, c.params, rows.length, c.tokens, c.masks, c.logits, c.out), "ls_pipeline_begin");
    for (const r of rows) r.session.inStep = true;
    this.begun = c;
    if (!c.masks) return;
    try {
      this.fillMasks(c);
    } finally {
      this.lib.ls_pipeline_masks_ready(this.pointer);
    }
  }

  /** The begun step's tokens (waiting for it when it still runs); throws as batchStep does. */
  pipelineEnd(): Int32Array {
    const c = this.begun;
    if (!c) throw new NativeError("no batch step was begun", LS_ERR_STATE);
    this.settle();
    this.begun = null;
    return this.batchResult(c);
  }

  /** Waits for a begun step that still runs: what every other call does first. */
  settle(): void {
    const c = this.begun;
    if (!c || c.rc !== null) return;
    c.rc = this.lib.ls_pipeline_end(this.pointer);
    if (c.rc >= 0) this.recordSteps(c);
    for (const r of c.rows) r.session.stepEnded();
  }

  /** Draws a token from logits with the C sampler, `counter` the RNG position (ls_sample). */
  sample(logits: Float32Array, history: Int32Array, sampling: SamplingParams, counter: number): number {
    const params = fillSampling(new StructView("ls_sampling"), sampling).bytes;
    return check(this.lib, this.lib.ls_sample(logits, logits.length, history, history.length, params, counter), "ls_sample");
  }

  /** Turns the per-op time breakdown on or off (false when the library lacks LS_FEATURE_PROFILE). */
  setProfile(on: boolean): boolean {
    if ((this.features & LS_FEATURE_PROFILE) === 0) return false;
    this.settle();
    this.lib.ls_model_set_profile(this.pointer, on ? 1 : 0);
    return true;
  }

  /** Seconds per op since the last reset (null when the library lacks LS_FEATURE_PROFILE). */
  readProfile(reset = true): OpProfile | null {
    if ((this.features & LS_FEATURE_PROFILE) === 0) return null;
    this.settle();
    const out = new Float64Array(PROFILE_OPS.length);
    check(this.lib, this.lib.ls_model_profile_read(this.pointer, out, out.length, reset ? 1 : 0), "ls_model_profile_read");
    return Object.fromEntries(PROFILE_OPS.map((k, i) => [k, out[i]])) as OpProfile;
  }

  /** The handler of the cycle running now (specCycle), which the one callback the library is given calls. */
  private pathMask: PathMask | null = null;
  private pathMaskError: unknown = null;
  private maskCallback: JSCallback | null = null;

  /** @internal ls_mask_fn for specCycle: made once, calling the running cycle's handler. */
  maskFunction(handler: PathMask): { fn: Pointer; done(): void } {
    this.maskCallback ??= new JSCallback(
      (_ctx: Pointer, pathPtr: Pointer, n: number, maskPtr: Pointer): number => {
        try {
          const path = n > 0 ? new Int32Array(toArrayBuffer(pathPtr, 0, n * 4)) : new Int32Array(0);
          const mask = new Uint32Array(toArrayBuffer(maskPtr, 0, maskWords(this.info.vocabSize) * 4));
          return (this.pathMask as PathMask)(path, mask) ? 1 : 0;
        } catch (e) {
          this.pathMaskError = e;
          return LS_ERR_ARG;
        }
      },
      { args: [ptr, ptr, i32, ptr], returns: i32 },
    );
    this.pathMask = handler;
    this.pathMaskError = null;
    return {
      fn: this.maskCallback.ptr as Pointer,
      done: () => {
        this.pathMask = null;
        const e = this.pathMaskError;
        this.pathMaskError = null;
        if (e) throw e;
      },
    };
  }

  close(): void {
    this.settle();
    for (const s of [...this.open]) s.close();
    if (this.handle) this.lib.ls_model_free(this.handle);
    this.handle = null;
    this.maskCallback?.close();
    this.maskCallback = null;
  }
}

export class NativeSession {
  private handle: Pointer | null;
  /** @internal in a step begun by NativeModel.pipelineBegin that has not ended */
  inStep = false;
  private closeAfterStep = false;

  constructor(
    readonly model: NativeModel,
    handle: Pointer,
  ) {
    this.handle = handle;
  }

  /** @internal the raw handle, for calls that take two sessions */
  get pointer(): Pointer {
    if (!this.handle) throw new NativeError("session is closed", LS_ERR_STATE);
    return this.handle;
  }

  /** @internal NativeModel.settle's notice that the library is done with this session's step. */
  stepEnded(): void {
    this.inStep = false;
    if (this.closeAfterStep) this.close();
  }

  /** Takes positions [0, n) from src (this session must be empty). */
  copyPrefixFrom(src: NativeSession, n: number): void {
    this.model.settle();
    const { lib } = this.model;
    check(lib, lib.ls_session_copy_prefix(this.pointer, src.pointer, n), "ls_session_copy_prefix");
  }

  get pos(): number {
    this.model.settle();
    return this.model.lib.ls_session_pos(this.pointer);
  }

  /** Bytes of key/value cache the session holds now (ls_session_cache_bytes_held): it grows as positions arrive. */
  get cacheBytesHeld(): number {
    this.model.settle();
    const { lib } = this.model;
    return check(lib, Number(lib.ls_session_cache_bytes_held(this.pointer)), "ls_session_cache_bytes_held");
  }

  /** Steps the last sampled token ran (ls_session_last_steps): its exit step + 1, or its loops. */
  get lastSteps(): number {
    this.model.settle();
    return this.lastStepsNow();
  }

  /** @internal lastSteps without waiting for a begun step: NativeModel reads it as a step ends. */
  lastStepsNow(): number {
    const { lib } = this.model;
    return check(lib, lib.ls_session_last_steps(this.pointer), "ls_session_last_steps");
  }

  rollback(pos: number): void {
    this.model.settle();
    const { lib } = this.model;
    check(lib, lib.ls_session_rollback(this.pointer, pos), "ls_session_rollback");
  }

  /** Runs tokens through `loops` loops; fills logitsOut (nLogits rows) when given. */
  forward(tokens: Int32Array, loops: number, logitsOut: Float32Array | null = null, nLogits = 0): void {
    if (logitsOut && logitsOut.length < nLogits * this.model.info.vocabSize)
      throw new NativeError("logits buffer too small", LS_ERR_ARG);
    this.model.settle();
    const { lib } = this.model;
    check(lib, lib.ls_session_forward(this.pointer, tokens, tokens.length, loops, logitsOut, logitsOut ? nLogits : 0), "ls_session_forward");
  }

  /**
   * Forward of `tokens` then sampling of the next token, in one FFI call; logitsOut receives the last row's logits.
   * With an exit rule (a model with an exit gate), the sampled token may stop before `loops` steps (lastSteps says
   * where).
   */
  step(tokens: Int32Array, loops: number, sampling: SamplingParams, logitsOut: Float32Array | null = null, exit?: ExitPlan): number {
    const params = new StructView("ls_step_params");
    fillStepParams(params, loops, sampling, exit);
    this.model.settle();
    const { lib } = this.model;
    return check(lib, lib.ls_session_step(this.pointer, tokens, tokens.length, params.bytes, logitsOut), "ls_session_step");
  }

  /**
   * One self-speculative cycle (ls_spec_cycle_logits in kernels/loopserve.h),
   * in one FFI call: `pending` is the last sampled, not yet fed token; writes
   * the new tokens to out (room for draftAhead + 1) and returns how many. The
   * last of them is the next cycle's pending token. logitsOut, when given
   * (draftAhead + 1 rows), receives the verifier's logits of each new token.
   * mask, when given, masks every draft and verification by the mask after
   * its path (ls_spec_cycle_masked); the cycle may then end at a path no
   * token may follow, without a token of the verifier's own.
   */
  specCycle(
    pending: number,
    p: SpecCycleParams,
    out: Int32Array,
    stats: SpecCycleStats,
    logitsOut: Float32Array | null = null,
    mask: PathMask | null = null,
  ): number {
    if (!this.model.hasSpeculative) throw new NativeError("this kernel library has no speculative decoding (ls_spec_cycle)", LS_ERR_ARG);
    if (out.length < p.draftAhead + 1) throw new NativeError("spec output buffer too small", LS_ERR_ARG);
    if (logitsOut && logitsOut.length < (p.draftAhead + 1) * this.model.info.vocabSize)
      throw new NativeError("spec logits buffer too small", LS_ERR_ARG);
    const st = new Int32Array(2);
    this.model.settle();
    const { lib } = this.model;
    const masking = mask ? this.model.maskFunction(mask) : null;
    let rc: number;
    try {
      rc = lib.ls_spec_cycle_masked(this.pointer, pending, specParams(p), masking?.fn ?? null, null, out, st, logitsOut);
    } finally {
      masking?.done();
    }
    const n = check(lib, rc, "ls_spec_cycle");
    stats.drafted = st[0];
    stats.accepted = st[1];
    return n;
  }

  /** Frees the session; one in a begun step is freed as that step ends. */
  close(): void {
    if (this.inStep) {
      this.closeAfterStep = true;
      return;
    }
    if (this.handle) this.model.lib.ls_session_free(this.handle);
    this.handle = null;
    this.model.forget(this);
  }
}

function sessionParams(maxSeq: number, loops: number, cacheWindow: number, kv: KvCacheSettings): StructView<"ls_session_params"> {
  const kvMode = kvModeCode(kvModeSpec(kv.mode, kv.fp16AttnQkv ?? false));
  return new StructView("ls_session_params").fill({ max_seq: maxSeq, loops, cache_window: cacheWindow, kv_mode: kvMode, cache_steps: kv.cacheSteps ?? 0 });
}

/** ls_exit_policy of each policy, and the bits of each rule ORed to it. */
const EXIT_POLICY_CODE: Record<ExitPolicy, number> = { exact: LS_EXIT_EXACT, copy: LS_EXIT_COPY };
const EXIT_RULE_CODE: Record<ExitRule, number> = { gate: 0, kl: LS_EXIT_RULE_KL, entropy: LS_EXIT_RULE_ENTROPY };

/** ls_step_params: the depth, the exit rule (none: fixed depth) and, for a sampling step, how to draw. */
function fillStepParams(p: StructView<"ls_step_params">, loops: number, sampling: SamplingParams | null, exit: ExitPlan | undefined): void {
  const policy = exit ? EXIT_POLICY_CODE[exit.policy] | EXIT_RULE_CODE[exit.rule ?? "gate"] : LS_EXIT_NONE;
  p.set("loops", loops).set("exit_policy", policy).set("exit_threshold", exit?.threshold ?? 0);
  if (sampling) fillSampling(p.member("sampling", "ls_sampling"), sampling);
}

/** ls_sampling from its TypeScript shape. */
function fillSampling(s: StructView<"ls_sampling">, { temperature, topK, topP, repetitionPenalty, seed }: SamplingParams): StructView<"ls_sampling"> {
  return s.fill({ temperature, top_k: topK, top_p: topP, repetition_penalty: repetitionPenalty, seed: BigInt(seed) });
}

/** One batched call's arrays, kept alive while the library may read or write them; rc once it returned. */
interface BatchCall {
  rows: BatchRow[];
  sessions: BigUint64Array;
  params: Uint8Array;
  tokens: Int32Array;
  /** Every row's token mask (only masked rows' are read), or null when no row is masked. */
  masks: Uint32Array | null;
  logits: Float32Array | null;
  out: Int32Array;
  rc: number | null;
}

/**
 * A masked row's token mask (structured output): fill writes it (one bit
 * per vocabulary id, maskWords(vocab) words, bit t % 32 of word t / 32 for
 * id t) just before the row's draw needs it; pipelined, while the step's
 * forward pass runs.
 */
export interface RowMask {
  fill(out: Uint32Array): void;
  /** The mask of the row that follows this one in its session, fed the token this one draws (a pipelined step's predicted row). */
  successor(token: number): RowMask;
}

/** The token mask after a path of tokens (a speculative cycle's drafts): writes it and returns true, or false when no token may follow the path. */
export type PathMask = (path: Int32Array, mask: Uint32Array) => boolean;

/** One row of NativeModel.batchStep. */
export interface BatchRow {
  session: NativeSession;
  /** Fed at the session's position, through `loops` loops. */
  tokens: Int32Array;
  loops: number;
  /** Draws the next token as NativeSession.step does; null: forward only (a prompt chunk before its last). */
  sampling: SamplingParams | null;
  /** A sampling row's exit rule (NativeSession.step); absent: fixed depth. */
  exit?: ExitPlan;
  /** A sampling row's last logits, before any sampling transform but its mask. */
  logitsOut?: Float32Array | null;
  /** A sampling row's token mask: its draw returns only a token the mask allows. */
  mask?: RowMask;
  /** Written by the step for a sampling row: the steps its token ran (under an exit rule its exit step + 1, else loops). */
  steps?: number;
}

/** ls_spec_params (kernels/loopserve.h) as the binding fills it. */
export interface SpecCycleParams {
  draftLoops: number;
  verifyLoops: number;
  draftAhead: number;
  kBranches: number;
  maxNew: number;
  sampling: SamplingParams;
  flags?: number; // SPEC_FLAGS
  /** Tree: a candidate becomes a leaf only with at least this draft probability (default 0: all top-K). */
  leafMinProb?: number;
}

/** ls_spec_params.flags */
export const SPEC_FLAGS = {
  /** Draft with the model's own output head instead of the shortlist head (kernels/cpu/draft_head.c). */
  exactDraftHead: LS_SPEC_EXACT_DRAFT_HEAD,
} as const;

/** What one cycle did: tokens proposed and draft tokens accepted. */
export interface SpecCycleStats {
  drafted: number;
  accepted: number;
}

function specParams(p: SpecCycleParams): Uint8Array {
  const shape = { draft_loops: p.draftLoops, verify_loops: p.verifyLoops, draft_ahead: p.draftAhead, k_branches: p.kBranches, max_new: p.maxNew };
  const params = new StructView("ls_spec_params").fill({ ...shape, flags: p.flags ?? 0, leaf_min_prob: p.leafMinProb ?? 0 });
  fillSampling(params.member("sampling", "ls_sampling"), p.sampling);
  return params.bytes;
}

const QUANTIZE_INPUT: Record<SourceDtype, number> = { F32: LS_QUANTIZE_F32, F16: LS_QUANTIZE_F16, BF16: LS_QUANTIZE_BF16 };
const SIMD_NAMES = Object.fromEntries(Object.entries(SIMD_CODES).map(([name, code]) => [code, name])) as Record<number, SimdChoice>;

/** The library's weight quantizer (ls_quantize) on a pool of its own: the reference quantizer's bytes (src/model/quantize.ts). */
export class NativeQuantizer implements RowQuantizer {
  private handle: Pointer | null;
  private readonly params = new StructView("ls_quantize_params");
  private readonly err = new Uint8Array(ERR_LEN);
  /** The SIMD path it runs. */
  readonly simd: SimdChoice;

  /** threads <= 0: every core. Throws NativeError when the library has no quantizer or the CPU lacks `simd`. */
  constructor(
    private readonly lib: Lib,
    threads: number,
    simd: SimdChoice = "auto",
  ) {
    const handle = lib.ls_quantizer_new(threads, SIMD_CODES[simd], this.err, ERR_LEN);
    if (!handle) throw new NativeError(readError(this.err) || "cannot start the quantizer", LS_ERR_UNSUPPORTED);
    this.handle = handle as Pointer;
    this.simd = SIMD_NAMES[lib.ls_quantizer_simd(this.handle)];
  }

  static open(libraryPath: string, threads: number, simd: SimdChoice = "auto"): NativeQuantizer {
    return new NativeQuantizer(openKernelLibrary(libraryPath), threads, simd);
  }

  quantizeRows(f: MatrixFormat, dtype: SourceDtype, src: Uint8Array, rows: number, out: QuantRows, what: string): void {
    if (!this.handle) throw new NativeError("quantizer closed", LS_ERR_STATE);
    if (rows === 0) return;
    this.params.fill({ bits: f.bits, group: f.groupSize, cols: f.cols, input: QUANTIZE_INPUT[dtype] });
    const rc = this.lib.ls_quantize(this.handle, this.params.bytes, src, rows, out.qweight, out.scales, out.zeros ?? null, this.err, ERR_LEN);
    if (rc === LS_ERR_ARG) throw new ModelFormatError(`${what}: ${readError(this.err)}`);
    check(this.lib, rc, `ls_quantize: ${readError(this.err)}`);
  }

  close(): void {
    if (this.handle) this.lib.ls_quantizer_free(this.handle);
    this.handle = null;
  }
}
