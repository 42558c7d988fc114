// Request bodies are JSON whatever the Content-Type says (curl -d sends
// application/x-www-form-urlencoded; llama.cpp's server is just as lenient).
// An empty or unreadable body is a 400 that says what was wrong, never a 500.
// Every body of this API is a JSON object; anything else is a shape error
// (422), reported here because the validator would only see it as {}.
//
// Three limits are enforced before JSON.parse ever runs (docs/limits.md):
// - the time a body may stall (SERVICE_BODY_TIMEOUT_MS): 408;
// - the body size (SERVICE_MAX_BODY_BYTES): a declared Content-Length over it
//   is refused unread, a chunked body as soon as it passes it (413);
// - the nesting depth (MAX_JSON_DEPTH), measured by one linear scan of the
//   text, because validating a deeply nested value recurses once per level
//   and would overflow the stack (400).
import { badRequest, payloadTooLarge, requestTimeout, unprocessable, valueKind } from "./errors.ts";

/** Deepest array/object nesting a request body may have. */
export const MAX_JSON_DEPTH = 64;

/** The characters the nesting scan looks at, as the char codes it compares. */
const [OPEN_BRACE, OPEN_BRACKET, CLOSE_BRACE, CLOSE_BRACKET, QUOTE, BACKSLASH] = [..."{[}]\"\\"].map((c) => c.charCodeAt(0));

/**
 * True when the JSON text nests arrays/objects more than `limit` deep. One
 * pass, no recursion; brackets inside strings do not count. Malformed text
 * gives some answer; JSON.parse then reports what is wrong with it.
 */
function nestsDeeperThan(text: string, limit: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) {
      inString = true;
    } else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
      if (++depth > limit) return true;
    } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
      depth--;
    }
  }
  return false;
}

function tooLarge(maxBytes: number, what: string): never {
  throw payloadTooLarge(`request body ${what}, more than the limit of ${maxBytes} bytes (SERVICE_MAX_BODY_BYTES)`);
}

/** How a request body is read. */
export interface BodyLimits {
  /** SERVICE_MAX_BODY_BYTES: a longer body gets 413. */
  maxBytes: number;
  /** SERVICE_BODY_TIMEOUT_MS: a body that sends nothing for this long gets 408. */
  stallMs: number;
  /** Called for each body that stalled (counted on /metrics). */
  onStall(): void;
}

const STALLED = Symbol("stalled");

/** The next chunk of the body, or STALLED when none came within stallMs. */
function readOrStall(reader: ReadableStreamDefaultReader<Uint8Array>, stallMs: number) {
  let timer: Timer | undefined;
  const stalled = new Promise<typeof STALLED>((resolve) => {
    timer = setTimeout(() => resolve(STALLED), stallMs);
  });
  return Promise.race([reader.read(), stalled]).finally(() => clearTimeout(timer));
}

/**
 * The body as text, refusing one longer than maxBytes (413) without reading
 * past the limit, and one that stalls (408): a client that sends headers and
 * part of a body, then nothing, would otherwise hold its connection and what
 * was buffered for as long as it likes.
 */
async function readBodyText(request: Request, limits: BodyLimits): Promise<string> {
  const { maxBytes, stallMs } = limits;
  const declared = request.headers.get("content-length");
  if (declared !== null && /^[0-9]+$/.test(declared) && Number(declared) > maxBytes) tooLarge(maxBytes, `is ${declared} bytes`);
  if (request.body === null) return "";
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = request.body.getReader();
  for (;;) {
    const next = await readOrStall(reader, stallMs);
    if (next === STALLED) {
      limits.onStall();
      reader.cancel().catch(() => undefined);
      throw requestTimeout(`request body stalled: nothing received for ${stallMs} ms after ${size} bytes (SERVICE_BODY_TIMEOUT_MS)`);
    }
    const { done, value } = next;
    if (done) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel();
      tooLarge(maxBytes, `passed ${size} bytes`);
    }
    chunks.push(value);
  }
  // As request.text() decodes: invalid UTF-8 becomes U+FFFD.
  return new TextDecoder().decode(Buffer.concat(chunks, size));
}

/** Elysia's parse hook for every route: the JSON object of the body, within the limits. */
export function jsonBodyParser(limits: BodyLimits) {
  return async function parseJsonBody({ request }: { request: Request }): Promise<unknown> {
    const text = await readBodyText(request, limits);
    if (text.trim() === "") throw badRequest("request body is empty: expected a JSON object", null, "invalid_json");
    if (nestsDeeperThan(text, MAX_JSON_DEPTH))
      throw badRequest(`request body nests arrays/objects more than ${MAX_JSON_DEPTH} levels deep (the limit)`, null, "json_too_deep");
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch (e) {
      const type = request.headers.get("content-type");
      const hint = type && !/json/i.test(type) ? ` (Content-Type is ${type}; send application/json)` : "";
      throw badRequest(`request body is not valid JSON: ${(e as Error).message}${hint}`, null, "invalid_json");
    }
    if (typeof body !== "object" || body === null || Array.isArray(body))
      throw unprocessable(`request body must be a JSON object, got ${valueKind(body)}`);
    return body;
  };
}
