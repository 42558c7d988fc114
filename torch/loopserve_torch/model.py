"""LoopedLlama: the function loopserve serves, in PyTorch.

A stack of `n_layers` Llama-style layers (distinct weights) applied `loops`
times ("steps"); the single-block model of format version 1 is n_layers = 1:

    h = E[token]
    for s in range(loops):
        for layer i in range(n_layers):                        KV cache slot (s, i)
            x = rmsnorm(h, attn_norm_i)
            q, k, v = x Wq^T, x Wk^T, x Wv^T; rope(q, k, pos)  GQA: n_kv_heads
            a = attention(q, k, v) Wo^T                        causal, 1/sqrt(head_dim)
            if sandwich: a = rmsnorm(a, attn_out_norm_i)
            h = h + a
            x = rmsnorm(h, ffn_norm_i)
            f = (silu(x W1^T) * (x W3^T)) W2^T                 SwiGLU
            if sandwich: f = rmsnorm(f, ffn_out_norm_i)
            h = h + f
        if step_norm: h = rmsnorm(h, norm)                     carried into the next step
        if exit gate: lambda_s = sigmoid(h . w_gate + b_gate)  fp32
    logits = (h if step_norm else rmsnorm(h, norm)) Wout^T     Wout = E when tied

rmsnorm(x, w) = x / sqrt(mean(x^2) + eps) * w. RoPE rotates the pairs
(i, i + head_dim/2) by pos * theta^(-2i / head_dim), as Hugging Face's Llama
does. Matrices are [out_features, in_features], as nn.Linear keeps them.

Recurrent depth (docs/model-format.md; Huginn-0125, the retrofitted
checkpoints): n_prelude layers before the stack and n_coda after it, each
run once per token with its own cache; with injection "adapter" every
step's input is adapter . concat[state, e] (e the prelude's output, the
first state state0.py's draw times state_std); the embedding times
embed_scale; mid_norm norms the stack's output before the coda; layers may
norm their residual sums (norm_layout "sandwich_sum"), add q/k biases, rotate
adjacent RoPE pairs (rope_layout "interleaved") and have a head_dim other
than dim / n_heads. The gate's exits work there too; exit_forward does not.

Early exit (docs/early-exit.md; a model with the gate and a
threshold in (0, 1]): per token, remaining = 1, cdf = 0; after step s < the
last, p = lambda_s * remaining, remaining *= 1 - lambda_s, cdf += p; at the
last allowed step cdf = 1. The token exits after the first step whose
cdf >= threshold and its logits come from that step. Under the "exact"
policy it still runs every step (every step, select: the published Ouro
code); under "copy" it stops, and the slots (s', i) of its deeper steps s'
hold copies of its K/V of step s. Only tokens whose logits are sampled
exit; the other prompt positions run every step. `exit_forward` computes
this for a whole sequence at once; `Decoder` does it the way a server does,
one token at a time with a cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from .state0 import state0

GPT2_VOCAB = 50257
# The kernels' caps on a model (kernels/loopserve.h, LS_MAX_*): a config
# beyond them would write a file loopserve refuses. The header is their one
# source; test/torch/limits.test.ts fails when these differ from it.
MAX_LOOPS = 64
LIMITS = {"dim": 65536, "n_heads": 4096, "n_kv_heads": 4096, "ffn_dim": 262144, "vocab_size": 1 << 20, "max_seq_len": 1 << 20}
MAX_ROPE_THETA = 1e12  # rope_theta < this
MAX_NORM_EPS = 1.0  # norm_eps < this
MAX_LAYERS = 128  # the format's n_layers range, 1..128 (kernels/loopserve.h LS_MAX_LAYERS)
NORM_LAYOUTS = ("pre", "sandwich", "sandwich_sum")
ROPE_LAYOUTS = ("half", "interleaved")
INJECTIONS = ("none", "adapter")


# What fills an exited token's deeper cache slots (module docstring).
EXIT_POLICIES = ("exact", "copy")

@dataclass
class LoopedConfig:
    dim: int = 256
    n_heads: int = 8
    n_kv_heads: int = 8
    ffn_dim: int = 768
    vocab_size: int = GPT2_VOCAB
    default_loops: int = 8
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied_output: bool = True
    # format version 2 (stacks); the defaults are the single-block model
    n_layers: int = 1
    norm_layout: str = "pre"
    step_norm: bool = False
    exit_gate: bool = False
    exit_threshold: float | None = None  # the default threshold of requests naming none (needs the gate)
    # recurrent depth; the defaults are a stack without it
    attn_head_dim: int = 0  # 0: dim / n_heads (metadata head_dim)
    n_prelude: int = 0
    n_coda: int = 0
    injection: str = "none"
    embed_scale: float = 1.0
    state_std: float = 0.0
    mid_norm: bool = False
    rope_layout: str = "half"
    qk_bias: bool = False

    def __post_init__(self) -> None:
        for key, cap in LIMITS.items():
            if not 1 <= getattr(self, key) <= cap:
                raise ValueError(f"{key} must be in [1, {cap}], got {getattr(self, key)}")
        if not 0 < self.rope_theta < MAX_ROPE_THETA:
            raise ValueError(f"rope_theta must be in (0, {MAX_ROPE_THETA:g}), got {self.rope_theta}")
        if not 0 < self.norm_eps < MAX_NORM_EPS:
            raise ValueError(f"norm_eps must be in (0, {MAX_NORM_EPS:g}), got {self.norm_eps}")
        if self.attn_head_dim == 0 and self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of n_heads ({self.n_heads})")
        if self.head_dim % 2 or self.head_dim < 2:
            raise ValueError(f"head_dim = {self.head_dim} must be even (RoPE rotates pairs)")
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if not 1 <= self.default_loops <= MAX_LOOPS:
            raise ValueError(f"default_loops must be in [1, {MAX_LOOPS}], got {self.default_loops}")
        if not 1 <= self.n_layers <= MAX_LAYERS:
            raise ValueError(f"n_layers must be in [1, {MAX_LAYERS}], got {self.n_layers}")
        if self.norm_layout not in NORM_LAYOUTS:
            raise ValueError(f"norm_layout must be one of {', '.join(NORM_LAYOUTS)}, got {self.norm_layout!r}")
        if self.n_layers + self.n_prelude + self.n_coda > MAX_LAYERS or min(self.n_prelude, self.n_coda) < 0:
            raise ValueError(f"n_layers + n_prelude + n_coda must be at most {MAX_LAYERS}")
        if self.injection not in INJECTIONS:
            raise ValueError(f"injection must be one of {', '.join(INJECTIONS)}, got {self.injection!r}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope_layout must be one of {', '.join(ROPE_LAYOUTS)}, got {self.rope_layout!r}")
        if not self.embed_scale > 0 or self.state_std < 0:
            raise ValueError("embed_scale must be > 0 and state_std >= 0")
        if self.state_std and self.injection != "adapter":
            raise ValueError('state_std needs injection "adapter"')
        if self.mid_norm and not self.n_coda:
            raise ValueError("mid_norm needs a coda (n_coda > 0)")
        if self.exit_threshold is not None:
            if not self.exit_gate:
                raise ValueError("exit_threshold needs the exit gate")
            check_threshold(self.exit_threshold)

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.dim // self.n_heads

    @property
    def recurrent(self) -> bool:
        """Whether the config uses any recurrent-depth field."""
        return (self.n_prelude > 0 or self.n_coda > 0 or self.injection != "none" or self.embed_scale != 1 or self.mid_norm
                or self.rope_layout != "half" or self.qk_bias or self.head_dim * self.n_heads != self.dim)

    @property
    def stacked(self) -> bool:
        """Whether the config uses anything of format version 2."""
        return (self.n_layers != 1 or self.norm_layout != "pre" or self.step_norm or self.exit_gate or self.exit_threshold is not None
                or self.recurrent)

    @classmethod
    def from_dict(cls, d: dict) -> "LoopedConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def check_threshold(t: float) -> None:
    if not 0 < t <= 1:
        raise ValueError(f"exit_threshold must be in (0, 1], got {t}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim: int, positions: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of pos * theta^(-2i/head_dim), each (T, head_dim/2), in float64 then float32."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """x: (B, heads, T, head_dim); rotates the pair (i, i + head_dim/2), or (2i, 2i + 1) interleaved."""
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def causal_mask(past: int, new: int, device: torch.device | None = None) -> torch.Tensor:
    """(new, past + new) True where key position > query position (masked out)."""
    keys = torch.arange(past + new, device=device)
    queries = past + torch.arange(new, device=device)
    return keys[None, :] > queries[:, None]


class Block(nn.Module):
    """One layer of the stack."""

    def __init__(self, c: LoopedConfig) -> None:
        super().__init__()
        self.c = c
        hd = c.head_dim
        self.attn_norm = RMSNorm(c.dim, c.norm_eps)
        self.wq = nn.Linear(c.dim, c.n_heads * hd, bias=c.qk_bias)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * hd, bias=c.qk_bias)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(c.n_heads * hd, c.dim, bias=False)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.w1 = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.w2 = nn.Linear(c.ffn_dim, c.dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn_dim, bias=False)
        if c.norm_layout != "pre":
            self.attn_out_norm = RMSNorm(c.dim, c.norm_eps)
            self.ffn_out_norm = RMSNorm(c.dim, c.norm_eps)

    def tensor_names(self) -> list[str]:
        """The layer's tensors in file order (without the layer prefix and `.weight`)."""
        names = ["attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3"]
        if self.c.norm_layout != "pre":
            names += ["attn_out_norm", "ffn_out_norm"]
        return names

    def named_tensors(self, prefix: str) -> list[tuple[str, torch.Tensor]]:
        """(file name, tensor) of the layer's weights, then its q/k biases."""
        out = [(f"{prefix}{n}.weight", getattr(self, n).weight) for n in self.tensor_names()]
        if self.c.qk_bias:
            out += [(f"{prefix}wq.bias", self.wq.bias), (f"{prefix}wk.bias", self.wk.bias)]
        return out

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, kv_fp16: bool,
                past: tuple[torch.Tensor, torch.Tensor] | None = None, kv_hook=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(new h, K, V of the new positions). `past`: the cache's K and V of the
        earlier positions, (B, n_kv_heads, P, head_dim); `kv_hook(k, v)` may
        replace the new positions' K and V before attention reads them."""
        c = self.c
        B, T, _ = h.shape
        hd = c.head_dim
        x = self.attn_norm(h)
        q = self.wq(x).view(B, T, c.n_heads, hd).transpose(1, 2)
        k = self.wk(x).view(B, T, c.n_kv_heads, hd).transpose(1, 2)
        v = self.wv(x).view(B, T, c.n_kv_heads, hd).transpose(1, 2)
        interleaved = c.rope_layout == "interleaved"
        q = apply_rope(q, cos, sin, interleaved)
        k = apply_rope(k, cos, sin, interleaved)
        if kv_fp16:  # loopserve's cache holds K and V in fp16 (read back in the model's dtype)
            k = k.half().to(h.dtype)
            v = v.half().to(h.dtype)
        if kv_hook is not None:
            k, v = kv_hook(k, v)
        new_k, new_v = k, v
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        group = c.n_heads // c.n_kv_heads
        if group > 1:  # query head j reads key/value head j // group
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        att = (probs @ v).transpose(1, 2).reshape(B, T, c.n_heads * hd)
        a = self.wo(att)
        h = self._add(h, a, "attn_out_norm")
        x = self.ffn_norm(h)
        f = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self._add(h, f, "ffn_out_norm"), new_k, new_v

    def _add(self, h: torch.Tensor, y: torch.Tensor, norm: str) -> torch.Tensor:
        """The residual add of a sublayer's output y, as the norm layout places its norm."""
        layout = self.c.norm_layout
        if layout == "sandwich":
            return h + getattr(self, norm)(y)
        if layout == "sandwich_sum":
            return getattr(self, norm)(h + y)
        return h + y


