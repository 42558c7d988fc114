// Weight quantization (src/model/quantize.ts): each format's round-trip
// bound, the activation quantizer the kernels share, quantized files
// (schema, loader, determinism, errors) and the `model quantize` CLI.
import { describe, expect, test } from "bun:test";
import { readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { runModelCommand } from "../../src/cli/model.ts";
import { NativeQuantizer } from "../../src/engine/binding.ts";
import { F16_TO_F32 } from "../../src/model/fp16.ts";
import { loadModelFile, loadQuantModelFile, type QuantMatrix } from "../../src/model/format.ts";
import { DEFAULT_MIX, f16BitsDown, f16BitsUp, quantizeInt2, quantizeInt4, quantizeInt6, quantizeInt8, quantizeModelFile } from "../../src/model/quantize.ts";
import { ModelFormatError, readSafetensors, writeSafetensors } from "../../src/model/safetensors.ts";
import { ReferenceModel } from "../reference/forward.ts";
import { codeAt, dequantize, quantizeActivations } from "../reference/quant.ts";
import { writeSyntheticModel } from "../../src/model/synthetic.ts";
import { ensureLibrary, LIB } from "../helpers/kernels.ts";
import { testTempDir } from "../helpers/models.ts";

/** A copy of the file at src without one tensor, written to dest. */
function withoutTensor(src: string, dest: string, tensor: string): string {
  const f = readSafetensors(src);
  const kept = [...f.tensors].filter(([name]) => name !== tensor).map(([name, t]) => ({ name, dtype: t.dtype, shape: t.shape, data: t.data }));
  writeSafetensors(dest, f.metadata, kept);
  return dest;
}

let n = 0;
const tmp = (name: string) => join(testTempDir(), `quantize-${n++}-${name}`);

/** Gaussian-ish weights (sum of uniforms) with a few extremes. */
function weights(count: number, seed: number, scale = 0.05): Float32Array {
  let s = seed >>> 0;
  const u = () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
  const w = Float32Array.from({ length: count }, () => (u() + u() + u() + u() - 2) * scale);
  w[7] = 40 * scale;
  w[70] = -55 * scale;
  w.fill(0, 96, 128); // one all-zero group of 32
  return w;
}

const groupScale = (q: QuantMatrix, r: number, g: number) => F16_TO_F32[q.scales[r * (q.cols / q.groupSize) + g]];

describe("round trip", () => {
  const rows = 6;
  const cols = 256;
  for (const group of [32, 64, 128, 256]) {
    for (const [name, quantize, L] of [["int4", quantizeInt4, 7], ["int6", quantizeInt6, 31]] as const)
    test(`${name} group ${group}: codes in [${-L - 1}, ${L}], nearest or clipped to an end, never worse than keeping each group's largest weight`, () => {
      const w = weights(rows * cols, group);
      const q = quantize(w, rows, cols, group);
      const deq = dequantize(q);
      const used = new Set<number>();
      for (let r = 0; r < rows; r++) {
        for (let g = 0; g < cols / group; g++) {
          const s = groupScale(q, r, g);
          let sse = 0;
          let maxPos = 0;
          let maxNeg = 0;
          for (let i = g * group; i < (g + 1) * group; i++) {
            const v = w[r * cols + i];
            const c = codeAt(q, r, i);
            used.add(c);
            expect(c >= -L - 1 && c <= L).toBe(true);
            const t = s !== 0 ? v / s : 0;
            // nearest code, or the end code for a weight beyond it
            if (t > L + 0.5) expect(c).toBe(L);
            else if (t < -L - 1.5) expect(c).toBe(-L - 1);
            else if (!(Math.abs(v - deq[r * cols + i]) <= Math.abs(s) / 2)) throw new Error(`row ${r} input ${i}: |${v} - ${deq[r * cols + i]}| > |${s}| / 2`);
            sse += (v - deq[r * cols + i]) ** 2;
            maxPos = Math.max(maxPos, v);
            maxNeg = Math.max(maxNeg, -v);
          }
          // The first candidate: the largest weight exactly at -L - 1.
          const s0 = F16_TO_F32[f16BitsUp(Math.max(maxPos, maxNeg) / (L + 1))] * (maxNeg >= maxPos ? 1 : -1);
          let sse0 = 0;
          for (let i = g * group; i < (g + 1) * group; i++) {
            const v = w[r * cols + i];
            const c = s0 !== 0 ? Math.min(L, Math.max(-L - 1, Math.round(v / s0))) : 0;
            sse0 += (v - c * s0) ** 2;
          }
          expect(sse).toBeLessThanOrEqual(sse0 * (1 + 1e-9));
        }
      }
      // Both ends of the code range occur: the packing keeps every bit of a code.
      expect(used.has(-L - 1) && used.has(L)).toBe(true);
    });

    test(`int8 group ${group}: codes in [-127, 127], |w - dequant| <= scale / 2`, () => {
      const w = weights(rows * cols, group + 1);
      const q = quantizeInt8(w, rows, cols, group);
      const deq = dequantize(q);
      for (let i = 0; i < rows * cols; i++) {
        const r = Math.floor(i / cols);
        expect(Math.abs(codeAt(q, r, i % cols))).toBeLessThanOrEqual(127);
        expect(Math.abs(w[i] - deq[i])).toBeLessThanOrEqual(groupScale(q, r, Math.floor((i % cols) / group)) / 2);
      }
    });

    test(`int2 group ${group}: codes 0..3, each weight at its nearest level or an end level, the searched range no worse (|w|-weighted) than spanning the group`, () => {
      const w = weights(rows * cols, group + 2);
      const q = quantizeInt2(w, rows, cols, group);
      const deq = dequantize(q);
      const ng = cols / group;
      const used = new Set<number>();
      let clipped = 0;
      for (let r = 0; r < rows; r++) {
        for (let g = 0; g < ng; g++) {
          let mn = Infinity;
          let mx = -Infinity;
          for (let i = g * group; i < (g + 1) * group; i++) {
            mn = Math.min(mn, w[r * cols + i]);
            mx = Math.max(mx, w[r * cols + i]);
          }
          const z = F16_TO_F32[q.zeros![r * ng + g]];
          const s = groupScale(q, r, g);
          expect(z).toBeGreaterThanOrEqual(F16_TO_F32[f16BitsDown(mn)]);
          let e = 0;
          for (let i = g * group; i < (g + 1) * group; i++) {
            const v = w[r * cols + i];
            const c = codeAt(q, r, i);
            used.add(c);
            expect(c >= 0 && c <= 3).toBe(true);
            const t = (v - z) / s;
            if (t > 3.5) expect(c).toBe(3);
            else if (t < -0.5) expect(c).toBe(0);
            else expect(Math.abs(v - deq[r * cols + i])).toBeLessThanOrEqual(s / 2 + 1e-12);
            if (t > 3.5 || t < -0.5) clipped++;
            e += Math.abs(v) * (v - deq[r * cols + i]) ** 2;
          }
          // The first candidate: the levels spanning the group.
          const z0 = F16_TO_F32[f16BitsDown(mn)];
          const s0 = F16_TO_F32[f16BitsUp((mx - z0) / 3)];
          let e0 = 0;
          for (let i = g * group; i < (g + 1) * group; i++) {
            const v = w[r * cols + i];
            const c = s0 > 0 ? Math.min(3, Math.max(0, Math.round((v - z0) / s0))) : 0;
            e0 += Math.abs(v) * (v - (c * s0 + z0)) ** 2;
          }
          expect(e).toBeLessThanOrEqual(e0 * (1 + 1e-9));
        }
      }
      expect([...used].sort()).toEqual([0, 1, 2, 3]);
      // The search does trade extremes for the rest somewhere.
      expect(clipped).toBeGreaterThan(0);
    });
  }


  test("packing: int4 low nibble first (c + 8), int2 four per byte from the low bits", () => {
    const w = new Float32Array(32);
    w[0] = -1; // the largest magnitude: scale = 1 / 8, code -8
    w[1] = 7 / 8; // 7
    const q4 = quantizeInt4(w, 1, 32, 32);
    expect(F16_TO_F32[q4.scales[0]]).toBe(1 / 8);
    expect(q4.qweight[0]).toBe(0x00 | (15 << 4));
    expect(q4.qweight[1]).toBe(0x88); // zeros are code 0, stored 8
    // The larger side positive: a negative scale puts it on the -8 end.
    const q4n = quantizeInt4(w.map((v) => -v), 1, 32, 32);
    expect(F16_TO_F32[q4n.scales[0]]).toBe(-1 / 8);
    expect(q4n.qweight[0]).toBe(0x00 | (15 << 4));
    const v = Float32Array.from({ length: 32 }, (_, i) => i % 4); // levels 0..3
    const q2 = quantizeInt2(v, 1, 32, 32);
    expect(F16_TO_F32[q2.scales[0]]).toBe(1);
    expect(F16_TO_F32[q2.zeros![0]]).toBe(0);
    expect(q2.qweight[0]).toBe(0 | (1 << 2) | (2 << 4) | (3 << 6));
  });

  test("in_features not a multiple of the group, or an unsupported group, is refused with the reason", () => {
    expect(() => quantizeInt4(new Float32Array(2 * 48), 2, 48, 32)).toThrow(/in_features 48 is not a multiple of the group size 32/);
    expect(() => quantizeInt2(new Float32Array(96), 1, 96, 48)).toThrow(/group size must be one of 32, 64, 128, 256, got 48/);
    expect(() => quantizeInt4(Float32Array.of(...new Array(32).fill(1e9)), 1, 32, 32)).toThrow(/does not fit in fp16/);
  });
});

describe("activation quantization", () => {
  test("per row: the largest magnitude maps to +-127, every value within d/2, fp32 like the kernels", () => {
    const x = Float32Array.from({ length: 200 }, (_, i) => Math.sin(i * 0.7) * (i === 13 ? -9 : 2));
    const { q, d } = quantizeActivations(x);
    expect(q[13]).toBe(-127);
    expect(d).toBe(Math.fround(Math.abs(x[13]) / 127));
    for (let i = 0; i < x.length; i++) expect(Math.abs(x[i] - d * q[i])).toBeLessThanOrEqual(d / 2 + 1e-7);
    const zero = quantizeActivations(new Float32Array(8));
    expect(zero.d).toBe(0);
    expect(Array.from(zero.q)).toEqual(new Array(8).fill(0));
  });

  test("ties round to even, as cvtps2dq does", () => {
    // amax 127 makes the multiplier exactly 1: x * 1 = x.
    const { q } = quantizeActivations(Float32Array.of(127, 0.5, 1.5, 2.5, -0.5, -1.5));
    expect(Array.from(q)).toEqual([127, 0, 2, 2, 0, -2]);
  });
});

// ---- files ----

const SHAPE = { dim: 64, nHeads: 4, nKvHeads: 2, ffnDim: 96, vocabSize: 300, loops: 2, seed: 3 };

function fp16Model(opts: Partial<typeof SHAPE & { tiedOutput: boolean }> = {}): string {
  const path = tmp("fp16.safetensors");
  writeSyntheticModel(path, { ...SHAPE, ...opts });
  return path;
}

describe("quantized model files", () => {
  test("int4 and int2 files: metadata, tensors, loader; the same input gives the same bytes", () => {
    const src = fp16Model();
    for (const quant of ["int4", "int2"] as const) {
      const a = tmp(`${quant}-a.safetensors`);
      const b = tmp(`${quant}-b.safetensors`);
      const r = quantizeModelFile(src, a, { quant });
      quantizeModelFile(src, b, { quant });
      expect(readFileSync(a).equals(readFileSync(b))).toBe(true);
      expect(r.head).toBe("int6"); // the default head where dim is a multiple of 64
      const f = readSafetensors(a);
      expect(f.metadata).toMatchObject({ quant, group_size: "32", output_quant: "int6", output_group_size: "32", format: "loopserve" });
      // int2 keeps wv, wo and w2 at int4 unless told otherwise (DEFAULT_MIX).
      expect(f.metadata.quant_mix as string | undefined).toBe(quant === "int2" ? "wv=int4,wo=int4,w2=int4" : undefined);
      expect(f.tensors.get("block.w1.qweight")).toMatchObject({ dtype: "U8", shape: [96, (64 * (quant === "int4" ? 4 : 2)) / 8] });
      expect(f.tensors.get("block.w1.scales")).toMatchObject({ dtype: "F16", shape: [96, 2] });
      expect(f.tensors.has("block.w1.zeros")).toBe(quant === "int2");
      expect(f.tensors.get("block.w2.qweight")).toMatchObject({ dtype: "U8", shape: [64, 48] });
      expect(f.tensors.get("block.w2.scales")).toMatchObject({ dtype: "F16", shape: [64, 3] });
      expect(f.tensors.has("block.w2.zeros")).toBe(false);
      expect(f.tensors.get("output.qweight")).toMatchObject({ dtype: "U8", shape: [300, 48] });
      expect(f.tensors.get("tok_embeddings.weight")!.dtype).toBe("F16");
      expect(f.tensors.has("block.wq.weight")).toBe(false);
      const m = loadQuantModelFile(a);
      expect(m.config).toMatchObject({ quant, groupSize: 32, tiedOutput: false, quantMix: DEFAULT_MIX[quant] });
      expect(m.weights.block.wo.bits).toBe(4);
      expect(m.weights.block.wq.bits).toBe(quant === "int4" ? 4 : 2);
      expect(() => loadModelFile(a)).toThrow(/loadQuantModelFile reads it/);
    }
  });

  test("group size 64, fp16 head, tied models, bf16 and fp32 inputs", () => {
    const src = fp16Model();
    const g64 = tmp("g64.safetensors");
    const wide = fp16Model({ ffnDim: 128 });
    expect(quantizeModelFile(wide, g64, { quant: "int4", groupSize: 64, head: "fp16" }).head).toBe("fp16");
    const m = loadQuantModelFile(g64);
    expect(m.config.groupSize).toBe(64);
    expect(m.weights.output).toBeInstanceOf(Uint16Array);
    // dim 64, ffn 96: ffn_dim is not a multiple of 64.
    expect(() => quantizeModelFile(src, tmp("g64-bad.safetensors"), { quant: "int4", groupSize: 64 })).toThrow(
      /ffn_dim \(96\) must be a multiple of group_size \(64\)/,
    );

    const tied = fp16Model({ tiedOutput: true });
    const t1 = tmp("tied-fp16.safetensors");
    expect(quantizeModelFile(tied, t1, { quant: "int2", head: "fp16" }).head).toBe("tied");
    expect(loadQuantModelFile(t1).config.tiedOutput).toBe(true);
    const t2 = tmp("tied-int8.safetensors");
    quantizeModelFile(tied, t2, { quant: "int2" });
    // The embedding's quantized copy is the head, and the only copy: it serves the embedding too.
    const q2 = loadQuantModelFile(t2);
    expect(q2.config).toMatchObject({ tiedOutput: false, embeddingFromHead: true });
    expect(q2.weights.tokEmbeddings).toBe(q2.weights.output);

    // The same weights as F32 and BF16 tensors.
    const f = readSafetensors(src);
    for (const dtype of ["F32", "BF16"] as const) {
      const tensors = [...f.tensors].map(([name, t]) => {
        const h = new Uint16Array(t.data.buffer, t.data.byteOffset, t.data.byteLength / 2);
        const v = Float32Array.from(h, (b) => F16_TO_F32[b]);
        const data =
          dtype === "F32" ? new Uint8Array(v.buffer) : new Uint8Array(Uint16Array.from(new Uint32Array(v.buffer), (u) => u >>> 16).buffer);
        return { name, dtype, shape: t.shape, data };
      });
      const wide = tmp(`${dtype}.safetensors`);
      writeSafetensors(wide, f.metadata, tensors);
      const out = tmp(`${dtype}-int4.safetensors`);
      quantizeModelFile(wide, out, { quant: "int4" });
      const q = loadQuantModelFile(out);
      if (dtype === "F32") {
        // fp16 values through F32 quantize exactly as from F16.
        const direct = tmp("direct-int4.safetensors");
        quantizeModelFile(src, direct, { quant: "int4" });
        expect(readFileSync(out).equals(readFileSync(direct))).toBe(true);
      }
      expect(q.weights.block.w1.rows).toBe(96);
    }
  });

  test("int6 / int4 heads and an fp16 block with a quantized head: metadata, tensors, loader", () => {
    const src = fp16Model();
    const cases = [
      ["int4", "int6", [300, 48]],
      ["int2", "int4", [300, 32]],
      ["fp16", "int8", [300, 64]],
    ] as const;
    for (const [quant, head, shape] of cases) {
      const out = tmp(`${quant}-${head}.safetensors`);
      const r = quantizeModelFile(src, out, { quant, head, headGroupSize: 64 });
      expect(r.head).toBe(head);
      const f = readSafetensors(out);
      expect(f.metadata).toMatchObject({ quant, group_size: quant === "fp16" ? "0" : "32", output_quant: head, output_group_size: "64" });
      expect(f.tensors.get("output.qweight")).toMatchObject({ dtype: head === "int8" ? "I8" : "U8", shape });
      expect(f.tensors.get("output.scales")).toMatchObject({ dtype: "F16", shape: [300, 1] });
      expect(f.tensors.has("output.weight")).toBe(false);
      const m = ReferenceModel.load(out);
      expect(m.config).toMatchObject({ quant, headQuant: head, headGroupSize: 64, tiedOutput: false });
      if (quant === "fp16") {
        expect(f.tensors.get("block.wq.weight")!.dtype).toBe("F16");
        expect(() => loadModelFile(out)).toThrow(/an int8 output head is not supported by the TypeScript loader of fp16 weights/);
      } else {
        expect(loadQuantModelFile(out).weights.output).toMatchObject({ bits: head === "int6" ? 6 : 4, groupSize: 64 });
      }
    }
    // The default head is int8 where dim is not a multiple of 64; int6 needs whole blocks of 64 inputs.
    expect(quantizeModelFile(fp16Model({ dim: 96, nHeads: 4, nKvHeads: 2 }), tmp("d96.safetensors"), { quant: "fp16" }).head).toBe("int8");
    expect(() => quantizeModelFile(fp16Model({ dim: 96, nHeads: 4, nKvHeads: 2 }), tmp("x.safetensors"), { quant: "fp16", head: "int6" })).toThrow(
      /in_features 96 is not a multiple of 64 \(the int6 layout\)/,
    );
  });

  test("every quantized file is smaller than its source, tied or untied: a tied model's quantized head is its embedding too", () => {
    ensureLibrary();
    const quantizer = NativeQuantizer.open(LIB, 2); // the library's bytes are the reference's (test/kernels/quantizer.test.ts), in a fraction of the time
    for (const tiedOutput of [false, true]) {
      const src = fp16Model({ tiedOutput });
      for (const quant of ["int4", "int2", "fp16"] as const) {
        for (const head of ["int8", "int6", "int4", "fp16"] as const) {
          if (quant === "fp16" && head === "fp16") continue; // nothing to quantize
          const name = `${tiedOutput ? "tied" : "untied"} ${quant} block, ${head} head`;
          const out = tmp(`${name.replace(/[ ,]+/g, "-")}.safetensors`);
          const r = quantizeModelFile(src, out, { quant, head, quantizer });
          expect(r.inputBytes).toBe(statSync(src).size);
          expect(r.bytes).toBe(statSync(out).size);
          if (!(r.bytes < r.inputBytes)) throw new Error(`${name}: ${r.bytes} bytes from ${r.inputBytes}`);
          const fromHead = tiedOutput && head !== "fp16";
          expect(readSafetensors(out).tensors.has("tok_embeddings.weight")).toBe(!fromHead);
          expect(r.config).toMatchObject({ tiedOutput: tiedOutput && head === "fp16", embeddingFromHead: fromHead });
          expect(ReferenceModel.load(out).config).toEqual(r.config);
        }
      }
    }
    quantizer.close();
  });

  test("without tok_embeddings.weight a model needs a quantized head to stand in for it", () => {
    const src = fp16Model({ tiedOutput: true });
    const fromHead = tmp("from-head.safetensors");
    quantizeModelFile(src, fromHead, { quant: "int4" });
    const f = readSafetensors(fromHead);
    const tensors = [...f.tensors].map(([name, t]) => ({ name, dtype: t.dtype, shape: t.shape, data: t.data }));
    // The same file stating an fp16 head: the head's tensors no longer fit, and the embedding is missing.
    const noHead = tmp("no-embedding.safetensors");
    writeSafetensors(noHead, { ...f.metadata, output_quant: "fp16" }, tensors.filter((t) => !t.name.startsWith("output.")));
    expect(() => loadQuantModelFile(noHead)).toThrow(/missing tensor "tok_embeddings.weight" \(F16 \[300, 64\]\)/);
    // An fp16 model without its embedding.
    const noEmbedding = withoutTensor(src, tmp("fp16-no-embedding.safetensors"), "tok_embeddings.weight");
    expect(() => loadModelFile(noEmbedding)).toThrow(/missing tensor "tok_embeddings.weight"/);
  });

  test("an already quantized or malformed input is refused with the reason", () => {
    const src = fp16Model();
    const q = tmp("q.safetensors");
    quantizeModelFile(src, q, { quant: "int4" });
    expect(() => quantizeModelFile(q, tmp("qq.safetensors"), { quant: "int2" })).toThrow(/already quantized/);
    const broken = withoutTensor(src, tmp("broken.safetensors"), "block.w3.weight");
    expect(() => quantizeModelFile(broken, tmp("x.safetensors"), { quant: "int4" })).toThrow(/missing tensor "block.w3.weight"/);
  });

  test("the schema names a quantized tensor with a wrong dtype or shape, or a leftover fp16 matrix", () => {
    const src = fp16Model();
    const good = tmp("good.safetensors");
    quantizeModelFile(src, good, { quant: "int2" });
    const f = readSafetensors(good);
    const rewrite = (edit: (t: { name: string; dtype: string; shape: number[]; data: Uint8Array }[]) => void) => {
      const list = [...f.tensors].map(([name, t]) => ({ name, dtype: t.dtype as string, shape: t.shape, data: t.data }));
      edit(list);
      const p = tmp("bad.safetensors");
      writeSafetensors(p, f.metadata, list as never);
      return p;
    };
    const noZeros = rewrite((l) => l.splice(l.findIndex((t) => t.name === "block.wk.zeros"), 1));
    expect(() => loadQuantModelFile(noZeros)).toThrow(/missing tensor "block.wk.zeros"/);
    const i8 = rewrite((l) => {
      l.find((t) => t.name === "block.wv.qweight")!.dtype = "I8";
    });
    expect(() => loadQuantModelFile(i8)).toThrow(/tensor "block.wv.qweight": dtype must be U8, got I8/);
    const both = rewrite((l) => l.push({ name: "block.wq.weight", dtype: "F16", shape: [64, 64], data: new Uint8Array(64 * 64 * 2) }));
    expect(() => loadQuantModelFile(both)).toThrow(/"block.wq.weight" present in an int2 model/);
    const meta = tmp("meta.safetensors");
    writeSafetensors(meta, { ...f.metadata, group_size: "48" }, [...f.tensors].map(([name, t]) => ({ name, dtype: t.dtype, shape: t.shape, data: t.data })));
    expect(() => loadQuantModelFile(meta)).toThrow(/group_size must be one of 32, 64, 128, 256 for quant int2, got 48/);
  });

  test("the reference forward pass of a quantized model stays close to the fp16 model's, tied (the embedding read from the head) or not", () => {
    const toks = [1, 50, 200, 7, 99];
    for (const tiedOutput of [false, true]) {
      const src = fp16Model({ tiedOutput });
      const want = ReferenceModel.load(src).forward(toks, 2);
      for (const [quant, tol] of [["int4", 0.3], ["int2", 1.5]] as const) {
        const q = tmp(`ref-${quant}.safetensors`);
        quantizeModelFile(src, q, { quant });
        const model = ReferenceModel.load(q);
        expect(model.config.embeddingFromHead).toBe(tiedOutput);
        const got = model.forward(toks, 2);
        let d = 0;
        let m = 0;
        for (let t = 0; t < toks.length; t++) {
          for (let i = 0; i < 300; i++) {
            d = Math.max(d, Math.abs(got[t][i] - want[t][i]));
            m = Math.max(m, Math.abs(want[t][i]));
          }
        }
        expect(d / m).toBeGreaterThan(0); // the quantization shows
        if (!(d / m < tol)) throw new Error(`${tiedOutput ? "tied" : "untied"} ${quant}: rel err ${d / m}`);
      }
    }
  });
});

// ---- CLI ----

async function run(...argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runModelCommand(argv, { out: (l) => out.push(l), err: (l) => err.push(l) });
  return { code, out: out.join("\n"), err: err.join("\n") };
}

describe("loopserve model quantize", () => {
  test("quantize, then inspect shows quant and group_size", async () => {
    const src = fp16Model();
    const out = tmp("cli-int4.safetensors");
    const r = await run("quantize", src, out, "--quant", "int4", "--group-size", "32");
    expect(r).toMatchObject({ code: 0, err: "" });
    expect(r.out).toMatch(/^wrote .*: \d+ bytes \(\d+\.\d% of \d+\), int4 block, group 32, output head int6, group 32 in \d+ ms$/);
    const i = await run("inspect", out);
    expect(i.code).toBe(0);
    expect(i.out).toMatch(/^ {2}quant +int4$/m);
    expect(i.out).toMatch(/^ {2}group_size +32$/m);
    expect(i.out).toMatch(/block\.wq\.qweight +U8 +\[64, 32\]/);
    expect(i.out).toContain("loopserve model: int4 (group 32), output head int6 (group 32), dim 64");
    const again = tmp("cli-int4-again.safetensors");
    await run("quantize", src, again, "--quant=int4");
    expect(readFileSync(again).equals(readFileSync(out))).toBe(true);
  });

  test("--mix: int2's default keeps wv, wo, w2 at int4; none, a list, or the other way round", async () => {
    const src = fp16Model();
    const cases: [string[], string | undefined, string][] = [
      [["--quant", "int2"], "wv=int4,wo=int4,w2=int4", "int2 (group 32, with wv=int4,wo=int4,w2=int4)"],
      [["--quant", "int2", "--mix", "none"], undefined, "int2 (group 32)"],
      [["--quant", "int2", "--mix", "w2=int4, wq=int2"], "w2=int4", "int2 (group 32, with w2=int4)"],
      [["--quant", "int4", "--mix", "w1=int2,w3=int2"], "w1=int2,w3=int2", "int4 (group 32, with w1=int2,w3=int2)"],
    ];
    for (const [flags, mix, shown] of cases) {
      const out = tmp("cli-mix.safetensors");
      const q = await run("quantize", src, out, ...flags);
      expect(q.code).toBe(0);
      expect(q.out).toContain(mix === undefined ? `${flags[1]} block, group 32, output head` : `with ${mix}, output head`);
      expect(readSafetensors(out).metadata.quant_mix as string | undefined).toBe(mix);
      const i = await run("inspect", out);
      expect(i.code).toBe(0);
      expect(i.out).toContain(`loopserve model: ${shown}, output head int6`);
    }
  });

  test("bad arguments exit 2 with the reason; a bad input file exits 1", async () => {
    const src = fp16Model();
    const cases: [string[], RegExp][] = [
      [["quantize", src, tmp("a")], /--quant int4\|int2\|fp16 is required/],
      [["quantize", src, tmp("a"), "--quant", "int3"], /--quant must be int4, int2 or fp16, got "int3"/],
      [["quantize", src, tmp("a"), "--quant", "int4", "--group-size", "48"], /--group-size must be 32, 64, 128 or 256, got 48/],
      [["quantize", src, tmp("a"), "--quant", "int4", "--head-group-size", "16"], /--head-group-size must be 32, 64, 128 or 256, got 16/],
      [["quantize", src, tmp("a"), "--quant", "int4", "--head", "int5"], /--head must be one of fp16, int8, int6, int4, got "int5"/],
      [["quantize", src, tmp("a"), "--quant", "fp16", "--head", "fp16"], /--quant fp16 with --head fp16 leaves nothing to quantize/],
      [["quantize", src, "--quant", "int4"], /missing OUT path/],
      [["quantize", src, tmp("a"), "--quant", "int2", "--mix", "wv=int8"], /--mix: quant_mix gives wv the format "int8": int4 or int2/],
      [["quantize", src, tmp("a"), "--quant", "int2", "--mix", "w1=int4"], /--mix: quant_mix must give w1 and w3 the same format/],
      [["quantize", src, tmp("a"), "--quant", "int2", "--mix", "ffn=int4"], /--mix: quant_mix names "ffn", which is not a block matrix/],
      [["quantize", src, tmp("a"), "--quant", "fp16", "--mix", "wv=int4"], /--mix needs --quant int4 or int2/],
      [["quantize", src, tmp("a"), "--quant", "int4", "--threads", "two"], /--threads must be a non-negative integer, got "two"/],
    ];
    for (const [argv, msg] of cases) {
      const r = await run(...argv);
      expect(r.code).toBe(2);
      expect(r.err).toMatch(msg);
    }
    const junk = tmp("junk.safetensors");
    writeFileSync(junk, "not a model");
    const r = await run("quantize", junk, tmp("b"), "--quant", "int2");
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/^error: /);
    expect((await run("quantize", "--help")).out).toContain("usage: loopserve model quantize IN OUT --quant int4|int2");
  });
});

test("ModelFormatError is what quantization failures throw", () => {
  expect(() => quantizeInt8(new Float32Array(10), 1, 10, 32)).toThrow(ModelFormatError);
});
