import { describe, expect, test } from "bun:test";
import { closeSync, mkdirSync, openSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { MAX_VIEW_BYTES, ModelFormatError, readSafetensors, writeSafetensors, writeSafetensorsStream } from "../../src/model/safetensors.ts";
import { testTempDir } from "../helpers/models.ts";
import { modelFormatMessage, type RawHeader, writeRawSafetensors } from "../helpers/safetensors.ts";

let n = 0;
const tmp = (name: string) => join(testTempDir(), `st-${n++}-${name}.safetensors`);

/** A raw safetensors file: length field (overridable), header text (unpadded), data. */
function rawFile(header: RawHeader | null, data: Uint8Array = new Uint8Array(0), opts: { text?: string; len?: bigint } = {}) {
  return writeRawSafetensors(tmp("raw"), opts.text ?? JSON.stringify(header), data, { len: opts.len, pad: false });
}

/** Expects readSafetensors(path) to throw a ModelFormatError whose message matches every pattern. */
function expectBad(path: string, ...patterns: (string | RegExp)[]) {
  const msg = modelFormatMessage(() => readSafetensors(path));
  expect(msg).toContain(path);
  for (const p of patterns) expect(msg).toMatch(p);
}

const f16 = (vals: number[]) => new Uint8Array(new Uint16Array(vals).buffer);
const goodTensor = { dtype: "F16", shape: [2, 2], data_offsets: [0, 8] };

describe("safetensors writer and reader", () => {
  test("round trip keeps metadata, order, dtypes, shapes and bytes; data and tensors are 8-byte aligned", () => {
    const path = tmp("roundtrip");
    const u8 = new Uint8Array([1, 2, 3, 4, 5]); // 5 bytes: the next tensor needs padding
    const f32 = new Uint8Array(new Float32Array([1.5, -2, 3.25]).buffer);
    const tensors = [
      { name: "b.u8", dtype: "U8" as const, shape: [5], data: u8 },
      { name: "a.f32", dtype: "F32" as const, shape: [3], data: f32 },
      { name: "c.f16", dtype: "F16" as const, shape: [2, 2], data: f16([0x3c00, 0x4000, 0xc000, 0]) },
      { name: "d.bf16", dtype: "BF16" as const, shape: [1], data: f16([0x3f80]) },
      { name: "e.empty", dtype: "F16" as const, shape: [0, 7], data: new Uint8Array(0) },
      { name: "f.scalar", dtype: "U8" as const, shape: [], data: new Uint8Array([9]) },
    ];
    const bytes = writeSafetensors(path, { hello: "world", n: "3" }, tensors);
    expect(readFileSync(path).length).toBe(bytes);

    const file = readSafetensors(path);
    expect(file.metadata).toEqual({ hello: "world", n: "3" });
    expect([...file.tensors.keys()]).toEqual(tensors.map((t) => t.name));
    expect(file.dataStart % 8).toBe(0);
    for (const t of tensors) {
      const got = file.tensors.get(t.name)!;
      expect(got.dtype).toBe(t.dtype);
      expect(got.shape).toEqual(t.shape);
      expect([...got.data]).toEqual([...t.data]);
      expect(got.offset).toBe(got.data.byteOffset - file.map!.byteOffset);
      expect(got.offset % 8).toBe(0);
      expect(got.data.buffer).toBe(file.map!.buffer); // a view into the mapping, not a copy
    }
    // The header is padded with spaces, which JSON ignores.
    const headerText = new TextDecoder().decode(file.map!.subarray(8, file.dataStart));
    expect(headerText).toMatch(/^\{.*\} *$/);
  });

  test("no metadata: the header has no __metadata__ and reads back as {}", () => {
    const path = tmp("nometa");
    writeSafetensors(path, {}, [{ name: "x", dtype: "U8", shape: [1], data: new Uint8Array([7]) }]);
    const file = readSafetensors(path);
    expect(file.metadata).toEqual({});
    expect(new TextDecoder().decode(file.map!.subarray(8, file.dataStart))).not.toContain("__metadata__");
  });

  test("a file larger than one view may be (4 GiB): mapped all the same, each tensor viewed alone", () => {
    // sparse: a tensor at the start, one past 4 GiB; the gap between them reads as zeros and is never touched
    const far = MAX_VIEW_BYTES + 4096;
    const header = JSON.stringify({ a: { dtype: "U8", shape: [4], data_offsets: [0, 4] }, b: { dtype: "U8", shape: [4], data_offsets: [far, far + 4] } });
    const path = writeRawSafetensors(tmp("huge"), header, new Uint8Array([1, 2, 3, 4]), { pad: false });
    const dataStart = 8 + header.length;
    truncateSync(path, dataStart + far + 4);
    const fd = openSync(path, "r+");
    writeSync(fd, new Uint8Array([5, 6, 7, 8]), 0, 4, dataStart + far);
    closeSync(fd);
    const file = readSafetensors(path);
    expect(file.map).toBeNull();
    expect([...file.tensors.get("a")!.data]).toEqual([1, 2, 3, 4]);
    expect([...file.tensors.get("b")!.data]).toEqual([5, 6, 7, 8]);
    expect(file.tensors.get("b")!.offset).toBe(dataStart + far);
    rmSync(path);
  });

  test("rewriting a mapped file leaves the old mapping intact (rename, never truncate)", () => {
    const path = tmp("rewrite");
    writeSafetensors(path, {}, [{ name: "x", dtype: "U8", shape: [4], data: new Uint8Array([1, 2, 3, 4]) }]);
    const old = readSafetensors(path);
    writeSafetensors(path, {}, [{ name: "x", dtype: "U8", shape: [2], data: new Uint8Array([8, 9]) }]);
    expect([...old.tensors.get("x")!.data]).toEqual([1, 2, 3, 4]);
    expect([...readSafetensors(path).tensors.get("x")!.data]).toEqual([8, 9]);
  });

  test("a write cut short leaves no file: killed mid-write, or failing, the directory holds only what it held", () => {
    const dir = join(testTempDir(), `st-cut-${n++}`);
    mkdirSync(dir);
    const out = join(dir, "out.safetensors");
    // A writer that kills itself (as Ctrl-C or the OOM killer would) after its first tensor.
    const script = `
      import { writeSafetensorsStream } from ${JSON.stringify(join(import.meta.dir, "../../src/model/safetensors.ts"))};
      const specs = [{ name: "a", dtype: "U8", shape: [1 << 20] }, { name: "b", dtype: "U8", shape: [8] }];
      writeSafetensorsStream(${JSON.stringify(out)}, {}, specs, (t, i, write) => {
        if (i === 1) process.kill(process.pid, "SIGKILL");
        write(new Uint8Array(t.shape[0]).fill(7));
      });`;
    const r = Bun.spawnSync([process.execPath, "-e", script], { stderr: "pipe" });
    expect(r.signalCode).toBe("SIGKILL");
    expect(readdirSync(dir)).toEqual([]);
    const specs = [{ name: "a", dtype: "U8" as const, shape: [4] }];
    expect(() => writeSafetensorsStream(out, {}, specs, () => { throw new ModelFormatError("the data failed"); })).toThrow(/the data failed/);
    expect(readdirSync(dir)).toEqual([]);
    writeSafetensorsStream(out, {}, specs, (_, __, write) => write(new Uint8Array(4)));
    expect(readdirSync(dir)).toEqual(["out.safetensors"]);
  });

  test("writer rejects data of the wrong size, duplicate names and non-string metadata", () => {
    const path = tmp("badwrite");
    expect(() => writeSafetensors(path, {}, [{ name: "x", dtype: "F16", shape: [3], data: new Uint8Array(5) }])).toThrow(
      /tensor "x": F16 \[3\] needs 6 bytes, data has 5/,
    );
    const t = { name: "x", dtype: "U8" as const, shape: [1], data: new Uint8Array(1) };
    expect(() => writeSafetensors(path, {}, [t, t])).toThrow(/tensor "x": duplicate name/);
    expect(() => writeSafetensors(path, { a: 1 as unknown as string }, [t])).toThrow(/__metadata__.a must be a string/);
  });
});

describe("safetensors validation: every bad file is a ModelFormatError naming the problem", () => {
  test("missing file", () => {
    expectBad(join(testTempDir(), "does-not-exist.safetensors"), /cannot open/);
  });

  test("empty and truncated files", () => {
    const empty = tmp("empty");
    writeFileSync(empty, new Uint8Array(0));
    expectBad(empty, /truncated file: 0 bytes/);
    const short = tmp("short");
    writeFileSync(short, new Uint8Array(5));
    expectBad(short, /truncated file: 5 bytes/);
  });

  test("header length past the end of the file", () => {
    expectBad(rawFile({}, undefined, { len: 1000n }), /header length 1000 runs past the end/);
    expectBad(rawFile({}, undefined, { len: 0xffffffffffffffffn }), /header length \d+ runs past the end/);
  });

  test("a header length over the format's 100 MB limit", () => {
    // Sparse: the length fits the file, not the limit.
    const path = tmp("len-limit");
    const len = new Uint8Array(8);
    new DataView(len.buffer).setBigUint64(0, 150_000_000n, true);
    writeFileSync(path, len);
    truncateSync(path, 150_000_100);
    expectBad(path, /header length 150000000 exceeds the format's 100 MB limit/);
  });

  test("a key repeated at any depth: JSON.parse would keep one of them silently", () => {
    const data = new Uint8Array(8);
    const w = JSON.stringify(goodTensor);
    expectBad(rawFile(null, data, { text: `{"w":${w},"w":${w}}` }), /header repeats the key "w" \(duplicate keys are ambiguous\)/);
    expectBad(rawFile(null, data, { text: `{"__metadata__":{"a":"1","\\u0061":"2"},"w":${w}}` }), /header repeats the key "a"/);
    expectBad(rawFile(null, data, { text: `{"w":{"dtype":"F16","dtype":"F16","shape":[2,2],"data_offsets":[0,8]}}` }), /repeats the key "dtype"/);
    // The same name in different objects, and strings that look like keys, are fine.
    const ok = `{"__metadata__":{"w":"{\\"w\\":1,"},"w":${w}}`;
    expect(readSafetensors(rawFile(null, data, { text: ok })).metadata.w).toBe('{"w":1,');
  });

  test("header that is not JSON, not UTF-8 or not an object", () => {
    expectBad(rawFile(null, undefined, { text: '{"a": ' }), /header is not valid JSON/);
    const bad = rawFile(null, undefined, { text: '{"a":"\xff"}' });
    const bytes = readFileSync(bad);
    bytes[bytes.indexOf(0xc3)] = 0xff; // break the UTF-8 encoding of \xff
    writeFileSync(bad, bytes);
    expectBad(bad, /not valid UTF-8/);
    expectBad(rawFile([1, 2]), /header must be a JSON object/);
  });

  test("a header's top level is capped as it is scanned: entries, and bytes per entry; refused in well under a second, without parsing it", () => {
    const w = JSON.stringify(goodTensor);
    const entries = (n: number) => `{${Array.from({ length: n }, (_, i) => `"t${i}":${w}`).join(",")}}`;
    expectBad(rawFile(null, undefined, { text: entries(65_537) }), /header has more than 65536 entries/);
    expectBad(rawFile(null, undefined, { text: `{"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8],"junk":"${"x".repeat(70_000)}"}}` }), /the entry "w" is over 65536 bytes/);
    // A 60 MB header of a million junk entries: refused at entry 65,537, its memory never more than the mapping.
    const junk = rawFile(null, undefined, { text: `{${Array.from({ length: 1_000_000 }, (_, i) => `"k${i}":[${"0,".repeat(25)}0]`).join(",")}}` });
    expect(readFileSync(junk).length).toBeGreaterThan(50_000_000);
    const t0 = performance.now();
    expectBad(junk, /header has more than 65536 entries/);
    expect(performance.now() - t0).toBeLessThan(1000); // generous: about 20 ms
    // The metadata entry is capped only by the header's own limit (a model's tokenizer lives there).
    const big = { __metadata__: { tokenizer_json: "x".repeat(200_000) }, w: goodTensor };
    expect(readSafetensors(rawFile(big, new Uint8Array(8))).metadata.tokenizer_json).toHaveLength(200_000);
  });

  test("__metadata__ must be an object of strings", () => {
    expectBad(rawFile({ __metadata__: "x" }), /__metadata__ must be an object/);
    expectBad(rawFile({ __metadata__: { dim: 64 } }), /__metadata__\.dim must be a string, got 64/);
  });

  test("values nested deeper than JSON.stringify can write are shown cut short", () => {
    // JSON.parse reads 200,000 levels; JSON.stringify of them throws a RangeError.
    const deep = (n: number) => `${"[".repeat(n)}${"]".repeat(n)}`;
    const deepObject = (n: number) => `${'{"a":'.repeat(n)}1${"}".repeat(n)}`;
    const n = 200_000;
    expectBad(rawFile(null, undefined, { text: deep(n) }), /header must be a JSON object, got \[{57}\.\.\.$/);
    expectBad(rawFile(null, undefined, { text: `{"__metadata__":{"dim":${deepObject(n)}}}` }), /__metadata__\.dim must be a string, got (\{"a":){11}\{"\.\.\.$/);
    // A tensor's entry may hold 64 KiB at most: 30,000 levels.
    expectBad(rawFile(null, undefined, { text: `{"w":{"dtype":"F16","shape":${deep(30_000)},"data_offsets":[0,0]}}` }), /tensor "w": shape \[{57}\.\.\. has a dimension that is not a non-negative integer: \[{57}\.\.\.$/);
  });

  test("tensor entries: not an object, bad dtype, bad shape, bad offsets", () => {
    const data = new Uint8Array(8);
    expectBad(rawFile({ w: 3 }, data), /tensor "w": entry must be an object/);
    expectBad(rawFile({ w: { ...goodTensor, dtype: "F17" } }, data), /tensor "w": dtype "F17" is not a safetensors dtype/);
    expectBad(rawFile({ w: { ...goodTensor, dtype: undefined } }, data), /tensor "w": dtype/);
    expectBad(rawFile({ w: { ...goodTensor, shape: "2x2" } }, data), /tensor "w": shape must be an array/);
    expectBad(rawFile({ w: { ...goodTensor, shape: [2, -2] } }, data), /tensor "w": shape \[2,-2\] has a dimension/);
    expectBad(rawFile({ w: { ...goodTensor, shape: [2, 1.5] } }, data), /tensor "w": shape/);
    expectBad(rawFile({ w: { ...goodTensor, data_offsets: [0] } }, data), /tensor "w": data_offsets must be \[begin, end\]/);
    expectBad(rawFile({ w: { ...goodTensor, data_offsets: [8, 0] } }, data), /tensor "w": data_offsets \[8, 0\] end before/);
  });

  test("shape and byte size disagree", () => {
    expectBad(
      rawFile({ w: { ...goodTensor, shape: [2, 3] } }, new Uint8Array(12)),
      /tensor "w": data_offsets \[0, 8\] span 8 bytes but F16 \[2,3\] needs 12/,
    );
  });

  test("offsets past the end of the data (a truncated file)", () => {
    const path = tmp("trunc");
    writeSafetensors(path, {}, [
      { name: "a", dtype: "U8", shape: [8], data: new Uint8Array(8) },
      { name: "b", dtype: "F32", shape: [4], data: new Uint8Array(16) },
    ]);
    truncateSync(path, readFileSync(path).length - 3);
    expectBad(path, /tensor "b": data_offsets \[8, 24\] run past the end of the data region \(21 bytes; file truncated\?\)/);
  });

  test("overlapping tensors", () => {
    expectBad(
      rawFile(
        {
          a: { dtype: "U8", shape: [8], data_offsets: [0, 8] },
          b: { dtype: "U8", shape: [4], data_offsets: [4, 8] },
        },
        new Uint8Array(8),
      ),
      /tensor "b": data_offsets \[4, 8\] overlap tensor "a" \[0, 8\]/,
    );
  });

  test("tensors listed out of offset order are fine when they do not overlap", () => {
    const file = readSafetensors(
      rawFile(
        {
          late: { dtype: "U8", shape: [2], data_offsets: [2, 4] },
          early: { dtype: "U8", shape: [2], data_offsets: [0, 2] },
        },
        new Uint8Array([1, 2, 3, 4]),
      ),
    );
    expect([...file.tensors.get("late")!.data]).toEqual([3, 4]);
    expect([...file.tensors.get("early")!.data]).toEqual([1, 2]);
  });
});
