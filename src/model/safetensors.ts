// safetensors reader and writer.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header,
// then the data region. The header maps tensor names to
// {dtype, shape, data_offsets: [begin, end]} (offsets relative to the data
// region) plus an optional "__metadata__" object of string values.
//
// The reader mmaps the file and hands out views into the mapping: weights
// are never copied. Every field of the header is validated before any view
// is made, and each failure is a ModelFormatError naming the file and the
// field or tensor at fault. A file larger than one ArrayBuffer may be (4 GiB
// in JavaScriptCore) is mapped the same way, and each tensor viewed alone.

import { dlopen, toArrayBuffer } from "bun:ffi";
import { closeSync, constants as fsConstants, fstatSync, openSync, renameSync, statSync, unlinkSync, writeSync } from "node:fs";
import { dirname } from "node:path";

// ---- errors ----

/** The one error type of src/model: a bad file, a bad header, bad options. */
export class ModelFormatError extends Error {
  override name = "ModelFormatError";

  /**
   * @param reason what is wrong without the file's name, for callers that
   * name the file themselves (the message is `${file}: ${reason}`).
   */
  constructor(
    message: string,
    readonly reason: string = message,
  ) {
    super(message);
  }

  /** An error about the file (or image) `where`. */
  static about(where: string, reason: string): ModelFormatError {
    return new ModelFormatError(`${where}: ${reason}`, reason);
  }
}

// ---- dtypes ----

/** Element sizes of every dtype the safetensors format defines. */
export const DTYPE_SIZES = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E5M2: 1,
  F8_E4M3: 1,
  I16: 2,
  U16: 2,
  F16: 2,
  BF16: 2,
  I32: 4,
  U32: 4,
  F32: 4,
  I64: 8,
  U64: 8,
  F64: 8,
} as const;

export type Dtype = keyof typeof DTYPE_SIZES;

export function isDtype(s: unknown): s is Dtype {
  return typeof s === "string" && Object.prototype.hasOwnProperty.call(DTYPE_SIZES, s);
}

// ---- types ----

export interface TensorView {
  dtype: Dtype;
  shape: number[];
  /** Where the tensor's bytes start in the file (data region start + data_offsets[0]). */
  offset: number;
  /** The tensor's bytes: a view into the file mapping (read-only by contract). */
  data: Uint8Array;
}

export interface SafetensorsFile {
  path: string;
  /** `__metadata__`, or {} when the header has none. */
  metadata: Record<string, string>;
  /** In header order. */
  tensors: Map<string, TensorView>;
  /** Byte offset of the data region in the file (8 + header length). */
  dataStart: number;
  /** The whole file, mapped; null for a file larger than one view may be (MAX_VIEW_BYTES), whose tensors are viewed one by one. */
  map: Uint8Array | null;
}

/** The largest ArrayBuffer, hence view, the engine makes (JavaScriptCore: 4 GiB). */
export const MAX_VIEW_BYTES = 2 ** 32;

/** A mapped file: its size and views of its byte ranges (each at most MAX_VIEW_BYTES). */
interface Mapping {
  size: number;
  whole: Uint8Array | null;
  view(offset: number, length: number): Uint8Array;
}

function wholeMapping(map: Uint8Array): Mapping {
  return { size: map.byteLength, whole: map, view: (offset, length) => new Uint8Array(map.buffer, map.byteOffset + offset, length) };
}

export interface TensorToWrite {
  name: string;
  dtype: Dtype;
  shape: number[];
  data: Uint8Array;
}

/** The format caps the header at 100 MB; a larger claim is a corrupt file. */
const MAX_HEADER_BYTES = 100 * 1024 * 1024;
/**
 * Caps on a header's top level, checked as it is scanned, before any of it
 * is parsed: a 60 MB header of a million junk entries cost over a gigabyte
 * when parsed whole. The largest published checkpoints hold a few thousand
 * tensors per file, each entry about a hundred bytes; __metadata__ (the
 * loopserve format keeps the tokenizer there) has only the header's cap.
 */
const MAX_HEADER_ENTRIES = 65_536;
const MAX_ENTRY_BYTES = 64 * 1024;

// ---- mapping ----

