// The published families import-hf reads beside Ouro and loopserve's own
// (docs/import-hf.md), each in its own module.
import type { HfFamily } from "./hf_checkpoint.ts";
import { HUGINN } from "./hf_huginn.ts";
import { NANBEIGE } from "./hf_nanbeige.ts";

export const HF_FAMILIES: readonly HfFamily[] = [HUGINN, NANBEIGE];