def gate_lambda(model: "LoopedLlama", h: torch.Tensor) -> torch.Tensor:
    """lambda = 1/(1+exp(-z)), z = h . w + b, in fp32; h (..., dim) -> (...)."""
    g = model.exit_gate
    z = h.float() @ g.weight.float()[0] + g.bias.float()[0]
    return 1.0 / (1.0 + torch.exp(-z))


class ExitState:
    """The server's exit rule (docs/early-exit.md) for a set of tokens, updated step by step in fp32."""

    def __init__(self, shape: tuple[int, ...], threshold: float, loops: int, device=None) -> None:
        check_threshold(threshold)
        self.threshold = torch.tensor(threshold, dtype=torch.float32)
        self.loops = loops
        self.remaining = torch.ones(shape, dtype=torch.float32, device=device)
        self.cdf = torch.zeros(shape, dtype=torch.float32, device=device)
        # the closest any decision came to the threshold: |cdf - threshold| over the steps decided
        # by the gate (not the last); a kernel summing in another order can only differ where it is tiny
        self.margin = torch.full(shape, float("inf"), dtype=torch.float32, device=device)

    def update(self, s: int, lam: torch.Tensor) -> torch.Tensor:
        """After step s: True where the token exits now (or has already)."""
        if s < self.loops - 1:
            p = lam * self.remaining
            self.remaining = self.remaining * (1 - lam)
            self.cdf = self.cdf + p
            self.margin = torch.minimum(self.margin, (self.cdf - self.threshold).abs())
        else:
            self.cdf = torch.ones_like(self.cdf)
        return self.cdf >= self.threshold


