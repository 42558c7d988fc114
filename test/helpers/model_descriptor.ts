// Model descriptors for the C drivers (test/c/model_desc.h): a driver loads
// FILE with FILE.desc, the ls_model_desc bytes the binding would pass for it
// (src/engine/model_descriptor.ts, after the TypeScript validator). Tests of
// the library's own checks edit those bytes before writing them.
import { copyFileSync, writeFileSync } from "node:fs";
import { describeModelFile, descriptorLayout } from "../../src/engine/model_descriptor.ts";

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
export type ConfigField = keyof typeof descriptorLayout.config;

/** ls_tensor_span fields by name. */
export interface SpanEdit {
  offset?: bigint;
  length?: bigint;
  dtype?: number;
  reserved?: number;
}

/** A copy of a descriptor with config fields and tensor spans changed. */
export function editDescriptor(
  descriptor: Uint8Array,
  edit: { config?: Partial<Record<ConfigField, number>>; tensors?: Record<string, SpanEdit> },
): Uint8Array {
  const out = descriptor.slice();
  const view = new DataView(out.buffer);
  for (const [field, value] of Object.entries(edit.config ?? {})) {
    const f = descriptorLayout.config[field as ConfigField];
    if (f.type === "f32") view.setFloat32(f.offset, value, true);
    else view.setInt32(f.offset, value, true);
  }
  for (const [name, span] of Object.entries(edit.tensors ?? {})) {
    const at = descriptorLayout.spanOffset(name);
    if (span.offset !== undefined) view.setBigUint64(at, span.offset, true);
    if (span.length !== undefined) view.setBigUint64(at + 8, span.length, true);
    if (span.dtype !== undefined) view.setInt32(at + 16, span.dtype, true);
    if (span.reserved !== undefined) view.setInt32(at + 20, span.reserved, true);
  }
  return out;
}

/** A tensor's span as the descriptor holds it. */
export function spanOf(descriptor: Uint8Array, name: string): { offset: bigint; length: bigint; dtype: number } {
  const view = new DataView(descriptor.buffer, descriptor.byteOffset, descriptor.byteLength);
  const at = descriptorLayout.spanOffset(name);
  return { offset: view.getBigUint64(at, true), length: view.getBigUint64(at + 8, true), dtype: view.getInt32(at + 16, true) };
}
