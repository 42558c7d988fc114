// The model descriptor (kernels/loopserve.h, ls_model_desc): what the kernel
// library is told about a model file once src/model/format.ts has validated
// it — the dimensions, and for each tensor the model uses its byte range in
// the file and its dtype. The library maps the file itself and checks every
// range against the mapped bytes; it never parses the header.
import { HEAD_BITS, matrixBits, type ModelConfig, NORM_LAYOUTS, QUANT_MATRICES, type ValidatedModel, validateModel } from "../model/format.ts";
import { readSafetensors } from "../model/safetensors.ts";
import { type ModelFamily, modelFamily } from "../model/family.ts";
import {
  LS_DTYPE_F16,
  LS_DTYPE_I8,
  LS_DTYPE_U8,
  LS_INJECT_ADAPTER,
  LS_INJECT_NONE,
  LS_LAYER_TENSORS,
  LS_QUANT_FP16,
  LS_QUANT_INT2,
  LS_QUANT_INT4,
  LS_TENSORS,
} from "../abi/abi.generated.ts";
import { StructView } from "../abi/abi_struct.ts";

const DTYPE_CODES: Record<string, number> = { F16: LS_DTYPE_F16, U8: LS_DTYPE_U8, I8: LS_DTYPE_I8 };
const QUANT_CODES = { fp16: LS_QUANT_FP16, int4: LS_QUANT_INT4, int2: LS_QUANT_INT2 } as const;

/**
 * The ls_tensor_span of tensor `name` in a descriptor of a model of `config`'s
 * layers: a model-wide tensor (LS_TENSORS), or a layer's ("block." + a name
 * of LS_LAYER_TENSORS in a one-layer core, "layers.<i>." + it in a stack;
 * "prelude.<i>." and "coda.<i>." the layers after the core's).
 */
export function tensorSpan(desc: StructView<"ls_model_desc">, name: string, config: Pick<ModelConfig, "nLayers" | "nPrelude">): StructView<"ls_tensor_span"> {
  const slot = (LS_TENSORS as readonly string[]).indexOf(name);
  if (slot >= 0) return desc.member("tensors", "ls_tensor_span", slot);
  const m = /^(block|layers|prelude|coda)\.(?:(\d+)\.)?(.+)$/.exec(name);
  const layerSlot = m ? (LS_LAYER_TENSORS as readonly string[]).indexOf(m[3]) : -1;
  if (!m || layerSlot < 0 || (m[1] === "block") !== (m[2] === undefined)) throw new Error(`no descriptor slot for tensor ${name}`);
  const first = { block: 0, layers: 0, prelude: config.nLayers, coda: config.nLayers + config.nPrelude }[m[1] as "block"];
  return desc.member("layers", "ls_layer_spans", first + Number(m[2] ?? 0)).member("t", "ls_tensor_span", layerSlot);
}

/** ls_model_desc of a validated model, as the bytes the library reads. */
export function encodeModelDescriptor(model: ValidatedModel): Uint8Array {
  const desc = new StructView("ls_model_desc");
  const c = model.config;
  const config = desc.member("config", "ls_model_config");
  config.fill({
    dim: c.dim,
    n_heads: c.nHeads,
    n_kv_heads: c.nKvHeads,
    ffn_dim: c.ffnDim,
    vocab_size: c.vocabSize,
    default_loops: c.defaultLoops,
    max_seq_len: c.maxSeqLen,
    rope_theta: c.ropeTheta,
    norm_eps: c.normEps,
    quant: QUANT_CODES[c.quant],
    group_size: c.groupSize,
    head_bits: c.headQuant === "fp16" ? 0 : HEAD_BITS[c.headQuant],
    head_group: c.headGroupSize,
    n_layers: c.nLayers,
    sandwich_norm: NORM_LAYOUTS.indexOf(c.normLayout),
    step_norm: c.stepNorm ? 1 : 0,
    head_dim: c.headDim,
    n_prelude: c.nPrelude,
    n_coda: c.nCoda,
    injection: c.injection === "adapter" ? LS_INJECT_ADAPTER : LS_INJECT_NONE,
    embed_scale: c.embedScale,
    state_std: c.stateStd,
    mid_norm: c.midNorm ? 1 : 0,
    rope_interleaved: c.ropeLayout === "interleaved" ? 1 : 0,
    qk_bias: c.qkBias ? 1 : 0,
  });
  QUANT_MATRICES.forEach((m, k) => config.set("block_bits", matrixBits(c, m), k));
  for (const [name, t] of model.tensors) {
    const code = DTYPE_CODES[t.dtype];
    if (code === undefined) throw new Error(`model tensor ${name} has dtype ${t.dtype}, which no descriptor slot holds`);
    tensorSpan(desc, name, c).fill({ offset: t.offset, length: t.data.byteLength, dtype: code });
  }
  return desc.bytes;
}

/** Reads and validates the model file at path (ModelFormatError when it is not one) and describes it. */
export function describeModelFile(path: string): { model: ValidatedModel; descriptor: Uint8Array; family: ModelFamily } {
  const file = readSafetensors(path);
  const model = validateModel(file);
  return { model, descriptor: encodeModelDescriptor(model), family: modelFamily(file.metadata.source_arch, model.config) };
}
