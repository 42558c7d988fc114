// The one place that touches libloopserve.so through bun:ffi. Everything
// above works with NativeModel / NativeSession and never sees a pointer.
// One FFI call per engine step: forward/step take whole token batches.
import { dlopen, FFIType, type Pointer } from "bun:ffi";
import { type KvCacheMode, kvModeCode, kvModeSpec } from "../model/kvcache.ts";
import type { ModelFileInfo, ModelInfo, SimdChoice } from "./types.ts";

const { i32, u64, f32, ptr, void: none, cstring } = FFIType;

const symbols = {
  ls_abi_version: { args: [], returns: i32 },
  ls_simd_name: { args: [i32], returns: cstring },
  ls_model_load: { args: [ptr, i32, i32, ptr, i32], returns: ptr },
  ls_model_free: { args: [ptr], returns: none },
  ls_model_info_get: { args: [ptr, ptr], returns: none },
  ls_model_check: { args: [ptr, ptr, ptr, i32], returns: i32 },
  ls_session_new: { args: [ptr, i32, i32, i32, ptr, i32], returns: ptr },
  ls_session_new_kv: { args: [ptr, i32, i32, i32, i32, ptr, i32], returns: ptr },
  ls_session_free: { args: [ptr], returns: none },
  ls_session_pos: { args: [ptr], returns: i32 },
  ls_session_rollback: { args: [ptr, i32], returns: i32 },
  ls_session_copy_prefix: { args: [ptr, ptr, i32], returns: i32 },
  ls_session_forward: { args: [ptr, ptr, i32, i32, ptr, i32], returns: i32 },
  ls_session_step: { args: [ptr, ptr, i32, i32, f32, i32, f32, f32, u64, ptr], returns: i32 },
  ls_sample: { args: [ptr, i32, ptr, i32, f32, i32, f32, f32, u64, u64], returns: i32 },
} as const;

// Speculative decoding (kernels/spec.c) is opened separately: a kernel
// library without it (the CUDA library has no speculative kernels) still
// loads and serves plain generation.
const specSymbols = {
  ls_spec_cycle_logits: { args: [ptr, i32, ptr, ptr, ptr, ptr], returns: i32 },
} as const;

export const ABI_VERSION = 1;

export const SIMD_CODES: Record<SimdChoice, number> = { auto: 0, portable: 1, avx2: 2, avx512: 3 };

const QUANT_NAMES: readonly ModelFileInfo["quant"][] = ["fp16", "int4", "int2"];

const ERROR_NAMES: Record<number, string> = {
  [-1]: "invalid argument",
  [-2]: "session is full",
  [-3]: "out of memory",
  [-4]: "invalid session state",
};

export class NativeError extends Error {
  constructor(
    message: string,
    readonly code: number,
  ) {
    super(message);
  }
}

type Lib = ReturnType<typeof dlopen<typeof symbols>>["symbols"];
type SpecLib = ReturnType<typeof dlopen<typeof specSymbols>>["symbols"];

const ERR_LEN = 1024;
const cString = (s: string) => Buffer.from(`${s}\0`, "utf8");
function readError(buf: Uint8Array): string {
  const end = buf.indexOf(0);
  return new TextDecoder().decode(buf.subarray(0, end < 0 ? buf.length : end));
}
function check(rc: number, what: string): number {
  if (rc < 0) throw new NativeError(`${what}: ${ERROR_NAMES[rc] ?? `error ${rc}`}`, rc);
  return rc;
}

const opened = new Map<string, Lib>();
const openedSpec = new Map<string, SpecLib | null>();

/** The speculative entry points of the library at `path`, or null when it has none. */
// Per-op time breakdown (loopserve.h LS_PROF_*), optional like spec.
const profileSymbols = {
  ls_model_set_profile: { args: [ptr, i32], returns: none },
  ls_model_profile_read: { args: [ptr, ptr, i32, i32], returns: i32 },
} as const;
type ProfileLib = ReturnType<typeof dlopen<typeof profileSymbols>>["symbols"];
const openedProfile = new Map<string, ProfileLib | null>();

function openProfileSymbols(path: string): ProfileLib | null {
  if (!openedProfile.has(path)) {
    let lib: ProfileLib | null = null;
    try {
      lib = dlopen(path, profileSymbols).symbols;
    } catch {
      lib = null;
    }
    openedProfile.set(path, lib);
  }
  return openedProfile.get(path) ?? null;
}

