// Property fuzzing of the TypeScript model validator (src/model/safetensors.ts
// and format.ts) with fast-check. Model images come from three sources:
//   - valid models of random small shapes and every weight format: must load;
//   - the seed models with byte-level damage (bit flips, JSON tokens pasted
//     in, cuts, insertions, a rewritten length field);
//   - the seed models with structural header edits (metadata and tensor
//     fields replaced by hostile JSON: wrong types, huge or non-finite
//     numbers, numeric-looking strings, unicode, up to 200,000 levels
//     of nesting, duplicate keys, "__proto__" as a name).
// Each image is written to a file, validated and described as the server
// does before the kernel library sees it (describeModelFile), then loaded
// the way the TypeScript side loads a single-block model's weights
// (loadModelFile or loadQuantModelFile). It must load or be refused with a
// ModelFormatError that has a message; any other exception (TypeError,
// RangeError, ...) or a load that takes seconds is a finding.
import fc from "fast-check";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describeModelFile } from "../src/engine/model_descriptor.ts";
import {
  type BlockQuant,
  configToMetadata,
  expectedTensorShapes,
  formatVersionOf,
  GROUP_SIZES,
  layerPrefix,
  loadModelFile,
  loadQuantModelFile,
  matrixBits,
  matrixShapes,
  HEAD_BITS,
  type ModelConfig,
  type ModelShape,
  type QuantizedHead,
  QUANT_MATRICES,
  type QuantMatrix,
  type QuantMatrixName,
  type QuantMix,
  quantTensorShapes,
  NO_RECURRENCE,
  SINGLE_BLOCK,
} from "../src/model/format.ts";
import { DTYPE_SIZES, type Dtype, ModelFormatError } from "../src/model/safetensors.ts";
import { rawSafetensorsImage } from "../test/helpers/safetensors.ts";
import { corruptedSeeds, type Entries, entriesOf, objectText, splitImage, validSeeds } from "./corpus.ts";

/** A load slower than this on a file of a few kilobytes is a hang, not a slow machine. */
const HANG_MS = 10_000;

// ---- loading ----

export type Verdict = { loaded: true } | { loaded: false; message: string };

/**
 * Loads a model file through the TypeScript loader. Returns whether it
 * loaded or why it was refused (a ModelFormatError); anything else thrown is
 * rethrown: that is a validator bug.
 */
export function loadWithTypeScript(path: string): Verdict {
  try {
    const { quant, headQuant, nLayers, normLayout, stepNorm, exitGate } = describeModelFile(path).model.config;
    // A stack, or an fp16 block with a quantized head, has no TypeScript weight loader: validation is the check.
    if (nLayers > 1 || normLayout !== "pre" || stepNorm || exitGate) return { loaded: true };
    if (quant === "int4" || quant === "int2") loadQuantModelFile(path);
    else if (headQuant === "fp16") loadModelFile(path);
    return { loaded: true };
  } catch (e) {
    if (e instanceof ModelFormatError) return { loaded: false, message: e.message };
    throw e;
  }
}

let serial = 0;

/** Writes an image to a fresh file in dir, loads it, removes it; throws on any finding. */
export function checkImage(bytes: Uint8Array, dir: string): Verdict {
  const path = join(dir, `validator-${process.pid}-${serial++}.safetensors`);
  writeFileSync(path, bytes);
  try {
    const t0 = performance.now();
    const verdict = loadWithTypeScript(path);
    const ms = performance.now() - t0;
    if (ms > HANG_MS) throw new Error(`the validator took ${Math.round(ms)} ms on a ${bytes.length}-byte file`);
    if (!verdict.loaded && verdict.message.trim() === "") throw new Error("refused with an empty message");
    return verdict;
  } finally {
    rmSync(path, { force: true });
  }
}

// ---- valid models of random shapes ----

/**
 * A number in any decimal form the format accepts, from `forms` or up to
 * `max` (below kernels/loopserve.h's LS_MAX_ROPE_THETA / LS_MAX_NORM_EPS,
 * also once rounded to fp32).
 */
