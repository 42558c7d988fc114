// Entry point of a tokenizer pool worker (src/tokenizer/pool.ts): its own
// Tokenizer built from the same description (GPT-2's ranks or the model's
// tokenizer.json), encoding one text at a time within a token limit, and
// stopping at the encoder's next checkpoint once the pool marks the encode
// cancelled.
import { Tokenizer } from "./tokenizer.ts";
import type { WorkerReply, WorkerRequest } from "./pool.ts";

declare const self: Worker;

let tokenizer: Promise<Tokenizer> | null = null;
let cancelled: Int32Array<ArrayBufferLike> = new Int32Array(1).fill(-1);

class Stopped extends Error {}

self.onmessage = async (event: MessageEvent<WorkerRequest>) => {
  const msg = event.data;
  if (msg.kind === "init") {
    cancelled = msg.cancelled;
    // The count bound's trie and the long-piece tables are built at once, not on the first long prompt.
    tokenizer = Tokenizer.fromSpec(msg.spec).then((t) => {
      t.prepare();
      return t;
    });
    return;
  }
  let reply: WorkerReply;
  const checkpoint = () => {
    if (Atomics.load(cancelled, 0) === msg.id) throw new Stopped();
  };
  try {
    if (!tokenizer) throw new Error("encode before init");
    const t = await tokenizer;
    checkpoint();
    const out = t.encodeWithin(msg.text, msg.limit, { checkpoint, rest: msg.rest });
    if ("atLeast" in out) {
      reply = { id: msg.id, atLeast: out.atLeast };
      self.postMessage(reply);
      return;
    }
    const ids = Uint32Array.from(out.ids);
    reply = { id: msg.id, ids };
    self.postMessage(reply, [ids.buffer]);
  } catch (e) {
    reply = e instanceof Stopped ? { id: msg.id, cancelled: true } : { id: msg.id, error: (e as Error).message };
    self.postMessage(reply);
  }
};
