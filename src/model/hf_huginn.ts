// Huginn-0125 (`RavenForCausalLM`, model_type "huginn_raven") and the
// checkpoints made by retrofitting recurrence into pretrained models (the
// same classes and names), as their published modeling code
// (raven_modeling_minimal.py) runs them, read for `model import-hf`
// (docs/import-hf.md):
//
//   e = prelude(wte[token] * embed_scale)          SandwichBlocks, once
//   s = state0 (a normal truncated at 3 sigma, sigma = std * embed_scale)
//   each step: s = core(adapter(concat[s, e]))     the core's SandwichBlocks
//   s = ln_f(s); x = coda(s); logits = lm_head(ln_f(x))
//
// A SandwichBlock norms its input (norm_1) and the residual sum after each add
// (norm_2, then norm_3 before the MLP and norm_4 after it): loopserve's
// sandwich_sum layout. Wqkv is q, k and v fused by rows, mlp.fc the gate and
// up matrices (gate first), attn.qk_bias [2, 1, heads, head_dim] the q and k
// biases; RoPE rotates adjacent pairs. The retrofitted checkpoints keep the
// names but their blocks are pre-norm (norm_1, norm_2 only), their RoPE
// Llama's halves and no ln_f comes between the core and the coda: which
// kind a checkpoint is, its tensors say (norm_3 present or not).

import { LS_MAX_ROPE_THETA } from "../abi/abi.generated.ts";
import { MAX_LAYERS, SETTING_RANGES } from "./format.ts";
import { type ConfigReader, checkAttention, type ExpectedTensor, type HfFamily, type HfModelShape, llamaWidths } from "./hf_checkpoint.ts";

const ARCH = "RavenForCausalLM";

/** What the published code's config fixes beside the shape: each must be as Huginn's, or the code computes another function. */
const FIXED: [string, unknown][] = [
  ["injection_type", "linear"],
  ["block_class_name", "SandwichBlock"],
  ["norm_class_name", "RMSNorm_llama"],
  ["mlp_class_name", "GatedMLP"],
  ["nonlin_name", "SiLU"],
  ["bias", false],
  ["test_time_noise", 0],
];

/** config.init_values (the published config class computes them from n_embd when absent): the embedding's scale and the first state's std. */
function initValues(config: Record<string, unknown>, dim: number): { embedScale: number; std: number } {
  const init = typeof config.init_values === "object" && config.init_values !== null ? (config.init_values as Record<string, unknown>) : {};
  const num = (v: unknown, dflt: number) => (typeof v === "number" && Number.isFinite(v) ? v : dflt);
  return { embedScale: num(init.embed_scale, Math.sqrt(dim)), std: num(init.std, Math.sqrt(2 / (5 * dim))) };
}

/** The prefix of layer i of a group in the checkpoint, and in loopserve's file. */
function groups(m: HfModelShape, layout: Record<string, string>): { src: string; dst: string }[] {
  const out: { src: string; dst: string }[] = [];
  for (let i = 0; i < Number(layout.n_prelude ?? 0); i++) out.push({ src: `transformer.prelude.${i}.`, dst: `prelude.${i}.` });
  for (let i = 0; i < m.nLayers; i++) out.push({ src: `transformer.core_block.${i}.`, dst: m.nLayers === 1 ? "block." : `layers.${i}.` });
  for (let i = 0; i < Number(layout.n_coda ?? 0); i++) out.push({ src: `transformer.coda.${i}.`, dst: `coda.${i}.` });
  return out;
}

