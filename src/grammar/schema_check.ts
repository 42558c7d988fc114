// What a JSON Schema may say before it reaches the grammar engine. A
// validation keyword of JSON Schema that the engine does not honour, or
// honours only in part, is refused naming the keyword and where it is (a
// JSON pointer into the schema), never silently dropped; so are the uses of
// honoured keywords the engine gets wrong (measured against a validator,
// docs/structured-output.md): a format it only approximates, a pattern that
// could match a character JSON must escape, a combinator beside other
// keywords. Keywords outside JSON Schema's vocabularies ("x-...", a
// project's own) constrain nothing, as in every validator, and are passed
// over. The engine itself reports the features it would ignore among the
// keywords it honours (a warning, refused by src/grammar/engine.ts).

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
  "anyOf",
  "allOf",
  "$ref",
  "$defs",
  "definitions",
]);

/** JSON Schema's validation keywords (drafts 4 to 2020-12) the engine does not honour. */
const REFUSED = new Set([
  "not",
  "if",
  "then",
  "else",
  "uniqueItems",
  "contains",
  "minContains",
  "maxContains",
  "additionalItems",
  "unevaluatedItems",
  "dependencies",
  "dependentRequired",
  "dependentSchemas",
  "contentSchema",
  "$dynamicRef",
  "$recursiveRef",
  // honoured as anyOf: a value matching two branches would pass
  "oneOf",
  // ignored
  "multipleOf",
]);

/** Keywords that hold subschemas and nothing else: allowed beside a combinator. */
const CONTAINERS = new Set(["$defs", "definitions"]);

/** Combinators: the engine honours them only without other keywords beside them. */
const COMBINATORS = new Set(["anyOf", "allOf"]);

/**
 * `format` values whose grammar is exact (each value it allows passes a
 * validator's check): the others the engine checks for their syntax only
 * (a date-time on February 31, an IPv4 address with a leading zero).
 */
export const FORMATS = new Set(["uuid", "uri-reference", "json-pointer", "relative-json-pointer"]);

/** Keywords whose value is a map of names to schemas, an array of schemas, or one schema. */
const SCHEMA_MAPS = new Set(["properties", "patternProperties", "$defs", "definitions"]);
const SCHEMA_ARRAYS = new Set(["anyOf", "allOf", "prefixItems"]);
const SCHEMA_VALUES = new Set(["additionalProperties", "propertyNames", "unevaluatedProperties", "items"]);

/** Deepest nesting of subschemas taken. */
const MAX_DEPTH = 64;

