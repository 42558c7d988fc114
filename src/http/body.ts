// Request bodies are JSON whatever the Content-Type says (curl -d sends
// application/x-www-form-urlencoded; llama.cpp's server is just as lenient).
// An empty or unreadable body is a 400 that says what was wrong, never a 500.
// Every body of this API is a JSON object; anything else is a shape error
// (422), reported here because the validator would only see it as {}.
import { badRequest, unprocessable, valueKind } from "./errors.ts";

export async function parseJsonBody({ request }: { request: Request }): Promise<unknown> {
  const text = await request.text();
  if (text.trim() === "") throw badRequest("request body is empty: expected a JSON object", null, "invalid_json");
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
}
