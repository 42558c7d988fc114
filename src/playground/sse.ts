// Server-sent events read from a fetch() response body: the playground
// streams with POST requests, which EventSource cannot send. The server
// frames every event as `data: <json>` and a blank line, and ends each
// stream with `data: [DONE]` (src/http/sse.ts).

/** Splits event-stream text into the data of each complete event. */
export class SseParser {
  private buffer = "";

  /** Feeds decoded text; returns the data of each event it completed, in order. */
  push(text: string): string[] {
    this.buffer = (this.buffer + text).replace(/\r\n/g, "\n");
    const events: string[] = [];
    for (let end = this.buffer.indexOf("\n\n"); end >= 0; end = this.buffer.indexOf("\n\n")) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      // Several data lines make one value joined by newlines; comments and other fields are skipped.
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""));
      if (data.length > 0) events.push(data.join("\n"));
    }
    return events;
  }
}

/** The data of each event of a stream, up to [DONE] (or the end of the body). */
export async function* sseData(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  let finished = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        finished = true;
        return;
      }
      for (const data of parser.push(decoder.decode(value, { stream: true }))) {
        if (data === "[DONE]") return;
        yield data;
      }
    }
  } finally {
    // Left early ([DONE], or the consumer stopped): let the connection go.
    if (!finished) await reader.cancel().catch(() => undefined);
  }
}