class LoopedLlama(nn.Module):
    def __init__(self, c: LoopedConfig) -> None:
        super().__init__()
        self.config = c
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        if c.n_layers == 1:
            self.block = Block(c)
        else:
            self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.prelude = nn.ModuleList(Block(c) for _ in range(c.n_prelude))
        self.coda = nn.ModuleList(Block(c) for _ in range(c.n_coda))
        if c.injection == "adapter":  # [dim, 2 dim]: the state's columns, then the prelude output's
            self.adapter = nn.Linear(2 * c.dim, c.dim, bias=False)
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = None if c.tied_output else nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.exit_gate:
            self.exit_gate = nn.Linear(c.dim, 1, bias=True)

    @property
    def stack(self) -> list[Block]:
        return [self.block] if self.config.n_layers == 1 else list(self.layers)

    def layer_prefix(self, i: int) -> str:
        return "block." if self.config.n_layers == 1 else f"layers.{i}."

    def named_layers(self) -> list[tuple[str, Block]]:
        """Every layer with its file prefix: the stack's, then the prelude's and the coda's."""
        return ([(self.layer_prefix(i), b) for i, b in enumerate(self.stack)] + [(f"prelude.{j}.", b) for j, b in enumerate(self.prelude)]
                + [(f"coda.{j}.", b) for j, b in enumerate(self.coda)])

    def embed(self, tokens: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """E[token] (or `h` given in its place) times embed_scale."""
        e = self.tok_embeddings(tokens) if h is None else h
        return e * self.config.embed_scale if self.config.embed_scale != 1 else e

    def initial_state(self, e: torch.Tensor, first: int) -> torch.Tensor:
        """The first step's state of positions first..: state0's draw times state_std with an adapter, else e itself."""
        c = self.config
        if c.injection != "adapter":
            return e
        rows = torch.stack([state0(first + t, c.dim, c.state_std, e.dtype) for t in range(e.shape[1])]).to(e.device)
        return rows.expand(e.shape[0], -1, -1).clone()

    def step_input(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """A step's input: adapter . concat[h, e] with an adapter, else h."""
        return self.adapter(torch.cat((h, e), dim=-1)) if self.config.injection == "adapter" else h

    def finish(self, h: torch.Tensor, coda_layer) -> torch.Tensor:
        """The head's input from the stack's output h; coda_layer(j, x) runs the coda's layer j (with its cache)."""
        c = self.config
        if not c.n_coda:
            return self.head_input(h)
        if c.mid_norm:
            h = self.norm(h)
        for j in range(c.n_coda):
            h = coda_layer(j, h)
        return self.norm(h)

    def init_weights(self, seed: int) -> None:
        """Small-normal initialisation; the residual projections are scaled down
        by the number of layer applications at the default depth, since every
        one adds to the same stream. The exit gate's bias starts where lambda is
        1/default_loops."""
        g = torch.Generator().manual_seed(seed)
        c = self.config
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                    continue
                if name == "exit_gate.bias":  # lambda = 1/default_loops at first
                    p.fill_(-math.log(max(1, c.default_loops - 1)))
                    continue
                std = 0.02
                if name.endswith(("wo.weight", "w2.weight")):
                    std = 0.02 / math.sqrt(2 * c.default_loops * c.n_layers)
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def head_weight(self) -> torch.Tensor:
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    def head_input(self, h: torch.Tensor) -> torch.Tensor:
        """What the head multiplies after a step: h itself with step_norm (already normed), else rmsnorm(h).
        A model with a coda runs it in between (finish)."""
        if self.config.n_coda:
            raise ValueError("this model has a coda between its stack and its head: finish() runs it")
        return h if self.config.step_norm else self.norm(h)

    def _end_step(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h) if self.config.step_norm else h

    def step_states(self, tokens: torch.Tensor, loops: int, kv_fp16: bool = False, h: torch.Tensor | None = None) -> list[torch.Tensor]:
        """h after each step s = 0..loops-1 (after the step norm when the model
        has one), each (B, T, dim), for tokens (B, T) at positions 0..T-1;
        `h` replaces the embedding lookup when given."""
        if not 1 <= loops <= MAX_LOOPS:
            raise ValueError(f"loops must be in [1, {MAX_LOOPS}], got {loops}")
        cos, sin, mask = self._whole_sequence(tokens)
        e = self.embed(tokens, h)
        for layer in self.prelude:
            e, _, _ = layer(e, cos, sin, mask, kv_fp16)
        h = self.initial_state(e, 0)
        out = []
        for _ in range(loops):
            h = self.step_input(h, e)
            for layer in self.stack:
                h, _, _ = layer(h, cos, sin, mask, kv_fp16)
            h = self._end_step(h)
            out.append(h)
        return out

    def _whole_sequence(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """RoPE tables and the causal mask of positions 0..T-1."""
        T = tokens.shape[1]
        cos, sin = rope_tables(self.config.head_dim, torch.arange(T), self.config.rope_theta)
        return cos.to(tokens.device), sin.to(tokens.device), causal_mask(0, T, tokens.device)

    def hidden(self, tokens: torch.Tensor, loops: int, kv_fp16: bool = False, h: torch.Tensor | None = None) -> torch.Tensor:
        """The head's input, (B, T, dim), after `loops` steps (no early exit)."""
        cos, sin, mask = self._whole_sequence(tokens)
        return self.finish(self.step_states(tokens, loops, kv_fp16, h)[-1], lambda j, x: self.coda[j](x, cos, sin, mask, kv_fp16)[0])

    def forward(self, tokens: torch.Tensor, loops: int | None = None, kv_fp16: bool = False) -> torch.Tensor:
        """Logits (B, T, vocab_size) at a fixed depth."""
        x = self.hidden(tokens, self.config.default_loops if loops is None else loops, kv_fp16)
        return x @ self.head_weight().t()

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, loops: int) -> torch.Tensor:
        """Mean next-token cross-entropy in nats."""
        logits = self.forward(tokens, loops)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def exit_forward(self, tokens: torch.Tensor, loops: int, threshold: float | None, exits: torch.Tensor | None = None,
                     kv_fp16: bool = False, policy: str = "exact") -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (B, T, vocab), exit step (B, T)) with early exit, for a whole
        sequence at once, as if each position in `exits` (bool (B, T); default:
        every position) were a sampled token decoded one at a time: such a
        token's logits come from the step the rule names; under "copy" the
        deeper steps' attention reads copies of its K/V from that step, under
        "exact" every step runs. The others run every step. threshold None: no
        exit (every position runs `loops` steps)."""
        if policy not in EXIT_POLICIES:
            raise ValueError(f"policy must be one of {EXIT_POLICIES}, got {policy!r}")
        if not 1 <= loops <= MAX_LOOPS:
            raise ValueError(f"loops must be in [1, {MAX_LOOPS}], got {loops}")
        if threshold is not None and not self.config.exit_gate:
            raise ValueError("this model has no exit gate")
        if self.config.recurrent:
            raise ValueError("exit_forward computes stacks without recurrent depth; Decoder runs every model")
        B, T = tokens.shape
        cos, sin = rope_tables(self.config.head_dim, torch.arange(T), self.config.rope_theta)
        mask = causal_mask(0, T, tokens.device)
        if exits is None:
            exits = torch.ones(B, T, dtype=torch.bool)
        h = self.tok_embeddings(tokens)
        done = torch.zeros(B, T, dtype=torch.bool)
        step = torch.full((B, T), loops - 1, dtype=torch.long)
        final = torch.zeros_like(h)
        state = ExitState((B, T), threshold, loops) if threshold is not None else None
        frozen: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.config.n_layers
        for s in range(loops):
            for i, layer in enumerate(self.stack):
                def hook(k: torch.Tensor, v: torch.Tensor, i: int = i) -> tuple[torch.Tensor, torch.Tensor]:
                    if policy == "exact" or frozen[i] is None or not done.any():
                        return k, v
                    m = done[:, None, :, None]
                    return torch.where(m, frozen[i][0], k), torch.where(m, frozen[i][1], v)
                h, k, v = layer(h, cos, sin, mask, kv_fp16, kv_hook=hook)
                frozen[i] = (k, v)
            h = self._end_step(h)
            final = torch.where(done[..., None], final, self.head_input(h))
            if state is not None:
                now = state.update(s, gate_lambda(self, h)) & exits & ~done
                step = torch.where(now, torch.full_like(step, s), step)
                done = done | now
        return final @ self.head_weight().t(), step


class Decoder:
    """Incremental decoding with a KV cache of loops * n_layers slots, slot
    (s, i) at index s * n_layers + i, as the server runs a model: `prefill`
    the prompt (every position runs every step; the last one, whose logits
    are sampled, exits by the rule), then `step` one token at a time. An
    exiting token's logits come from its exit step; with the "exact" policy
    it still runs every step (every step, select: the published Ouro code),
    with "copy" it stops and its deeper slots get its exit step's K/V.
    `kv_hook` (Block.forward's) replaces the new positions' K and V before
    the cache stores them."""

    def __init__(self, model: LoopedLlama, loops: int, threshold: float | None = None, kv_fp16: bool = True, kv_hook=None,
                 policy: str = "exact") -> None:
        if not 1 <= loops <= MAX_LOOPS:
            raise ValueError(f"loops must be in [1, {MAX_LOOPS}], got {loops}")
        if threshold is not None and not model.config.exit_gate:
            raise ValueError("this model has no exit gate")
        if policy not in EXIT_POLICIES:
            raise ValueError(f"policy must be one of {EXIT_POLICIES}, got {policy!r}")
        self.model, self.loops, self.threshold, self.kv_fp16, self.kv_hook = model, loops, threshold, kv_fp16, kv_hook
        self.policy = policy
        c = model.config
        empty = torch.zeros(1, c.n_kv_heads, 0, c.head_dim, dtype=model.tok_embeddings.weight.dtype)
        # the core's units (s * n_layers + i), then the prelude's and the coda's
        units = loops * c.n_layers + c.n_prelude + c.n_coda
        self.k = [empty] * units
        self.v = [empty] * units
        self.pos = 0
        self.last_margin = float("inf")  # ExitState.margin of the last token that could exit

    @torch.no_grad()
    def _run(self, tokens: list[int]) -> tuple[torch.Tensor, int]:
        """Runs `tokens` at the next positions; (logits of each (T, vocab), exit
        step of the last). Only a single token (T = 1) may exit."""
        m, c, L = self.model, self.model.config, self.model.config.n_layers
        T, P = len(tokens), self.pos
        cos, sin = rope_tables(c.head_dim, torch.arange(P, P + T), c.rope_theta)
        mask = causal_mask(P, T)

        def run(layer: Block, x: torch.Tensor, slot: int) -> torch.Tensor:
            x, k, v = layer(x, cos, sin, mask, self.kv_fp16, past=(self.k[slot], self.v[slot]), kv_hook=self.kv_hook)
            self.k[slot] = torch.cat((self.k[slot], k), dim=2)
            self.v[slot] = torch.cat((self.v[slot], v), dim=2)
            return x

        fixed = self.loops * L
        e = m.embed(torch.tensor([tokens]))
        for j, layer in enumerate(m.prelude):
            e = run(layer, e, fixed + j)
        h = m.initial_state(e, P)
        state = ExitState((1,), self.threshold, self.loops) if self.threshold is not None and T == 1 else None
        self.last_margin = float("inf")
        exit_step, selected = self.loops - 1, None
        for s in range(self.loops):
            h = m.step_input(h, e)
            for i, layer in enumerate(m.stack):
                h = run(layer, h, s * L + i)
            h = m._end_step(h)
            if state is not None and selected is None and s < self.loops - 1:
                stop = bool(state.update(s, gate_lambda(m, h[0, -1:]))[0])
                self.last_margin = float(state.margin[0])
                if stop:
                    exit_step, selected = s, h
                    if self.policy == "copy":
                        break
        coda = lambda j, x: run(m.coda[j], x, fixed + c.n_prelude + j)  # noqa: E731
        logits = m.finish(h if selected is None else selected, coda)[0] @ m.head_weight().t()
        copied = range(exit_step + 1, self.loops) if self.policy == "copy" else ()
        for s2 in copied:  # an exited token's deeper slots get its last K/V
            for i in range(L):
                src, dst = exit_step * L + i, s2 * L + i
                self.k[dst] = torch.cat((self.k[dst], self.k[src][:, :, -1:]), dim=2)
                self.v[dst] = torch.cat((self.v[dst], self.v[src][:, :, -1:]), dim=2)
        self.pos += T
        return logits, exit_step

    def prefill(self, tokens: list[int]) -> tuple[torch.Tensor, int]:
        """Logits of every prompt position (T, vocab) and the exit step of the
        last; the other positions run every step. With exit, the last position
        runs on its own after the others (the same values as one batch: no
        earlier position reads it)."""
        if self.threshold is None or len(tokens) == 1:
            return self._run(tokens)
        head, _ = self._run(tokens[:-1])
        last, step = self._run(tokens[-1:])
        return torch.cat((head, last)), step

    def step(self, token: int) -> tuple[torch.Tensor, int]:
        """Logits (vocab,) of one more token and its exit step."""
        logits, s = self._run([token])
        return logits[-1], s


@torch.no_grad()
def generate(model: LoopedLlama, prompt: list[int], n: int, loops: int, threshold: float | None = None,
             kv_fp16: bool = True, forced: list[int] | None = None, kv_hook=None, policy: str = "exact") -> dict:
    """Greedy decoding (lowest id on ties): {"prompt_logits" (T, vocab),
    "tokens" [n], "exit_steps" [n] (of the position whose logits chose each
    token), "logits" (n, vocab) (those logits), "margin" (the closest an exit
    decision came to the threshold; inf without exit)}. `forced`: decode
    these n tokens instead of the greedy choices (another run's, to compare
    the logits position by position); `kv_hook`, `policy`: Decoder's."""
    d = Decoder(model, loops, threshold, kv_fp16, kv_hook, policy)
    prompt_logits, step = d.prefill(prompt)
    margin = d.last_margin
    last = prompt_logits[-1]
    tokens, steps, rows = [], [], []
    for j in range(n):
        nxt = int(torch.argmax(last).item()) if forced is None else forced[j]  # first maximum
        tokens.append(nxt)
        steps.append(step)
        rows.append(last)
        if j + 1 < n:
            last, step = d.step(nxt)
            margin = min(margin, d.last_margin)
    return {"prompt_logits": prompt_logits, "tokens": tokens, "exit_steps": steps, "margin": margin,
            "logits": torch.stack(rows) if rows else torch.zeros(0, model.config.vocab_size)}
