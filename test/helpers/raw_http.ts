// HTTP requests written byte for byte over a TCP socket, for what fetch will
// not send: any Host header (or none), HTTP/1.0, oversized headers, a chunked
// body, a version the server does not speak.
import { connect } from "node:net";

export interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** The response to `request` (sent as is), read until the server closes the connection. */
export function rawRequest(port: number, request: string | Uint8Array, timeoutMs = 30_000): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: "127.0.0.1", port });
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no complete response within ${timeoutMs} ms: ${Buffer.concat(chunks).toString()}`));
    }, timeoutMs);
    socket.on("connect", () => socket.write(request));
    socket.on("data", (c: Buffer) => chunks.push(c));
    socket.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    socket.on("close", () => {
      clearTimeout(timer);
      const text = Buffer.concat(chunks).toString("utf8");
      const split = text.indexOf("\r\n\r\n");
      const head = split < 0 ? text : text.slice(0, split);
      const [statusLine, ...lines] = head.split("\r\n");
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(statusLine);
      if (!m) return reject(new Error(`not an HTTP response: ${JSON.stringify(text.slice(0, 200))}`));
      const headers: Record<string, string> = {};
      for (const line of lines) {
        const colon = line.indexOf(":");
        if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
      }
      resolve({ status: Number(m[1]), headers, body: split < 0 ? "" : text.slice(split + 4) });
    });
  });
}

/** A request head plus body, closing the connection after the response. */
export function requestText(method: string, path: string, headers: Record<string, string>, body = "", version = "HTTP/1.1"): string {
  const lines = [`${method} ${path} ${version}`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)];
  if (body !== "") lines.push(`Content-Length: ${Buffer.byteLength(body)}`);
  lines.push("Connection: close");
  return `${lines.join("\r\n")}\r\n\r\n${body}`;
}

export function portOf(url: string): number {
  return Number(new URL(url).port);
}
