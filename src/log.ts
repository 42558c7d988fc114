// The server's one log: every line loopserve writes while serving goes
// through here, as text (`loopserve: ...`, what a journal or terminal shows)
// or as one JSON object per line (SERVICE_LOG_FORMAT=json, for collectors).
//
// Info lines (the start-up line, one line per request) go to stdout;
// warnings and errors to stderr. An expected refusal is a request line and
// nothing more; only a real fault (a bug: HTTP 500) carries a stack trace,
// exactly one.

export type LogFormat = "text" | "json";

export const LOG_FORMATS: readonly LogFormat[] = ["text", "json"];

type Level = "info" | "warn" | "error";

/** Extra fields of a line: JSON keys, or `key=value` pairs in text. */
export type LogFields = Record<string, string | number | boolean | null>;

/** What the access log records of each request once its response has ended. */
export interface RequestLine {
  request_id: string;
  method: string;
  path: string;
  status: number;
  prompt_tokens: number;
  completion_tokens: number;
  /** From the request's arrival to the end of its response body (the last event of a stream). */
  ms: number;
  /** "complete", or "cancelled" when the client went away before the response ended. */
  outcome: "complete" | "cancelled";
}

// A text value with spaces, quotes or `=` is quoted so that every line
// splits back into its pairs.
function textValue(v: string | number | boolean | null): string {
  const s = String(v);
  return /^[^\s"=]+$/.test(s) ? s : JSON.stringify(s);
}

class Log {
  private format: LogFormat = "text";

  /** Set once at start-up from SERVICE_LOG_FORMAT; text until then. */
  setFormat(format: LogFormat): void {
    this.format = format;
  }

  info(message: string, fields: LogFields = {}): void {
    this.write("info", message, fields);
  }

  warn(message: string, fields: LogFields = {}): void {
    this.write("warn", message, fields);
  }

  /** A condition the operator must act on (a model that did not load), without a stack trace. */
  error(message: string, fields: LogFields = {}): void {
    this.write("error", message, fields);
  }

  /** A real fault (a bug): the message, then the error's stack trace, once. */
  fault(message: string, error: unknown, fields: LogFields = {}): void {
    const stack = error instanceof Error ? (error.stack ?? `${error.name}: ${error.message}`) : String(error);
    this.write("error", message, { ...fields, stack });
  }

  request(line: RequestLine): void {
    this.write("info", "request", { ...line });
  }

  private write(level: Level, message: string, fields: LogFields): void {
    const out = level === "info" ? console.log : console.error;
    if (this.format === "json") {
      out(JSON.stringify({ time: new Date().toISOString(), level, msg: message, ...fields }));
      return;
    }
    const { stack, ...pairs } = fields;
    const kv = Object.entries(pairs).map(([k, v]) => ` ${k}=${textValue(v)}`);
    const prefix = level === "info" ? "loopserve: " : `loopserve: ${level === "warn" ? "warning" : "error"}: `;
    out(`${prefix}${message}${kv.join("")}${stack === undefined ? "" : `\n${stack}`}`);
  }
}

/** The process's log. */
export const log = new Log();
