// The one place that touches libloopserve.so through bun:ffi. Everything
// above works with NativeModel / NativeSession and never sees a pointer.
// One FFI call per engine step: forward/step take whole token batches.
import { dlopen, FFIType, type Pointer } from "bun:ffi";

const { i32, u64, f32, ptr, void: none, cstring } = FFIType;

const symbols = {
  ls_abi_version: { args: [], returns: i32 },
  ls_simd_name: { args: [i32], returns: cstring },
  ls_model_load: { args: [ptr, i32, i32, ptr, i32], returns: ptr },
  ls_model_free: { args: [ptr], returns: none },
  ls_model_info_get: { args: [ptr, ptr], returns: none },
  ls_session_new: { args: [ptr, i32, i32, i32, ptr, i32], returns: ptr },
  ls_session_free: { args: [ptr], returns: none },
  ls_session_pos: { args: [ptr], returns: i32 },
  ls_session_rollback: { args: [ptr, i32], returns: i32 },
  ls_session_copy_prefix: { args: [ptr, ptr, i32], returns: i32 },
  ls_session_forward: { args: [ptr, ptr, i32, i32, ptr, i32], returns: i32 },
  ls_session_step: { args: [ptr, ptr, i32, i32, f32, i32, f32, f32, u64, ptr], returns: i32 },
  ls_sample: { args: [ptr, i32, ptr, i32, f32, i32, f32, f32, u64, u64], returns: i32 },
} as const;

export const ABI_VERSION = 1;

export const SIMD_CODES = { auto: 0, portable: 1, avx2: 2, avx512: 3 } as const;
export type SimdChoice = keyof typeof SIMD_CODES;

const QUANT_NAMES = ["fp16", "int4", "int2"] as const;

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

export interface NativeModelInfo {
  dim: number;
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  ffnDim: number;
  vocabSize: number;
  defaultLoops: number;
  maxSeqLen: number;
  ropeTheta: number;
  normEps: number;
  quant: (typeof QUANT_NAMES)[number];
  groupSize: number;
  tiedOutput: boolean;
  simd: string;
  threads: number;
}

export class NativeModel {
  readonly info: NativeModelInfo;
  private handle: Pointer | null;

  private constructor(
    readonly lib: Lib,
    handle: Pointer,
  ) {
    this.handle = handle;
    const raw = new Int32Array(16); // ls_model_info: 16 x 32-bit fields
    lib.ls_model_info_get(handle, raw);
    const f = new Float32Array(raw.buffer);
    this.info = {
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
      simd: String(lib.ls_simd_name(raw[13])),
      threads: raw[14],
    };
  }

  /** Loads a model file; throws NativeError with the loader's message. */
  static load(libraryPath: string, modelPath: string, threads: number, simd: SimdChoice): NativeModel {
    const lib = openKernelLibrary(libraryPath);
    const err = new Uint8Array(ERR_LEN);
    const handle = lib.ls_model_load(cString(modelPath), threads, SIMD_CODES[simd], err, ERR_LEN);
    if (!handle) throw new NativeError(readError(err) || `cannot load ${modelPath}`, -1);
    return new NativeModel(lib, handle as Pointer);
  }

  get pointer(): Pointer {
    if (!this.handle) throw new NativeError("model is closed", -4);
    return this.handle;
  }

  newSession(maxSeq: number, loops: number, cacheWindow: number): NativeSession {
    const err = new Uint8Array(ERR_LEN);
    const s = this.lib.ls_session_new(this.pointer, maxSeq, loops, cacheWindow, err, ERR_LEN);
    if (!s) throw new NativeError(readError(err) || "cannot create session", -3);
    return new NativeSession(this, s as Pointer);
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

  close(): void {
    if (this.handle) this.model.lib.ls_session_free(this.handle);
    this.handle = null;
  }
}
