// Clients that send a request head and part of its body, then nothing: the
// shape of a slow or hostile upload. Run as a script in a process of its own
// (so that writing the bodies does not hold up the test's own event loop,
// which measures the server meanwhile):
//   bun test/helpers/stalled_bodies.ts <port> <spec JSON>
// where the spec is a list of {head, body, count}; it prints "sent" once every
// body is written, then one JSON line per connection as the server closes it,
// in the order of the spec.
import { connect } from "node:net";

export interface StalledSpec {
  /** Request line and headers, ending with the blank line. */
  head: string;
  /** What is sent of the body (shorter than its declared length): these characters, then "x" up to `padTo` bytes. */
  body: string;
  padTo?: number;
  count: number;
}

export interface StalledAnswer {
  status: number;
  /** The response body. */
  text: string;
  /** From the last byte sent to the connection's close, in ms. */
  closedAfterMs: number;
}

const GIVE_UP_MS = 20_000;

function stalled(port: number, head: string, body: string): { sent: Promise<void>; answer: Promise<StalledAnswer> } {
  let sentAt = 0;
  let markSent = () => {};
  const sent = new Promise<void>((resolve) => {
    markSent = resolve;
  });
  const answer = new Promise<StalledAnswer>((resolve) => {
    const socket = connect({ host: "127.0.0.1", port });
    const chunks: Buffer[] = [];
    // A server that never closes the connection: given up on, reported with what came (status 0 if nothing).
    const guard = setTimeout(() => socket.destroy(), GIVE_UP_MS);
    socket.on("connect", () => {
      socket.write(head);
      socket.write(body, () => {
        sentAt = performance.now();
        markSent();
      });
    });
    socket.on("data", (c: Buffer) => chunks.push(c));
    socket.on("error", () => undefined); // a reset after the answer is a close like any other
    socket.on("close", () => {
      clearTimeout(guard);
      markSent();
      const text = Buffer.concat(chunks).toString();
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0);
      resolve({ status, text: text.slice(text.indexOf("\r\n\r\n") + 4), closedAfterMs: performance.now() - sentAt });
    });
  });
  return { sent, answer };
}

if (import.meta.main) {
  const port = Number(process.argv[2]);
  const spec = JSON.parse(process.argv[3] as string) as StalledSpec[];
  const clients = spec.flatMap((s) => {
    const body = s.body.padEnd(s.padTo ?? 0, "x");
    return Array.from({ length: s.count }, () => stalled(port, s.head, body));
  });
  await Promise.all(clients.map((c) => c.sent));
  console.log("sent");
  for (const answer of await Promise.all(clients.map((c) => c.answer))) console.log(JSON.stringify(answer));
}
