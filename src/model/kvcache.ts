// Key/value cache modes (docs/kv-cache.md; the formats are written down in
// kernels/loopserve.h next to LS_KV_*): the names the configuration takes
// and the kv_mode bits a session is opened with. The row encodings as the
// kernels compute them are reproduced for the tests (test/reference/kvcache.ts).
import { LS_KV_FP16, LS_KV_FP16_QKV, LS_KV_HADAMARD, LS_KV_INT4, LS_KV_INT8 } from "../abi/abi.generated.ts";

export type KvCacheMode = "fp16" | "int8" | "int4" | "fp16-h" | "int8-h" | "int4-h";
export type KvFormat = "fp16" | "int8" | "int4";

export const KV_CACHE_MODES: readonly KvCacheMode[] = ["fp16", "int8", "int4", "fp16-h", "int8-h", "int4-h"];

/** A cache mode taken apart: storage format, rotation, fp16 q/k/v before the rotation. */
export interface KvModeSpec {
  format: KvFormat;
  hadamard: boolean;
  /** SERVICE_H_MODE_FP16_ATTN_QKV (only with hadamard). */
  fp16Qkv: boolean;
}

export function kvModeSpec(mode: KvCacheMode, fp16Qkv = false): KvModeSpec {
  const hadamard = mode.endsWith("-h");
  if (fp16Qkv && !hadamard) throw new RangeError(`fp16 q/k/v rounding only applies to the H modes, not ${mode}`);
  return { format: (hadamard ? mode.slice(0, -2) : mode) as KvFormat, hadamard, fp16Qkv };
}

/** loopserve.h kv_mode: the format's LS_KV_* ORed with LS_KV_HADAMARD and LS_KV_FP16_QKV. */
export function kvModeCode(spec: KvModeSpec): number {
  const fmt = { fp16: LS_KV_FP16, int8: LS_KV_INT8, int4: LS_KV_INT4 }[spec.format];
  return fmt | (spec.hadamard ? LS_KV_HADAMARD : 0) | (spec.fp16Qkv ? LS_KV_FP16_QKV : 0);
}