/** LS_PROF_* order (kernels/loopserve.h). */
export const PROFILE_OPS = [
  "embed",
  "rmsnorm",
  "qkv",
  "rope+attention",
  "wo",
  "ffn gate/up",
  "ffn down",
  "head",
  "sampling",
  "draft head",
] as const;
export type OpProfile = Record<(typeof PROFILE_OPS)[number], number>; // seconds

/** The profile as a table: op, ms, share of the total. */
export function formatProfile(p: OpProfile, title = "profile"): string {
  const total = PROFILE_OPS.reduce((a, k) => a + p[k], 0);
  const lines = [`${title}: total ${(total * 1000).toFixed(2)} ms`];
  for (const k of PROFILE_OPS)
    lines.push(`  ${k.padEnd(15)} ${(p[k] * 1000).toFixed(2).padStart(10)} ms ${total > 0 ? ((100 * p[k]) / total).toFixed(1).padStart(5) : "  0.0"}%`);
  return lines.join("\n");
}

function openSpecSymbols(path: string): SpecLib | null {
  if (!openedSpec.has(path)) {
    let lib: SpecLib | null = null;
    try {
      lib = dlopen(path, specSymbols).symbols;
    } catch {
      lib = null;
    }
    openedSpec.set(path, lib);
  }
  return openedSpec.get(path) ?? null;
}

/** Opens (once per path) the kernel library and checks its ABI version. */
export function openKernelLibrary(path: string): Lib {
  let lib = opened.get(path);
  if (!lib) {
    lib = dlopen(path, symbols).symbols;
    const abi = lib.ls_abi_version();
    if (abi !== ABI_VERSION) throw new NativeError(`${path}: ABI version ${abi}, expected ${ABI_VERSION}`, -4);
    opened.set(path, lib);
  }
  return lib;
}

/** Devices the CUDA library can use (0 without a driver or GPU). */
export function cudaDeviceCount(path: string): number {
  return dlopen(path, { ls_cuda_device_count: { args: [], returns: i32 } }).symbols.ls_cuda_device_count();
}

/** A session's key/value cache mode (ls_session_new_kv's kv_mode). */
export interface KvCacheSettings {
  mode: KvCacheMode;
  /** With an H mode: q, k, v rounded to fp16 before the rotation (SERVICE_H_MODE_FP16_ATTN_QKV). */
  fp16AttnQkv?: boolean;
}

export const FP16_CACHE: KvCacheSettings = { mode: "fp16" };

const MODEL_INFO_FIELDS = 16; // ls_model_info: 16 x 32-bit fields

/** ls_model_info without the runtime's simd and threads. */
function fileInfo(raw: Int32Array): ModelFileInfo {
  const f = new Float32Array(raw.buffer);
  return {
    arch: "looped-llama",
    dim: raw[0],
    nHeads: raw[1],
    nKvHeads: raw[2],
    headDim: raw[3],
    ffnDim: raw[4],
    vocabSize: raw[5],
    defaultLoops: raw[6],
    maxSeqLen: raw[7],
    ropeTheta: f[8],
    normEps: f[9],
    quant: QUANT_NAMES[raw[10]] ?? "fp16",
    groupSize: raw[11],
    tiedOutput: raw[12] === 1,
  };
}

/**
 * Validates a model file exactly as NativeModel.load does, without starting
 * a runtime (ls_model_check); throws NativeError with the loader's message.
 */
export function checkModelFile(libraryPath: string, modelPath: string): ModelFileInfo {
  const lib = openKernelLibrary(libraryPath);
  const raw = new Int32Array(MODEL_INFO_FIELDS);
  const err = new Uint8Array(ERR_LEN);
  if (lib.ls_model_check(cString(modelPath), raw, err, ERR_LEN) < 0) throw new NativeError(readError(err) || `cannot load ${modelPath}`, -1);
  return fileInfo(raw);
}

export class NativeModel {
  readonly info: ModelInfo;
  private handle: Pointer | null;

