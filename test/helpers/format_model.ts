// A tiny model that writes JSON readily, for the structured-output tests:
// a random model constrained to a schema wanders (a string it never closes
// runs into max_tokens), so this one's next-token distribution is nearly
// fixed, favouring short tokens and JSON's punctuation, and a value under a
// schema's mask completes within a few hundred tokens. Built from a
// synthetic model with tiny residual updates: every embedding row gets a
// large first coordinate, so the normed final state's first coordinate is
// about the same positive number at every position, and the output head's
// row of token t is bias(t) times the first unit vector: logits ~ bias.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { f32ToF16Bits } from "../../src/model/fp16.ts";
import { writeSyntheticModel } from "../../src/model/synthetic.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { TINY, testTempDir } from "./models.ts";

/** The embedding's first coordinate: far above the other coordinates (about 1) and the layers' updates. */
const LEAD = 30;

/** Characters of JSON's structure and numbers: tokens made only of them are favoured, and closing ones most. */
const STRUCTURE = new Set([..."{}[]\",:0123456789.-"]);
const CLOSING = new Set([..."}]\""]);

/** The head's weight for a token (its logit divided by the final state's first coordinate). */
function bias(bytes: Uint8Array): number {
  if (bytes.length === 0) return 0;
  const chars = [...new TextDecoder().decode(bytes)];
  const structural = chars.every((c) => STRUCTURE.has(c));
  const closing = chars.every((c) => CLOSING.has(c));
  return -0.3 * bytes.length + (structural ? 0.5 : 0) + (closing ? 0.15 : 0);
}

/** Writes the fp16 tensor `name` of a safetensors file's bytes through `fill(values, shape)`. */
function patchTensor(file: Buffer, name: string, fill: (values: Uint16Array, shape: number[]) => void): void {
  const headerLength = Number(file.readBigUInt64LE(0));
  const header = JSON.parse(file.subarray(8, 8 + headerLength).toString("utf8")) as Record<string, { shape: number[]; data_offsets: [number, number] }>;
  const t = header[name];
  const start = 8 + headerLength + t.data_offsets[0];
  const values = new Uint16Array(file.buffer, file.byteOffset + start, (t.data_offsets[1] - t.data_offsets[0]) / 2);
  fill(values, t.shape);
}

let made: Promise<string> | null = null;

/** The path of the JSON-leaning model (GPT-2's vocabulary), written once per process. */
export function formatModelPath(): Promise<string> {
  made ??= (async () => {
    const path = join(testTempDir(), "format-model.safetensors");
    writeSyntheticModel(path, { ...TINY, loops: 2, residualScale: 0.01, tiedOutput: false });
    const tokenizer = await Tokenizer.load();
    const file = readFileSync(path);
    patchTensor(file, "tok_embeddings.weight", (values, [, dim]) => {
      for (let row = 0; row < values.length / dim; row++) values[row * dim] = f32ToF16Bits(LEAD);
    });
    patchTensor(file, "output.weight", (values, [vocab, dim]) => {
      values.fill(0);
      for (let t = 0; t < vocab; t++) values[t * dim] = f32ToF16Bits(bias(tokenizer.tokenBytes(t)));
    });
    writeFileSync(path, file);
    tokenizer.close();
    return path;
  })();
  return made;
}
