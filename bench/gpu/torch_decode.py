"""The GPU peers of the validation run (bench/gpu/validate.sh), on a loopserve model file:

  graph  a plain PyTorch decode of the same looped block: fp16 weights,
         a static key/value cache per loop, cuBLAS matmuls, SDPA, and the
         whole token step (embedding, every loop, head, argmax) captured as
         one CUDA graph and replayed per token;
  hf     Hugging Face transformers eager: LlamaForCausalLM of the same
         shape unrolled to `loops` layers (random weights: speed only),
         greedy `generate`, batch `rows`;
  copy   the device-to-device copy bandwidth (bytes read + written).

Prints one JSON object per line: {"engine", "model", "loops", "rows", "tok_s"}
or, for the copy, {"engine", "gb_s"}; --name labels the model (default: the
file's name).

  python3 bench/gpu/torch_decode.py MODEL --loops 1,8 --rows 1,64 [--peers graph,hf,copy] [--name NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "torch"))
from loopserve_torch.model import rope_tables  # noqa: E402
from loopserve_torch.safetensors_io import load  # noqa: E402

PROMPT = 64


def graph_decode_tok_s(model, loops: int, rows: int, steps: int) -> float:
    """Tokens per second of `rows` greedy streams decoding `steps` tokens
    each after a PROMPT-token position, one graph replay per token."""
    c = model.config
    dev = torch.device("cuda")
    hd, n_kv, group = c.head_dim, c.n_kv_heads, c.n_heads // c.n_kv_heads
    b = model.block
    f16 = lambda t: t.detach().to(dev, torch.float16).contiguous()  # noqa: E731
    E, head = f16(model.tok_embeddings.weight), f16(model.head_weight())
    wqkv = torch.cat([f16(b.wq.weight), f16(b.wk.weight), f16(b.wv.weight)])
    wo, w13, w2 = f16(b.wo.weight), torch.cat([f16(b.w1.weight), f16(b.w3.weight)]), f16(b.w2.weight)
    an, fn, nn_ = f16(b.attn_norm.weight), f16(b.ffn_norm.weight), f16(model.norm.weight)
    max_seq = PROMPT + steps + 1
    kc = torch.zeros(loops, rows, n_kv, max_seq, hd, device=dev, dtype=torch.float16)
    vc = torch.zeros_like(kc)
    cos_all, sin_all = (t.to(dev, torch.float16) for t in rope_tables(hd, torch.arange(max_seq), c.rope_theta))
    tok = torch.zeros(rows, dtype=torch.long, device=dev)
    pos = torch.zeros((), dtype=torch.long, device=dev)
    dq, dk = c.n_heads * hd, n_kv * hd

    def rms(x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + c.norm_eps).half() * w

    def rope(x, cos, sin):
        half = hd // 2
        a, bb = x[..., :half], x[..., half:]
        return torch.cat((a * cos - bb * sin, a * sin + bb * cos), dim=-1)

    def step():
        h = E[tok]  # (rows, dim)
        cos, sin = cos_all.index_select(0, pos.view(1)), sin_all.index_select(0, pos.view(1))  # no host sync
        mask = (torch.arange(max_seq, device=dev) <= pos).view(1, 1, 1, max_seq)
        for l in range(loops):
            qkv = F.linear(rms(h, an), wqkv)
            q = rope(qkv[:, :dq].view(rows, c.n_heads, 1, hd), cos, sin)
            k = rope(qkv[:, dq:dq + dk].view(rows, n_kv, 1, hd), cos, sin)
            v = qkv[:, dq + dk:].view(rows, n_kv, 1, hd)
            kc[l].index_copy_(2, pos.view(1), k)
            vc[l].index_copy_(2, pos.view(1), v)
            K = kc[l].repeat_interleave(group, dim=1) if group > 1 else kc[l]
            V = vc[l].repeat_interleave(group, dim=1) if group > 1 else vc[l]
            att = F.scaled_dot_product_attention(q, K, V, attn_mask=mask)
            h = h + F.linear(att.reshape(rows, dq), wo)
            gu = F.linear(rms(h, fn), w13)
            h = h + F.linear(F.silu(gu[:, :c.ffn_dim]) * gu[:, c.ffn_dim:], w2)
        tok.copy_(F.linear(rms(h, nn_), head).argmax(-1))
        pos.add_(1)

    pos.fill_(PROMPT)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    pos.fill_(PROMPT)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        g.replay()
    torch.cuda.synchronize()
    return rows * steps / (time.perf_counter() - start)


def hf_tok_s(model, loops: int, rows: int, steps: int) -> float:
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    cfg = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn_dim, num_hidden_layers=loops,
                      num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, rms_norm_eps=c.norm_eps,
                      rope_theta=c.rope_theta, max_position_embeddings=PROMPT + steps + 8, tie_word_embeddings=True)
    with torch.device("cuda"):
        m = LlamaForCausalLM(cfg).half().eval()
    ids = torch.randint(0, c.vocab_size, (rows, PROMPT), device="cuda")
    kw = dict(do_sample=False, min_new_tokens=steps, max_new_tokens=steps, pad_token_id=0)
    with torch.no_grad():
        m.generate(ids, **{**kw, "min_new_tokens": 4, "max_new_tokens": 4})
        torch.cuda.synchronize()
        start = time.perf_counter()
        m.generate(ids, **kw)
        torch.cuda.synchronize()
    return rows * steps / (time.perf_counter() - start)


def copy_gb_s() -> float:
    n = 1 << 30  # 1 GiB each way
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    reps = 20
    start = time.perf_counter()
    for _ in range(reps):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * n * reps / (time.perf_counter() - start) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--loops", default="8")
    ap.add_argument("--rows", default="1")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--peers", default="graph,hf,copy")
    ap.add_argument("--name")
    a = ap.parse_args()
    peers = a.peers.split(",")
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    name = a.name or os.path.basename(a.model)
    if "copy" in peers:
        print(json.dumps({"engine": "device copy", "gb_s": copy_gb_s()}), flush=True)
    model = load(a.model)
    runs = {"graph": ("pytorch cuda graph", graph_decode_tok_s), "hf": ("hf transformers eager", hf_tok_s)}
    for loops in ints(a.loops):
        for rows in ints(a.rows):
            for peer in (p for p in peers if p in runs):
                engine, run = runs[peer]
                try:
                    tok_s = run(model, loops, rows, a.steps)
                    print(json.dumps({"engine": engine, "model": name, "loops": loops, "rows": rows, "tok_s": tok_s}), flush=True)
                except Exception as e:  # one peer failing (a transformers version, memory) leaves the others
                    print(json.dumps({"engine": engine, "model": name, "loops": loops, "rows": rows, "error": repr(e)}), flush=True)
                torch.cuda.empty_cache()

if __name__ == "__main__":
    main()
