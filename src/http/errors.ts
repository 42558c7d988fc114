// Every HTTP error, in one place: OpenAI's body shape
// {"error": {"message", "type", "param", "code"}} and one map from error kind
// to status (docs/http.md#errors):
//   422  the body has the wrong shape (missing property, wrong type)
//   400  a value out of range / not allowed, unreadable JSON, a request the
//        engine refuses, prompt + max_tokens over the sequence limit
//   401  API key missing or wrong (SERVICE_API_KEY)
//   403  a browser request from an origin, or to a Host, that is not allowed
//   404  unknown route
//   408  request body stalled for SERVICE_BODY_TIMEOUT_MS
//   413  request body over SERVICE_MAX_BODY_BYTES
//   499  the client went away while its prompt was tokenized (only the log sees it)
//   503  model not loaded (or shutting down), queue full, latency target
//   500  only a genuine bug: logged with its stack (src/log.ts)
import { CloneType, type TObject } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import type { ValueError } from "@sinclair/typebox/errors";
import { ValueErrorType } from "@sinclair/typebox/errors";
import { EngineRequestError } from "../engine/errors.ts";
import { log } from "../log.ts";
import { currentRequest, requestPath } from "./request_context.ts";
import type { ErrorBody, ErrorType } from "../wire/responses.ts";

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: ErrorType,
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
  }

  body(): ErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }

  toResponse(): Response {
    return Response.json(this.body(), { status: this.status, headers: extraHeaders(this) });
  }
}

function extraHeaders(error: HttpError): Record<string, string> {
  if (error.status === 503) return { "retry-after": String(retryAfterSeconds(error.code)) };
  // The rest of a stalled body is never read: the connection cannot carry another request.
  if (error.status === 408) return { connection: "close" };
  return {};
}

// Retry-After on every 503, by reason: a full queue or an unmet latency
// target frees up within a second; a draining server is replaced by its
// orchestrator within seconds; a model that failed to load needs an operator.
const RETRY_AFTER_S: Record<string, number> = { shutting_down: 5, model_not_loaded: 60 };
const RETRY_AFTER_DEFAULT_S = 1;

function retryAfterSeconds(code: string | null): number {
  return (code !== null ? RETRY_AFTER_S[code] : undefined) ?? RETRY_AFTER_DEFAULT_S;
}

// ---- constructors for the kinds handlers raise ----

export const badRequest = (message: string, param: string | null = null, code: string | null = "invalid_value") =>
  new HttpError(400, message, "invalid_request_error", param, code);

export const unprocessable = (message: string, param: string | null = null, code: string | null = "invalid_type") =>
  new HttpError(422, message, "invalid_request_error", param, code);

export const unavailable = (message: string, code: string) => new HttpError(503, message, "service_unavailable_error", null, code);

export const notFound = (message: string) => new HttpError(404, message, "not_found_error", null, "not_found");

/** OpenAI's answer to a missing or wrong key: 401, code invalid_api_key. */
export const unauthorized = (message: string) => new HttpError(401, message, "invalid_request_error", null, "invalid_api_key");

export const forbidden = (message: string, code: string) => new HttpError(403, message, "invalid_request_error", null, code);
/** nginx's 499: the client closed the connection before the answer; nobody reads it, the log line does. */
export const clientClosed = (message: string) => new HttpError(499, message, "invalid_request_error", null, "client_closed_request");
export const requestTimeout = (message: string) => new HttpError(408, message, "invalid_request_error", null, "request_timeout");
export const payloadTooLarge = (message: string) => new HttpError(413, message, "invalid_request_error", null, "request_too_large");

/** Request-validation failures that are values, not shapes: "`x` must be at most 8192, got 9000". */
export function outOfRange(param: string, message: string): HttpError {
  return badRequest(`\`${param}\` ${message}`, param);
}

// ---- TypeBox validation errors → 400 or 422 ----

type Kind = "shape" | "bound";

interface Classified {
  kind: Kind;
  error: HttpError;
}

/** "/messages/0/role" → "messages[0].role"; the root is null. */
export function paramName(path: string): string | null {
  if (path === "" || path === "/") return null;
  return path
    .split("/")
    .slice(1)
    .map((s) => s.replaceAll("~1", "/").replaceAll("~0", "~"))
    .reduce((acc, seg) => (/^[0-9]+$/.test(seg) ? `${acc}[${seg}]` : acc ? `${acc}.${seg}` : seg), "");
}

