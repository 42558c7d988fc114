// Nanbeige4.2 (`NanbeigeForCausalLM`), read for `model import-hf`
// (docs/import-hf.md): a Llama decoder (pre-norm layers, GQA, SwiGLU,
// rotate-half RoPE, Llama's tensor names) whose num_hidden_layers layers run
// num_loops times with the same weights, each (loop, layer) attending to its
// own keys and values, the same positions every loop. The norm at the loop
// boundary is the final norm's weight (model.norm), applied after every loop
// unless skip_loop_final_norm (then after the last only): loopserve's step
// norm. head_dim may differ from hidden_size / heads (4.2-3B: 128 against
// 3072 / 48), so q and the attention output are heads x head_dim wide. The
// options the published code refuses on this family (n-gram embeddings,
// hyper-connections, depth attention, loop-split, shared loop caches, q/k
// norms) are refused here too.

import { LS_MAX_ROPE_THETA } from "../abi/abi.generated.ts";
import { SETTING_RANGES } from "./format.ts";
import { checkAttention, type ConfigReader, type HfFamily, type HfModelShape, loopserveTensorShapes, ouroName } from "./hf_checkpoint.ts";

const ARCH = "NanbeigeForCausalLM";

/** Options of the family's config class that change the function; this checkpoint leaves them off, and so must any imported. */
const UNSUPPORTED = [
  "qk_layernorm",
  "emb_neighbor_num",
  "insert_ngram_layer_idx",
  "ngram_insert_all_layers",
  "enable_double_loop_split",
  "loop_middle_layers",
  "loop_share_kv",
  "enable_hyper_connection",
  "enable_mhc",
  "enable_h_res_identity",
  "enable_depth_attention",
];

export const NANBEIGE: HfFamily = {
  arch: "nanbeige",
  title: `Nanbeige4.2 (${ARCH})`,
  head: "lm_head.weight",

  matches: (config, archs) => archs.includes(ARCH),

  shape(r: ConfigReader, c: Record<string, unknown>): HfModelShape {
    const dim = r.int("hidden_size", ...SETTING_RANGES.dim);
    const nHeads = r.int("num_attention_heads", ...SETTING_RANGES.nHeads);
    const nKvHeads = r.int("num_key_value_heads", ...SETTING_RANGES.nKvHeads, nHeads);
    const stated = r.has("head_dim") ? r.int("head_dim", ...SETTING_RANGES.headDim) : undefined;
    const headDim = checkAttention(r, { dim, nHeads, nKvHeads }, { dim: "hidden_size", nHeads: "num_attention_heads", nKvHeads: "num_key_value_heads", headDim: "head_dim" }, stated);
    for (const key of UNSUPPORTED) if (c[key] !== undefined && c[key] !== null && c[key] !== false && !(Array.isArray(c[key]) && c[key].length === 0)) {
      r.fail(`${key} ${JSON.stringify(c[key])} is not supported (Nanbeige4.2's plain looped layers only)`);
    }
    if (r.has("hidden_act") && c.hidden_act !== "silu") r.fail(`hidden_act must be "silu", got ${JSON.stringify(c.hidden_act)}`);
    if (c.attention_bias === true || c.mlp_bias === true) r.fail("attention_bias and mlp_bias must be false (loopserve's projections have no bias)");
    if (r.has("rope_scaling")) r.fail(`rope_scaling ${JSON.stringify(c.rope_scaling)} is not supported (plain RoPE only)`);
    if (Array.isArray(c.layer_types) && c.layer_types.some((t) => t !== "full_attention")) r.fail("sliding-window attention is not supported (layer_types)");
    return {
      dim,
      nHeads,
      nKvHeads,
      headDim,
      ffnDim: r.int("intermediate_size", ...SETTING_RANGES.ffnDim),
      vocabSize: r.int("vocab_size", ...SETTING_RANGES.vocabSize),
      nLayers: r.int("num_hidden_layers", ...SETTING_RANGES.nLayers),
      defaultLoops: r.int("num_loops", ...SETTING_RANGES.loops, 1),
      maxSeqLen: r.int("max_position_embeddings", ...SETTING_RANGES.maxSeqLen, 262144),
      ropeTheta: r.positive("rope_theta", LS_MAX_ROPE_THETA, 10000),
      normEps: r.positive("rms_norm_eps", 1, 1e-5),
      sandwich: false,
      // model.norm at every loop boundary, or only after the last loop
      stepNorm: !r.bool("skip_loop_final_norm", false),
      exitGate: false,
      exitThreshold: null,
      tiedOutput: r.bool("tie_word_embeddings", false),
    };
  },

  layout: (m): Record<string, string> => (m.headDim * m.nHeads !== m.dim ? { head_dim: String(m.headDim) } : {}),

  // Llama's names, which Ouro's pre-norm layers share
  tensors: (m) => loopserveTensorShapes(m).map(([target, shape]) => ({ name: ouroName(target), target, shape })),

  ignorable: () => false,
};