const escapePointer = (key: string) => key.replace(/~/g, "~0").replace(/\//g, "~1");

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** Throws SchemaError at the first thing in `schema` the engine cannot honour, wherever it is used from (a reference's target included). */
export function checkSchema(schema: unknown): void {
  if (!isObject(schema)) throw new SchemaError(`a schema must be a JSON object, got ${schema === null ? "null" : Array.isArray(schema) ? "an array" : typeof schema}`, "");
  checkNode(schema, "", 0);
  // A reference may point anywhere in the document, even under a key that is
  // no keyword (passed over above): each target is checked as a schema too.
  const done = new Set<string>([""]);
  for (let unchecked = references(schema); unchecked.length > 0; ) {
    const ref = unchecked.pop() as string;
    if (done.has(ref)) continue;
    done.add(ref);
    const target = resolvePointer(schema, ref);
    if (target === undefined) throw new SchemaError(`the reference "#${ref}" points to nothing`, ref);
    checkNode(target, ref, 0);
    unchecked.push(...references(target));
  }
}

/** The JSON pointers (without "#") of every "$ref" in a value. */
function references(value: unknown): string[] {
  const out: string[] = [];
  const walk = (v: unknown) => {
    if (Array.isArray(v)) v.forEach(walk);
    else if (isObject(v))
      for (const [k, x] of Object.entries(v)) {
        if (k === "$ref" && typeof x === "string" && x.startsWith("#")) out.push(decodeURIComponent(x.slice(1)));
        else walk(x);
      }
  };
  walk(value);
  return out;
}

function resolvePointer(root: unknown, pointer: string): unknown {
  if (pointer === "") return root;
  let at: unknown = root;
  for (const raw of pointer.replace(/^\//, "").split("/")) {
    const key = raw.replace(/~1/g, "/").replace(/~0/g, "~");
    at = Array.isArray(at) ? at[Number(key)] : isObject(at) ? at[key] : undefined;
    if (at === undefined) return undefined;
  }
  return at;
}

function checkNode(node: unknown, at: string, depth: number): void {
  if (typeof node === "boolean") return; // true: anything, false: nothing
  if (!isObject(node)) throw new SchemaError("a subschema must be an object or a boolean", at);
  if (depth > MAX_DEPTH) throw new SchemaError(`subschemas are nested more than ${MAX_DEPTH} deep`, at);
  const combinator = Object.keys(node).find((k) => COMBINATORS.has(k));
  const beside = Object.keys(node).filter((k) => HONOURED.has(k) && !CONTAINERS.has(k) && k !== combinator);
  if (combinator && beside.length > 0)
    throw new SchemaError(`"${combinator}" beside ${beside.map((k) => `"${k}"`).join(", ")} is not supported: put those keywords in each of its schemas`, at);
  checkValuesOfType(node, at);
  checkRequired(node, at);
  for (const [key, value] of Object.entries(node)) {
    const here = `${at}/${escapePointer(key)}`;
    if (REFUSED.has(key)) throw new SchemaError(`the keyword "${key}" is not supported`, here);
    if (!HONOURED.has(key)) continue; // an annotation, or no keyword of JSON Schema: it constrains nothing
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
  if (key === "$ref" && (typeof value !== "string" || !value.startsWith("#")))
    throw new SchemaError(`only references within the schema ("#...") are supported, got ${JSON.stringify(value)}`, at);
  if (key === "pattern") checkPattern(value, at);
  // The engine's grammar for a negative or fractional bound lets numbers out of range, or not numbers, through.
  if (BOUNDS.has(key) && !(typeof value === "number" && Number.isInteger(value) && value >= 0))
    throw new SchemaError(`"${key}" ${JSON.stringify(value)} is not supported: only bounds that are whole numbers of at least 0 are`, at);
}

const BOUNDS = new Set(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]);

/** A required property the schema does not describe: the engine writes only described properties, so it would leave it out. */
function checkRequired(node: Record<string, unknown>, at: string): void {
  if (!Array.isArray(node.required)) return;
  const described = isObject(node.properties) ? node.properties : {};
  const missing = node.required.find((name) => typeof name !== "string" || !(name in described));
  if (missing !== undefined) throw new SchemaError(`the required property ${JSON.stringify(missing)} is not among "properties"`, at);
}

/** The JSON Schema types a value has ("integer" values are numbers too). */
function typesOf(v: unknown): string[] {
  if (v === null) return ["null"];
  if (Array.isArray(v)) return ["array"];
  if (typeof v === "number") return Number.isInteger(v) ? ["integer", "number"] : ["number"];
  return [typeof v];
}

/** `enum` and `const` beside `type`: the engine writes the listed values whatever the type, so each must be of it. */
function checkValuesOfType(node: Record<string, unknown>, at: string): void {
  if (node.type === undefined) return;
  const types = Array.isArray(node.type) ? node.type : [node.type];
  const values = [...(Array.isArray(node.enum) ? node.enum : []), ...("const" in node ? [node.const] : [])];
  const stray = values.find((v) => !typesOf(v).some((t) => types.includes(t)));
  if (stray !== undefined) throw new SchemaError(`the value ${JSON.stringify(stray)} is not of the type ${JSON.stringify(node.type)}: no value can satisfy both`, at);
}

/** Characters JSON writes escaped inside a string: the engine matches a pattern against the raw text, so these must not match. */
const mustEscape = (c: number) => c < 0x20 || c === 0x22 || c === 0x5c;

/** Escapes that stand for a class containing a character JSON escapes (or any character). */
const WIDE_ESCAPES = new Set(["s", "S", "W", "D", "n", "r", "t", "f", "v", "0", "b", "B", "p", "P", "c", "k"]);

/**
 * A pattern the engine matches correctly: none of its characters, classes
 * or escapes may match a quote, a backslash or a control character (JSON
 * text holds them escaped, the engine would write them as they are), and
 * so no `.`, negated class or wide escape.
 */
function checkPattern(value: unknown, at: string): void {
  if (typeof value !== "string") throw new SchemaError('"pattern" must be a string', at);
  const refuse = (what: string): never => {
    throw new SchemaError(`the pattern ${JSON.stringify(value)} is not supported: ${what} may match a character JSON escapes (a quote, a backslash, a control character)`, at);
  };
  let inClass = false;
  let prev = -1; // the last single character in a class, for ranges
  for (let i = 0; i < value.length; i++) {
    let c = value.charCodeAt(i);
    const ch = value[i];
    if (ch === "\\") {
      const e = value[++i] ?? "";
      if (WIDE_ESCAPES.has(e)) refuse(`\\${e}`);
      if (e === "x" || e === "u") {
        const hex = /^[0-9a-fA-F]+/.exec(value.slice(i + 1, i + 1 + (e === "x" ? 2 : 4)))?.[0] ?? "";
        c = Number.parseInt(hex || "0", 16);
        i += hex.length;
      } else if (e === "d" || e === "w") {
        prev = -1;
        continue;
      } else c = value.charCodeAt(i);
      if (mustEscape(c)) refuse(`the escape \\${e}`);
    } else if (!inClass && ch === "[") {
      inClass = true;
      if (value[i + 1] === "^") refuse("a negated class");
      prev = -1;
      continue;
    } else if (inClass && ch === "]") {
      inClass = false;
      continue;
    } else if (inClass && ch === "-" && prev >= 0 && i + 1 < value.length && value[i + 1] !== "]") {
      const hi = value[i + 1] === "\\" ? value.charCodeAt(i + 2) : value.charCodeAt(i + 1);
      for (let x = prev; x <= hi; x++) if (mustEscape(x)) refuse(`the range ${String.fromCharCode(prev)}-${String.fromCharCode(hi)}`);
      continue;
    } else if (!inClass && ch === ".") {
      refuse("`.`");
    } else if (mustEscape(c)) {
      refuse(`the character ${JSON.stringify(ch)}`);
    }
    if (inClass) prev = c;
  }
}
