// The playground's requests. Every URL is relative to the page, so the page
// works wherever it is served from (the root, or a path behind a proxy) and
// never talks to another origin.
import type { ExtendedModelList } from "../wire/responses.ts";
import { sseData } from "./sse.ts";

/** A request the server refused or that failed, with the server's message. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number | null,
  ) {
    super(message);
  }
}

// A server started with SERVICE_API_KEY answers 401 until the page sends the
// key. The key is asked for once (the key form) and kept for the tab's life
// in sessionStorage, never in the page or the URL.
const KEY_STORAGE = "loopserve-api-key";
/** Dispatched on window when the server asks for an API key (401). */
export const KEY_NEEDED_EVENT = "loopserve:key-needed";

export function setApiKey(key: string): void {
  if (key === "") sessionStorage.removeItem(KEY_STORAGE);
  else sessionStorage.setItem(KEY_STORAGE, key);
}

function authorization(): Record<string, string> {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { authorization: `Bearer ${key}` } : {};
}

/** The server's message from an error response (OpenAI shape or native), else the status. */
async function failure(res: Response): Promise<ApiError> {
  if (res.status === 401) window.dispatchEvent(new Event(KEY_NEEDED_EVENT));
  const text = await res.text().catch(() => "");
  try {
    const body = JSON.parse(text) as { error?: { message?: string } | string };
    const message = typeof body.error === "string" ? body.error : body.error?.message;
    if (message) return new ApiError(`${message} (HTTP ${res.status})`, res.status);
  } catch {
    // not JSON: fall through
  }
  return new ApiError(`HTTP ${res.status} ${res.statusText}${text ? `: ${text.slice(0, 200)}` : ""}`, res.status);
}

export async function getText(path: string): Promise<string> {
  const res = await fetch(path, { cache: "no-store", headers: authorization() });
  if (!res.ok) throw await failure(res);
  return res.text();
}

async function getJson<T>(path: string): Promise<T> {
  return JSON.parse(await getText(path)) as T;
}

/**
 * POSTs a streaming request and yields each event's JSON. An error event
 * (the server failed after the stream began) is thrown as an ApiError.
 */
export async function* postStream<T>(path: string, body: unknown, signal: AbortSignal): AsyncGenerator<T> {
  const res = await fetch(path, {
    method: "POST",
    headers: { "content-type": "application/json", ...authorization() },
    body: JSON.stringify(body),
    signal,
  });
  if (!res.ok) throw await failure(res);
  if (!res.body) throw new ApiError("the response has no body", res.status);
  for await (const data of sseData(res.body)) {
    const event = JSON.parse(data) as { error?: { message?: string } };
    if (event.error) throw new ApiError(event.error.message ?? "the server reported an error", null);
    yield event as T;
  }
}

/** What the page needs to know about the served model (GET api/v0/models). */
export interface ModelSummary {
  /** The model id requests name; null when none is configured. */
  id: string | null;
  /** The model's default loop depth; null when the model is not loaded. */
  defaultLoops: number | null;
  /** One line for the header. */
  description: string;
}

export async function loadModelSummary(): Promise<ModelSummary> {
  const list = await getJson<ExtendedModelList>("api/v0/models");
  const entry = list.data[0];
  if (!entry) return { id: null, defaultLoops: null, description: "no model configured (SERVICE_MODEL_PATH is not set)" };
  const info = entry.model_info;
  if (!info) {
    // /healthz says why (503 with the reason).
    const reason = await getText("healthz").then(
      () => "",
      (e: Error) => e.message,
    );
    return { id: entry.id, defaultLoops: null, description: `${entry.id}: not loaded${reason ? ` — ${reason}` : ""}` };
  }
  return {
    id: entry.id,
    defaultLoops: info.default_loops,
    description: `${entry.id} · dim ${info.dim} · ${info.n_heads} heads · default loops ${info.default_loops} · ${info.quant} · kv ${info.kv_cache_mode}`,
  };
}
