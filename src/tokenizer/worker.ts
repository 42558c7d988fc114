// Entry point of a tokenizer pool worker (src/tokenizer/pool.ts): its own
// Tokenizer built from the same description (GPT-2's ranks or the model's
// tokenizer.json), encoding one text at a time within a token
// limit.
import { Tokenizer } from "./tokenizer.ts";
import type { WorkerReply, WorkerRequest } from "./pool.ts";

declare const self: Worker;

let tokenizer: Promise<Tokenizer> | null = null;

self.onmessage = async (event: MessageEvent<WorkerRequest>) => {
  const msg = event.data;
  if (msg.kind === "init") {
    // The count bound's trie is built at once, not on the first long prompt.
    tokenizer = Tokenizer.fromSpec(msg.spec).then((t) => {
      t.bound();
      return t;
    });
    return;
  }
  let reply: WorkerReply;
  try {
    if (!tokenizer) throw new Error("encode before init");
    const out = (await tokenizer).encodeWithin(msg.text, msg.limit);
    if ("atLeast" in out) {
      reply = { id: msg.id, atLeast: out.atLeast };
      self.postMessage(reply);
      return;
    }
    const ids = Uint32Array.from(out.ids);
    reply = { id: msg.id, ids };
    self.postMessage(reply, [ids.buffer]);
  } catch (e) {
    reply = { id: msg.id, error: (e as Error).message };
    self.postMessage(reply);
  }
};