/** The libc calls Bun does not expose, opened on first use. */
const libcSymbols = {
  mmap: { args: ["ptr", "u64", "i32", "i32", "i32", "i64"], returns: "u64" },
  linkat: { args: ["i32", "ptr", "i32", "ptr", "i32"], returns: "i32" },
} as const;
let libcLib: ReturnType<typeof dlopen<typeof libcSymbols>>["symbols"] | null = null;
function libc(): NonNullable<typeof libcLib> {
  libcLib ??= dlopen("libc.so.6", libcSymbols).symbols;
  return libcLib;
}

/**
 * Maps a file through libc, read through a read-only fd: for files this
 * process may read but not write (Bun.mmap opens files read-write: EACCES
 * on a model owned by another user), and for files larger than one view.
 * The mapping is never unmapped; model files are mapped once per process.
 */
function libcMapping(path: string, size: number): Mapping {
  const fd = openSync(path, "r");
  try {
    // Private copy-on-write: the fd is read-only, yet a stray write into a
    // view lands in this process's copy instead of crashing it, exactly as
    // with the Bun.mmap path.
    const PROT_READ_WRITE = 3;
    const MAP_PRIVATE = 2;
    const p = libc().mmap(null, BigInt(size), PROT_READ_WRITE, MAP_PRIVATE, fd, 0n) as bigint;
    if (p === 0xffffffffffffffffn || p === 0n) throw new Error("mmap failed");
    const base = Number(p);
    if (size <= MAX_VIEW_BYTES) return wholeMapping(new Uint8Array(toArrayBuffer(base, 0, size)));
    return { size, whole: null, view: (offset, length) => new Uint8Array(toArrayBuffer(base + offset, 0, length)) };
  } finally {
    closeSync(fd);
  }
}

function mapFile(path: string): Mapping {
  let size: number;
  try {
    const st = statSync(path);
    if (!st.isFile()) throw ModelFormatError.about(path, "not a regular file");
    size = st.size;
  } catch (e) {
    if (e instanceof ModelFormatError) throw e;
    throw ModelFormatError.about(path, `cannot open: ${(e as Error).message}`);
  }
  // Bun.mmap rejects empty files; anything under 8 bytes is truncated anyway.
  if (size < 8) {
    throw ModelFormatError.about(path, `truncated file: ${size} bytes, need at least 8 for the header length`);
  }
  const viaLibc = () => {
    try {
      return libcMapping(path, size);
    } catch (e) {
      throw ModelFormatError.about(path, `cannot map: ${(e as Error).message}`);
    }
  };
  if (size > MAX_VIEW_BYTES) return viaLibc();
  try {
    // MAP_PRIVATE: a stray write into a view can never reach the file.
    return wholeMapping(Bun.mmap(path, { shared: false }));
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code === "EACCES" || code === "EPERM" || code === "EROFS") return viaLibc();
    throw ModelFormatError.about(path, `cannot map: ${(e as Error).message}`);
  }
}

// ---- reader ----

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * A value for an error message: its JSON text, cut to 60 characters. Written
 * out only as far as needed: a hostile header's value may be megabytes long
 * or nested far deeper than JSON.stringify can go (JSON.parse reads 200,000
 * levels; JSON.stringify throws a RangeError, slowly, long before that).
 */
function describe(v: unknown): string {
  const MAX = 60;
  let out = "";
  const emit = (s: string) => {
    out += s;
    return out.length <= MAX;
  };
  const walk = (x: unknown): boolean => {
    if (Array.isArray(x)) {
      if (!emit("[")) return false;
      for (let i = 0; i < x.length; i++) if ((i > 0 && !emit(",")) || !walk(x[i])) return false;
      return emit("]");
    }
    if (typeof x === "object" && x !== null) {
      if (!emit("{")) return false;
      let first = true;
      for (const [k, y] of Object.entries(x)) {
        if ((!first && !emit(",")) || !emit(`${JSON.stringify(k)}:`) || !walk(y)) return false;
        first = false;
      }
      return emit("}");
    }
    return emit(typeof x === "bigint" ? String(x) : (JSON.stringify(x) ?? String(x)));
  };
  walk(v);
  return out.length > MAX ? `${out.slice(0, MAX - 3)}...` : out;
}

/**
 * The first key an object of `json` (well-formed: JSON.parse read it)
 * repeats, at any depth, or null. JSON.parse silently keeps the last value
 * of a repeated key, so a header naming a tensor twice would mean whichever
 * entry a reader happened to keep. A flat scan with an explicit stack: the
 * header may nest far deeper than recursion can go.
 */
