// What the HTTP tests share about responses. The bodies' types and schemas
// are the server's own (src/wire/responses.ts: the handlers build them);
// this reads responses and streams, and checks bodies against those
// schemas, whose objects are closed: a body that matches has nothing more.
import { expect } from "bun:test";
import type { Static, TSchema } from "@sinclair/typebox";
import { TypeCheck, TypeCompiler } from "@sinclair/typebox/compiler";
import { ErrorBody } from "../../src/wire/responses.ts";

const compiled = new WeakMap<TSchema, TypeCheck<TSchema>>();

/** Asserts that `body` is what `schema` describes, naming every mismatch (path, message, value). */
export function expectSchema<S extends TSchema>(schema: S, body: unknown, what = "body"): asserts body is Static<S> {
  if (schema === undefined) throw new Error(`no schema given to check the ${what} against`);
  let check = compiled.get(schema);
  if (!check) {
    check = TypeCompiler.Compile(schema);
    compiled.set(schema, check);
  }
  if (check.Check(body)) return;
  const errors = [...check.Errors(body)].map((e) => `${e.path || "/"}: ${e.message} (got ${JSON.stringify(e.value)})`);
  throw new Error(`${what} does not match its schema:\n${errors.join("\n")}\n${JSON.stringify(body)}`);
}

/** The JSON body of a response with the expected status, checked against `schema`. */
export async function jsonBody<S extends TSchema>(res: Response, schema: S, status = 200): Promise<Static<S>> {
  const text = await res.text();
  if (res.status !== status) throw new Error(`${res.url}: expected ${status}, got ${res.status}: ${text}`);
  const body: unknown = JSON.parse(text);
  expectSchema(schema, body, `${res.url} body`);
  return body;
}

/** The error body every route answers with (an error event's too), with a message saying something. */
export function expectErrorShape(body: unknown): asserts body is ErrorBody {
  expectSchema(ErrorBody, body, "error body");
  expect(body.error.message.length).toBeGreaterThan(0);
}

/** A refused request's error body: the error shape, an invalid request, naming `param` (null: the body as a whole). */
export function expectInvalidRequest(body: unknown, param: string | null): asserts body is ErrorBody {
  expectErrorShape(body);
  expect(body.error.type).toBe("invalid_request_error");
  expect(body.error.param).toBe(param);
}

/** The data payloads of a complete SSE body, in order (the last is "[DONE]" when well formed): one `data:` line per event. */
export function sseData(body: string): string[] {
  if (body === "") return [];
  expect(body.endsWith("\n\n")).toBe(true);
  return body
    .slice(0, -2)
    .split("\n\n")
    .map((event) => {
      expect(event.startsWith("data: ")).toBe(true);
      expect(event.slice("data: ".length)).not.toContain("\n");
      return event.slice("data: ".length);
    });
}

/** The events of a complete stream, before its closing [DONE], each checked against `schema`. */
export function sseEvents<S extends TSchema>(raw: string, schema: S): Static<S>[] {
  const data = sseData(raw);
  expect(data.at(-1)).toBe("[DONE]");
  return data.slice(0, -1).map((d, i) => {
    const event: unknown = JSON.parse(d);
    expectSchema(schema, event, `stream event ${i}`);
    return event;
  });
}
