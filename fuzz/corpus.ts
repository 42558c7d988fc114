// Model-file images for the fuzzers: tiny valid models of every weight
// format (the seed corpus of the libFuzzer target, and the starting points
// of the validator's property fuzzer) and hand-corrupted variants of them.
//
// A header is handled as JSON text fragments rather than as a JS object, so
// that an edit can produce anything a hostile file could hold: duplicate
// keys, "__proto__" as a tensor name, numbers JSON.stringify never writes
// ("1e999", "-0"), nesting far deeper than JSON.stringify can serialise.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { quantizeModelFile } from "../src/model/quantize.ts";
import { type SyntheticOptions, writeSyntheticModel } from "../src/model/synthetic.ts";

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

/**
 * A safetensors image: the 8-byte little-endian header length (`len`
 * overrides it), the header text padded with spaces to a multiple of 8 (as
 * the writer does, so the data stays aligned), the data region.
 */
export function safetensorsImage(header: string, data: Uint8Array, len?: bigint): Uint8Array {
  const raw = new TextEncoder().encode(header);
  const text = new Uint8Array(Math.ceil(raw.length / 8) * 8).fill(0x20);
  text.set(raw);
  const out = new Uint8Array(8 + text.length + data.length);
  new DataView(out.buffer).setBigUint64(0, len ?? BigInt(text.length), true);
  out.set(text, 8);
  out.set(data, 8 + text.length);
  return out;
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
 * int4 with the int8 head, int2 with the fp16 head. The quantized ones need
 * dim and ffn_dim multiples of the smallest group (32).
 */
const FP16_SHAPE: SyntheticOptions = { dim: 8, nHeads: 2, nKvHeads: 1, ffnDim: 16, vocabSize: 32, loops: 2, seed: 3, maxSeqLen: 16 };
const QUANT_SHAPE: SyntheticOptions = { dim: 32, nHeads: 2, nKvHeads: 1, ffnDim: 32, vocabSize: 16, loops: 2, seed: 4, maxSeqLen: 16 };

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
    validCache = ["fp16", "fp16-tied", "int4-head-int8", "int2-head-fp16"].map((name) => ({
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
  return safetensorsImage(objectText(entries), image.data);
}

function withTensor(image: SplitImage, name: string, edit: (t: Entries) => Entries): Uint8Array {
  const entries = entriesOf(image.header).map(([k, v]): [string, string] => (k === name ? [k, objectText(edit(entriesOf(v)))] : [k, v]));
  return safetensorsImage(objectText(entries), image.data);
}

const setKey = (key: string, value: string) => (e: Entries) => e.map(([k, v]): [string, string] => [k, k === key ? value : v]);

/**
 * One corrupted variant per kind of damage the loaders check for, from the
 * fp16 seed: each is refused, and each starts the fuzzer next to a check.
 */
export function corruptedSeeds(): ModelImage[] {
  const fp16 = validSeeds()[0];
  const img = splitImage(fp16.bytes);
  const deep = (n: number) => `${"[".repeat(n)}${"]".repeat(n)}`;
  const variants: [string, Uint8Array][] = [
    ["truncated-data", fp16.bytes.subarray(0, fp16.bytes.length - 5)],
    ["truncated-header", fp16.bytes.subarray(0, 8 + Math.floor(img.header.length / 2))],
    ["length-past-end", safetensorsImage(img.header, img.data, BigInt(fp16.bytes.length))],
    ["length-huge", safetensorsImage(img.header, img.data, (1n << 64n) - 1n)],
    ["header-array", safetensorsImage("[1, 2]", img.data)],
    ["header-deep", safetensorsImage(`{"__metadata__":${deep(80)}}`, img.data)],
    ["duplicate-key", safetensorsImage(img.header.replace("{", '{"norm.weight":1,'), img.data)],
    ["bad-utf8-escape", safetensorsImage(img.header.replace('"F16"', '"\\ud800"'), img.data)],
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

/** Writes every seed, valid and corrupted, into dir (one file each). */
export function writeSeedCorpus(dir: string): string[] {
  mkdirSync(dir, { recursive: true });
  return [...validSeeds(), ...corruptedSeeds()].map(({ name, bytes }) => {
    const path = join(dir, `${name}.safetensors`);
    writeFileSync(path, bytes);
    return path;
  });
}
