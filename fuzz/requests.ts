// Property fuzzing of request bodies against a real server, with fast-check.
// Every route family gets bodies built from its own fields, each field either
// a plausible value or a hostile one (wrong type, huge or non-finite number,
// numeric-looking string, unicode, nested objects and arrays), plus unknown
// fields, missing required ones, whole bodies that are not objects or not
// JSON, odd Content-Types and clients that hang up mid-request.
//
// The property: no answer is a 5xx, a stream never carries a server_error
// event, and /healthz still answers 200 afterwards. The one 5xx the API
// defines for a well-formed request is 503 latency_target, the refusal of a
// request whose own slo_ms cannot be met (README, Scheduling): allowed only
// when the body set slo_ms.
//
// Bounds that keep the generators off problems fixed elsewhere: nesting at
// most 20 levels, prompts at most 4 KB, and the Host header left to fetch.
import fc from "fast-check";

/** One request as sent (and as saved under fuzz/regressions/requests/). */
export interface FuzzRequest {
  method: "GET" | "POST";
  path: string;
  /** null: no Content-Type header. */
  contentType: string | null;
  /** The body text exactly as sent; null for GET. */
  body: string | null;
  /** Milliseconds after which the client hangs up; null: reads the whole answer. */
  abortAfterMs: number | null;
}

// ---- JSON text with literals JSON.stringify never writes ----

/** A number literal spliced into the body text as is ("1e999" parses to Infinity). */
class RawNumber {
  constructor(readonly text: string) {}
}

function toJson(v: unknown): string {
  if (v instanceof RawNumber) return v.text;
  if (Array.isArray(v)) return `[${v.map(toJson).join(",")}]`;
  if (typeof v === "object" && v !== null) {
    return `{${Object.entries(v)
      .map(([k, x]) => `${JSON.stringify(k)}:${toJson(x)}`)
      .join(",")}}`;
  }
  return JSON.stringify(v) ?? "null";
}

// ---- values ----

const MAX_DEPTH = 20;
const MAX_PROMPT_BYTES = 4096;

const encoder = new TextEncoder();

/** Cuts a string to at most MAX_PROMPT_BYTES of UTF-8 (on a code point boundary). */
function clip(s: string): string {
  if (encoder.encode(s).length <= MAX_PROMPT_BYTES) return s;
  let out = "";
  let bytes = 0;
  for (const ch of s) {
    bytes += encoder.encode(ch).length;
    if (bytes > MAX_PROMPT_BYTES) break;
    out += ch;
  }
  return out;
}

const text = fc
  .oneof(
    fc.constantFrom("And God said unto Moses,", "The LORD is my shepherd;", "Hello!", " ", "\n", "<|endoftext|>", "😀", "\u0000"),
    fc.string({ maxLength: 200 }),
    fc.string({ unit: "grapheme", maxLength: 100 }),
    fc.string({ unit: "binary", maxLength: 100 }),
    fc.string({ unit: fc.constantFrom("a", "b", " ", "é", "\u{10ffff}", "\ud800", "'", "\\"), maxLength: 4096 }),
  )
  .map(clip);

const tokenIds = fc.array(fc.oneof(fc.integer({ min: 0, max: 50_256 }), fc.integer({ min: -5, max: 60_000 })), { maxLength: 64 });

/** A nested value: depth objects and arrays deep, at most MAX_DEPTH. */
const nested = fc
  .tuple(fc.integer({ min: 1, max: MAX_DEPTH }), fc.array(fc.boolean(), { minLength: MAX_DEPTH, maxLength: MAX_DEPTH }), fc.jsonValue({ maxDepth: 0 }))
  .map(([depth, kinds, leaf]) => {
    let v: unknown = leaf;
    for (let i = 0; i < depth; i++) v = kinds[i] ? { x: v } : [v];
    return v;
  });

const hugeNumber = fc.constantFrom(1e308, -1e308, Number.MAX_SAFE_INTEGER, 2 ** 53 + 2, -0, 5e-324, 0.5, -1, 2 ** 31, 2 ** 32, 2 ** 63, 1e21, -(2 ** 53));
const rawNumber = fc
  .constantFrom("1e999", "-1e999", "1E400", "-0.0", "123456789012345678901234567890", "1e-400", "9007199254740993")
  .map((t) => new RawNumber(t));