function firstRepeatedKey(json: string): string | null {
  const open: (Set<string> | null)[] = []; // per open object its keys; null for an array
  let atKey = false; // the next string is an object key
  for (let i = 0; i < json.length; i++) {
    const c = json[i];
    if (c === '"') {
      let end = i + 1;
      while (json[end] !== '"') end += json[end] === "\\" ? 2 : 1;
      const keys = open[open.length - 1];
      if (atKey && keys) {
        const key = JSON.parse(json.slice(i, end + 1)) as string;
        if (keys.has(key)) return key;
        keys.add(key);
        atKey = false;
      }
      i = end;
    } else if (c === "{" || c === "[") {
      open.push(c === "{" ? new Set() : null);
      atKey = c === "{";
    } else if (c === "}" || c === "]") {
      open.pop();
      atKey = false;
    } else if (c === ",") {
      atKey = open[open.length - 1] !== null;
    }
  }
  return null;
}

/** Where one entry of a header's top level lies: its key (a JSON string) and its value, as byte ranges of the header. */
interface HeaderEntry {
  key: Uint8Array;
  value: Uint8Array;
}

const isJsonSpace = (b: number) => b === 0x20 || b === 0x09 || b === 0x0a || b === 0x0d;

/**
 * The top-level entries of a header, found by one scan of its bytes that
 * parses nothing: strings are skipped to their closing quote, nested values
 * to their closing bracket (JSON.parse of each entry's bytes checks the
 * rest). The caps on entries and on an entry's bytes are checked as the
 * scan goes, so a hostile header is refused long before it is read through.
 */
function headerEntries(h: Uint8Array, fail: (msg: string) => never): HeaderEntry[] {
  let i = 0;
  const space = () => {
    while (i < h.length && isJsonSpace(h[i])) i++;
  };
  const expect = (byte: number, what: string) => {
    space();
    if (h[i] !== byte) fail(`header is not valid JSON: expected ${what} at byte ${i} of the header`);
    i++;
  };
  /** Skips the value at i, failing once it runs past `cap` bytes. */
  const skipValue = (cap: number, what: string) => {
    const start = i;
    const over = () => fail(`${what} is over ${cap} bytes: more than a header entry may have`);
    let depth = 0;
    do {
      if (i - start > cap) over();
      const b = h[i];
      if (b === 0x22) {
        for (i++; i < h.length && h[i] !== 0x22; i++) {
          if (h[i] === 0x5c) i++;
          if (i - start > cap) over();
        }
        if (i >= h.length) fail(`header is not valid JSON: ${what} is not closed`);
      } else if (b === 0x7b || b === 0x5b) depth++;
      else if (b === 0x7d || b === 0x5d) depth--;
      else if (depth === 0 && (b === 0x2c || isJsonSpace(b))) break;
      i++;
    } while (i < h.length && depth > 0);
    if (depth > 0) fail(`header is not valid JSON: ${what} is not closed`);
    if (i - start > cap) over();
  };
  space();
  if (h[i] !== 0x7b) {
    const text = new TextDecoder().decode(h.subarray(i, i + 64)).trimEnd();
    fail(`header must be a JSON object, got ${text.length > 60 ? `${text.slice(0, 57)}...` : text}`);
  }
  i++;
  const entries: HeaderEntry[] = [];
  space();
  if (h[i] === 0x7d) i++;
  else
    for (;;) {
      if (entries.length === MAX_HEADER_ENTRIES) fail(`header has more than ${MAX_HEADER_ENTRIES} entries`);
      space();
      const keyStart = i;
      if (h[i] !== 0x22) fail(`header is not valid JSON: expected a key at byte ${i} of the header`);
      skipValue(MAX_ENTRY_BYTES, `a key at byte ${keyStart} of the header`);
      const key = h.subarray(keyStart, i);
      expect(0x3a, '":"');
      space();
      const valueStart = i;
      const metadata = new TextDecoder().decode(key) === '"__metadata__"';
      skipValue(metadata ? MAX_HEADER_BYTES : MAX_ENTRY_BYTES, `the entry ${new TextDecoder().decode(key.subarray(0, 60))}`);
      entries.push({ key, value: h.subarray(valueStart, i) });
      space();
      if (h[i] === 0x2c) {
        i++;
        continue;
      }
      expect(0x7d, '"," or "}"');
      break;
    }
  space();
  if (i < h.length) fail(`header is not valid JSON: unexpected data after the object at byte ${i} of the header`);
  return entries;
}

