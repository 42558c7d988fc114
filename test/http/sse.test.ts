import { describe, expect, test } from "bun:test";
import { badRequest } from "../../src/http/errors.ts";
import { SSE_DONE, sseEvent, sseResponse } from "../../src/http/sse.ts";

const request = () => new Request("http://localhost/x", { method: "POST" });

describe("SSE framing", () => {
  test("an event is one data line of JSON and a blank line", () => {
    expect(sseEvent({ token_id: 5, text: "a\nb" })).toBe('data: {"token_id":5,"text":"a\\nb"}\n\n');
    expect(SSE_DONE).toBe("data: [DONE]\n\n");
  });

  test("the stream carries the produced events and ends with [DONE]", async () => {
    const res = sseResponse(request(), async (send) => {
      send(sseEvent({ n: 1 }));
      send(sseEvent({ n: 2 }));
    });
    expect(res.headers.get("content-type")).toStartWith("text/event-stream");
    expect(await res.text()).toBe('data: {"n":1}\n\ndata: {"n":2}\n\ndata: [DONE]\n\n');
  });

  test("an error after the stream started is an error event, then [DONE]", async () => {
    const res = sseResponse(request(), async (send) => {
      send(sseEvent({ n: 1 }));
      throw badRequest("`x` is wrong", "x");
    });
    expect(await res.text()).toBe(
      'data: {"n":1}\n\n' +
        'data: {"error":{"message":"`x` is wrong","type":"invalid_request_error","param":"x","code":"invalid_value"}}\n\n' +
        "data: [DONE]\n\n",
    );
  });

  test("an unexpected failure is reported as a server_error event", async () => {
    const original = console.error;
    console.error = () => {};
    try {
      const res = sseResponse(request(), async () => {
        throw new Error("boom");
      });
      const events = (await res.text()).split("\n\n").filter(Boolean);
      expect(JSON.parse(events[0].slice(6)).error).toMatchObject({ type: "server_error", message: expect.stringContaining("boom") });
      expect(events[1]).toBe("data: [DONE]");
    } finally {
      console.error = original;
    }
  });

  test("cancelling the response body aborts the producer's signal", async () => {
    let seen: AbortSignal | null = null;
    const res = sseResponse(request(), async (send, signal) => {
      seen = signal;
      send(sseEvent({ n: 1 }));
      await new Promise((resolve) => signal.addEventListener("abort", resolve));
    });
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    await reader.read();
    await reader.cancel();
    expect((seen as AbortSignal | null)?.aborted).toBe(true);
  });
});