const numberText = (forms: string[], max: number) => fc.oneof(fc.constantFrom(...forms), fc.double({ min: 1e-30, max, noNaN: true }).map(String));
const ropeThetaText = numberText(["10000", "1e-05", "1e-6", "500000.0", "0.5", "1E4", "+3", "7.", ".25"], 1e11);
const normEpsText = numberText(["1e-05", "1e-6", "0.5", "5E-1", "+.5", ".25"], 0.99);

type Output = "tied" | "fp16" | QuantizedHead;
type ValidConfig = ModelShape & {
  output: Output;
  exitGate: boolean;
  /** rope_theta and norm_eps as written: any decimal form the format accepts. */
  ropeThetaText: string;
  normEpsText: string;
};

/** The block matrices whose bit in `bits` is set, in the other block format than `quant`. */
function mixOf(quant: BlockQuant, bits: number): QuantMix {
  const other: BlockQuant = quant === "int4" ? "int2" : "int4";
  const bit: Record<QuantMatrixName, number> = { wq: 0, wk: 1, wv: 2, wo: 3, w1: 4, w2: 5, w3: 4 };
  return Object.fromEntries(QUANT_MATRICES.filter((m) => bits & (1 << bit[m])).map((m) => [m, other]));
}

/** A consistent config of a small model in any weight format. */
const validConfig: fc.Arbitrary<ValidConfig> = fc
  .record({
    quant: fc.constantFrom("fp16", "int4", "int2"),
    kvHeads: fc.integer({ min: 1, max: 3 }),
    group: fc.integer({ min: 1, max: 3 }),
    headDimHalf: fc.integer({ min: 1, max: 4 }),
    ffn: fc.integer({ min: 1, max: 24 }),
    vocabSize: fc.integer({ min: 1, max: 20 }),
    defaultLoops: fc.integer({ min: 1, max: 64 }),
    maxSeqLen: fc.integer({ min: 1, max: 1 << 20 }),
    ropeTheta: ropeThetaText,
    normEps: normEpsText,
    groupSize: fc.constantFrom(...GROUP_SIZES.slice(0, 2)),
    output: fc.constantFrom<Output>("tied", "fp16", "int8", "int6", "int4"),
    // Bit k puts block matrix k in the other block format (w1 and w3 share bit 4).
    mixBits: fc.integer({ min: 0, max: 63 }),
    // A stack (format version 2) half the time.
    stack: fc.option(
      fc.record({ nLayers: fc.integer({ min: 1, max: 3 }), sandwich: fc.boolean(), stepNorm: fc.boolean(), exitGate: fc.boolean(), threshold: fc.option(fc.constantFrom(0.25, 0.5, 1)) }),
    ),
  })
  .map((r) => {
    const nHeads = r.kvHeads * r.group;
    const quantized = r.quant !== "fp16";
    // Quantized: dim and ffn_dim multiples of the group size.
    const headDim = quantized ? r.groupSize : 2 * r.headDimHalf;
    const dim = nHeads * headDim;
    const st = r.stack;
    const stack = st
      ? { nLayers: st.nLayers, normLayout: st.sandwich ? ("sandwich" as const) : ("pre" as const), stepNorm: st.stepNorm, exitThreshold: st.exitGate ? st.threshold : null, tokenizer: "gpt2" as const, ...NO_RECURRENCE }
      : SINGLE_BLOCK;
    const exitGate = st?.exitGate ?? false;
    return {
      arch: "looped-llama" as const,
      formatVersion: formatVersionOf(stack, exitGate),
      ...stack,
      exitGate,
      dim,
      nHeads,
      nKvHeads: r.kvHeads,
      headDim,
      ffnDim: quantized ? r.groupSize * Math.min(r.ffn, 2) : r.ffn,
      vocabSize: r.vocabSize,
      defaultLoops: r.defaultLoops,
      maxSeqLen: r.maxSeqLen,
      ropeTheta: Number(r.ropeTheta),
      normEps: Number(r.normEps),
      ropeThetaText: r.ropeTheta,
      normEpsText: r.normEps,
      quant: r.quant as ModelConfig["quant"],
      groupSize: quantized ? r.groupSize : 0,
      quantMix: quantized ? mixOf(r.quant as BlockQuant, r.mixBits) : {},
      // A quantized head needs dim a multiple of its group (int6: of 64).
      output: !quantized && r.output !== "tied" ? "fp16" : r.output === "int6" && dim % 64 !== 0 ? "int8" : r.output,
    };
  });