/** Reads and validates a safetensors file; tensor data are views into an mmap. */
export function readSafetensors(path: string): SafetensorsFile {
  return parseMapping(mapFile(path), path);
}

/**
 * Validates a safetensors image already in memory (used by readSafetensors;
 * also handy for tests). `where` names the source in error messages.
 */
export function parseSafetensors(map: Uint8Array, where: string): SafetensorsFile {
  return parseMapping(wholeMapping(map), where);
}

function parseMapping(map: Mapping, where: string): SafetensorsFile {
  const fail = (msg: string): never => {
    throw ModelFormatError.about(where, msg);
  };
  const size = map.size;
  if (size < 8) fail(`truncated file: ${size} bytes, need at least 8 for the header length`);

  const head = map.view(0, 8);
  const headerLen64 = new DataView(head.buffer, head.byteOffset, 8).getBigUint64(0, true);
  if (headerLen64 > BigInt(size - 8)) {
    fail(`header length ${headerLen64} runs past the end of the file (${size - 8} bytes follow the length field)`);
  }
  const headerLen = Number(headerLen64);
  if (headerLen > MAX_HEADER_BYTES) fail(`header length ${headerLen} exceeds the format's 100 MB limit`);
  if (headerLen < 2) fail(`header length ${headerLen} is too short for a JSON object`);
  const dataStart = 8 + headerLen;
  const dataLen = size - dataStart;

  const entries = headerEntries(map.view(8, headerLen), fail);
  const utf8 = new TextDecoder("utf-8", { fatal: true });
  const decode = (bytes: Uint8Array): string => {
    try {
      return utf8.decode(bytes);
    } catch {
      return fail("header is not valid UTF-8");
    }
  };
  const header = new Map<string, unknown>();
  for (const e of entries) {
    let name: string;
    try {
      name = JSON.parse(decode(e.key)) as string;
    } catch (err) {
      return fail(`header is not valid JSON: ${(err as Error).message}`);
    }
    if (header.has(name)) fail(`header repeats the key ${describe(name)} (duplicate keys are ambiguous)`);
    const text = decode(e.value);
    try {
      header.set(name, JSON.parse(text));
    } catch (err) {
      return fail(`header is not valid JSON: ${(err as Error).message}`);
    }
    const repeated = firstRepeatedKey(text);
    if (repeated !== null) fail(`header repeats the key ${describe(repeated)} (duplicate keys are ambiguous)`);
  }

  const metadata: Record<string, string> = {};
  const rawMeta = header.get("__metadata__");
  if (rawMeta !== undefined) {
    if (!isPlainObject(rawMeta)) fail(`__metadata__ must be an object of strings, got ${describe(rawMeta)}`);
    for (const [k, v] of Object.entries(rawMeta as Record<string, unknown>)) {
      if (typeof v !== "string") fail(`__metadata__.${k} must be a string, got ${describe(v)}`);
      metadata[k] = v as string;
    }
  }

  const tensors = new Map<string, TensorView>();
  const spans: { name: string; begin: number; end: number }[] = [];
  for (const [name, entry] of header) {
    if (name === "__metadata__") continue;
    const t = `tensor "${name}"`;
    if (!isPlainObject(entry)) fail(`${t}: entry must be an object, got ${describe(entry)}`);
    const e = entry as Record<string, unknown>;
    if (!isDtype(e.dtype)) {
      fail(`${t}: dtype ${describe(e.dtype)} is not a safetensors dtype (${Object.keys(DTYPE_SIZES).join(", ")})`);
    }
    const dtype = e.dtype as Dtype;
    if (!Array.isArray(e.shape)) fail(`${t}: shape must be an array of integers, got ${describe(e.shape)}`);
    const shape = e.shape as unknown[];
    let count = 1;
    for (const d of shape) {
      if (typeof d !== "number" || !Number.isSafeInteger(d) || d < 0) {
        fail(`${t}: shape ${describe(shape)} has a dimension that is not a non-negative integer: ${describe(d)}`);
      }
      count *= d as number;
      if (!Number.isSafeInteger(count)) fail(`${t}: shape ${describe(shape)} has too many elements`);
    }
    const offs = e.data_offsets;
    if (
      !Array.isArray(offs) ||
      offs.length !== 2 ||
      !offs.every((o) => typeof o === "number" && Number.isSafeInteger(o) && o >= 0)
    ) {
      fail(`${t}: data_offsets must be [begin, end] non-negative integers, got ${describe(offs)}`);
    }
    const [begin, end] = offs as [number, number];
    if (end < begin) fail(`${t}: data_offsets [${begin}, ${end}] end before they begin`);
    const expected = count * DTYPE_SIZES[dtype];
    if (end - begin !== expected) {
      fail(
        `${t}: data_offsets [${begin}, ${end}] span ${end - begin} bytes but ${dtype} ${describe(shape)} needs ${expected}`,
      );
    }
    if (end > dataLen) {
      fail(`${t}: data_offsets [${begin}, ${end}] run past the end of the data region (${dataLen} bytes; file truncated?)`);
    }
    if (end - begin > MAX_VIEW_BYTES) fail(`${t}: ${end - begin} bytes, more than one view may hold (${MAX_VIEW_BYTES})`);
    spans.push({ name, begin, end });
    tensors.set(name, {
      dtype,
      shape: shape as number[],
      offset: dataStart + begin,
      data: map.view(dataStart + begin, end - begin),
    });
  }

  // Tensors may not share bytes. Gaps are tolerated (this writer pads each
  // tensor to 8 bytes; the reference library writes none).
  spans.sort((a, b) => a.begin - b.begin || a.end - b.end);
  for (let i = 1; i < spans.length; i++) {
    const prev = spans[i - 1];
    const cur = spans[i];
    if (cur.begin < prev.end) {
      fail(
        `tensor "${cur.name}": data_offsets [${cur.begin}, ${cur.end}] overlap tensor "${prev.name}" [${prev.begin}, ${prev.end}]`,
      );
    }
  }

  return { path: where, metadata, tensors, dataStart, map: map.whole };
}

