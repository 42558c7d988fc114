import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { runModelCommand } from "../../src/cli/model.ts";
import { F16_TO_F32 } from "../../src/model/fp16.ts";
import { SINGLE_BLOCK, configToMetadata, loadModelFile } from "../../src/model/format.ts";
import {
  exportGguf,
  GGUF_ALIGNMENT,
  gpt2Vocab,
  permuteRopeRows,
  TokenType,
  unpermuteRopeRows,
} from "../../src/model/gguf.ts";
import { ModelFormatError, readSafetensors, writeSafetensors } from "../../src/model/safetensors.ts";
import { BYTE_CHARS } from "../../src/tokenizer/byte_chars.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { testTempDir, tinyModelPath } from "../helpers/models.ts";
import { applyRope } from "../reference/forward.ts";

// ---- a tiny GGUF reader, independent of the writer ----

type Value = number | bigint | boolean | string | Value[];

interface ParsedTensor {
  ne: number[];
  type: number;
  offset: number;
  data: Uint8Array;
}

interface ParsedGguf {
  version: number;
  metadata: Map<string, Value>;
  tensors: Map<string, ParsedTensor>;
  order: string[];
  dataStart: number;
}

/** GGUF's fixed-width value types by number (8, the string, and 9, the array, are read apart): each one's width and reader. */
const FIXED_WIDTH: Record<number, { width: number; at: (dv: DataView, at: number) => Value }> = {
  0: { width: 1, at: (dv, at) => dv.getUint8(at) },
  1: { width: 1, at: (dv, at) => dv.getInt8(at) },
  2: { width: 2, at: (dv, at) => dv.getUint16(at, true) },
  3: { width: 2, at: (dv, at) => dv.getInt16(at, true) },
  4: { width: 4, at: (dv, at) => dv.getUint32(at, true) },
  5: { width: 4, at: (dv, at) => dv.getInt32(at, true) },
  6: { width: 4, at: (dv, at) => dv.getFloat32(at, true) },
  7: { width: 1, at: (dv, at) => dv.getUint8(at) !== 0 },
  10: { width: 8, at: (dv, at) => dv.getBigUint64(at, true) },
  11: { width: 8, at: (dv, at) => dv.getBigInt64(at, true) },
  12: { width: 8, at: (dv, at) => dv.getFloat64(at, true) },
};

function parseGguf(buf: Uint8Array): ParsedGguf {
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const dec = new TextDecoder("utf-8", { fatal: true });
  let p = 0;
  const u32 = () => ((p += 4), dv.getUint32(p - 4, true));
  const u64 = () => ((p += 8), Number(dv.getBigUint64(p - 8, true)));
  const string = () => {
    const n = u64();
    p += n;
    return dec.decode(buf.subarray(p - n, p));
  };
  const scalar = (type: number): Value => {
    if (type === 8) return string();
    const read = FIXED_WIDTH[type];
    if (read === undefined) throw new Error(`unknown GGUF value type ${type} at ${p}`);
    p += read.width;
    return read.at(dv, p - read.width);
  };
  const value = (type: number): Value => {
    if (type !== 9) return scalar(type);
    const elem = u32();
    const n = u64();
    const out: Value[] = [];
    for (let i = 0; i < n; i++) out.push(scalar(elem));
    return out;
  };

  if (u32() !== 0x46554747) throw new Error("bad magic");
  const version = u32();
  const nTensors = u64();
  const nKv = u64();
  const metadata = new Map<string, Value>();
  for (let i = 0; i < nKv; i++) {
    const key = string();
    metadata.set(key, value(u32()));
  }
  const infos: { name: string; ne: number[]; type: number; offset: number }[] = [];
  for (let i = 0; i < nTensors; i++) {
    const name = string();
    const nDims = u32();
    const ne = Array.from({ length: nDims }, u64);
    infos.push({ name, ne, type: u32(), offset: u64() });
  }
  const alignment = Number(metadata.get("general.alignment") ?? 32);
  const dataStart = Math.ceil(p / alignment) * alignment;
  const tensors = new Map<string, ParsedTensor>();
  for (const t of infos) {
    const size = t.ne.reduce((a, b) => a * b, 1) * (t.type === 0 ? 4 : 2);
    tensors.set(t.name, { ...t, data: buf.subarray(dataStart + t.offset, dataStart + t.offset + size) });
  }
  return { version, metadata, tensors, order: infos.map((t) => t.name), dataStart };
}