export function valueKind(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  switch (typeof v) {
    case "number":
    case "boolean":
      return String(v);
    case "string":
      return "a string";
    case "object":
      return "an object";
    default:
      return typeof v;
  }
}

const SINGULAR: Record<string, string> = {
  string: "a string",
  integer: "an integer",
  number: "a number",
  boolean: "a boolean",
  object: "an object",
  null: "null",
};

// A readable description of what a schema accepts; null-only branches are
// left out because null just means "unset" on optional fields.
function describeSchema(schema: Record<string, unknown>, plural = false): string {
  if (Array.isArray(schema.anyOf)) {
    const parts = (schema.anyOf as Record<string, unknown>[])
      .filter((s) => s.type !== "null")
      .map((s) => describeSchema(s, plural));
    return parts.length <= 1 ? (parts[0] ?? "null") : `${parts.slice(0, -1).join(", ")} or ${parts.at(-1)}`;
  }
  if ("const" in schema) return JSON.stringify(schema.const);
  const type = String(schema.type);
  if (type === "array") {
    const items = schema.items as Record<string, unknown> | undefined;
    const what = items ? `array${plural ? "s" : ""} of ${describeSchema(items, true)}` : `array${plural ? "s" : ""}`;
    return plural ? what : `an ${what}`;
  }
  if (plural) return type === "null" ? "null" : `${type}s`;
  return SINGULAR[type] ?? type;
}

function name(path: string): string {
  const p = paramName(path);
  return p === null ? "request body" : `\`${p}\``;
}

/** A number's bounds: the schema keyword each error type names, and how the message says it (the same for numbers and integers). */
const NUMBER_BOUNDS = new Map<ValueErrorType, [keyword: string, says: string]>([
  [ValueErrorType.NumberMaximum, ["maximum", "must be at most"]],
  [ValueErrorType.IntegerMaximum, ["maximum", "must be at most"]],
  [ValueErrorType.NumberMinimum, ["minimum", "must be at least"]],
  [ValueErrorType.IntegerMinimum, ["minimum", "must be at least"]],
  [ValueErrorType.NumberExclusiveMaximum, ["exclusiveMaximum", "must be less than"]],
  [ValueErrorType.IntegerExclusiveMaximum, ["exclusiveMaximum", "must be less than"]],
  [ValueErrorType.NumberExclusiveMinimum, ["exclusiveMinimum", "must be greater than"]],
  [ValueErrorType.IntegerExclusiveMinimum, ["exclusiveMinimum", "must be greater than"]],
  [ValueErrorType.NumberMultipleOf, ["multipleOf", "must be a multiple of"]],
  [ValueErrorType.IntegerMultipleOf, ["multipleOf", "must be a multiple of"]],
]);

function boundMessage(e: ValueError): string | null {
  const s = e.schema as Record<string, unknown>;
  const got = `got ${valueKind(e.value)}`;
  const number = NUMBER_BOUNDS.get(e.type);
  if (number) return `${number[1]} ${s[number[0]]}, ${got}`;
  switch (e.type) {
    case ValueErrorType.StringMinLength:
      return s.minLength === 1 ? "must not be empty" : `must be at least ${s.minLength} characters long`;
    case ValueErrorType.StringMaxLength:
      return `must be at most ${s.maxLength} characters long`;
    case ValueErrorType.StringPattern:
      return `must match the pattern /${s.pattern}/`;
    case ValueErrorType.StringFormat:
      return `must be in the ${s.format} format`;
    case ValueErrorType.ArrayMinItems:
      return s.minItems === 1 ? "must not be empty" : `must have at least ${s.minItems} items`;
    case ValueErrorType.ArrayMaxItems:
      return `must have at most ${s.maxItems} items, got ${(e.value as unknown[]).length}`;
    case ValueErrorType.ArrayUniqueItems:
      return "must not contain duplicates";
    case ValueErrorType.Literal:
      return `must be ${JSON.stringify(s.const)}, got ${JSON.stringify(e.value)}`;
    default:
      return null;
  }
}

function shapeError(e: ValueError, message: string): Classified {
  const code = e.type === ValueErrorType.ObjectRequiredProperty ? "missing_required_parameter" : "invalid_type";
  return { kind: "shape", error: unprocessable(`${name(e.path)} ${message}`, paramName(e.path), code) };
}

