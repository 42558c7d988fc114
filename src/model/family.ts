// The family a model file belongs to, as `model inspect` and model_info name
// it (docs/import-hf.md): the published family `model import-hf` read it from
// (metadata source_arch), else the layout it has.
import type { ModelConfig } from "./format.ts";
import { isRecurrent } from "./format.ts";

export const MODEL_FAMILIES = ["ouro", "huginn", "huginn-retrofit", "nanbeige", "recurrent", "stack", "block"] as const;
export type ModelFamily = (typeof MODEL_FAMILIES)[number];

/** What each family is, in a phrase. */
export const FAMILY_TITLES: Record<ModelFamily, string> = {
  ouro: "Ouro (OuroForCausalLM)",
  huginn: "Huginn (RavenForCausalLM)",
  "huginn-retrofit": "recurrence retrofitted into a pretrained model (RavenForCausalLM, pre-norm blocks)",
  nanbeige: "Nanbeige4.2 (NanbeigeForCausalLM)",
  recurrent: "recurrent depth (layers before and after the looped core)",
  stack: "a looped stack of layers",
  block: "a looped block",
};

type Layout = Pick<ModelConfig, "nLayers" | "normLayout" | "nPrelude" | "nCoda" | "injection" | "embedScale" | "stateStd" | "midNorm" | "ropeLayout" | "qkBias" | "headDim" | "dim" | "nHeads">;

export function modelFamily(sourceArch: string | undefined, c: Layout): ModelFamily {
  if (sourceArch === "ouro" || sourceArch === "nanbeige") return sourceArch;
  if (sourceArch === "huginn") return c.normLayout === "sandwich_sum" ? "huginn" : "huginn-retrofit";
  return isRecurrent(c) ? "recurrent" : c.nLayers > 1 ? "stack" : "block";
}
