// The trained model's text: the King James Bible split by
// torch/loopserve_torch/data.py (every 20th block of 30 verses held out),
// tokenized by `loopserve tokenize` (the server's own tokenizer).
// Made once and cached under .cache/kjv (needs Debian's bible-kjv and
// python3; docs/training.md).
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { runTokenizeCommand } from "../src/cli/tokenize.ts";
import { runTorchModule } from "../test/helpers/torch.ts";

const ROOT = resolve(import.meta.dir, "..");
const CACHE = join(ROOT, ".cache", "kjv");

/** The path of the training or the held-out split's text (written on first use). */
export function kjvText(split: "train" | "val"): string {
  const text = join(CACHE, `${split}.txt`);
  if (!existsSync(text)) {
    console.error(`writing the King James Bible's split into ${CACHE} (once; reused afterwards)`);
    mkdirSync(CACHE, { recursive: true });
    try {
      runTorchModule("data", [CACHE]);
    } catch (e) {
      throw new Error(`the KJV text needs Debian's bible-kjv and python3-numpy (npm test installs them when run as root): ${(e as Error).message}`);
    }
  }
  return text;
}

/** Token ids of the training or the held-out split. */
export async function kjvTokens(split: "train" | "val"): Promise<Uint16Array> {
  const bin = join(CACHE, `${split}.bin`);
  if (!existsSync(bin)) {
    const text = kjvText(split);
    console.error(`tokenizing ${text} into ${bin} (once; reused afterwards)`);
    if ((await runTokenizeCommand([text, bin])) !== 0) throw new Error(`loopserve tokenize ${text} failed`);
  }
  const bytes = readFileSync(bin);
  return new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 2);
}
