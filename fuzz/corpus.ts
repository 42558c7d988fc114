// Model images for the fuzzers: tiny valid models of every weight format
// and hand-corrupted variants of them. The validator's property fuzzer
// starts from the files (safetensors images); the libFuzzer target of the
// library's loader from each file behind its model descriptor (descriptor
// bytes, then the file), and from descriptors that no longer fit the file.
//
// A header is handled as JSON text fragments rather than as a JS object, so
// that an edit can produce anything a hostile file could hold: duplicate
// keys, "__proto__" as a tensor name, numbers JSON.stringify never writes
// ("1e999", "-0"), nesting far deeper than JSON.stringify can serialise.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LS_DTYPE_F16, LS_DTYPE_NONE, LS_DTYPE_U8, LS_MAX_LAYERS, LS_STRUCTS } from "../src/abi/abi.generated.ts";
import { describeModelFile } from "../src/engine/model_descriptor.ts";
import { quantizeModelFile } from "../src/model/quantize.ts";
import { type SyntheticOptions, writeSyntheticModel } from "../src/model/synthetic.ts";
import { type ConfigField, editDescriptor, type SpanEdit, spanOf } from "../test/helpers/model_descriptor.ts";
import { rawSafetensorsImage } from "../test/helpers/safetensors.ts";

export interface ModelImage {
  name: string;
  bytes: Uint8Array;
}

// ---- images ----

/** [key, value as JSON text] in file order: a JSON object as its fragments. */
export type Entries = [string, string][];

