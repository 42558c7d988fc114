"""The published looped families as their own modeling code computes them,
written from a reading of that code (not from loopserve's kernels), on their
Hugging Face checkpoints as published: the PyTorch oracle the kernels are
held to (test/torch/families.test.ts, docs/import-hf.md).

Huginn-0125 (RavenForCausalLM, raven_modeling_minimal.py) and the
checkpoints made by retrofitting recurrence into pretrained models::

    e = prelude(wte[x] * embed_scale)                  SandwichBlocks, once per token
    s = state0                                         truncated normal, sigma = init std * embed_scale
    for each step: s = core(adapter(cat[s, e]))        the core's SandwichBlocks
    s = ln_f(s);  x = coda(s);  logits = lm_head(ln_f(x))

A SandwichBlock: x = norm_2(attn(norm_1(x)) + x); x = norm_4(mlp(norm_3(x)) + x).
attn: Wqkv fused by rows (q, k, v), qk_bias [2, 1, heads, head_dim] added to
q and k, RoPE on adjacent pairs with fp32 tables (theta = rope_base), causal
softmax attention over the cache of its own (layer, step) index. mlp:
fc fused (gate, up), silu(gate) * up, proj. The retrofitted checkpoints'
blocks are pre-norm (norm_1, norm_2), their RoPE rotates halves, and no
ln_f comes between the core and the coda (their modeling file).

The published code draws the first state from torch's global generator
(randn_like, then trunc_normal_): a different state every call. Here it is
loopserve's documented draw (kernels/loopserve.h, ls_model_config.state_std:
the same normal truncated at 3 sigma, from a counter-based generator keyed
by the position), so that two implementations can be compared at all.

Exits follow generate_with_adaptive_compute's criteria exactly (kl: the KL of
the previous step's distribution to this step's, the previous one uniform
before the first; entropy-diff: |H - H_prev| with H_prev 100 before the
first, H = -sum p log(p + 1e-10)), each probe running ln_f, the coda and the
head on the step's state, the exit step's probe the one whose coda rows stay
cached. The first generated token never exits: the published code means not
to exit a prompt ("do not exit in prefill"; in one revision the counter it
tests is shadowed by iterate_one_step's return, so the test always passes and
a prompt's every position stops where its last one does). What the cache
holds after an exit, two ways: "exact" still computes the token's every step
(a token's output equals computing every step and selecting); "copy" stops at
the exit as the published loop does (batch of one) and reads the missing
deeper indices as its latest-m4 lookup does: the position's row of the same
core layer at the deepest step computed.

Caches: "full" (every (layer, step) index its own) or compress-s N (N cache
indices for the core: index i >= prelude kept at (i - prelude) % N + prelude,
a later write replacing an earlier one of the same position; Huginn-0125's
compress-s16 keeps 4 steps of its 4 core layers).

Nanbeige4.2 (NanbeigeForCausalLM): Llama's decoder layers (pre-norm, GQA,
SwiGLU, rotate-half RoPE with fp32 tables, head_dim from the config) run
num_loops times over the same weights, each (loop, layer) with its own
cache, model.norm after every loop (after the last only with
skip_loop_final_norm), then lm_head.

    python3 -m loopserve_torch.published logits DIR --tokens 1,2,3 --steps 1,4,8 [--greedy N]
            [--rule kl|entropy --threshold T [--policy exact|copy]] [--cache compress-sN]

prints, per depth, "logits" (of every prompt position), "greedy" (N greedy
tokens, lowest id on ties), "greedy_logits", "greedy_margins" (top-2
differences), "exit_steps" (the steps each greedy token's position ran) and
"exit_margin" (the nearest any exit decision came to the threshold, relative
to it; null without one), computing in float64.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

from .hf import _read_tensors
from .state0 import state0

DTYPE = torch.float64


# ---- shared pieces ----


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(head_dim: int, positions: list[int], theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of pos * inv_freq, computed in fp32 as both families' code does: (T, head_dim / 2)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.tensor(positions, dtype=torch.float32), inv)
    return freqs.cos().to(DTYPE), freqs.sin().to(DTYPE)


def rotate_adjacent(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, head_dim): the pairs (2i, 2i + 1) rotated (Huginn's apply_rotary_emb_complex_like)."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, head_dim): Llama's q * cos + rotate_half(q) * sin."""
    half = x.shape[-1] // 2
    c, s = torch.cat((cos, cos), -1)[:, None, :], torch.cat((sin, sin), -1)[:, None, :]
    rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * c + rotated * s


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int) -> torch.Tensor:
    """q (T, H, d) at positions first.., k and v (P, KV, d) for positions 0..P-1: causal softmax attention, (T, H * d)."""
    T, H, d = q.shape
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,phd->htp", q, k) / math.sqrt(d)
    mask = torch.arange(k.shape[0])[None, :] > (first + torch.arange(T))[:, None]
    probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    return torch.einsum("htp,phd->thd", probs, v).reshape(T, H * d)


