// The model descriptor (kernels/loopserve.h, ls_model_desc): what the kernel
// library is told about a model file once src/model/format.ts has validated
// it — the dimensions, and for each tensor the model uses its byte range in
// the file and its dtype. The library maps the file itself and checks every
// range against the mapped bytes; it never parses the header.
import { type ValidatedModel, validateModel } from "../model/format.ts";
import { readSafetensors } from "../model/safetensors.ts";

/** The descriptor's tensor slots in LS_TENSOR_* order (kernels/loopserve.h LS_TENSORS). */
const TENSOR_SLOTS = [
  "tok_embeddings.weight",
  "block.attn_norm.weight",
  "block.ffn_norm.weight",
  "norm.weight",
  ...["wq", "wk", "wv", "wo", "w1", "w2", "w3"].flatMap((m) => ["weight", "qweight", "scales", "zeros"].map((k) => `block.${m}.${k}`)),
  "output.weight",
  "output.qweight",
  "output.scales",
];
const DTYPE_CODES: Record<string, number> = { F16: 1, U8: 2, I8: 3 }; // LS_DTYPE_*
const QUANT_CODES = { fp16: 0, int4: 1, int2: 2 } as const; // LS_QUANT_*

const CONFIG_BYTES = 48; // ls_model_config: 12 x 32-bit fields
const SPAN_BYTES = 24; // ls_tensor_span: offset, length (u64), dtype, reserved (i32)

/** Where each field of ls_model_desc lies. */
export const descriptorLayout = {
  bytes: CONFIG_BYTES + TENSOR_SLOTS.length * SPAN_BYTES,
  config: {
    dim: { offset: 0, type: "i32" },
    n_heads: { offset: 4, type: "i32" },
    n_kv_heads: { offset: 8, type: "i32" },
    ffn_dim: { offset: 12, type: "i32" },
    vocab_size: { offset: 16, type: "i32" },
    default_loops: { offset: 20, type: "i32" },
    max_seq_len: { offset: 24, type: "i32" },
    rope_theta: { offset: 28, type: "f32" },
    norm_eps: { offset: 32, type: "f32" },
    quant: { offset: 36, type: "i32" },
    group_size: { offset: 40, type: "i32" },
    reserved: { offset: 44, type: "i32" },
  },
  /** Byte offset of tensor `name`'s ls_tensor_span (offset u64, length u64, dtype i32, reserved i32). */
  spanOffset(name: string): number {
    const slot = TENSOR_SLOTS.indexOf(name);
    if (slot < 0) throw new Error(`no descriptor slot for tensor ${name}`);
    return CONFIG_BYTES + slot * SPAN_BYTES;
  },
} as const;

/** ls_model_desc of a validated model, as the bytes the library reads. */
export function encodeModelDescriptor(model: ValidatedModel): Uint8Array {
  const bytes = new Uint8Array(descriptorLayout.bytes);
  const view = new DataView(bytes.buffer);
  const c = model.config;
  const set = (field: keyof typeof descriptorLayout.config, value: number) => {
    const f = descriptorLayout.config[field];
    if (f.type === "f32") view.setFloat32(f.offset, value, true);
    else view.setInt32(f.offset, value, true);
  };
  set("dim", c.dim);
  set("n_heads", c.nHeads);
  set("n_kv_heads", c.nKvHeads);
  set("ffn_dim", c.ffnDim);
  set("vocab_size", c.vocabSize);
  set("default_loops", c.defaultLoops);
  set("max_seq_len", c.maxSeqLen);
  set("rope_theta", c.ropeTheta);
  set("norm_eps", c.normEps);
  set("quant", QUANT_CODES[c.quant]);
  set("group_size", c.groupSize);
  for (const [name, t] of model.tensors) {
    const code = DTYPE_CODES[t.dtype];
    if (code === undefined) throw new Error(`model tensor ${name} has dtype ${t.dtype}, which no descriptor slot holds`);
    const at = descriptorLayout.spanOffset(name);
    view.setBigUint64(at, BigInt(t.offset), true);
    view.setBigUint64(at + 8, BigInt(t.data.byteLength), true);
    view.setInt32(at + 16, code, true);
  }
  return bytes;
}

/** Reads and validates the model file at path (ModelFormatError when it is not one) and describes it. */
export function describeModelFile(path: string): { model: ValidatedModel; descriptor: Uint8Array } {
  const model = validateModel(readSafetensors(path));
  return { model, descriptor: encodeModelDescriptor(model) };
}
