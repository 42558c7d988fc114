#!/usr/bin/env bun
// loopserve command line: `serve` (default), `model ...`, `tokenize`, `bench`,
// `--version`, `--help`; each command lives in its own module beside this one.
import pkg from "../../package.json" with { type: "json" };

const USAGE = `loopserve ${pkg.version} — serves a weight-shared looped transformer over HTTP

usage:
  loopserve [serve] [--host H] [--port P]   start the server (environment: see README)
  loopserve model new OUT [options]         write a deterministic synthetic model
  loopserve model inspect FILE              print a model file's header
  loopserve model quantize IN OUT --quant int4|int2   quantize an fp16/bf16/fp32 model
  loopserve model export-gguf IN OUT [--loops N]      write the unrolled model as a Llama GGUF
  loopserve model import-hf DIR OUT         import a Hugging Face checkpoint (Ouro) as fp16
  loopserve tokenize IN OUT [--eot]         write a text file's GPT-2 token ids (uint16) for training
  loopserve bench [--model FILE]            prefill and decode tokens/s of this build
  loopserve --version                       print the version
  loopserve COMMAND --help                  help for one command
`;

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case undefined:
    case "serve":
      return (await import("./serve.ts")).runServe(rest);
    case "model":
      return (await import("./model.ts")).runModelCommand(rest);
    case "tokenize":
      return (await import("./tokenize.ts")).runTokenizeCommand(rest);
    case "bench":
      return (await import("./bench/command.ts")).runBench(rest);
    case "--version":
    case "-v":
      console.log(pkg.version);
      return 0;
    case "--help":
    case "-h":
    case "help":
      console.log(USAGE);
      return 0;
    default:
      if (command.startsWith("--")) return (await import("./serve.ts")).runServe(argv);
      console.error(`unknown command '${command}'\n\n${USAGE}`);
      return 2;
  }
}

if (import.meta.main) {
  // serve resolves only when the server has shut down; the rest right away.
  process.exit(await main(process.argv.slice(2)));
}