export function objectText(entries: Entries): string {
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(",")}}`;
}

/** The fragments of a JSON object's text (JSON.parse keeps the last of duplicate keys; that is fine for seeds). */
export function entriesOf(objectJson: string): Entries {
  return Object.entries(JSON.parse(objectJson) as Record<string, unknown>).map(([k, v]) => [k, JSON.stringify(v)]);
}

export interface SplitImage {
  header: string;
  data: Uint8Array;
}

/** Header text and data region of a well-formed image. */
export function splitImage(bytes: Uint8Array): SplitImage {
  const len = Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true));
  return { header: new TextDecoder().decode(bytes.subarray(8, 8 + len)), data: bytes.subarray(8 + len) };
}

// ---- valid seeds ----

/**
 * Tiny shapes so that every seed is a few kilobytes: fp16 (untied and tied),
 * int4 with the int8 head, int2 with the fp16 head, int4 with the int6 head,
 * fp16 with the int4 head. The quantized ones need dim and ffn_dim multiples
 * of the smallest group (32); the int6 head, dim a multiple of 64.
 */
const FP16_SHAPE: SyntheticOptions = { dim: 8, nHeads: 2, nKvHeads: 1, ffnDim: 16, vocabSize: 32, loops: 2, seed: 3, maxSeqLen: 16 };
const QUANT_SHAPE: SyntheticOptions = { dim: 32, nHeads: 2, nKvHeads: 1, ffnDim: 32, vocabSize: 16, loops: 2, seed: 4, maxSeqLen: 16 };
const INT6_SHAPE: SyntheticOptions = { ...QUANT_SHAPE, dim: 64, seed: 5 };

let validCache: ModelImage[] | null = null;

/** The valid seed models (written once per process through the real writers). */
export function validSeeds(): ModelImage[] {
  if (validCache !== null) return validCache;
  const dir = mkdtempSync(join(tmpdir(), "loopserve-fuzz-seeds-"));
  try {
    const path = (name: string) => join(dir, `${name}.safetensors`);
    writeSyntheticModel(path("fp16"), FP16_SHAPE);
    writeSyntheticModel(path("fp16-tied"), { ...FP16_SHAPE, tiedOutput: true });
    writeSyntheticModel(path("quant-base"), QUANT_SHAPE);
    quantizeModelFile(path("quant-base"), path("int4-head-int8"), { quant: "int4", groupSize: 32, head: "int8" });
    quantizeModelFile(path("quant-base"), path("int2-head-fp16"), { quant: "int2", groupSize: 32, head: "fp16" });
    quantizeModelFile(path("quant-base"), path("fp16-head-int4"), { quant: "fp16", groupSize: 32, head: "int4" });
    writeSyntheticModel(path("int6-base"), INT6_SHAPE);
    quantizeModelFile(path("int6-base"), path("int4-head-int6"), { quant: "int4", groupSize: 32, head: "int6" });
    // a stack as Ouro lays it out (format version 2), fp16 and int4
    writeSyntheticModel(path("stack-gated"), { ...QUANT_SHAPE, seed: 6, nLayers: 2, sandwichNorm: true, stepNorm: true, exitGate: true });
    quantizeModelFile(path("stack-gated"), path("stack-int4"), { quant: "int4", groupSize: 32, head: "int8" });
    validCache = ["fp16", "fp16-tied", "int4-head-int8", "int2-head-fp16", "fp16-head-int4", "int4-head-int6", "stack-gated", "stack-int4"].map((name) => ({
      name,
      bytes: new Uint8Array(readFileSync(path(name))),
    }));
    return validCache;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// ---- corrupted seeds ----

function withMetadata(image: SplitImage, edit: (meta: Entries) => Entries): Uint8Array {
  const entries = entriesOf(image.header).map(([k, v]): [string, string] =>
    k === "__metadata__" ? [k, objectText(edit(entriesOf(v)))] : [k, v],
  );
  return rawSafetensorsImage(objectText(entries), image.data);
}

function withTensor(image: SplitImage, name: string, edit: (t: Entries) => Entries): Uint8Array {
  const entries = entriesOf(image.header).map(([k, v]): [string, string] => (k === name ? [k, objectText(edit(entriesOf(v)))] : [k, v]));
  return rawSafetensorsImage(objectText(entries), image.data);
}

const setKey = (key: string, value: string) => (e: Entries) => e.map(([k, v]): [string, string] => [k, k === key ? value : v]);

/**
 * One corrupted variant per kind of damage the validator checks for, from
 * the fp16 seed: each is refused, and each starts the fuzzer next to a check.
 */
export function corruptedSeeds(): ModelImage[] {
  const fp16 = validSeeds()[0];
  const img = splitImage(fp16.bytes);
  const deep = (n: number) => `${"[".repeat(n)}${"]".repeat(n)}`;
  const variants: [string, Uint8Array][] = [
    ["truncated-data", fp16.bytes.subarray(0, fp16.bytes.length - 5)],
    ["truncated-header", fp16.bytes.subarray(0, 8 + Math.floor(img.header.length / 2))],
    ["length-past-end", rawSafetensorsImage(img.header, img.data, { len: BigInt(fp16.bytes.length) })],
    ["length-huge", rawSafetensorsImage(img.header, img.data, { len: (1n << 64n) - 1n })],
    ["header-array", rawSafetensorsImage("[1, 2]", img.data)],
    ["header-deep", rawSafetensorsImage(`{"__metadata__":${deep(80)}}`, img.data)],
    ["duplicate-key", rawSafetensorsImage(img.header.replace("{", '{"norm.weight":1,'), img.data)],
    ["bad-utf8-escape", rawSafetensorsImage(img.header.replace('"F16"', '"\\ud800"'), img.data)],
    ["metadata-dim-number", withMetadata(img, setKey("dim", "8"))],
    ["metadata-dim-huge", withMetadata(img, setKey("dim", '"99999999999999999999"'))],
    ["metadata-theta-inf", withMetadata(img, setKey("rope_theta", '"1e999"'))],
    ["metadata-quant-int4", withMetadata(img, setKey("quant", '"int4"'))],
    ["shape-negative", withTensor(img, "norm.weight", setKey("shape", "[-8]"))],
    ["shape-float", withTensor(img, "norm.weight", setKey("shape", "[8.5]"))],
    ["offsets-reversed", withTensor(img, "norm.weight", setKey("data_offsets", "[16, 0]"))],
    ["offsets-huge", withTensor(img, "norm.weight", setKey("data_offsets", "[0, 18446744073709551616]"))],
    ["offsets-overlap", withTensor(img, "norm.weight", setKey("data_offsets", "[0, 16]"))],
    ["offsets-misaligned", withTensor(img, "norm.weight", setKey("data_offsets", "[1, 17]"))],
    ["dtype-unknown", withTensor(img, "block.wq.weight", setKey("dtype", '"Q4_K"'))],
  ];
  return variants.map(([name, bytes]) => ({ name: `corrupt-${name}`, bytes }));
}

/** Every model file seed, valid and corrupted (the validator's starting points). */
export function modelSeeds(): ModelImage[] {
  return [...validSeeds(), ...corruptedSeeds()];
}

// ---- descriptor images (the libFuzzer target's input) ----

/**
 * A libFuzzer input (fuzz/model_load.c): the descriptor up to its layers,
 * one byte counting the layer slots that follow, those slots (through the
 * last one that holds a span), then the file's bytes. The full descriptor
 * is mostly empty layer slots, larger than the fuzzer's inputs.
 */
function descriptorImage(descriptor: Uint8Array, file: Uint8Array): Uint8Array {
  const head = LS_STRUCTS.ls_model_desc.fields.layers.offset;
  const slot = LS_STRUCTS.ls_layer_spans.size;
  let layers = 0;
  for (let i = 0; i < LS_MAX_LAYERS; i++) if (descriptor.subarray(head + i * slot, head + (i + 1) * slot).some((b) => b !== 0)) layers = i + 1;
  const kept = head + layers * slot;
  const out = new Uint8Array(kept + 1 + file.length);
  out.set(descriptor.subarray(0, head));
  out[head] = layers;
  out.set(descriptor.subarray(head, kept), head + 1);
  out.set(file, kept + 1);
  return out;
}

/** The descriptor the binding would pass for a valid seed. */
function descriptorOfImage(image: ModelImage): Uint8Array {
  const dir = mkdtempSync(join(tmpdir(), "loopserve-fuzz-desc-"));
  try {
    const path = join(dir, `${image.name}.safetensors`);
    writeFileSync(path, image.bytes);
    return describeModelFile(path).descriptor;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Every valid seed behind its descriptor, and, from the fp16 seed, one
 * variant per kind of mismatch the loader checks for: each is refused, and
 * each starts the fuzzer next to a check.
 */
export function descriptorSeeds(): ModelImage[] {
  const valid = validSeeds().map((image) => ({ name: image.name, bytes: descriptorImage(descriptorOfImage(image), image.bytes) }));
  const fp16 = validSeeds()[0];
  const desc = descriptorOfImage(fp16);
  const edit = (config: Partial<Record<ConfigField, number>>, tensors: Record<string, SpanEdit> = {}, file = fp16.bytes) =>
    descriptorImage(editDescriptor(desc, { config, tensors }), file);
  const offsetOf = (name: string) => spanOf(desc, name).offset;
  const nan = fp16.bytes.slice();
  new DataView(nan.buffer).setUint16(Number(offsetOf("norm.weight")), 0x7e00, true);
  const variants: [string, Uint8Array][] = [
    ["truncated-file", edit({}, {}, fp16.bytes.subarray(0, fp16.bytes.length - 5))],
    ["empty-file", edit({}, {}, new Uint8Array(0))],
    ["dim-zero", edit({ dim: 0 })],
    ["heads-inconsistent", edit({ n_heads: 3 })],
    ["quant-unknown", edit({ quant: 7 })],
    ["group-fp16", edit({ group_size: 32 })],
    ["span-past-end", edit({}, { "norm.weight": { offset: fp16.bytes.length } })],
    ["span-misaligned", edit({}, { "norm.weight": { offset: offsetOf("norm.weight") + 1n } })],
    ["span-overlap", edit({}, { "norm.weight": { offset: offsetOf("block.ffn_norm.weight") } })],
    ["span-short", edit({}, { "norm.weight": { length: 2 } })],
    ["span-dtype", edit({}, { "norm.weight": { dtype: LS_DTYPE_U8 } })],
    ["span-missing", edit({}, { "block.wk.weight": { offset: 0, length: 0, dtype: LS_DTYPE_NONE } })],
    ["span-foreign", edit({}, { "block.wq.zeros": { dtype: LS_DTYPE_F16 } })],
    ["layers-beyond-limit", edit({ n_layers: 129 })],
    ["layers-more-than-given", edit({ n_layers: 2 })],
    ["layer-not-counted", edit({}, { "layers.1.attn_norm.weight": { ...spanOf(desc, "block.attn_norm.weight"), dtype: LS_DTYPE_F16 } })],
    ["sandwich-norms-missing", edit({ sandwich_norm: 1 })],
    ["nan-weight", edit({}, {}, nan)],
  ];
  return [...valid, ...variants.map(([name, bytes]) => ({ name: `corrupt-${name}`, bytes }))];
}

/** Writes images into dir (one file each, NAME.safetensors); returns the paths. */
function writeImages(dir: string, images: ModelImage[], extension: string): string[] {
  mkdirSync(dir, { recursive: true });
  return images.map(({ name, bytes }) => {
    const path = join(dir, `${name}${extension}`);
    writeFileSync(path, bytes);
    return path;
  });
}

/** Writes the libFuzzer target's seed corpus (descriptorSeeds) into dir. */
export function writeSeedCorpus(dir: string): string[] {
  return writeImages(dir, descriptorSeeds(), ".desc+safetensors");
}

/** Writes the validator's seeds (modelSeeds) into dir. */
export function writeModelSeeds(dir: string): string[] {
  return writeImages(dir, modelSeeds(), ".safetensors");
}
