// Entry point of a tokenizer pool worker (src/tokenizer_pool.ts): its own
// Tokenizer over the same ranks, encoding one text at a time.
import { Tokenizer } from "./tokenizer.ts";
import type { WorkerReply, WorkerRequest } from "./tokenizer_pool.ts";

declare const self: Worker;

let tokenizer: Promise<Tokenizer> | null = null;

self.onmessage = async (event: MessageEvent<WorkerRequest>) => {
  const msg = event.data;
  if (msg.kind === "init") {
    tokenizer = Tokenizer.load(msg.tokenizerHome);
    return;
  }
  let reply: WorkerReply;
  try {
    if (!tokenizer) throw new Error("encode before init");
    const ids = Uint32Array.from((await tokenizer).encode(msg.text));
    reply = { id: msg.id, ids };
    self.postMessage(reply, [ids.buffer]);
  } catch (e) {
    reply = { id: msg.id, error: (e as Error).message };
    self.postMessage(reply);
  }
};