/** Every tensor (name, dtype, shape) a file of this config holds. */
function tensorsOf(c: ValidConfig): [string, Dtype, number[]][] {
  const out: [string, Dtype, number[]][] = [];
  const f16 = expectedTensorShapes(c, c.exitGate).filter(([name]) => name !== "output.weight");
  if (c.quant === "fp16") {
    for (const [name, shape] of f16) out.push([name, "F16", shape]);
  } else {
    for (const [name, shape] of f16) if (!/^(block|layers\.\d+)\.w[qkvo123]\./.test(name)) out.push([name, "F16", shape]);
    const shapes = matrixShapes(c);
    for (let i = 0; i < c.nLayers; i++)
      for (const m of QUANT_MATRICES) out.push(...quantTensorShapes(`${layerPrefix(c, i)}${m}`, matrixBits(c, m) as QuantMatrix["bits"], shapes[m][0], shapes[m][1], c.groupSize));
  }
  if (c.output !== "tied" && c.output !== "fp16") out.push(...quantTensorShapes("output", HEAD_BITS[c.output], c.vocabSize, c.dim, c.groupSize));
  if (c.output === "fp16") out.push(["output.weight", "F16", [c.vocabSize, c.dim]]);
  return out;
}

/** A valid model image of a random config, its tensors in random order, filled with random bytes. */
export const validModelImage: fc.Arbitrary<Uint8Array> = validConfig.chain((c) => {
  const tensors = tensorsOf(c);
  return fc.tuple(fc.shuffledSubarray(tensors, { minLength: tensors.length }), fc.integer({ min: 0, max: 2 ** 31 - 1 })).map(([order, seed]) => {
    const head = c.output === "tied" || c.output === "fp16" ? {} : { output_quant: c.output };
    const metadata = { ...configToMetadata(c), ...head, rope_theta: c.ropeThetaText, norm_eps: c.normEpsText };
    const entries: Entries = [["__metadata__", JSON.stringify(metadata)]];
    let offset = 0;
    for (const [name, dtype, shape] of order) {
      const bytes = shape.reduce((a, b) => a * b, 1) * DTYPE_SIZES[dtype];
      entries.push([name, JSON.stringify({ dtype, shape, data_offsets: [offset, offset + bytes] })]);
      offset += Math.ceil(bytes / 8) * 8;
    }
    const data = new Uint8Array(offset);
    let s = seed;
    for (let i = 0; i < data.length; i++) data[i] = (s = (Math.imul(s, 1103515245) + 12345) >>> 0) >>> 24;
    return rawSafetensorsImage(objectText(entries), data);
  });
});

// ---- hostile JSON ----

const deepText = fc
  .tuple(fc.integer({ min: 1, max: 200_000 }), fc.boolean())
  .map(([n, objects]) => (objects ? `${'{"a":'.repeat(n)}1${"}".repeat(n)}` : `${"[".repeat(n)}${"]".repeat(n)}`));

const numberLiteral = fc.oneof(
  fc.constantFrom("1e999", "-1e999", "-0", "0.0", "1E400", "1e-400", "9007199254740993", "18446744073709551616", "-9223372036854775809", "4294967296", "2147483648", "1.5", "-1"),
  fc.double().filter(Number.isFinite).map(String),
  fc.integer().map(String),
);

const numericLookingString = fc
  .oneof(
    fc.constantFrom("NaN", "Infinity", "-Infinity", "1e999", "0x10", "+5", " 5", "5 ", "5.", ".5", "007", "-0", "", "1_000", "٣", "１", "1e5", "99999999999999999999"),
    fc.integer().map(String),
    fc.string({ unit: "binary", maxLength: 24 }),
  )
  .map((s) => JSON.stringify(s));

