// A request's output format (docs/structured-output.md): `response_format`
// as OpenAI defines it (text, json_object, json_schema with name, schema and
// strict) on every generation route, and on the native and extended routes
// also `grammar`, an EBNF grammar. Read here into the format the engine
// constrains the generation to, compiled once per distinct source (the
// server's FormatCompiler); whatever cannot be honoured is a 400 naming the
// field and, for a schema, the place in it.
import type { OutputFormat } from "../engine/types.ts";
import { type FormatCompiler, FormatError, type FormatRequest } from "../grammar/formats.ts";
import { badRequest } from "./errors.ts";
import type { AppDeps } from "./generation.ts";

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** The format `response_format` asks for; null for plain text. */
function readResponseFormat(value: unknown): FormatRequest | null {
  if (value == null) return null;
  if (!isObject(value) || typeof value.type !== "string")
    throw badRequest('`response_format` must be an object with a `type`: "text", "json_object" or "json_schema"', "response_format");
  if (value.type === "text") return null;
  if (value.type === "json_object") return { kind: "json_object" };
  if (value.type !== "json_schema")
    throw badRequest(`\`response_format.type\` must be "text", "json_object" or "json_schema", got ${JSON.stringify(value.type)}`, "response_format.type");
  const spec = value.json_schema;
  if (!isObject(spec)) throw badRequest("`response_format.json_schema` must be an object with the `schema`", "response_format.json_schema");
  if (spec.name !== undefined && typeof spec.name !== "string")
    throw badRequest("`response_format.json_schema.name` must be a string", "response_format.json_schema.name");
  if (spec.strict != null && typeof spec.strict !== "boolean")
    throw badRequest("`response_format.json_schema.strict` must be true or false", "response_format.json_schema.strict");
  if (spec.schema === undefined) throw badRequest("`response_format.json_schema.schema` is required", "response_format.json_schema.schema");
  return { kind: "json_schema", schema: spec.schema, strict: spec.strict === true };
}

/**
 * The output format of a request's `response_format` and `grammar` (the
 * latter on the native and extended routes only); undefined for free text.
 * Without a model loaded nothing is compiled: the route's 503 follows.
 */
export async function requestFormat(deps: AppDeps, responseFormat: unknown, grammar?: string | null): Promise<OutputFormat | undefined> {
  const fromSchema = readResponseFormat(responseFormat);
  if (fromSchema && grammar != null)
    throw badRequest("send one of `response_format` and `grammar`: both constrain the output", "grammar");
  const request: FormatRequest | null = grammar != null ? { kind: "ebnf", grammar } : fromSchema;
  const param = grammar != null ? "grammar" : request?.kind === "json_schema" ? "response_format.json_schema.schema" : "response_format";
  if (request === null || !deps.engine) return undefined;
  const compiler: FormatCompiler | null | undefined = deps.formats;
  if (!compiler)
    throw badRequest(`\`${param}\` is not supported by this server: ${deps.formatsUnavailable ?? "structured output is not available"}`, param, "unsupported_parameter");
  try {
    return await compiler.format(request);
  } catch (e) {
    if (e instanceof FormatError) throw badRequest(`\`${param}\` cannot be honoured: ${e.message}`, param, "invalid_response_format");
    throw e;
  }
}
