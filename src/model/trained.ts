// The trained model that ships with the repository (torch/: trained on the
// King James Bible; docs/training.md says how). `npm run demo` serves it and
// the quality benchmark measures it.
import { join } from "node:path";

export const TRAINED_MODEL_PATH = join(import.meta.dir, "..", "..", "models", "kjv-looped-256.safetensors");