/** JSON text of a value no writer produces. */
export const hostileJson: fc.Arbitrary<string> = fc.oneof(
  { weight: 3, arbitrary: fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.stringify(v)) },
  { weight: 3, arbitrary: numberLiteral },
  { weight: 3, arbitrary: numericLookingString },
  { weight: 2, arbitrary: fc.array(numberLiteral, { maxLength: 5 }).map((a) => `[${a.join(",")}]`) },
  { weight: 1, arbitrary: deepText },
);

const hostileKey = fc.oneof(
  fc.constantFrom("__proto__", "constructor", "toString", "hasOwnProperty", "", "__metadata__", "norm.weight", "output.qweight", "block.wq.weight"),
  fc.string({ unit: "binary", maxLength: 16 }),
);

/** The keys of a loopserve header's metadata, from the fp16 seed. */
const METADATA_KEYS = entriesOf(entriesOf(splitImage(validSeeds()[0].bytes).header).find(([k]) => k === "__metadata__")![1]).map(([k]) => k);
const TENSOR_FIELDS = ["dtype", "shape", "data_offsets"];

// ---- header edits ----

type Edit = (entries: Entries) => Entries;

const pick = <T>(xs: T[], i: number): T => xs[i % xs.length];

function onObject(entries: Entries, key: (keys: string[]) => string, edit: Edit): Entries {
  const target = key(entries.map(([k]) => k));
  return entries.map(([k, v]): [string, string] => {
    if (k !== target) return [k, v];
    try {
      return [k, objectText(edit(entriesOf(v)))];
    } catch {
      return [k, v]; // not an object (an earlier edit replaced it): leave it
    }
  });
}

const editArb: fc.Arbitrary<Edit> = fc.oneof(
  // a metadata value replaced, or added
  fc.tuple(fc.oneof(fc.constantFrom(...METADATA_KEYS), hostileKey), hostileJson).map(
    ([key, value]): Edit => (e) => onObject(e, () => "__metadata__", (m) => [...m.filter(([k]) => k !== key), [key, value]]),
  ),
  // a metadata key removed
  fc.constantFrom(...METADATA_KEYS).map((key): Edit => (e) => onObject(e, () => "__metadata__", (m) => m.filter(([k]) => k !== key))),
  // a tensor field replaced, added or removed
  fc.tuple(fc.nat(), fc.oneof(fc.constantFrom(...TENSOR_FIELDS), hostileKey), fc.option(hostileJson)).map(
    ([i, field, value]): Edit =>
      (e) =>
        onObject(
          e,
          (keys) => pick(keys.filter((k) => k !== "__metadata__"), i),
          (t) => (value === null ? t.filter(([k]) => k !== field) : [...t.filter(([k]) => k !== field), [field, value]]),
        ),
  ),
  // a whole entry replaced, duplicated, renamed or removed; a new one added
  fc.tuple(fc.nat(), hostileJson).map(([i, value]): Edit => (e) => e.map(([k, v], j) => [k, j === i % e.length ? value : v])),
  fc.nat().map((i): Edit => (e) => [...e, e[i % e.length]]),
  fc.tuple(fc.nat(), hostileKey).map(([i, key]): Edit => (e) => e.map(([k, v], j) => [j === i % e.length ? key : k, v])),
  fc.nat().map((i): Edit => (e) => e.filter((_, j) => j !== i % e.length)),
  fc.tuple(hostileKey, hostileJson).map(([key, value]): Edit => (e) => [...e, [key, value]]),
);

/** One image in eight has its whole header replaced by a hostile value. */
const wholeHeader = fc.oneof({ weight: 7, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: hostileJson });

/** A seed model with 1-4 structural header edits (the length field follows the new header). */
const editedImage: fc.Arbitrary<Uint8Array> = fc
  .tuple(fc.constantFrom(...validSeeds()), fc.array(editArb, { minLength: 1, maxLength: 4 }), wholeHeader)
  .map(([seed, edits, wholeHeader]) => {
    const { header, data } = splitImage(seed.bytes);
    if (wholeHeader !== null) return rawSafetensorsImage(wholeHeader, data);
    return rawSafetensorsImage(objectText(edits.reduce((e, edit) => edit(e), entriesOf(header))), data);
  });

