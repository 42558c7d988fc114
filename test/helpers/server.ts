// Starts a REAL loopserve process (`bun src/cli/main.ts serve`, or the compiled
// executable) on 127.0.0.1 and a free port, with a tiny synthetic model by
// default, and waits until it answers /healthz (200, or 503 when it was
// started without a usable model). Every test that runs a server shares this
// helper. For what no process can be made
// to do (an engine that fails on purpose, a configuration no environment
// gives), inProcessApp builds the same app in this process around a
// stand-in engine.
import { afterAll, beforeAll } from "bun:test";
import type { Static, TSchema } from "@sinclair/typebox";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { type Config, loadConfig } from "../../src/config.ts";
import type { ModelInfo } from "../../src/engine/types.ts";
import { NO_RECURRENCE } from "../../src/model/format.ts";
import { frontDoor } from "../../src/http/front_door.ts";
import type { GenerationEngine } from "../../src/http/generation.ts";
import { ServiceMetrics } from "../../src/metrics.ts";
import { createApp } from "../../src/http/app.ts";
import { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { jsonBody } from "./http.ts";
import { TINY, tinyModelPath } from "./models.ts";

const ROOT = resolve(import.meta.dir, "../..");
const ENTRY = existsSync(join(ROOT, "src/cli/main.ts")) ? ["src/cli/main.ts", "serve"] : ["src/cli/serve.ts"];
const START_TIMEOUT_MS = 30_000;

export interface TestServer {
  /** Base URL, e.g. http://127.0.0.1:41234 (no trailing slash). */
  url: string;
  /** The server's process id (its memory is /proc/<pid>/status). */
  pid: number;
  /** Everything the process wrote to stdout and stderr so far. */
  output(): string;
  /** POSTs a JSON body (or a raw string sent as-is) to `path`. */
  post(path: string, body: unknown, headers?: Record<string, string>): Promise<Response>;
  /** POSTs a JSON body to `path` and returns the 200 response's body, checked against `schema` (jsonBody). */
  postOk<S extends TSchema>(path: string, body: unknown, schema: S): Promise<Static<S>>;
  /** SIGTERM, then waits for the exit; resolves to the exit code. */
  stop(): Promise<number>;
}

export interface ServerOptions {
  /** Model file; null starts without SERVICE_MODEL_PATH. Default: tinyModelPath(). */
  modelPath?: string | null;
  /** Extra environment (SERVICE_MAX_SEQ_LEN, ...). */
  env?: Record<string, string>;
  /** What to run, with its arguments: default this checkout's CLI (`bun src/cli/main.ts serve`). */
  command?: string[];
  /** Working directory; default the repository. */
  cwd?: string;
  /** The environment `env` is laid over; default the test runner's without its SERVICE_* settings. */
  baseEnv?: Record<string, string>;
  /** Fail unless /healthz answers 200 (the model loaded), instead of accepting a 503. */
  requireModel?: boolean;
  /**
   * Let the server see the host's GPUs. Without it CUDA_VISIBLE_DEVICES is
   * empty: the suite's servers run the CPU kernels on every host, as in CI
   * (the CUDA kernels lack speculative decoding and the compressed caches).
   */
  gpu?: boolean;
}

/** A port the OS just handed out, released for the server to take. */
export function freePort(): number {
  const probe = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const port = probe.port;
  probe.stop(true);
  return port;
}

// The test runner's own SERVICE_* settings must not leak into the servers.
function cleanEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env))
    if (v !== undefined && !/^(SERVICE_|TOKENIZER_HOME$|HOST$|PORT$)/.test(k)) env[k] = v;
  return env;
}

async function collect(stream: ReadableStream<Uint8Array>, into: string[]): Promise<void> {
  const decoder = new TextDecoder();
  for await (const chunk of stream) into.push(decoder.decode(chunk, { stream: true }));
}

