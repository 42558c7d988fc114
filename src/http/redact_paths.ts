// The server's file paths out of a message /healthz shows to callers
// without the API key (docs/security.md). The paths the configuration
// names (the model file, TOKENIZER_HOME) are taken out whole, as written
// and as resolved, so a path with spaces or a bare file name leaves nothing
// behind; any other path-like word (a shard, a file the loader opened
// through the model's directory) goes by its slash.
import { resolve } from "node:path";

const REDACTED = "(a path)";
// Characters without spaces or quotes around a slash.
const FILE_PATH = /[^\s'"`]*\/[^\s'"`:]*/g;

/** `message` with the `known` paths (null entries skipped) and every path-like word replaced by "(a path)". */
export function withoutPaths(message: string, known: readonly (string | null)[]): string {
  const forms = known.flatMap((p) => (p === null || p === "" ? [] : [p, resolve(p)]));
  // Longest first: a resolved path holds the path as written.
  let out = message;
  for (const form of [...new Set(forms)].sort((a, b) => b.length - a.length)) {
    // Whole words only: a model file named "model" leaves "the model's vocabulary" alone.
    const escaped = form.replace(/[\\^$.*+?()[\]{}|/-]/g, "\\$&");
    out = out.replace(new RegExp(`(?<=^|[\\s'"\`(])${escaped}(?=$|[\\s"\`:),]|'(?!\\w))`, "g"), REDACTED);
  }
  return out.replace(FILE_PATH, REDACTED);
}