const numericString = fc.constantFrom("NaN", "Infinity", "-Infinity", "1e999", "nan", "0x10", "", "null", "true", "-0", " 1", "1_0", "８");

/** A value of the wrong kind, size or shape for whatever field it lands in. */
const hostile: fc.Arbitrary<unknown> = fc.oneof(
  fc.jsonValue({ maxDepth: 2 }),
  hugeNumber,
  rawNumber,
  numericString,
  fc.string({ unit: "binary", maxLength: 64 }),
  nested,
  fc.constant(null),
);

/** Mostly a plausible value, sometimes a hostile one (for fields inside fields). */
const field = (plausible: fc.Arbitrary<unknown>) => fc.oneof({ weight: 4, arbitrary: plausible }, { weight: 1, arbitrary: hostile });

/** A JSON Schema, plausible or hostile: keywords with values of any shape, patterns, references, nesting. */
const schemaKeyword = fc.constantFrom("type", "properties", "required", "items", "enum", "pattern", "format", "$ref", "anyOf", "oneOf", "minimum", "maxLength", "additionalProperties", "x-vendor");
const schemaLike: fc.Arbitrary<unknown> = fc.letrec<{ schema: unknown }>((tie) => ({
  schema: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    fc.constantFrom({ type: "string" }, { type: "integer", minimum: 0 }, { type: "string", pattern: "^[a-z]{2,5}$" }, { $ref: "#/$defs/x" }, { enum: ["a", 1, null] }, true),
    fc.dictionary(schemaKeyword, fc.oneof(tie("schema"), hostile, fc.array(tie("schema"), { maxLength: 3 }), text), { maxKeys: 4 }),
  ),
})).schema;

/** A response format: OpenAI's shapes, well formed or not. */
const responseFormat = fc.oneof(
  fc.record({ type: fc.constantFrom("text", "json_object") }),
  fc.record({ type: fc.constant("json_schema"), json_schema: fc.record({ name: text, schema: schemaLike, strict: field(fc.boolean()) }, { requiredKeys: [] }) }),
  hostile,
);

/** An EBNF grammar, well formed or not. */
const grammar = fc.oneof(fc.constantFrom('root ::= "yes" | "no"', "root ::= [0-9]+", "root ::= missing", 'root ::= "a"{2,3}'), text);

// ---- fields of each family (src/wire/requests.ts) ----

type Fields = Record<string, fc.Arbitrary<unknown>>;

const sampling: Fields = {
  max_tokens: fc.integer({ min: 1, max: 16 }),
  temperature: fc.oneof(fc.constant(0), fc.double({ min: 0, max: 2, noNaN: true })),
  top_p: fc.double({ min: 0, max: 1, noNaN: true }),
  stream: fc.boolean(),
  loops: fc.integer({ min: 1, max: 8 }),
  priority: fc.integer({ min: -1000, max: 1000 }),
  slo_ms: fc.integer({ min: 1000, max: 100_000 }),
};

const speculative: Fields = {
  draft_loops: fc.integer({ min: 1, max: 3 }),
  verify_loops: fc.integer({ min: 2, max: 8 }),
  draft_ahead: fc.integer({ min: 1, max: 16 }),
  K_branches: fc.integer({ min: 1, max: 16 }),
};

const native: Fields = {
  prompt: fc.oneof(text, tokenIds),
  ...sampling,
  top_k: fc.integer({ min: 0, max: 1000 }),
  repetition_penalty: fc.double({ min: 0.5, max: 2, noNaN: true }),
  sample_seed: fc.nat(),
  stop: fc.oneof(text, fc.array(text, { maxLength: 3 }), fc.array(fc.nat({ max: 50_300 }), { maxLength: 3 })),
  cache_window: fc.integer({ min: 0, max: 300 }),
  response_format: responseFormat,
  grammar,
};

const compat: Fields = {
  model: fc.constantFrom("demo", "loopserve", ""),
  ...sampling,
  max_completion_tokens: fc.integer({ min: 1, max: 16 }),
  n: fc.constant(1),
  stop: fc.oneof(text, fc.array(text, { maxLength: 3 })),
  stream_options: fc.record({ include_usage: field(fc.boolean()) }, { requiredKeys: [] }),
  seed: fc.nat(),
  presence_penalty: fc.double({ min: -2, max: 2, noNaN: true }),
  frequency_penalty: fc.double({ min: -2, max: 2, noNaN: true }),
  user: text,
};

