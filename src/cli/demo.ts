// `npm run demo`: serves the trained model that ships with the repository
// (models/kjv-looped-256.safetensors, a looped transformer trained on the
// King James Bible), so a newcomer has a running service that writes
// English after `npm install && npm run demo`.
import { existsSync } from "node:fs";
import { readSafetensors } from "../model/safetensors.ts";
import { TRAINED_MODEL_PATH } from "../model/trained.ts";
import { runServe } from "./serve.ts";

if (process.env.SERVICE_MODEL_PATH === undefined) {
  if (!existsSync(TRAINED_MODEL_PATH)) {
    console.error(`demo: ${TRAINED_MODEL_PATH} is missing (it ships with the repository; docs/training.md rebuilds it)`);
    process.exit(1);
  }
  // The demo is the one caller that supplies the model path itself; the
  // config module still reads and validates everything. Requests stay
  // within the context the model was trained on.
  process.env.SERVICE_MODEL_PATH = TRAINED_MODEL_PATH;
  process.env.SERVICE_MAX_SEQ_LEN ??= readSafetensors(TRAINED_MODEL_PATH).metadata.max_seq_len;
}
process.exit(await runServe(process.argv.slice(2)));