  private constructor(
    readonly lib: Lib,
    handle: Pointer,
    /** ls_spec_cycle, when the library has it. */
    readonly specLib: SpecLib | null,
  ) {
    this.handle = handle;
    const raw = new Int32Array(MODEL_INFO_FIELDS);
    lib.ls_model_info_get(handle, raw);
    this.info = { ...fileInfo(raw), simd: String(lib.ls_simd_name(raw[13])), threads: raw[14] };
  }

  /** Loads a model file; throws NativeError with the loader's message. */
  static load(libraryPath: string, modelPath: string, threads: number, simd: SimdChoice): NativeModel {
    const lib = openKernelLibrary(libraryPath);
    const err = new Uint8Array(ERR_LEN);
    const handle = lib.ls_model_load(cString(modelPath), threads, SIMD_CODES[simd], err, ERR_LEN);
    if (!handle) throw new NativeError(readError(err) || `cannot load ${modelPath}`, -1);
    const model = new NativeModel(lib, handle as Pointer, openSpecSymbols(libraryPath));
    model.profileLib = openProfileSymbols(libraryPath);
    return model;
  }

  get pointer(): Pointer {
    if (!this.handle) throw new NativeError("model is closed", -4);
    return this.handle;
  }

  /** A session with its own key/value cache in the given mode (default fp16; DESIGN.md §3). */
  newSession(maxSeq: number, loops: number, cacheWindow: number, kv: KvCacheSettings = FP16_CACHE): NativeSession {
    const err = new Uint8Array(ERR_LEN);
    const code = kvModeCode(kvModeSpec(kv.mode, kv.fp16AttnQkv ?? false));
    const s = this.lib.ls_session_new_kv(this.pointer, maxSeq, loops, cacheWindow, code, err, ERR_LEN);
    if (!s) throw new NativeError(readError(err) || "cannot create session", -3);
    return new NativeSession(this, s as Pointer);
  }

  /** True when the kernel library implements speculative decoding (ls_spec_cycle). */
  get hasSpeculative(): boolean {
    return this.specLib !== null;
  }

  /** Samples from logits with the C sampler (used by tests and host-side modes). */
  sample(
    logits: Float32Array,
    history: Int32Array,
    temperature: number,
    topK: number,
    topP: number,
    repetitionPenalty: number,
    seed: number | bigint,
    counter: number | bigint,
  ): number {
    return check(
      this.lib.ls_sample(logits, logits.length, history, history.length, temperature, topK, topP, repetitionPenalty, seed, counter),
      "ls_sample",
    );
  }

  /** ls_model_set_profile / ls_model_profile_read, when the library has them. */
  profileLib: ProfileLib | null = null;

  /** Turns the per-op time breakdown on or off (false when the library lacks it). */
  setProfile(on: boolean): boolean {
    if (!this.profileLib) return false;
    this.profileLib.ls_model_set_profile(this.pointer, on ? 1 : 0);
    return true;
  }

  /** Seconds per op since the last reset (null when the library lacks it). */
  readProfile(reset = true): OpProfile | null {
    if (!this.profileLib) return null;
    const out = new Float64Array(PROFILE_OPS.length);
    this.profileLib.ls_model_profile_read(this.pointer, out, out.length, reset ? 1 : 0);
    return Object.fromEntries(PROFILE_OPS.map((k, i) => [k, out[i]])) as OpProfile;
  }

  close(): void {
    if (this.handle) this.lib.ls_model_free(this.handle);
    this.handle = null;
  }
}

export class NativeSession {
  private handle: Pointer | null;

  constructor(
    readonly model: NativeModel,
    handle: Pointer,
  ) {
    this.handle = handle;
  }

  /** @internal the raw handle, for calls that take two sessions */
  get pointer(): Pointer {
    if (!this.handle) throw new NativeError("session is closed", -4);
    return this.handle;
  }

  /** Takes positions [0, n) from src (this session must be empty). */
  copyPrefixFrom(src: NativeSession, n: number): void {
    check(this.model.lib.ls_session_copy_prefix(this.pointer, src.pointer, n), "ls_session_copy_prefix");
  }

  get pos(): number {
    return this.model.lib.ls_session_pos(this.pointer);
  }

  rollback(pos: number): void {
    check(this.model.lib.ls_session_rollback(this.pointer, pos), "ls_session_rollback");
  }