export const HUGINN: HfFamily = {
  arch: "huginn",
  title: `Huginn (model_type "huginn_raven", ${ARCH})`,
  head: "lm_head.weight",

  matches: (config, archs) => config.model_type === "huginn_raven" || archs.includes(ARCH),

  shape(r: ConfigReader, c: Record<string, unknown>): HfModelShape {
    const dimKey = r.has("n_embd") ? "n_embd" : "hidden_size";
    const headsKey = r.has("n_heads") ? "n_heads" : "num_attention_heads";
    const m: HfModelShape = {
      ...llamaWidths(r, dimKey, headsKey),
      vocabSize: r.int(r.has("padded_vocab_size") ? "padded_vocab_size" : "vocab_size", ...SETTING_RANGES.vocabSize),
      nLayers: r.int("n_layers_in_recurrent_block", ...SETTING_RANGES.nLayers),
      defaultLoops: r.int("mean_recurrence", ...SETTING_RANGES.loops, 32),
      maxSeqLen: r.int("block_size", ...SETTING_RANGES.maxSeqLen, 4096),
      // the retrofitted checkpoints' Llama RoPE reads rope_theta; Huginn's own, rope_base
      ropeTheta: r.has("rope_theta") ? r.positive("rope_theta", LS_MAX_ROPE_THETA, 10000) : r.positive("rope_base", LS_MAX_ROPE_THETA, 50000),
      normEps: r.positive("norm_eps", 1, 1e-6),
      sandwich: false, // the layout's norm_layout says which
      stepNorm: false,
      exitGate: false,
      exitThreshold: null,
      tiedOutput: r.bool(r.has("tie_embeddings") ? "tie_embeddings" : "tie_word_embeddings", true),
    };
    checkAttention(r, m, { dim: dimKey, nHeads: headsKey, nKvHeads: "num_key_value_heads", headDim: "head_dim" });
    if (r.has("head_dim") && c.head_dim !== m.headDim) r.fail(`head_dim (${JSON.stringify(c.head_dim)}) must equal ${dimKey} / ${headsKey} = ${m.headDim}`);
    const prelude = r.int("n_layers_in_prelude", ...SETTING_RANGES.outerLayers, 2);
    const coda = r.int("n_layers_in_coda", ...SETTING_RANGES.outerLayers, 2);
    if (prelude + m.nLayers + coda > MAX_LAYERS) r.fail(`n_layers_in_prelude + n_layers_in_recurrent_block + n_layers_in_coda must be at most ${MAX_LAYERS}`);
    if (r.has("n_layers") && c.n_layers !== prelude + m.nLayers + coda) {
      r.fail(`n_layers (${JSON.stringify(c.n_layers)}) must be n_layers_in_prelude + n_layers_in_recurrent_block + n_layers_in_coda = ${prelude + m.nLayers + coda}`);
    }
    // What loopserve's kernels do not compute: refuse rather than serve another function.
    for (const [key, value] of FIXED)
      if (r.has(key) && c[key] !== value) r.fail(`${key} must be ${JSON.stringify(value)} (as Huginn's), got ${JSON.stringify(c[key])}`);
    if (r.has("rope_scaling")) r.fail(`rope_scaling ${JSON.stringify(c.rope_scaling)} is not supported (plain RoPE only)`);
    if (r.bool("qk_bias", true) && m.nKvHeads !== m.nHeads) r.fail(`qk_bias needs num_key_value_heads = ${headsKey} (the k bias has one row per query head)`);
    return m;
  },

  layout(m, c, has) {
    const { embedScale, std } = initValues(c, m.dim);
    // Huginn's SandwichBlocks, or the retrofitted checkpoints' pre-norm blocks
    const sandwich = has("transformer.core_block.0.norm_3.weight");
    return {
      n_prelude: String(c.n_layers_in_prelude ?? 2),
      n_coda: String(c.n_layers_in_coda ?? 2),
      injection: "adapter",
      embed_scale: String(embedScale),
      state_std: String(std * embedScale),
      norm_layout: sandwich ? "sandwich_sum" : "pre",
      mid_norm: sandwich ? "1" : "0",
      rope_layout: sandwich ? "interleaved" : "half",
      qk_bias: c.qk_bias === false ? "0" : "1",
    };
  },

  tensors(m, layout): ExpectedTensor[] {
    const q = m.nHeads * m.headDim;
    const kv = m.nKvHeads * m.headDim;
    const sum = layout.norm_layout === "sandwich_sum";
    const out: ExpectedTensor[] = [{ name: "transformer.wte.weight", target: "tok_embeddings.weight", shape: [m.vocabSize, m.dim] }];
    for (const { src, dst } of groups(m, layout)) {
      const one = (name: string, target: string, shape: number[]) => out.push({ name: `${src}${name}`, target: `${dst}${target}`, shape });
      const part = (name: string, target: string, shape: number[], of: number[], first: number) =>
        out.push({ name: `${src}${name}`, target: `${dst}${target}`, shape, part: { of, first } });
      const qkv = [q + 2 * kv, m.dim];
      const fc = [2 * m.ffnDim, m.dim];
      one("norm_1.weight", "attn_norm.weight", [m.dim]);
      part("attn.Wqkv.weight", "wq.weight", [q, m.dim], qkv, 0);
      part("attn.Wqkv.weight", "wk.weight", [kv, m.dim], qkv, q * m.dim);
      part("attn.Wqkv.weight", "wv.weight", [kv, m.dim], qkv, (q + kv) * m.dim);
      if (layout.qk_bias === "1") {
        const of = [2, 1, m.nHeads, m.headDim];
        part("attn.qk_bias", "wq.bias", [q], of, 0);
        part("attn.qk_bias", "wk.bias", [kv], of, q);
      }
      one("attn.proj.weight", "wo.weight", [m.dim, q]);
      if (sum) {
        one("norm_2.weight", "attn_out_norm.weight", [m.dim]);
        one("norm_3.weight", "ffn_norm.weight", [m.dim]);
        one("norm_4.weight", "ffn_out_norm.weight", [m.dim]);
      } else {
        one("norm_2.weight", "ffn_norm.weight", [m.dim]);
      }
      part("mlp.fc.weight", "w1.weight", [m.ffnDim, m.dim], fc, 0);
      part("mlp.fc.weight", "w3.weight", [m.ffnDim, m.dim], fc, m.ffnDim * m.dim);
      one("mlp.proj.weight", "w2.weight", [m.dim, m.ffnDim]);
    }
    out.push({ name: "transformer.adapter.weight", target: "adapter.weight", shape: [m.dim, 2 * m.dim] });
    out.push({ name: "transformer.ln_f.weight", target: "norm.weight", shape: [m.dim] });
    if (!m.tiedOutput) out.push({ name: "lm_head.weight", target: "output.weight", shape: [m.vocabSize, m.dim] });
    return out;
  },

  // The RoPE table the published code saves as a persistent buffer: loopserve computes it from rope_base.
  ignorable: (name) => name === "freqs_cis" || name.endsWith(".freqs_cis"),

  // its generate stops at these as well as at eos (the chat template ends each turn with <|end_turn|>)
  stopTokens: ["<|begin_text|>", "<|end_text|>", "<|end_turn|>"],
};