function classify(e: ValueError): Classified {
  if (e.type === ValueErrorType.ObjectRequiredProperty) return shapeError(e, "is required");
  if (e.type === ValueErrorType.Union) return classifyUnion(e);
  const bound = boundMessage(e);
  if (bound !== null) return { kind: "bound", error: outOfRange(paramName(e.path) ?? "body", bound) };
  return shapeError(e, `must be ${describeSchema(e.schema as Record<string, unknown>)}, got ${valueKind(e.value)}`);
}

// A union fails as a whole; it is a bound violation (400) when some branch
// matched the type and only broke a bound (e.g. `stop: [""]`, or a nullable
// number out of range), or when it is an enum (every branch a literal).
function classifyUnion(e: ValueError): Classified {
  const branches = e.errors.map((it) => [...it]);
  const schema = e.schema as Record<string, unknown>;
  const consts = (schema.anyOf as Record<string, unknown>[] | undefined)?.filter((s) => "const" in s) ?? [];
  if (consts.length > 0 && consts.length === (schema.anyOf as unknown[]).length) {
    const allowed = consts.map((s) => JSON.stringify(s.const)).join(", ");
    return { kind: "bound", error: outOfRange(paramName(e.path) ?? "body", `must be one of ${allowed}, got ${JSON.stringify(e.value)}`) };
  }
  for (const branch of branches) {
    const inner = branch.map(classify);
    if (inner.length > 0 && inner.every((c) => c.kind === "bound")) return inner[0];
  }
  return shapeError(e, `must be ${describeSchema(schema)}, got ${valueKind(e.value)}`);
}

/** The one error for a failed validation: a shape error wins over a bound error. */
export function fromValidation(errors: readonly ValueError[]): HttpError {
  const classified = errors.map(classify);
  const chosen = classified.find((c) => c.kind === "shape") ?? classified[0];
  return chosen?.error ?? unprocessable("request body is invalid");
}

// ---- validating a body as it was sent ----

/**
 * Route options that validate the body before Elysia sees it. Elysia 1.4
 * "cleans" a body (an exact mirror of the schema, dropping unknown fields)
 * *before* checking it, which turns a string sent for an object field into
 * {} (so `stream_options: "x"` would pass) and a string sent for an array of
 * objects into an array of its characters (so `messages: "hi"` would be
 * reported as `messages[0].role`). The transform hook runs first, on the
 * body as parsed; Elysia's own clean-and-check then only strips unknown
 * fields. The schema is compiled from a copy because Elysia marks the root
 * object it is given `additionalProperties: false`, and unknown fields are
 * accepted (and ignored) everywhere in this API.
 */
export function validatedBody<S extends TObject>(schema: S) {
  const check = TypeCompiler.Compile(CloneType(schema));
  return {
    body: schema,
    // An arrow function, not a method: Elysia reads each hook's source to
    // infer what it uses, and misreads a minified method (`transform({body}){`),
    // printing a multi-line warning into the log at the first request.
    transform: ({ body }: { body: unknown }) => {
      if (!check.Check(body)) throw fromValidation([...check.Errors(body)]);
    },
  };
}

// ---- the Elysia onError hook ----

interface ElysiaErrorContext {
  code: string | number;
  error: unknown;
  request: Request;
}

/** Maps anything thrown while handling a request to an error response. */
export function errorResponse({ code, error, request }: ElysiaErrorContext): Response {
  return toHttpError(code, error, request).toResponse();
}

/** The one mapping from anything thrown to an HTTP error (responses and in-stream error events). */
export function toHttpError(code: string | number, error: unknown, request: Request): HttpError {
  if (error instanceof HttpError) return error;
  if (error instanceof EngineRequestError) return badRequest(error.message, error.param, error.code ?? undefined);
  switch (code) {
    case "VALIDATION":
      return fromValidation((error as { all: ValueError[] }).all);
    case "PARSE": {
      const cause = (error as Error).cause;
      if (cause instanceof HttpError) return cause;
      return badRequest(`request body is not valid JSON: ${(cause as Error | undefined)?.message ?? "parse error"}`, null, "invalid_json");
    }
    case "NOT_FOUND": {
      const path = new URL(request.url).pathname;
      return notFound(`no route for ${request.method} ${path}`);
    }
  }
  log.fault(`internal error on ${request.method} ${requestPath(request)}`, error, { request_id: currentRequest()?.id ?? null });
  return new HttpError(500, `internal server error: ${(error as Error)?.message ?? String(error)}`, "server_error", null, "internal_error");
}
