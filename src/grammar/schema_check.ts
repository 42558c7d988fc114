// What a JSON Schema may say before it reaches the grammar engine: every
// keyword is one the engine honours or an annotation that constrains
// nothing; anything else is refused naming the keyword and where it is
// (a JSON pointer into the schema), never silently dropped. The engine
// itself reports the features it would ignore among the keywords it knows
// (a warning, refused by src/grammar/engine.ts), so this list is the
// keywords it does not look at at all (docs/structured-output.md has both).

/** A schema the engine cannot honour; `pointer` is where (JSON pointer, "" for the root). */
export class SchemaError extends Error {
  constructor(
    message: string,
    readonly pointer: string,
  ) {
    super(message);
  }
}

/** Keywords the engine turns into grammar. */
const HONOURED = new Set([
  "type",
  "enum",
  "const",
  "properties",
  "required",
  "additionalProperties",
  "patternProperties",
  "propertyNames",
  "minProperties",
  "maxProperties",
  "unevaluatedProperties",
  "items",
  "prefixItems",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "pattern",
  "format",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
  "multipleOf",
  "anyOf",
  "oneOf",
  "allOf",
  "$ref",
  "$defs",
  "definitions",
]);

/** Keywords that constrain no value (annotations, identifiers). */
const ANNOTATIONS = new Set(["title", "description", "$schema", "$id", "id", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly"]);

/** `format` values the engine turns into grammar (others it would ignore). */
export const FORMATS = new Set([
  "date-time",
  "date",
  "time",
  "duration",
  "email",
  "hostname",
  "ipv4",
  "ipv6",
  "uri",
  "uri-reference",
  "uri-template",
  "uuid",
  "json-pointer",
  "relative-json-pointer",
]);

/** Keywords whose value is a map of names to schemas, an array of schemas, or one schema. */
const SCHEMA_MAPS = new Set(["properties", "patternProperties", "$defs", "definitions"]);
const SCHEMA_ARRAYS = new Set(["anyOf", "oneOf", "allOf", "prefixItems"]);
const SCHEMA_VALUES = new Set(["additionalProperties", "propertyNames", "unevaluatedProperties", "items"]);

/** Deepest nesting of subschemas taken. */
const MAX_DEPTH = 64;

const escapePointer = (key: string) => key.replace(/~/g, "~0").replace(/\//g, "~1");

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** Throws SchemaError at the first thing in `schema` the engine cannot honour. */
export function checkSchema(schema: unknown): void {
  if (!isObject(schema)) throw new SchemaError(`a schema must be a JSON object, got ${schema === null ? "null" : Array.isArray(schema) ? "an array" : typeof schema}`, "");
  checkNode(schema, "", 0);
}

function checkNode(node: unknown, at: string, depth: number): void {
  if (typeof node === "boolean") return; // true: anything, false: nothing
  if (!isObject(node)) throw new SchemaError("a subschema must be an object or a boolean", at);
  if (depth > MAX_DEPTH) throw new SchemaError(`subschemas are nested more than ${MAX_DEPTH} deep`, at);
  for (const [key, value] of Object.entries(node)) {
    const here = `${at}/${escapePointer(key)}`;
    if (ANNOTATIONS.has(key)) continue;
    if (!HONOURED.has(key)) throw new SchemaError(`the keyword "${key}" is not supported`, here);
    if (SCHEMA_MAPS.has(key)) {
      if (!isObject(value)) throw new SchemaError(`"${key}" must be an object of schemas`, here);
      for (const [name, sub] of Object.entries(value)) checkNode(sub, `${here}/${escapePointer(name)}`, depth + 1);
    } else if (SCHEMA_ARRAYS.has(key)) {
      if (!Array.isArray(value) || value.length === 0) throw new SchemaError(`"${key}" must be a non-empty array of schemas`, here);
      value.forEach((sub, i) => checkNode(sub, `${here}/${i}`, depth + 1));
    } else if (SCHEMA_VALUES.has(key)) {
      if (key === "items" && Array.isArray(value)) throw new SchemaError('"items" as an array (a tuple) is not supported: use "prefixItems"', here);
      checkNode(value, here, depth + 1);
    } else {
      checkValue(key, value, here);
    }
  }
}

function checkValue(key: string, value: unknown, at: string): void {
  if (key === "format" && (typeof value !== "string" || !FORMATS.has(value)))
    throw new SchemaError(`the format ${JSON.stringify(value)} is not supported (supported: ${[...FORMATS].join(", ")})`, at);
  if ((key === "exclusiveMinimum" || key === "exclusiveMaximum") && typeof value !== "number")
    throw new SchemaError(`"${key}" must be a number (the boolean form of draft 4 is not supported)`, at);
  if (key === "$ref" && (typeof value !== "string" || !value.startsWith("#")))
    throw new SchemaError(`only references within the schema ("#...") are supported, got ${JSON.stringify(value)}`, at);
}