class Cache:
    """K and V rows by (cache index, position), as HuginnDynamicCache keeps them: "full" (every index its own),
    compress-s N (index i >= prelude kept at (i - prelude) % N + prelude, a later write of a position replacing
    an earlier one) or, where an exit left a position's deeper indices unwritten, latest (the position's row of the
    deepest index at or before this one of the same core layer: the published latest-m4, its 2 prelude layers and
    4 core layers taken from the model)."""

    def __init__(self, prelude: int = 0, core: int = 1, compress: int = 0) -> None:
        self.rows: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.prelude, self.core, self.compress = prelude, core, compress

    def _latest(self, index: int, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        for s in range(index, self.prelude - 1, -1):
            if (s - index) % self.core == 0 and pos in self.rows.get(s, {}):
                return self.rows[s][pos]
        raise KeyError(f"no row of position {pos} for cache index {index}")

    def store(self, index: int, first: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes rows first.. of index, returns a row of every position 0..last, in order."""
        if self.compress and index >= self.prelude:
            index = (index - self.prelude) % self.compress + self.prelude
        slot = self.rows.setdefault(index, {})
        for t in range(k.shape[0]):
            slot[first + t] = (k[t], v[t])
        rows = [slot[p] if p in slot else self._latest(index, p) for p in range(first + k.shape[0])]
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


# ---- Huginn ----


class Huginn:
    """RavenForCausalLM on a checkpoint directory (float64)."""

    def __init__(self, directory: str) -> None:
        with open(os.path.join(directory, "config.json")) as f:
            c = json.load(f)
        self.w = {n: torch.from_numpy(a.astype("float64")).to(DTYPE) for n, a in _read_tensors(directory).items()}
        self.dim = c["n_embd"]
        self.heads = c.get("n_heads", c.get("num_attention_heads"))
        self.kv_heads = c.get("num_key_value_heads") or self.heads
        self.head_dim = self.dim // self.heads
        self.ffn = c["intermediate_size"]
        self.prelude, self.core, self.coda = c["n_layers_in_prelude"], c["n_layers_in_recurrent_block"], c["n_layers_in_coda"]
        self.steps = c.get("mean_recurrence", 32)
        self.eps = c.get("norm_eps", 1e-6)
        init = c.get("init_values") or {}
        self.embed_scale = init.get("embed_scale", math.sqrt(self.dim))
        self.std = init.get("std", math.sqrt(2 / (5 * self.dim))) * self.embed_scale
        self.qk_bias = c.get("qk_bias", True)
        # Huginn's SandwichBlocks, or the retrofitted checkpoints' pre-norm blocks (their modeling file)
        self.sandwich = "transformer.core_block.0.norm_3.weight" in self.w
        self.theta = c.get("rope_theta") or c.get("rope_base", 50000)
        self.closest = math.inf  # the nearest any exit decision came to its threshold, relative to it
        tied = c.get("tie_embeddings", c.get("tie_word_embeddings", True))
        self.head = self.w["transformer.wte.weight"] if tied else self.w["lm_head.weight"]

    def block(self, x: torch.Tensor, p: str, index: int, first: int, cache: Cache) -> torch.Tensor:
        w = self.w
        T = x.shape[0]
        qkv = rms_norm(x, w[p + "norm_1.weight"], self.eps) @ w[p + "attn.Wqkv.weight"].t()
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q = qkv[:, :q_dim].view(T, self.heads, self.head_dim)
        k = qkv[:, q_dim : q_dim + kv_dim].view(T, self.kv_heads, self.head_dim)
        v = qkv[:, q_dim + kv_dim :].view(T, self.kv_heads, self.head_dim)
        if self.qk_bias:
            bias = w[p + "attn.qk_bias"]
            q, k = q + bias[0, 0], k + bias[1, 0]
        cos, sin = rope_tables(self.head_dim, list(range(first, first + T)), self.theta)
        rotate = rotate_adjacent if self.sandwich else rotate_halves
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        keys, values = cache.store(index, first, k, v)
        a = attend(q, keys, values, first) @ w[p + "attn.proj.weight"].t()

        def mlp(y: torch.Tensor) -> torch.Tensor:
            gate, up = (y @ w[p + "mlp.fc.weight"].t()).chunk(2, dim=-1)
            return (F.silu(gate) * up) @ w[p + "mlp.proj.weight"].t()

        if not self.sandwich:
            x = x + a
            return x + mlp(rms_norm(x, w[p + "norm_2.weight"], self.eps))
        x = rms_norm(a + x, w[p + "norm_2.weight"], self.eps)
        return rms_norm(mlp(rms_norm(x, w[p + "norm_3.weight"], self.eps)) + x, w[p + "norm_4.weight"], self.eps)

    def predict(self, s: torch.Tensor, first: int, cache: Cache) -> torch.Tensor:
        """predict_from_latents: ln_f (Huginn's own), the coda (cache indices -1, -2, ...), ln_f, the head."""
        ln_f = self.w["transformer.ln_f.weight"]
        x = rms_norm(s, ln_f, self.eps) if self.sandwich else s
        for j in range(self.coda):
            x = self.block(x, f"transformer.coda.{j}.", -1 - j, first, cache)
        return rms_norm(x, ln_f, self.eps) @ self.head.t()

    def run(self, tokens: list[int], first: int, steps: int, cache: Cache, exit_rule: tuple[str, float, str] | None = None):
        """Tokens at positions first..: (logits (T, vocab), steps the last token ran). An exit rule (rule, threshold,
        policy; one token) probes each step but the last; the logits are the exit step's. Policy "exact" still runs
        every step (every step, select); "copy" stops there, as the published generate_with_adaptive_compute does,
        leaving the deeper cache indices for Cache's latest lookup."""
        e = self.w["transformer.wte.weight"][tokens] * self.embed_scale
        for j in range(self.prelude):
            e = self.block(e, f"transformer.prelude.{j}.", j, first, cache)
        s = torch.stack([state0(first + t, self.dim, self.std) for t in range(len(tokens))])
        index = self.prelude
        chosen, ran = None, steps
        prev_logp, prev_entropy = None, 100.0
        for step in range(steps):
            s = torch.cat((s, e), dim=-1) @ self.w["transformer.adapter.weight"].t()
            for i in range(self.core):
                s = self.block(s, f"transformer.core_block.{i}.", index, first, cache)
                index += 1
            if exit_rule is None or step == steps - 1:
                continue
            rule, threshold, policy = exit_rule
            logits = self.predict(s, first, cache)[-1]
            logp = F.log_softmax(logits, dim=-1)
            if rule == "kl":
                before = torch.full_like(logp, -math.log(logp.shape[0])) if prev_logp is None else prev_logp
                value = float((before.exp() * (before - logp)).sum())
                prev_logp = logp
            else:
                p = logp.exp()
                entropy = float(-(p * torch.log(p + 1e-10)).sum())
                value, prev_entropy = abs(entropy - prev_entropy), entropy
            self.closest = min(self.closest, abs(value - threshold) / threshold)
            if value < threshold:
                chosen, ran = s.clone(), step + 1
                if policy == "copy":
                    break
                exit_rule = None
        return self.predict(s if chosen is None else chosen, first, cache), ran


# ---- Nanbeige ----


class Nanbeige:
    """NanbeigeForCausalLM on a checkpoint directory (float64)."""

    def __init__(self, directory: str) -> None:
        with open(os.path.join(directory, "config.json")) as f:
            c = json.load(f)
        self.w = {n: torch.from_numpy(a.astype("float64")).to(DTYPE) for n, a in _read_tensors(directory).items()}
        self.heads, self.kv_heads = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.layers, self.steps = c["num_hidden_layers"], c.get("num_loops", 1)
        self.prelude, self.core = 0, self.layers  # cache indices: (loop, layer) at loop * layers + layer
        self.eps, self.theta = c.get("rms_norm_eps", 1e-5), c.get("rope_theta", 10000.0)
        self.loop_norm = not c.get("skip_loop_final_norm", False)
        tied = c.get("tie_word_embeddings", False)
        self.head = self.w["model.embed_tokens.weight"] if tied else self.w["lm_head.weight"]

    def layer(self, h: torch.Tensor, i: int, index: int, first: int, cache: Cache) -> torch.Tensor:
        w, p, T = self.w, f"model.layers.{i}.", h.shape[0]
        x = rms_norm(h, w[p + "input_layernorm.weight"], self.eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].t()).view(T, self.heads, self.head_dim)
        k = (x @ w[p + "self_attn.k_proj.weight"].t()).view(T, self.kv_heads, self.head_dim)
        v = (x @ w[p + "self_attn.v_proj.weight"].t()).view(T, self.kv_heads, self.head_dim)
        cos, sin = rope_tables(self.head_dim, list(range(first, first + T)), self.theta)
        keys, values = cache.store(index, first, rotate_halves(k, cos, sin), v)
        h = h + attend(rotate_halves(q, cos, sin), keys, values, first) @ w[p + "self_attn.o_proj.weight"].t()
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], self.eps)
        up = F.silu(x @ w[p + "mlp.gate_proj.weight"].t()) * (x @ w[p + "mlp.up_proj.weight"].t())
        return h + up @ w[p + "mlp.down_proj.weight"].t()

    def run(self, tokens: list[int], first: int, steps: int, cache: Cache, exit_rule=None):
        if exit_rule is not None:
            raise ValueError("Nanbeige's published code has no exit rule")
        h = self.w["model.embed_tokens.weight"][tokens]
        norm = self.w["model.norm.weight"]
        for loop in range(steps):
            for i in range(self.layers):
                h = self.layer(h, i, loop * self.layers + i, first, cache)
            if self.loop_norm or loop == steps - 1:
                h = rms_norm(h, norm, self.eps)
        return h @ self.head.t(), steps


