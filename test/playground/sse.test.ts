// The playground's event-stream reader (src/playground/sse.ts), fed the
// way a browser's fetch hands a body over: in chunks cut anywhere.
import { describe, expect, test } from "bun:test";
import { SseParser, sseData } from "../../src/playground/sse.ts";
import { sseEvent, SSE_DONE } from "../../src/http/sse.ts";

function bodyOf(chunks: string[]): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const c of chunks) controller.enqueue(encoder.encode(c));
      controller.close();
    },
  });
}

async function collect(body: ReadableStream<Uint8Array>): Promise<string[]> {
  const out: string[] = [];
  for await (const d of sseData(body)) out.push(d);
  return out;
}

describe("SseParser", () => {
  test("events split across chunks at every position come out whole and in order", () => {
    const stream = sseEvent({ text: "In the" }) + sseEvent({ text: " beginning" }) + SSE_DONE;
    for (let cut = 0; cut <= stream.length; cut++) {
      const p = new SseParser();
      const events = [...p.push(stream.slice(0, cut)), ...p.push(stream.slice(cut))];
      expect(events).toEqual(['{"text":"In the"}', '{"text":" beginning"}', "[DONE]"]);
    }
  });

  test("CRLF framing, several data lines joined by newlines, comments and other fields skipped", () => {
    const p = new SseParser();
    expect(p.push(": keep-alive\r\n\r\nevent: x\r\ndata: a\r\ndata: b\r\nid: 1\r\n\r\ndata:c\n\n")).toEqual(["a\nb", "c"]);
  });

  test("an incomplete event waits for its blank line", () => {
    const p = new SseParser();
    expect(p.push("data: 1\n")).toEqual([]);
    expect(p.push("\n")).toEqual(["1"]);
  });
});

describe("sseData", () => {
  test("yields each event's data and stops at [DONE], ignoring anything after it", async () => {
    const chunks = [sseEvent({ token_id: 1, text: "a" }).slice(0, 5), sseEvent({ token_id: 1, text: "a" }).slice(5), SSE_DONE, sseEvent({ late: true })];
    expect(await collect(bodyOf(chunks))).toEqual(['{"token_id":1,"text":"a"}']);
  });

  test("a body that ends without [DONE] ends the events", async () => {
    expect(await collect(bodyOf([sseEvent(1), sseEvent(2)]))).toEqual(["1", "2"]);
  });

  test("multi-byte characters split between chunks decode intact", async () => {
    const bytes = new TextEncoder().encode(sseEvent({ text: "אֱלֹהִים — ✝" }) + SSE_DONE);
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let i = 0; i < bytes.length; i += 3) controller.enqueue(bytes.slice(i, i + 3));
        controller.close();
      },
    });
    expect(await collect(body)).toEqual([JSON.stringify({ text: "אֱלֹהִים — ✝" })]);
  });
});
