// llama.cpp's llama-server as a bench:serve target: a model exported to
// GGUF at its loop depth (each loop one layer, bench/peer/llama.ts), started
// per concurrency with one slot per client (-np) and continuous batching, on
// the same threads as loopserve, every layer on the GPU when asked.
import { rmSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { freePort } from "../../test/helpers/server.ts";
import { cacheDir } from "./llama.ts";

/** Context per slot: the long prompt (~2,100 tokens) plus the longest completion. */
const SLOT_CONTEXT = 4096;
const START_TIMEOUT_MS = 120_000;

export interface LlamaServer {
  url: string;
  stop(): Promise<unknown>;
}

export async function startLlamaServer(server: string, gguf: string, slots: number, threads: string, gpu = false): Promise<LlamaServer> {
  const port = freePort();
  const args = [server, "-m", gguf, "--host", "127.0.0.1", "--port", String(port), "-t", threads, "-tb", threads];
  if (gpu) args.push("-ngl", "999");
  args.push("-np", String(slots), "-c", String(slots * SLOT_CONTEXT), "--cont-batching", "--no-webui");
  // The model was trained on 512 positions; like loopserve here (SERVICE_MAX_SEQ_LEN=4096), it is
  // allowed past them, or the long prompt would be refused.
  args.push("--override-kv", `llama.context_length=int:${SLOT_CONTEXT}`);
  // Its log goes to a file: it writes a lot, and an unread pipe would block it.
  const logFile = join(cacheDir(), `llama-server-${port}.log`);
  const proc: Subprocess = Bun.spawn(args, { stdout: "ignore", stderr: Bun.file(logFile) });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + START_TIMEOUT_MS;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`llama-server exited with ${proc.exitCode} (log: ${logFile})`);
    try {
      if ((await fetch(`${url}/health`)).status === 200) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      proc.kill();
      throw new Error(`llama-server did not answer /health within ${START_TIMEOUT_MS} ms (log: ${logFile})`);
    }
    await Bun.sleep(100);
  }
  return {
    url,
    async stop() {
      proc.kill("SIGTERM");
      const code = await proc.exited;
      rmSync(logFile, { force: true });
      return code;
    },
  };
}

/** A /completion request for exactly `tokens` tokens, greedy, streamed one token per event. */
export function llamaCompletionBody(prompt: string, tokens: number): unknown {
  return { prompt, n_predict: tokens, temperature: 0, top_k: 1, ignore_eos: true, stream: true, cache_prompt: false };
}