export async function startServer(opts: ServerOptions = {}): Promise<TestServer> {
  const modelPath = opts.modelPath === undefined ? tinyModelPath() : opts.modelPath;
  const port = freePort();
  const url = `http://127.0.0.1:${port}`;
  const env: Record<string, string> = {
    ...(opts.baseEnv ?? cleanEnv()),
    SERVICE_BUILD_DIR: join(ROOT, "build"),
    HOST: "127.0.0.1",
    PORT: String(port),
    ...(modelPath !== null ? { SERVICE_MODEL_PATH: modelPath } : {}),
    ...(opts.gpu ? {} : { CUDA_VISIBLE_DEVICES: "" }),
    ...opts.env,
  };
  const proc = Bun.spawn(opts.command ?? [process.execPath, ...ENTRY], { cwd: opts.cwd ?? ROOT, env, stdout: "pipe", stderr: "pipe" });
  const log: string[] = [];
  void collect(proc.stdout, log);
  void collect(proc.stderr, log);
  const output = () => log.join("");

  const deadline = Date.now() + START_TIMEOUT_MS;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`server exited with ${proc.exitCode} before answering:\n${output()}`);
    const health = await fetch(`${url}/healthz`).catch(() => null); // not listening yet
    if (health) {
      if (opts.requireModel && health.status !== 200) {
        proc.kill();
        throw new Error(`server answered /healthz with ${health.status}, not 200: ${await health.text()}\n${output()}`);
      }
      break;
    }
    if (Date.now() > deadline) {
      proc.kill();
      throw new Error(`server did not answer /healthz within ${START_TIMEOUT_MS} ms:\n${output()}`);
    }
    await Bun.sleep(50);
  }

  const post: TestServer["post"] = (path, body, headers = { "content-type": "application/json" }) =>
    fetch(`${url}${path}`, {
      method: "POST",
      headers,
      body: typeof body === "string" ? body : JSON.stringify(body),
    });
  return {
    url,
    pid: proc.pid,
    output,
    post,
    postOk: async (path, body, schema) => jsonBody(await post(path, body), schema),
    async stop() {
      if (proc.exitCode === null) proc.kill("SIGTERM");
      return await proc.exited;
    },
  };
}

/**
 * A server for the tests of the enclosing file or describe block: started
 * before them (beforeAll, in the order hooks are registered) and stopped after
 * them. `opts` may be a function, for options that write files (models) only
 * when the block runs. The handle answers once the block's tests run.
 */
export function serverForTests(opts: ServerOptions | (() => ServerOptions) = {}): TestServer {
  let started: TestServer | undefined;
  const live = (): TestServer => {
    if (!started) throw new Error("the server is used before its beforeAll hook started it");
    return started;
  };
  beforeAll(async () => {
    started = await startServer(typeof opts === "function" ? opts() : opts);
  });
  afterAll(async () => {
    await started?.stop();
  });
  return {
    get url() {
      return live().url;
    },
    get pid() {
      return live().pid;
    },
    output: () => live().output(),
    post: (path, body, headers) => live().post(path, body, headers),
    postOk: (path, body, schema) => live().postOk(path, body, schema),
    stop: () => live().stop(),
  };
}

/** What a server reports for the TINY model: a stand-in engine's description. */
export const TINY_MODEL_INFO: ModelInfo = {
  arch: "looped-llama",
  dim: TINY.dim,
  nHeads: TINY.nHeads,
  nKvHeads: TINY.nKvHeads,
  headDim: TINY.dim / TINY.nHeads,
  ffnDim: TINY.ffnDim,
  vocabSize: TINY.vocabSize,
  defaultLoops: TINY.loops,
  maxSeqLen: 2048,
  ropeTheta: 10000,
  normEps: 1e-5,
  quant: "fp16",
  groupSize: 0,
  tiedOutput: false,
  headQuant: "fp16",
  headGroupSize: 0,
  embeddingFromHead: false,
  quantMix: {},
  nLayers: 1,
  normLayout: "pre",
  stepNorm: false,
  ...NO_RECURRENCE,
  family: "block",
  exitGate: false,
  exitThreshold: null,
  simd: "portable",
  threads: 1,
};

export interface InProcessApp {
  /** One request through the front door and the routes, as the server handles it. */
  handle(request: Request): Promise<Response>;
  /** POSTs a JSON body to `path`. */
  post(path: string, body: unknown): Promise<Response>;
}

/**
 * The server's app in this process (no port, no model file), around `engine`;
 * the configuration of an empty environment and GPT-2's tokenizer by default.
 */
export async function inProcessApp(engine: GenerationEngine, config: Config = loadConfig({}), tokenizer?: Tokenizer): Promise<InProcessApp> {
  const metrics = new ServiceMetrics({ maxSeqLen: config.maxSeqLen, defaultLoops: engine.info.defaultLoops, processMetrics: false });
  const app = createApp({ config, tokenizer: tokenizer ?? (await Tokenizer.load()), engine, loadError: null, metrics });
  const handle = frontDoor(config, (req) => app.handle(req));
  return {
    handle,
    post: (path, body) =>
      handle(new Request(`http://localhost${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })),
  };
}