/** Fields the OpenAI routes refuse, ignore (tool calling) or only partly support: only in mixed bodies. */
const compatRefused: Fields = {
  n: fc.integer({ min: 0, max: 4 }),
  logprobs: fc.boolean(),
  top_logprobs: fc.integer({ min: 0, max: 20 }),
  response_format: responseFormat,
  tools: fc.array(fc.record({ type: fc.constant("function") }), { maxLength: 1 }),
  suffix: text,
  best_of: fc.integer({ min: 0, max: 3 }),
};

const role = fc.oneof({ weight: 9, arbitrary: fc.constantFrom("system", "user", "assistant") }, { weight: 1, arbitrary: fc.constant("tool") });
const content = fc.oneof(
  text,
  fc.array(fc.record({ type: fc.constantFrom("text", "image_url"), text }, { requiredKeys: ["type"] }), { maxLength: 3 }),
  fc.constant(null),
);
/** A chat message: mostly well formed, sometimes with hostile or missing parts. */
const message = fc.oneof(
  { weight: 6, arbitrary: fc.record({ role, content }) },
  { weight: 1, arbitrary: fc.record({ role: field(role), content: field(content), name: field(text) }, { requiredKeys: [] }) },
);

const chat: Fields = { ...compat, messages: fc.array(message, { minLength: 1, maxLength: 4 }) };
const completion: Fields = {
  ...compat,
  prompt: fc.oneof(text, fc.array(text, { minLength: 1, maxLength: 3 }), tokenIds),
  echo: fc.boolean(),
};
const extended: Fields = {
  ...speculative,
  mode: fc.constantFrom("generate", "speculative", "tree_speculative"),
  cache_window: fc.integer({ min: 0, max: 300 }),
  repetition_penalty: fc.double({ min: 0.5, max: 2, noNaN: true }),
};

/** Each route: its fields, the ones it requires, the ones mixed bodies add. */
const ROUTES: [string, Fields, string[], Fields][] = [
  ["/generate", native, ["prompt"], {}],
  ["/generate/speculative", { ...native, ...speculative }, ["prompt"], {}],
  ["/generate/tree_speculative", { ...native, ...speculative }, ["prompt"], {}],
  ["/v1/chat/completions", chat, ["model", "messages"], compatRefused],
  ["/v1/completions", completion, ["model", "prompt"], compatRefused],
  ["/api/v0/chat/completions", { ...chat, ...extended }, ["model", "messages"], compatRefused],
  ["/api/v0/completions", { ...completion, ...extended }, ["model", "prompt"], compatRefused],
];

// ---- whole requests ----

const extraFields = fc.dictionary(fc.string({ maxLength: 12 }), hostile, { maxKeys: 3 });