const asU16 = (b: Uint8Array) => new Uint16Array(b.slice().buffer);
const asF32 = (b: Uint8Array) => new Float32Array(b.slice().buffer);
const bytesOf = (a: Uint16Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

let n = 0;
const tmp = (name: string) => join(testTempDir(), `gguf-${n++}-${name}`);

// ---- tests ----

describe("GGUF export", () => {
  test("the file parses as GGUF v3 with llama metadata, 32-byte aligned contiguous tensors", () => {
    const src = tinyModelPath();
    const out = tmp("tiny.gguf");
    const r = exportGguf(src, out);
    const buf = new Uint8Array(readFileSync(out));
    expect(r.bytes).toBe(buf.length);
    const g = parseGguf(buf);
    const c = loadModelFile(src).config;

    expect(g.version).toBe(3);
    const m = Object.fromEntries(g.metadata);
    expect(m).toMatchObject({
      "general.architecture": "llama",
      "general.alignment": 32,
      "general.file_type": 1,
      "llama.block_count": c.defaultLoops,
      "llama.context_length": c.maxSeqLen,
      "llama.embedding_length": c.dim,
      "llama.feed_forward_length": c.ffnDim,
      "llama.attention.head_count": c.nHeads,
      "llama.attention.head_count_kv": c.nKvHeads,
      "llama.rope.dimension_count": c.headDim,
      "tokenizer.ggml.model": "gpt2",
      "tokenizer.ggml.pre": "gpt-2",
      "tokenizer.ggml.bos_token_id": 50256,
      "tokenizer.ggml.eos_token_id": 50256,
      "tokenizer.ggml.add_bos_token": false,
    });
    expect(m["llama.rope.freq_base"]).toBeCloseTo(c.ropeTheta, 3);
    expect(m["llama.attention.layer_norm_rms_epsilon"]).toBeCloseTo(c.normEps, 9);

    // token_embd, 9 per layer, output_norm, output.
    expect(g.tensors.size).toBe(2 + 9 * c.defaultLoops + 1);
    const q = c.nHeads * c.headDim;
    const kv = c.nKvHeads * c.headDim;
    const want: Record<string, [number[], number]> = {
      "token_embd.weight": [[c.dim, c.vocabSize], 1],
      "output_norm.weight": [[c.dim], 0],
      "output.weight": [[c.dim, c.vocabSize], 1],
    };
    for (let l = 0; l < c.defaultLoops; l++) {
      Object.assign(want, {
        [`blk.${l}.attn_norm.weight`]: [[c.dim], 0],
        [`blk.${l}.attn_q.weight`]: [[c.dim, q], 1],
        [`blk.${l}.attn_k.weight`]: [[c.dim, kv], 1],
        [`blk.${l}.attn_v.weight`]: [[c.dim, kv], 1],
        [`blk.${l}.attn_output.weight`]: [[q, c.dim], 1],
        [`blk.${l}.ffn_norm.weight`]: [[c.dim], 0],
        [`blk.${l}.ffn_gate.weight`]: [[c.dim, c.ffnDim], 1],
        [`blk.${l}.ffn_down.weight`]: [[c.ffnDim, c.dim], 1],
        [`blk.${l}.ffn_up.weight`]: [[c.dim, c.ffnDim], 1],
      });
    }
    for (const [name, [ne, type]] of Object.entries(want)) {
      const t = g.tensors.get(name);
      expect(t, name).toBeDefined();
      expect({ name, ne: t!.ne, type: t!.type }).toEqual({ name, ne, type });
    }
    // llama.cpp's reader demands each offset where the previous tensor ended, padded.
    expect(g.dataStart % GGUF_ALIGNMENT).toBe(0);
    let expected = 0;
    for (const name of g.order) {
      const t = g.tensors.get(name)!;
      expect(t.offset).toBe(expected);
      expected += Math.ceil(t.data.length / GGUF_ALIGNMENT) * GGUF_ALIGNMENT;
    }
    expect(g.dataStart + expected).toBe(buf.length);
  });

  test("every layer holds the shared block's weights; Wq/Wk permutation round-trips", () => {
    const src = tinyModelPath();
    const out = tmp("weights.gguf");
    exportGguf(src, out, { loops: 3 });
    const g = parseGguf(new Uint8Array(readFileSync(out)));
    const { config: c, weights: w } = loadModelFile(src);
    const get = (name: string) => g.tensors.get(name)!.data;

    expect(get("token_embd.weight")).toEqual(bytesOf(w.tokEmbeddings));
    expect(get("output.weight")).toEqual(bytesOf(w.output));
    expect(asF32(get("output_norm.weight"))).toEqual(Float32Array.from(w.norm, (h) => F16_TO_F32[h]));
    for (let l = 0; l < 3; l++) {
      const b = (s: string) => get(`blk.${l}.${s}.weight`);
      expect(permuteRopeRows(w.wq, c.nHeads, c.headDim, c.dim)).toEqual(asU16(b("attn_q")));
      expect(unpermuteRopeRows(asU16(b("attn_q")), c.nHeads, c.headDim, c.dim)).toEqual(w.wq);
      expect(unpermuteRopeRows(asU16(b("attn_k")), c.nKvHeads, c.headDim, c.dim)).toEqual(w.wk);
      expect(b("attn_v")).toEqual(bytesOf(w.wv));
      expect(b("attn_output")).toEqual(bytesOf(w.wo));
      expect(b("ffn_gate")).toEqual(bytesOf(w.w1));
      expect(b("ffn_down")).toEqual(bytesOf(w.w2));
      expect(b("ffn_up")).toEqual(bytesOf(w.w3));
      expect(asF32(b("attn_norm"))).toEqual(Float32Array.from(w.attnNorm, (h) => F16_TO_F32[h]));
      expect(asF32(b("ffn_norm"))).toEqual(Float32Array.from(w.ffnNorm, (h) => F16_TO_F32[h]));
    }
    expect(g.tensors.has("blk.3.attn_q.weight")).toBe(false);
    expect(g.metadata.get("llama.block_count")).toBe(3);
  });

  test("a pre-norm stack unrolls layer by layer, loop by loop; sandwich norms, a norm per step and an exit gate are refused", () => {
    const src = tinyModelPath({ nLayers: 2, vocabSize: 512 });
    const out = tmp("stack.gguf");
    expect(exportGguf(src, out, { loops: 3 }).loops).toBe(3);
    const g = parseGguf(new Uint8Array(readFileSync(out)));
    const file = readSafetensors(src);
    const raw = (name: string) => file.tensors.get(name)!.data;
    expect(g.metadata.get("llama.block_count")).toBe(6);
    for (let l = 0; l < 3; l++)
      for (let i = 0; i < 2; i++) {
        const b = (s: string) => g.tensors.get(`blk.${l * 2 + i}.${s}.weight`)!.data;
        expect(b("ffn_down")).toEqual(raw(`layers.${i}.w2.weight`));
        expect(b("attn_v")).toEqual(raw(`layers.${i}.wv.weight`));
      }
    expect(raw("layers.0.w2.weight")).not.toEqual(raw("layers.1.w2.weight"));
    expect(g.tensors.has("blk.6.attn_q.weight")).toBe(false);
    for (const [opts, what] of [
      [{ sandwichNorm: true }, /Llama graph, which has no place for this model's sandwich norms$/],
      [{ stepNorm: true }, /no place for this model's norm after every step$/],
      [{ exitGate: true }, /no place for this model's exit gate$/],
    ] as const) {
      expect(() => exportGguf(tinyModelPath({ nLayers: 2, vocabSize: 512, ...opts }), tmp("x.gguf"))).toThrow(what);
    }
  });

  test("permuted rows under adjacent-pair RoPE give the permuted result of rotate-half RoPE", () => {
    // What makes the export compute the same function: for q = W x,
    // ropeAdjacent(P W x) = P ropeHalf(W x), with P the row permutation.
    const nHeads = 3;
    const headDim = 8;
    const cols = 5;
    const rows = nHeads * headDim;
    const w = Uint16Array.from({ length: rows * cols }, (_, i) => 0x3c00 + ((i * 37) % 977)); // varied fp16 values
    const x = Array.from({ length: cols }, (_, i) => (i - 2) / 3);
    const matvec = (m: Uint16Array) =>
      Float64Array.from({ length: rows }, (_, r) => x.reduce((s, xc, col) => s + F16_TO_F32[m[r * cols + col]] * xc, 0));
    const pos = 7;
    const theta = 10000;

    const hf = matvec(w);
    applyRope(hf, nHeads, headDim, pos, theta);
    const ll = matvec(permuteRopeRows(w, nHeads, headDim, cols));
    // llama.cpp's normal RoPE: pairs (2i, 2i+1) at frequency theta^(-2i/headDim).
    for (let h = 0; h < nHeads; h++) {
      for (let i = 0; i < headDim / 2; i++) {
        const a = pos * Math.pow(theta, (-2 * i) / headDim);
        const [x0, x1] = [ll[h * headDim + 2 * i], ll[h * headDim + 2 * i + 1]];
        ll[h * headDim + 2 * i] = x0 * Math.cos(a) - x1 * Math.sin(a);
        ll[h * headDim + 2 * i + 1] = x0 * Math.sin(a) + x1 * Math.cos(a);
      }
    }
    for (let h = 0; h < nHeads; h++) {
      for (let i = 0; i < headDim / 2; i++) {
        for (let j = 0; j < 2; j++) {
          expect(ll[h * headDim + 2 * i + j]).toBeCloseTo(hf[h * headDim + j * (headDim / 2) + i], 12);
        }
      }
    }
    // And the row mapping itself, spelled out for head 1, headDim 8: new rows
    // 8..15 are old rows 8, 12, 9, 13, 10, 14, 11, 15.
    const ids = Uint16Array.from({ length: rows }, (_, r) => r);
    expect(Array.from(permuteRopeRows(ids, nHeads, headDim, 1).subarray(8, 16))).toEqual([8, 12, 9, 13, 10, 14, 11, 15]);
    expect(unpermuteRopeRows(permuteRopeRows(ids, nHeads, headDim, 1), nHeads, headDim, 1)).toEqual(ids);
  });

  test("the vocabulary is GPT-2's byte-level tokens and merges, and the merges reproduce tiktoken", async () => {
    const src = tinyModelPath();
    const out = tmp("vocab.gguf");
    exportGguf(src, out, { loops: 1 });
    const g = parseGguf(new Uint8Array(readFileSync(out)));
    const tokens = g.metadata.get("tokenizer.ggml.tokens") as string[];
    const merges = g.metadata.get("tokenizer.ggml.merges") as string[];
    const types = g.metadata.get("tokenizer.ggml.token_type") as number[];
    expect(tokens.length).toBe(50257);
    expect(merges.length).toBe(50000);
    expect(tokens[15496]).toBe("Hello");
    expect(tokens[220]).toBe("\u0120"); // "Ġ": a space
    expect(tokens[198]).toBe("\u010a"); // "Ċ": a newline
    expect(tokens[50256]).toBe("<|endoftext|>");
    expect(merges.slice(0, 3)).toEqual(["\u0120 t", "\u0120 a", "h e"]);
    expect(types[50256]).toBe(TokenType.CONTROL);
    expect(types.filter((t) => t === TokenType.NORMAL).length).toBe(50256);

    // Token strings are the tokenizer's bytes through bytes_to_unicode.
    const tok = await Tokenizer.load();
    const b2u = BYTE_CHARS;
    for (const id of [0, 255, 256, 1000, 6184, 26884, 50255]) {
      expect(tokens[id]).toBe(Array.from(tok.tokenBytes(id), (b) => b2u[b]).join(""));
    }

    // Plain BPE with these merges gives tiktoken's ids on mixed text.
    const rank = new Map(merges.map((m, i) => [m, i]));
    const idOf = new Map(tokens.map((t, i) => [t, i]));
    const pat = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
    const text = "Hello world ünïcödé 🙂 — it's 2026; merges\n\tmatch tiktoken's ranks!";
    const ids: number[] = [];
    for (const word of text.match(pat) ?? []) {
      let parts = Array.from(new TextEncoder().encode(word), (b) => b2u[b]);
      for (;;) {
        let best = -1;
        for (let i = 0; i + 1 < parts.length; i++) {
          const r = rank.get(`${parts[i]} ${parts[i + 1]}`);
          if (r !== undefined && (best < 0 || r < rank.get(`${parts[best]} ${parts[best + 1]}`)!)) best = i;
        }
        if (best < 0) break;
        parts = [...parts.slice(0, best), parts[best] + parts[best + 1], ...parts.slice(best + 2)];
      }
      for (const part of parts) ids.push(idOf.get(part)!);
    }
    expect(ids).toEqual(tok.encode(text));
  });

  test("--loops, a tied output and a small vocabulary", async () => {
    const src = tinyModelPath({ tiedOutput: true, vocabSize: 1000, nKvHeads: 4 });
    const out = tmp("tied.gguf");
    const r = await runCli("export-gguf", src, out, "--loops", "5");
    expect(r.code).toBe(0);
    expect(r.out).toContain("5 layers");
    const g = parseGguf(new Uint8Array(readFileSync(out)));
    expect(g.metadata.get("llama.block_count")).toBe(5);
    expect(g.tensors.has("output.weight")).toBe(false); // llama.cpp reuses token_embd
    expect(g.tensors.get("token_embd.weight")!.ne).toEqual([64, 1000]);
    expect((g.metadata.get("tokenizer.ggml.tokens") as string[]).length).toBe(1000);
    expect((g.metadata.get("tokenizer.ggml.merges") as string[]).length).toBe(1000 - 256);
    expect(g.metadata.has("tokenizer.ggml.bos_token_id")).toBe(false); // 50256 is not in this vocabulary
  });

  test("a padded vocabulary gets unused padding tokens", () => {
    const src = tinyModelPath({ vocabSize: 50304 });
    const out = tmp("padded.gguf");
    exportGguf(src, out, { loops: 1 });
    const g = parseGguf(new Uint8Array(readFileSync(out)));
    const tokens = g.metadata.get("tokenizer.ggml.tokens") as string[];
    const types = g.metadata.get("tokenizer.ggml.token_type") as number[];
    expect(tokens.length).toBe(50304);
    expect(tokens[50257]).toBe("<|pad_50257|>");
    expect(types[50303]).toBe(TokenType.UNUSED);
    expect(new Set(tokens).size).toBe(tokens.length);
  });

  test("a quantized model, bad loops and missing arguments are refused with a message", async () => {
    const q = tmp("int4.safetensors");
    writeSafetensors(
      q,
      configToMetadata({
        arch: "looped-llama",
        formatVersion: 1,
        ...SINGLE_BLOCK,
        dim: 64,
        nHeads: 4,
        nKvHeads: 4,
        headDim: 16,
        ffnDim: 128,
        vocabSize: 1000,
        defaultLoops: 2,
        maxSeqLen: 256,
        ropeTheta: 10000,
        normEps: 1e-5,
        quant: "int4",
        groupSize: 32,
        tokenizer: "gpt2",
        quantMix: {},
      }),
      [],
    );
    expect(() => exportGguf(q, tmp("q.gguf"))).toThrow(/needs an fp16 model, this one is int4/);
    expect(() => exportGguf(tinyModelPath(), tmp("x.gguf"), { loops: 0 })).toThrow(ModelFormatError);

    const r1 = await runCli("export-gguf", q, tmp("q2.gguf"));
    expect(r1.code).toBe(1);
    expect(r1.err).toContain("needs an fp16 model");
    const r2 = await runCli("export-gguf", tinyModelPath());
    expect(r2).toMatchObject({ code: 2 });
    expect(r2.err).toContain("missing OUT path");
    const r3 = await runCli("export-gguf", tinyModelPath(), tmp("y.gguf"), "--loops", "65");
    expect(r3.code).toBe(2);
    expect(r3.err).toContain("--loops must be in [1, 64]");
  });

  test("the vocabulary is derived once and matches GPT-2's merge count", () => {
    const v = gpt2Vocab();
    expect(gpt2Vocab()).toBe(v);
    expect(v.merges.length).toBe(v.tokens.length - 257);
  });
});

async function runCli(...argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runModelCommand(argv, { out: (l) => out.push(l), err: (l) => err.push(l) });
  return { code, out: out.join("\n"), err: err.join("\n") };
}
