// The maintained JSON Schema validator the structured-output tests judge
// outputs with: Ajv (draft 2020-12 or draft 7 by the schema's $schema) with
// ajv-formats. Draft 4 schemas are read as draft 7, their `id` keywords
// (draft 4's $id) left out: Ajv has no draft 4 mode.
import Ajv from "ajv";
import Ajv2020 from "ajv/dist/2020";
import addFormats from "ajv-formats";

/** A copy of a schema without its $schema and draft 4 `id`s (a string `id` is one; a property named id is an object). */
function withoutIds(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(withoutIds);
  if (typeof v !== "object" || v === null) return v;
  return Object.fromEntries(Object.entries(v).filter(([k, x]) => !(k === "id" && typeof x === "string") && k !== "$schema").map(([k, x]) => [k, withoutIds(x)]));
}

/** Null when `value` satisfies `schema`, else the validator's first complaint. */
export function schemaErrors(schema: Record<string, unknown>, value: unknown): string | null {
  const draft = String(schema.$schema ?? "");
  const ajv = /2019|2020/.test(draft) ? new Ajv2020({ strict: false }) : new Ajv({ strict: false });
  addFormats(ajv);
  return ajv.validate(withoutIds(schema) as object, value) ? null : JSON.stringify(ajv.errors?.[0]);
}
