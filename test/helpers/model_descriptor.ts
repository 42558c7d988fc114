// Model descriptors for the C drivers (test/c/model_desc.h): a driver loads
// FILE with FILE.desc, the ls_model_desc bytes the binding would pass for it
// (src/engine/model_descriptor.ts, after the TypeScript validator). Tests of
// the library's own checks edit those bytes before writing them.
import { copyFileSync, writeFileSync } from "node:fs";
import { type FieldName, StructView } from "../../src/abi/abi_struct.ts";
import { describeModelFile, tensorSpan } from "../../src/engine/model_descriptor.ts";

/** The descriptor of the (valid) model file at path. */
export function descriptorOf(path: string): Uint8Array {
  return describeModelFile(path).descriptor;
}

/** Writes path.desc (the given descriptor, default the file's own); returns path. */
export function writeDescriptor(path: string, descriptor: Uint8Array = descriptorOf(path)): string {
  writeFileSync(`${path}.desc`, descriptor);
  return path;
}

/** Gives `to` the descriptor file of `from`. */
export function copyDescriptor(from: string, to: string): string {
  copyFileSync(`${from}.desc`, `${to}.desc`);
  return to;
}

/** ls_model_config fields by name (kernels/loopserve.h). */
export type ConfigField = FieldName<"ls_model_config">;

/** ls_tensor_span fields to change. */
export type SpanEdit = Partial<Record<FieldName<"ls_tensor_span">, number | bigint>>;

/** A copy of a descriptor with config fields and tensor spans changed. */
export function editDescriptor(
  descriptor: Uint8Array,
  edit: { config?: Partial<Record<ConfigField, number | number[]>>; tensors?: Record<string, SpanEdit> },
): Uint8Array {
  const desc = new StructView("ls_model_desc", descriptor.slice());
  const config = desc.member("config", "ls_model_config");
  for (const [field, value] of Object.entries(edit.config ?? {})) {
    // An array field (block_bits) takes its elements in order.
    for (const [i, v] of (Array.isArray(value) ? value : [value]).entries()) config.set(field as ConfigField, v, i);
  }
  for (const [name, span] of Object.entries(edit.tensors ?? {})) {
    const view = tensorSpan(desc, name, layersOf(desc));
    for (const [field, value] of Object.entries(span)) view.set(field as FieldName<"ls_tensor_span">, value);
  }
  return desc.bytes;
}

/** The layer counts a descriptor gives (its core's, its prelude's): where a tensor's slot is. */
function layersOf(desc: StructView<"ls_model_desc">): { nLayers: number; nPrelude: number } {
  const config = desc.member("config", "ls_model_config");
  return { nLayers: Math.max(1, config.get("n_layers") as number), nPrelude: config.get("n_prelude") as number };
}

/** A tensor's span as the descriptor holds it. */
export function spanOf(descriptor: Uint8Array, name: string): { offset: bigint; length: bigint; dtype: number } {
  const desc = new StructView("ls_model_desc", descriptor);
  const span = tensorSpan(desc, name, layersOf(desc));
  return { offset: span.get("offset") as bigint, length: span.get("length") as bigint, dtype: span.get("dtype") as number };
}
