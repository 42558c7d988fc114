// The kernel library's structs (kernels/loopserve.h) as bytes, read and
// written by field name at the offsets build.ts generated from the header
// (abi.generated.ts, LS_STRUCTS): the binding never spells an offset.
import { LS_STRUCTS } from "./abi.generated.ts";

export type StructName = keyof typeof LS_STRUCTS;
type Fields<S extends StructName> = (typeof LS_STRUCTS)[S]["fields"];
export type FieldName<S extends StructName> = keyof Fields<S> & string;

const SCALAR_BYTES: Record<string, number> = { i32: 4, u32: 4, f32: 4, u64: 8, f64: 8 };

/** One struct (or a struct-typed field's element) over a byte buffer. */
export class StructView<S extends StructName> {
  readonly bytes: Uint8Array;
  private readonly view: DataView;

  /** A view of `name` at byte `base` of `bytes` (default: a fresh zeroed struct). */
  constructor(
    readonly name: S,
    bytes: Uint8Array = new Uint8Array(LS_STRUCTS[name].size),
    private readonly base = 0,
  ) {
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  private at(field: FieldName<S>, index: number): { offset: number; type: string } {
    const f = (LS_STRUCTS[this.name].fields as Record<string, { offset: number; type: string; count: number }>)[field];
    if (!(index >= 0 && index < f.count)) throw new RangeError(`${this.name}.${field}[${index}]: the field has ${f.count} elements`);
    const size = SCALAR_BYTES[f.type] ?? LS_STRUCTS[f.type as StructName].size;
    return { offset: this.base + f.offset + index * size, type: f.type };
  }

  set(field: FieldName<S>, value: number | bigint, index = 0): this {
    const { offset, type } = this.at(field, index);
    if (type === "i32") this.view.setInt32(offset, Number(value), true);
    else if (type === "u32") this.view.setUint32(offset, Number(value), true);
    else if (type === "f32") this.view.setFloat32(offset, Number(value), true);
    else if (type === "u64") this.view.setBigUint64(offset, BigInt(value), true);
    else if (type === "f64") this.view.setFloat64(offset, Number(value), true);
    else throw new TypeError(`${this.name}.${field} is a ${type}: use member()`);
    return this;
  }

  /** Sets several scalar fields at once. */
  fill(values: Partial<Record<FieldName<S>, number | bigint>>): this {
    for (const [field, value] of Object.entries(values)) this.set(field as FieldName<S>, value as number | bigint);
    return this;
  }

  /** A scalar field (u64 as a bigint). */
  get(field: FieldName<S>, index = 0): number | bigint {
    const { offset, type } = this.at(field, index);
    if (type === "i32") return this.view.getInt32(offset, true);
    if (type === "u32") return this.view.getUint32(offset, true);
    if (type === "f32") return this.view.getFloat32(offset, true);
    if (type === "u64") return this.view.getBigUint64(offset, true);
    if (type === "f64") return this.view.getFloat64(offset, true);
    throw new TypeError(`${this.name}.${field} is a ${type}: use member()`);
  }

  /** Element `index` of a struct-typed field, viewing the same bytes. */
  member<T extends StructName>(field: FieldName<S>, type: T, index = 0): StructView<T> {
    const f = this.at(field, index);
    if (f.type !== type) throw new TypeError(`${this.name}.${field} is a ${f.type}, not a ${type}`);
    return new StructView(type, this.bytes, f.offset);
  }
}