const contentType = fc.oneof(
  { weight: 8, arbitrary: fc.constant("application/json") },
  { weight: 1, arbitrary: fc.constantFrom(null, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=utf-8", "multipart/form-data") },
);

/** One request in ten hangs up after 0-50 ms; the others read the whole answer. */
const hangUp = fc.oneof({ weight: 9, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.integer({ min: 0, max: 50 }) });

/**
 * A body of one route. Plausible: the required fields and any others, every
 * one a plausible value (many of these run a generation). Mixed: any subset
 * of the fields and of the refused ones, each plausible or hostile, and
 * unknown fields.
 */
function routeBody(fields: Fields, required: string[], refused: Fields): fc.Arbitrary<Record<string, unknown>> {
  const mixed = Object.fromEntries(Object.entries({ ...fields, ...refused }).map(([k, v]) => [k, field(v)]));
  return fc.oneof(
    fc.record(fields, { requiredKeys: required }),
    fc.tuple(fc.record(mixed, { requiredKeys: [] }), extraFields).map(([f, extra]) => ({ ...extra, ...f })),
  );
}

const postRequest: fc.Arbitrary<FuzzRequest> = fc.oneof(
  ...ROUTES.map(([path, fields, required, refused]) =>
    fc
      .record({ fields: routeBody(fields, required, refused), contentType, abortAfterMs: hangUp })
      .map(({ fields, contentType, abortAfterMs }): FuzzRequest => ({ method: "POST", path, contentType, body: toJson(fields), abortAfterMs })),
  ),
);

/** Bodies that are not a JSON object: other JSON values, cut-off or garbage text, nothing. */
const oddBody: fc.Arbitrary<FuzzRequest> = fc
  .record({
    path: fc.constantFrom(...ROUTES.map(([path]) => path)),
    body: fc.oneof(
      hostile.map(toJson),
      postRequest.chain((r) => fc.nat({ max: r.body!.length }).map((n) => r.body!.slice(0, n))),
      fc.string({ unit: "binary", maxLength: 200 }),
      fc.constantFrom("", " ", "{", "}", "[]", "null", '{"prompt":"a"', "\u0000"),
    ),
    contentType,
  })
  .map(({ path, body, contentType }) => ({ method: "POST" as const, path, contentType, body, abortAfterMs: null }));

/** Model lookups with odd ids, and the operational routes. */
const getRequest: fc.Arbitrary<FuzzRequest> = fc
  .tuple(fc.constantFrom("/v1/models/", "/api/v0/models/"), fc.string({ unit: "binary", maxLength: 40 }))
  .map(([prefix, id]) => ({ method: "GET" as const, path: prefix + encodeURIComponent(id), contentType: null, body: null, abortAfterMs: null }));

export const fuzzRequest: fc.Arbitrary<FuzzRequest> = fc.oneof(
  { weight: 12, arbitrary: postRequest },
  { weight: 2, arbitrary: oddBody },
  { weight: 1, arbitrary: getRequest },
);

// ---- sending and judging ----

export interface Outcome {
  /** null: the client hung up before the answer came. */
  status: number | null;
  /** What is wrong with the answer, if anything. */
  problem: string | null;
}

function errorCode(text: string): string | null {
  try {
    return (JSON.parse(text) as { error?: { code?: string } }).error?.code ?? null;
  } catch {
    return null;
  }
}

function setsSloMs(body: string | null): boolean {
  try {
    const v = JSON.parse(body ?? "") as Record<string, unknown>;
    return typeof v === "object" && v !== null && v.slo_ms !== undefined && v.slo_ms !== null;
  } catch {
    return false;
  }
}

/** Sends one request and judges the answer (not the server's health: see checkHealthy). */
export async function send(baseUrl: string, req: FuzzRequest): Promise<Outcome> {
  const abort = new AbortController();
  const timer = req.abortAfterMs === null ? null : setTimeout(() => abort.abort(), req.abortAfterMs);
  try {
    const headers: Record<string, string> = {};
    if (req.contentType !== null) headers["content-type"] = req.contentType;
    const res = await fetch(`${baseUrl}${req.path}`, { method: req.method, headers, body: req.body ?? undefined, signal: abort.signal });
    const text = await res.text();
    if (res.status >= 500) {
      const allowed = res.status === 503 && errorCode(text) === "latency_target" && setsSloMs(req.body);
      if (!allowed) return { status: res.status, problem: `status ${res.status}: ${text.slice(0, 500)}` };
    }
    if ((res.headers.get("content-type") ?? "").startsWith("text/event-stream") && text.includes('"type":"server_error"')) {
      return { status: res.status, problem: `a server_error event in the stream: ${text.slice(0, 500)}` };
    }
    return { status: res.status, problem: null };
  } catch (e) {
    if (abort.signal.aborted) return { status: null, problem: null };
    return { status: null, problem: `request failed: ${(e as Error).message}` };
  } finally {
    if (timer !== null) clearTimeout(timer);
  }
}

/** null when /healthz answers 200, else what it said. */
export async function checkHealthy(baseUrl: string): Promise<string | null> {
  try {
    const res = await fetch(`${baseUrl}/healthz`);
    return res.status === 200 ? null : `/healthz answered ${res.status}: ${(await res.text()).slice(0, 300)}`;
  } catch (e) {
    return `/healthz unreachable: ${(e as Error).message}`;
  }
}

/** Every request answers without a 5xx and leaves the server healthy. */
export function requestsNeverFailTheServer(baseUrl: string) {
  return fc.asyncProperty(fuzzRequest, async (req) => {
    const outcome = await send(baseUrl, req);
    if (outcome.problem !== null) throw new Error(outcome.problem);
    const sick = await checkHealthy(baseUrl);
    if (sick !== null) throw new Error(`after the request: ${sick}`);
  });
}
