"""LoopedLlama: the function loopserve serves, in PyTorch.

One Llama-style block applied `loops` times with the same weights:

    h = E[token]
    for l in range(loops):
        x = rmsnorm(h, attn_norm)
        q, k, v = x Wq^T, x Wk^T, x Wv^T; rope(q, k, pos)     GQA: n_kv_heads
        h = h + attention(q, k, v) Wo^T                      causal, 1/sqrt(head_dim)
        x = rmsnorm(h, ffn_norm)
        h = h + (silu(x W1^T) * (x W3^T)) W2^T               SwiGLU
    logits = rmsnorm(h, norm) Wout^T                         Wout = E when tied

rmsnorm(x, w) = x / sqrt(mean(x^2) + eps) * w. RoPE rotates the pairs
(i, i + head_dim/2) by pos * theta^(-2i / head_dim), as Hugging Face's Llama
does. Matrices are [out_features, in_features], as nn.Linear keeps them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

GPT2_VOCAB = 50257
# The kernels' caps on a model (kernels/loopserve.h, LS_MAX_*): a config
# beyond them would write a file loopserve refuses. The header is their one
# source; test/torch/limits.test.ts fails when these differ from it.
MAX_LOOPS = 64
LIMITS = {"dim": 65536, "n_heads": 4096, "n_kv_heads": 4096, "ffn_dim": 262144, "vocab_size": 1 << 20, "max_seq_len": 1 << 20}
MAX_ROPE_THETA = 1e12  # rope_theta < this
MAX_NORM_EPS = 1.0  # norm_eps < this


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

    def __post_init__(self) -> None:
        for key, cap in LIMITS.items():
            if not 1 <= getattr(self, key) <= cap:
                raise ValueError(f"{key} must be in [1, {cap}], got {getattr(self, key)}")
        if not 0 < self.rope_theta < MAX_ROPE_THETA:
            raise ValueError(f"rope_theta must be in (0, {MAX_ROPE_THETA:g}), got {self.rope_theta}")
        if not 0 < self.norm_eps < MAX_NORM_EPS:
            raise ValueError(f"norm_eps must be in (0, {MAX_NORM_EPS:g}), got {self.norm_eps}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of n_heads ({self.n_heads})")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"head_dim = {self.dim // self.n_heads} must be even (RoPE rotates pairs)")
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if not 1 <= self.default_loops <= MAX_LOOPS:
            raise ValueError(f"default_loops must be in [1, {MAX_LOOPS}], got {self.default_loops}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def from_dict(cls, d: dict) -> "LoopedConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


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


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, heads, T, head_dim); rotates the pair (i, i + head_dim/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


class Block(nn.Module):
    def __init__(self, c: LoopedConfig) -> None:
        super().__init__()
        self.c = c
        hd = c.head_dim
        self.attn_norm = RMSNorm(c.dim, c.norm_eps)
        self.wq = nn.Linear(c.dim, c.n_heads * hd, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(c.n_heads * hd, c.dim, bias=False)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.w1 = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.w2 = nn.Linear(c.ffn_dim, c.dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn_dim, bias=False)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, kv_fp16: bool) -> torch.Tensor:
        c = self.c
        B, T, _ = h.shape
        hd = c.head_dim
        x = self.attn_norm(h)
        q = self.wq(x).view(B, T, c.n_heads, hd).transpose(1, 2)
        k = self.wk(x).view(B, T, c.n_kv_heads, hd).transpose(1, 2)
        v = self.wv(x).view(B, T, c.n_kv_heads, hd).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if kv_fp16:  # loopserve's cache holds K and V in fp16
            k = k.half().float()
            v = v.half().float()
        group = c.n_heads // c.n_kv_heads
        if group > 1:  # query head j reads key/value head j // group
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        att = (probs @ v).transpose(1, 2).reshape(B, T, c.n_heads * hd)
        h = h + self.wo(att)
        x = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(x)) * self.w3(x))


class LoopedLlama(nn.Module):
    def __init__(self, c: LoopedConfig) -> None:
        super().__init__()
        self.config = c
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.block = Block(c)
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = None if c.tied_output else nn.Linear(c.dim, c.vocab_size, bias=False)

    def init_weights(self, seed: int) -> None:
        """Small-normal initialisation; the residual projections are scaled down
        by the default depth, since every loop adds to the same stream."""
        g = torch.Generator().manual_seed(seed)
        c = self.config
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                    continue
                std = 0.02
                if name in ("block.wo.weight", "block.w2.weight"):
                    std = 0.02 / math.sqrt(2 * c.default_loops)
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def head_weight(self) -> torch.Tensor:
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    def hidden(self, tokens: torch.Tensor, loops: int, kv_fp16: bool = False, h: torch.Tensor | None = None) -> torch.Tensor:
        """The final rmsnorm'd hidden state, (B, T, dim), for tokens (B, T) at
        positions 0..T-1; `h` replaces the embedding lookup when given."""
        if not 1 <= loops <= MAX_LOOPS:
            raise ValueError(f"loops must be in [1, {MAX_LOOPS}], got {loops}")
        T = tokens.shape[1]
        cos, sin = rope_tables(self.config.head_dim, torch.arange(T), self.config.rope_theta)
        cos, sin = cos.to(tokens.device), sin.to(tokens.device)
        mask = torch.ones(T, T, dtype=torch.bool, device=tokens.device).triu(1)
        if h is None:
            h = self.tok_embeddings(tokens)
        for _ in range(loops):
            h = self.block(h, cos, sin, mask, kv_fp16)
        return self.norm(h)

    def forward(self, tokens: torch.Tensor, loops: int | None = None, kv_fp16: bool = False) -> torch.Tensor:
        """Logits (B, T, vocab_size)."""
        x = self.hidden(tokens, self.config.default_loops if loops is None else loops, kv_fp16)
        return x @ self.head_weight().t()

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, loops: int) -> torch.Tensor:
        """Mean next-token cross-entropy in nats."""
        logits = self.forward(tokens, loops)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
