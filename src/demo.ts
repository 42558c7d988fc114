// `npm run demo`: writes a small synthetic model (once) and serves it, so a
// newcomer has a running service after `npm install && npm run demo`.
import { existsSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { writeSyntheticModel } from "./model/synthetic.ts";
import { runServe } from "./serve.ts";

const DEMO_MODEL = join(import.meta.dir, "..", "models", "demo.safetensors");

if (!existsSync(DEMO_MODEL)) {
  console.log(`writing demo model ${DEMO_MODEL}`);
  mkdirSync(dirname(DEMO_MODEL), { recursive: true });
  writeSyntheticModel(DEMO_MODEL, { dim: 256, nHeads: 8, nKvHeads: 8, ffnDim: 768, vocabSize: 50257, loops: 8, seed: 1 });
}
// The demo is the one caller that supplies the model path itself; the
// config module still reads and validates everything.
process.env.SERVICE_MODEL_PATH ??= DEMO_MODEL;
process.exit(await runServe(process.argv.slice(2)));
