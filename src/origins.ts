// The syntax of what browsers send about where a request comes from and
// where it goes: the Origin header ("https://app.example:8443") and the Host
// header ("localhost:8000", "[::1]:8000"), and of the allow-list entries
// that name them. Policy lives in http/browser_guard.ts; config.ts validates
// the allow-lists with these same functions, so a setting is refused at
// start exactly when it could never match. Below both, so that the settings
// do not import the HTTP layer.

/**
 * The serialized origin (scheme://host[:port], lower-case, default port
 * dropped, as browsers send it) of an http(s) origin; null for anything else,
 * "null" (sandboxed documents, file://) included.
 */
export function normalizeOrigin(value: string): string | null {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return null;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return null;
  // An origin has nothing after host:port (a trailing "/" is tolerated in settings).
  if (url.username !== "" || url.password !== "" || url.search !== "" || url.hash !== "" || url.pathname !== "/") return null;
  if (!/^[a-z][a-z0-9+.-]*:\/\/[^/?#]+\/?$/i.test(value)) return null;
  return url.origin;
}

export interface HostAndPort {
  /** Lower-case, without a trailing dot; an IPv6 address keeps its brackets ("[::1]"). */
  name: string;
  /** The port as written, or null when the Host header has none (the scheme's default). */
  port: string | null;
}

const HOST_NAME = /^(\[[0-9a-f:.]+\]|[a-z0-9._~-]+)$/;

function canonicalName(name: string): string {
  const lower = name.toLowerCase();
  return lower.endsWith(".") && !lower.startsWith("[") ? lower.slice(0, -1) : lower;
}

/** A Host header split into name and port; null when it is not `host[:port]` (several hosts, a path, a user, spaces). */
export function parseHost(header: string): HostAndPort | null {
  const m = /^(\[[^\]]*\]|[^:]*)(?::([0-9]{1,5}))?$/.exec(header.trim());
  if (!m) return null;
  const name = canonicalName(m[1]);
  return HOST_NAME.test(name) && name !== "" ? { name, port: m[2] ?? null } : null;
}

/** localhost, *.localhost (RFC 6761: always the local machine), 127.0.0.0/8 and [::1]. */
export function isLoopbackName(name: string): boolean {
  const n = canonicalName(name);
  if (n === "localhost" || n.endsWith(".localhost") || n === "[::1]" || n === "::1") return true;
  const v4 = /^127\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(n);
  return v4 !== null && v4.slice(1).every((octet) => Number(octet) <= 255);
}

/**
 * Checks an allowed-host entry: a name or address ("api.example.com",
 * "10.0.0.5", "[fd00::1]"), a wildcard for its subdomains ("*.example.com"),
 * or "*" for any host. Returns the entry in canonical form, or null.
 */
export function normalizeHostPattern(entry: string): string | null {
  const e = entry.trim().toLowerCase();
  if (e === "*") return e;
  const wildcard = e.startsWith("*.");
  const name = canonicalName(wildcard ? e.slice(2) : e);
  if (name === "" || !HOST_NAME.test(name) || (wildcard && name.startsWith("["))) return null;
  return wildcard ? `*.${name}` : name;
}

/** Whether `name` (from parseHost) matches an entry of normalizeHostPattern; "*.x" matches subdomains of x, not x. */
export function hostMatches(pattern: string, name: string): boolean {
  if (pattern === "*") return true;
  if (pattern.startsWith("*.")) return name.endsWith(pattern.slice(1));
  return pattern === name;
}