// ---- writer ----

function align8(n: number): number {
  return Math.ceil(n / 8) * 8;
}

/**
 * Writes a safetensors file: header padded with spaces so the data region
 * starts 8-byte aligned, tensors in the given order, each starting 8-byte
 * aligned (zero padding between them only when a tensor's size is not a
 * multiple of 8: the Python/Rust safetensors library rejects such gaps, and
 * fp16 tensors whose last dimension is a multiple of 4 never need one).
 *
 * Written to a temporary file and renamed into place, so a process that has
 * the old file mapped keeps a valid mapping (truncating a mapped file would
 * crash it).
 */
export function writeSafetensors(path: string, metadata: Record<string, string>, tensors: TensorToWrite[]): number {
  for (const t of tensors) {
    const bytes = tensorBytes(path, t);
    if (t.data.byteLength !== bytes) {
      throw new ModelFormatError(
        `${path}: tensor "${t.name}": ${t.dtype} ${describe(t.shape)} needs ${bytes} bytes, data has ${t.data.byteLength}`,
      );
    }
  }
  return writeSafetensorsStream(path, metadata, tensors, (_t, i, write) => write(tensors[i].data));
}

/** A tensor's name, dtype and shape: its header entry without the offsets. */
export interface TensorSpec {
  name: string;
  dtype: Dtype;
  shape: number[];
}

/** Bytes of a tensor's data; throws on a bad dtype or dimension. */
function tensorBytes(path: string, t: TensorSpec): number {
  const what = `tensor "${t.name}"`;
  if (!isDtype(t.dtype)) throw new ModelFormatError(`${path}: ${what}: unknown dtype ${describe(t.dtype)}`);
  let count = 1;
  for (const d of t.shape) {
    if (!Number.isSafeInteger(d) || d < 0) throw new ModelFormatError(`${path}: ${what}: bad dimension ${describe(d)} in shape`);
    count *= d;
  }
  return count * DTYPE_SIZES[t.dtype];
}

/**
 * Writes a safetensors file whose tensor data come from `fill`, one tensor
 * at a time in the given order, so a file larger than memory streams through
 * (src/model/import_hf.ts). The header is computed from the specs and
 * written first; `fill(t, i, write)` then writes exactly tensor i's bytes, in
 * as many pieces as it likes. Same layout and atomic replacement as
 * writeSafetensors (which is this with each tensor's data in one piece).
 */
