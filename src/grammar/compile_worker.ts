// Entry point of the format compiler's worker (src/grammar/formats.ts): its
// own grammar engine over the same vocabulary, compiling each new format
// first, so that one the engine takes too long over, or crashes on, is
// refused (the worker is then ended and a fresh one made) before the
// server's own engine ever sees it. build.ts lists it as an entry point of
// the compiled executable.
import { GrammarEngine, GrammarEngineError, type GrammarSource } from "./engine.ts";

declare const self: Worker;

/** To the worker: its vocabulary (once, first), then formats to compile. */
export type CompileRequest = { kind: "init"; vocab: string[]; vocabSize: number; endIds: number[] } | { kind: "compile"; id: number; source: GrammarSource };
/** From the worker: a format compiled, or the engine's reason it cannot be (`aborted`: the worker's engine is unusable now). */
export type CompileReply = { id: number; ok: true } | { id: number; error: string; aborted: boolean };

let engine: Promise<GrammarEngine> | null = null;

self.onmessage = async (event: MessageEvent<CompileRequest>) => {
  const msg = event.data;
  if (msg.kind === "init") {
    engine = GrammarEngine.create(msg.vocab, msg.vocabSize, msg.endIds);
    return;
  }
  let reply: CompileReply;
  try {
    const compiled = await (engine as Promise<GrammarEngine>).then((e) => e.compile(msg.source));
    compiled.dispose();
    reply = { id: msg.id, ok: true };
  } catch (e) {
    reply = { id: msg.id, error: (e as Error).message, aborted: !(e instanceof GrammarEngineError) || e.aborted };
  }
  self.postMessage(reply);
};
