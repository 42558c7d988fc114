// A stand-in engine that answers every request with the same token ids, for
// HTTP tests of what the server makes of a reply (its text, stop ids,
// reasoning) through the real app. It records each request; an id among a
// request's stop ids ends the reply there, unsent, as the engine ends it.
import type { GenerateRequest, TokenSink } from "../../src/engine/types.ts";
import type { GenerationEngine } from "../../src/http/generation.ts";
import { TINY_MODEL_INFO } from "./server.ts";

export function scriptedEngine(script: readonly number[], seen: GenerateRequest[]): GenerationEngine {
  return {
    info: TINY_MODEL_INFO,
    enqueue(req, _opts, sink: TokenSink) {
      seen.push(req);
      const tokens: number[] = [];
      let finishReason: "stop" | "length" = "length";
      for (const id of script.slice(0, req.maxTokens)) {
        if (req.stopTokenIds.includes(id)) {
          finishReason = "stop";
          break;
        }
        tokens.push(id);
        if (sink(id) === false) {
          finishReason = "stop";
          break;
        }
      }
      const result = { tokens, finishReason, promptTokens: req.promptTokens.length, wallMs: 1, firstTokenMs: 1 };
      return { started: Promise.resolve(), result: Promise.resolve(result) };
    },
  };
}