export function writeSafetensorsStream(
  path: string,
  metadata: Record<string, string>,
  tensors: TensorSpec[],
  fill: (t: TensorSpec, index: number, write: (buf: Uint8Array) => void) => void,
): number {
  const fail = (msg: string): never => {
    throw new ModelFormatError(`${path}: ${msg}`);
  };
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length > 0) {
    for (const [k, v] of Object.entries(metadata)) {
      if (typeof v !== "string") fail(`__metadata__.${k} must be a string, got ${describe(v)}`);
    }
    header["__metadata__"] = metadata;
  }
  let offset = 0;
  const placed: { begin: number; bytes: number }[] = [];
  for (const t of tensors) {
    const what = `tensor "${t.name}"`;
    if (t.name === "__metadata__" || t.name.length === 0) fail(`${what}: reserved or empty name`);
    if (Object.prototype.hasOwnProperty.call(header, t.name)) fail(`${what}: duplicate name`);
    const bytes = tensorBytes(path, t);
    const begin = align8(offset);
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [begin, begin + bytes] };
    placed.push({ begin, bytes });
    offset = begin + bytes;
  }

  let json = new TextEncoder().encode(JSON.stringify(header));
  const padded = align8(json.length);
  if (padded !== json.length) {
    const p = new Uint8Array(padded).fill(0x20);
    p.set(json);
    json = p;
  }
  const lenField = new Uint8Array(8);
  new DataView(lenField.buffer).setBigUint64(0, BigInt(json.length), true);

  return writeFileAtomically(path, (writeAll) => {
    writeAll(lenField);
    writeAll(json);
    let pos = 0;
    const zeros = new Uint8Array(8);
    tensors.forEach((t, i) => {
      const { begin, bytes } = placed[i];
      if (begin > pos) writeAll(zeros.subarray(0, begin - pos));
      let written = 0;
      fill(t, i, (buf) => {
        if (written + buf.byteLength > bytes) fail(`tensor "${t.name}": given more than its ${bytes} bytes`);
        writeAll(buf);
        written += buf.byteLength;
      });
      if (written !== bytes) fail(`tensor "${t.name}": given ${written} of its ${bytes} bytes`);
      pos = begin + bytes;
    });
    return 8 + json.length + pos;
  });
}

// open(2)'s O_TMPFILE (with O_DIRECTORY, as the kernel defines it) and linkat(2)'s constants.
const O_TMPFILE = 0o20200000;
const AT_FDCWD = -100;
const AT_SYMLINK_FOLLOW = 0x400;

/** A file without a name in dir (O_TMPFILE), open for writing; -1 where the file system has none. */
function openNameless(dir: string): number {
  try {
    return openSync(dir, O_TMPFILE | fsConstants.O_WRONLY, 0o666);
  } catch {
    return -1;
  }
}

/**
 * Writes a file whose name appears only once it is complete, replacing any
 * file there: a process that has the old file mapped keeps a valid mapping,
 * and a reader never sees half a file. The data go to a file without a
 * name (O_TMPFILE), so a write cut short (an error, Ctrl-C, a kill) leaves
 * nothing behind; the finished file gets a uniquely named temporary name,
 * renamed into place. Where the file system has no nameless files, the
 * temporary name is made first (and removed on an error, though not by a
 * signal). `write` returns the size it meant to write; a short write is an
 * error. Returns the bytes written.
 */
export function writeFileAtomically(path: string, write: (writeAll: (buf: Uint8Array) => void) => number): number {
  const tmp = `${path}.tmp-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  let fd = -1;
  try {
    fd = openNameless(dirname(path));
    const nameless = fd >= 0;
    if (!nameless) fd = openSync(tmp, "w");
    const writeAll = (buf: Uint8Array) => {
      let done = 0;
      while (done < buf.length) done += writeSync(fd, buf, done, buf.length - done);
    };
    const total = write(writeAll);
    const written = fstatSync(fd).size;
    if (written !== total) throw new ModelFormatError(`${path}: short write: ${written} of ${total} bytes`);
    if (nameless && libc().linkat(AT_FDCWD, Buffer.from(`/proc/self/fd/${fd}\0`), AT_FDCWD, Buffer.from(`${tmp}\0`), AT_SYMLINK_FOLLOW) !== 0) {
      throw new ModelFormatError(`${path}: cannot name the written file ${tmp}`);
    }
    closeSync(fd);
    fd = -1;
    renameSync(tmp, path);
    return total;
  } catch (e) {
    if (fd >= 0) closeSync(fd);
    try {
      unlinkSync(tmp);
    } catch {
      // never named, or already renamed
    }
    if (e instanceof ModelFormatError) throw e;
    throw new ModelFormatError(`${path}: cannot write: ${(e as Error).message}`);
  }
}