def load_family(directory: str):
    with open(os.path.join(directory, "config.json")) as f:
        archs = json.load(f).get("architectures") or []
    if "RavenForCausalLM" in archs:
        return Huginn(directory)
    if "NanbeigeForCausalLM" in archs:
        return Nanbeige(directory)
    raise ValueError(f"{directory}: neither RavenForCausalLM nor NanbeigeForCausalLM")


@torch.no_grad()
def decode(model, prompt: list[int], steps: int, n: int, exit_rule=None, compress: int = 0) -> dict:
    """The prompt in one call, then n greedy tokens one at a time (the first without exit, as the published generate)."""
    cache = Cache(model.prelude, model.core, compress)
    model.closest = math.inf
    logits, ran = model.run(prompt, 0, steps, cache)
    out = {"logits": logits.tolist(), "greedy": [], "greedy_logits": [], "greedy_margins": [], "exit_steps": []}
    last, pos = logits[-1], len(prompt)
    for j in range(n):
        top = torch.topk(last, 2)
        nxt = int(torch.argmax(last))  # the first maximum
        out["greedy"].append(nxt)
        out["greedy_logits"].append(last.tolist())
        out["greedy_margins"].append(float(top.values[0] - top.values[1]))
        out["exit_steps"].append(ran)
        if j + 1 < n:
            row, ran = model.run([nxt], pos, steps, cache, exit_rule)
            last, pos = row[-1], pos + 1
    out["exit_margin"] = None if model.closest == math.inf else model.closest
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="loopserve_torch.published")
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits")
    lg.add_argument("directory")
    lg.add_argument("--tokens", required=True)
    lg.add_argument("--steps", required=True)
    lg.add_argument("--greedy", type=int, default=0)
    lg.add_argument("--rule", choices=["kl", "entropy"])
    lg.add_argument("--threshold", type=float)
    lg.add_argument("--policy", choices=["exact", "copy"], default="exact")
    lg.add_argument("--cache", default="full")
    a = ap.parse_args(argv)
    model = load_family(a.directory)
    tokens = [int(t) for t in a.tokens.split(",")]
    rule = (a.rule, a.threshold, a.policy) if a.rule else None
    compress = int(a.cache.removeprefix("compress-s")) if a.cache.startswith("compress-s") else 0
    result = {s: decode(model, tokens, int(s), a.greedy, rule, compress) for s in a.steps.split(",")}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
