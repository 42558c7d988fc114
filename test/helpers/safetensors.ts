// Raw safetensors images for tests that need files no writer makes: a header
// edited as a JS object (or given as text), the data region as bytes. The
// real writer (src/model/safetensors.ts) refuses to write what these tests
// feed the validator.
import { expect } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { ModelFormatError } from "../../src/model/safetensors.ts";

/** A header as JSON.parse reads it: tensor entries and __metadata__. */
export type RawHeader = Record<string, any>;

export interface RawParts {
  header: RawHeader;
  /** The data region. */
  data: Uint8Array;
  /** The whole file. */
  bytes: Uint8Array;
}

/** Header and data region of a well-formed file. */
export function readRawSafetensors(path: string): RawParts {
  const bytes = new Uint8Array(readFileSync(path));
  const len = Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true));
  return { header: JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + len))), data: bytes.subarray(8 + len), bytes };
}

export interface RawOptions {
  /** The 8-byte length field, instead of the header's true length. */
  len?: bigint;
  /** Pad the header with spaces to a multiple of 8 (as the writer does, so the data stay aligned); default true. */
  pad?: boolean;
}

/** A safetensors image: length field, header (an object, or exact text), data region. */
export function rawSafetensorsImage(header: RawHeader | string, data: Uint8Array = new Uint8Array(0), opts: RawOptions = {}): Uint8Array {
  const raw = new TextEncoder().encode(typeof header === "string" ? header : JSON.stringify(header));
  const text = new Uint8Array(opts.pad === false ? raw.length : Math.ceil(raw.length / 8) * 8).fill(0x20);
  text.set(raw);
  const out = new Uint8Array(8 + text.length + data.length);
  new DataView(out.buffer).setBigUint64(0, opts.len ?? BigInt(text.length), true);
  out.set(text, 8);
  out.set(data, 8 + text.length);
  return out;
}

/** Writes rawSafetensorsImage(header, data, opts) to path; returns path. */
export function writeRawSafetensors(path: string, header: RawHeader | string, data?: Uint8Array, opts?: RawOptions): string {
  writeFileSync(path, rawSafetensorsImage(header, data, opts));
  return path;
}

/** The message of the ModelFormatError that fn throws; the test fails when it throws anything else, or nothing. */
export function modelFormatMessage(fn: () => unknown): string {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(ModelFormatError);
  return (err as Error).message;
}
