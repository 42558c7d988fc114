// `loopserve tokenize IN OUT`: turns a UTF-8 text file into a flat file of
// GPT-2 token ids (little-endian uint16, every id < 50257 fits), the form the
// PyTorch training script reads. Tokenized with the server's own tokenizer,
// so training sees exactly the ids the server will feed the model.
//
// Exit codes: 0 done, 1 the work failed (unreadable input, cannot write), 2 bad arguments.

import { readFileSync } from "node:fs";
import { writeFileAtomically } from "../model/safetensors.ts";
import { Tokenizer } from "../tokenizer/tokenizer.ts";

const HELP = `usage: loopserve tokenize IN OUT [--eot]

Tokenizes the UTF-8 text file IN with the GPT-2 tokenizer and writes the ids
to OUT as little-endian uint16, one after another.

options:
  --eot        end the stream with <|endoftext|> (50256)
  -h, --help   this help`;

/** Token ids as the little-endian uint16 bytes written to a token file. */
function tokenFileBytes(ids: readonly number[]): Uint8Array {
  const out = new Uint8Array(ids.length * 2);
  const view = new DataView(out.buffer);
  ids.forEach((id, i) => {
    if (!Number.isInteger(id) || id < 0 || id > 0xffff) throw new RangeError(`token id ${id} does not fit uint16`);
    view.setUint16(i * 2, id, true);
  });
  return out;
}

export async function runTokenizeCommand(argv: string[]): Promise<number> {
  if (argv.includes("-h") || argv.includes("--help")) {
    console.log(HELP);
    return 0;
  }
  const eot = argv.includes("--eot");
  const paths = argv.filter((a) => a !== "--eot");
  const unknown = paths.find((a) => a.startsWith("-"));
  if (unknown !== undefined || paths.length !== 2) {
    console.error(unknown ? `unknown option ${unknown}\n\n${HELP}` : HELP);
    return 2;
  }
  const [input, output] = paths;
  let text: string;
  try {
    // fatal: invalid UTF-8 is an error, not U+FFFD tokens silently trained on
    text = new TextDecoder("utf-8", { fatal: true }).decode(readFileSync(input));
  } catch (e) {
    console.error(`cannot read ${input} as UTF-8 text: ${(e as Error).message}`);
    return 1;
  }
  const tokenizer = await Tokenizer.load();
  const started = performance.now();
  const ids = tokenizer.encode(text);
  if (eot) ids.push(tokenizer.endOfTextId);
  try {
    writeFileAtomically(output, (writeAll) => {
      const bytes = tokenFileBytes(ids);
      writeAll(bytes);
      return bytes.length;
    });
  } catch (e) {
    console.error((e as Error).message);
    return 1;
  }
  const ms = performance.now() - started;
  console.log(`${output}: ${ids.length} tokens from ${text.length} characters (${ms.toFixed(0)} ms)`);
  return 0;
}