  /** Runs tokens through `loops` loops; fills logitsOut (nLogits rows) when given. */
  forward(tokens: Int32Array, loops: number, logitsOut: Float32Array | null = null, nLogits = 0): void {
    if (logitsOut && logitsOut.length < nLogits * this.model.info.vocabSize)
      throw new NativeError("logits buffer too small", -1);
    check(
      this.model.lib.ls_session_forward(this.pointer, tokens, tokens.length, loops, logitsOut, logitsOut ? nLogits : 0),
      "ls_session_forward",
    );
  }

  /** Forward of `tokens` then sampling of the next token, in one FFI call. */
  step(
    tokens: Int32Array,
    loops: number,
    temperature: number,
    topK: number,
    topP: number,
    repetitionPenalty: number,
    seed: number | bigint,
    logitsOut: Float32Array | null = null,
  ): number {
    return check(
      this.model.lib.ls_session_step(this.pointer, tokens, tokens.length, loops, temperature, topK, topP, repetitionPenalty, seed, logitsOut),
      "ls_session_step",
    );
  }

  /**
   * One self-speculative cycle (ls_spec_cycle_logits in kernels/loopserve.h),
   * in one FFI call: `pending` is the last sampled, not yet fed token; writes
   * the new tokens to out (room for draftAhead + 1) and returns how many. The
   * last of them is the next cycle's pending token. logitsOut, when given
   * (draftAhead + 1 rows), receives the verifier's logits of each new token.
   */
  specCycle(pending: number, p: SpecCycleParams, out: Int32Array, stats: SpecCycleStats, logitsOut: Float32Array | null = null): number {
    const spec = this.model.specLib;
    if (!spec) throw new NativeError("this kernel library has no speculative decoding (ls_spec_cycle)", -1);
    if (out.length < p.draftAhead + 1) throw new NativeError("spec output buffer too small", -1);
    if (logitsOut && logitsOut.length < (p.draftAhead + 1) * this.model.info.vocabSize)
      throw new NativeError("spec logits buffer too small", -1);
    const raw = specParamsBuffer(p);
    const st = new Int32Array(2);
    const n = check(spec.ls_spec_cycle_logits(this.pointer, pending, raw, out, st, logitsOut), "ls_spec_cycle");
    stats.drafted = st[0];
    stats.accepted = st[1];
    return n;
  }

  close(): void {
    if (this.handle) this.model.lib.ls_session_free(this.handle);
    this.handle = null;
  }
}

/** ls_spec_params (kernels/loopserve.h) as the binding fills it. */
export interface SpecCycleParams {
  draftLoops: number;
  verifyLoops: number;
  draftAhead: number;
  kBranches: number;
  maxNew: number;
  temperature: number;
  topK: number;
  topP: number;
  repetitionPenalty: number;
  seed: number; // non-negative integer <= 2^53
  flags?: number; // SPEC_FLAGS
  /** Tree: a candidate becomes a leaf only with at least this draft probability (default 0: all top-K). */
  leafMinProb?: number;
}

/** ls_spec_params.flags */
export const SPEC_FLAGS = {
  /** Draft with the model's own output head instead of the shortlist head (kernels/draft_head.c). */
  exactDraftHead: 1,
  /** Tests only: accept every draft token (a broken sampler, to prove a distribution test has power). */
  testAcceptAll: 2,
} as const;

/** What one cycle did: tokens proposed and draft tokens accepted. */
export interface SpecCycleStats {
  drafted: number;
  accepted: number;
}

function specParamsBuffer(p: SpecCycleParams): Int32Array {
  const raw = new Int32Array(13); // ls_spec_params: 13 x 32-bit fields
  const f = new Float32Array(raw.buffer);
  raw[0] = p.draftLoops;
  raw[1] = p.verifyLoops;
  raw[2] = p.draftAhead;
  raw[3] = p.kBranches;
  raw[4] = p.maxNew;
  raw[5] = p.topK;
  f[6] = p.temperature;
  f[7] = p.topP;
  f[8] = p.repetitionPenalty;
  raw[9] = p.flags ?? 0;
  const seed = BigInt(p.seed);
  new Uint32Array(raw.buffer)[10] = Number(seed & 0xffffffffn);
  new Uint32Array(raw.buffer)[11] = Number((seed >> 32n) & 0xffffffffn);
  f[12] = p.leafMinProb ?? 0;
  return raw;
}