// ---- byte-level damage ----

const TOKENS = ["{", "}", "[", "]", ",", ":", '"', "\\", "\\u", "\\ud800", "-", "0", "1e999", "99999999999999999999", "null", "true", " ", '"F32"', '"F16"', '"U8"', "-1", "1.5"];

type ByteEdit = (b: Uint8Array) => Uint8Array;

const byteEditArb: fc.Arbitrary<ByteEdit> = fc.oneof(
  fc.tuple(fc.nat(), fc.integer({ min: 0, max: 7 })).map(([at, bit]): ByteEdit => (b) => {
    const c = b.slice();
    if (c.length > 0) c[at % c.length] ^= 1 << bit;
    return c;
  }),
  fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })).map(([at, v]): ByteEdit => (b) => {
    const c = b.slice();
    if (c.length > 0) c[at % c.length] = v;
    return c;
  }),
  fc.tuple(fc.nat(), fc.constantFrom(...TOKENS)).map(([at, t]): ByteEdit => (b) => {
    if (b.length <= 8) return b;
    const c = b.slice();
    const pos = 8 + (at % (c.length - 8)); // somewhere after the length field
    c.set(new TextEncoder().encode(t).subarray(0, c.length - pos), pos);
    return c;
  }),
  fc.tuple(fc.nat(), fc.uint8Array({ maxLength: 16 })).map(([at, ins]): ByteEdit => (b) => {
    const pos = at % (b.length + 1);
    const c = new Uint8Array(b.length + ins.length);
    c.set(b.subarray(0, pos));
    c.set(ins, pos);
    c.set(b.subarray(pos), pos + ins.length);
    return c;
  }),
  fc.tuple(fc.nat(), fc.integer({ min: 1, max: 64 })).map(([at, n]): ByteEdit => (b) => {
    const pos = at % (b.length + 1);
    const c = new Uint8Array(Math.max(0, b.length - n));
    c.set(b.subarray(0, Math.min(pos, c.length)));
    c.set(b.subarray(Math.min(b.length, pos + n)).subarray(0, c.length - Math.min(pos, c.length)), Math.min(pos, c.length));
    return c;
  }),
  fc.nat().map((n): ByteEdit => (b) => b.slice(0, n % (b.length + 1))),
  fc.oneof(fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }), fc.integer({ min: -16, max: 16 }).map((d) => BigInt(d))).map(
    (v): ByteEdit =>
      (b) => {
        if (b.length < 8) return b;
        const c = b.slice();
        const dv = new DataView(c.buffer);
        // small values: a nudge of the current length; large ones: a new length
        const cur = dv.getBigUint64(0, true);
        dv.setBigUint64(0, v >= -16n && v <= 16n ? BigInt.asUintN(64, cur + v) : v, true);
        return c;
      },
  ),
);

/** A seed (valid or corrupted) with 1-6 byte-level edits. */
const damagedImage: fc.Arbitrary<Uint8Array> = fc
  .tuple(fc.constantFrom(...validSeeds(), ...corruptedSeeds()), fc.array(byteEditArb, { minLength: 1, maxLength: 6 }))
  .map(([seed, edits]) => edits.reduce((b, edit) => edit(b), seed.bytes));

/** Every hostile image: structural edits and byte damage. */
export const hostileModelImage: fc.Arbitrary<Uint8Array> = fc.oneof(editedImage, damagedImage);

// ---- properties ----

/** Valid models load. */
export function validModelsLoad(dir: string) {
  return fc.property(validModelImage, (bytes) => {
    const v = checkImage(bytes, dir);
    if (!v.loaded) throw new Error(`a valid model was refused: ${v.message}`);
  });
}

/** Hostile images load or are refused with a ModelFormatError; nothing else. */
export function hostileModelsAreRefusedCleanly(dir: string) {
  return fc.property(hostileModelImage, (bytes) => {
    checkImage(bytes, dir);
  });
}
