import { describe, expect, test } from "bun:test";
import { Type as T } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { fromValidation, paramName } from "../../src/http/errors.ts";
import { GenerateBody } from "../../src/wire/requests.ts";

/** The HTTP error a body would get from the /generate schema. */
function check(body: unknown) {
  const e = fromValidation([...Value.Errors(GenerateBody, body)]);
  return { status: e.status, ...e.body().error };
}

describe("validation errors", () => {
  test("JSON pointer paths become OpenAI-style param names", () => {
    expect(paramName("/max_tokens")).toBe("max_tokens");
    expect(paramName("/stop/0")).toBe("stop[0]");
    expect(paramName("/messages/1/role")).toBe("messages[1].role");
    expect(paramName("")).toBeNull();
  });

  test("a missing property is a 422 missing_required_parameter", () => {
    expect(check({})).toMatchObject({ status: 422, param: "prompt", code: "missing_required_parameter", message: "`prompt` is required" });
  });

  test("a wrong type is a 422 that says what was expected", () => {
    expect(check({ prompt: "x", top_k: 2.5 })).toMatchObject({
      status: 422,
      param: "top_k",
      message: "`top_k` must be an integer, got 2.5",
    });
    expect(check({ prompt: { text: "x" } })).toMatchObject({
      status: 422,
      message: "`prompt` must be a string or an array of integers, got an object",
    });
  });

  test("a bound is a 400 with the bound and the value", () => {
    expect(check({ prompt: "x", max_tokens: 9000 })).toMatchObject({
      status: 400,
      param: "max_tokens",
      type: "invalid_request_error",
      message: "`max_tokens` must be at most 8192, got 9000",
    });
    expect(check({ prompt: "x", repetition_penalty: 0.1 }).message).toBe("`repetition_penalty` must be at least 0.5, got 0.1");
  });

  test("a shape error wins over a bound error in the same body", () => {
    expect(check({ prompt: "x", max_tokens: 0, temperature: "hot" })).toMatchObject({ status: 422, param: "temperature" });
  });

  test("a value outside an enum is a 400 listing the allowed values", () => {
    const Mode = T.Object({ mode: T.Union([T.Literal("generate"), T.Literal("speculative")]) });
    const e = fromValidation([...Value.Errors(Mode, { mode: "fast" })]);
    expect(e.status).toBe(400);
    expect(e.message).toBe('`mode` must be one of "generate", "speculative", got "fast"');
  });
});
