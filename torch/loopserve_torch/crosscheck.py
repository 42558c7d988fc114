"""The PyTorch half of the PyTorch <-> loopserve equivalence checks.

    python3 -m loopserve_torch.crosscheck make OUT [--seed N] [--dim N] ...
        builds a LoopedLlama with random weights, saves it with `save`, loads
        it back with `load` and fails unless every tensor comes back equal to
        the saved fp16 values; prints {"path", "tensors", "max_roundtrip_diff"}.

        Stacks (format version 2): --layers N, --sandwich, --step-norm,
        --exit-gate [--exit-threshold T].

    python3 -m loopserve_torch.crosscheck make-hf DIR [--dtype BF16|F16|F32] [--shards N] ...
        the same random model with sandwich norms, step norm and exit gate,
        written as a Hugging Face Ouro checkpoint (config.json, safetensors);
        prints {"path", "tensors"}.

    python3 -m loopserve_torch.crosscheck logits MODEL --tokens 1,2,3 --loops 1,4,8 [--greedy N] [--exit-threshold T]
                                                   [--exit-policy exact|copy]
        loads MODEL (any loopserve fp16 file, or an Ouro checkpoint directory),
        computes in float64 (free of float32's summation-order noise) with K
        and V rounded to fp16 as loopserve's cache holds them, and decodes
        token by token with a cache as a server does (model.Decoder). Prints,
        per depth: "logits" (of every prompt position), "greedy" (N greedy
        tokens, lowest id on ties), "greedy_logits" (the logits that chose
        each), "greedy_margins" (their top-2 differences) and "rounding_noise"
        (the largest |logit| change of all those positions over NUDGED_RUNS
        runs that nudge every K and V value by a random ±NUDGE, relative,
        before rounding it: how far float32 noise can move the logits by
        deciding the cache's roundings the other way).
        With --exit-threshold (a model with the exit gate) tokens exit early
        (--exit-policy: "exact", every step computed and the exit step's logits
        taken, the default; or "copy", model.Decoder's);
        per depth also "exit_steps" (the exit step, 0-based, of the position
        whose logits chose each greedy token) and "margin" (the closest any
        exit decision came to the threshold).

    python3 -m loopserve_torch.crosscheck head
        checks that training's out-of-text softmax (train.OutOfTextHead) is the
        full-vocabulary loss of the model it exports; prints both losses.

The other half (test/torch/equivalence.test.ts) serves the same files with
the kernels and compares.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from .hf import load_any, write_ouro
from .model import EXIT_POLICIES, LoopedConfig, LoopedLlama, generate
from .safetensors_io import load, model_tensors, save

# `logits`' rounding noise: a float32 dot product of a layer's width errs by
# about this much, relative (some 16 float32 ulps); more runs than one, since
# which roundings flip, and how much that moves the logits, is chaotic.
NUDGE = 1e-6
NUDGED_RUNS = 8


def random_model(c: LoopedConfig, seed: int) -> LoopedLlama:
    """Weights large enough that logits spread and greedy choices are far from
    ties: embeddings ~N(0, 1) (a tied head then gives logits of std ~sqrt(dim)),
    projections ~N(0, 1/fan_in), an untied head ~N(0, 9/dim), norms near 1."""
    model = LoopedLlama(c)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.05 * torch.randn(p.shape, generator=g))
            elif name == "tok_embeddings.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            elif name == "exit_gate.bias":  # with the weight below, z ~ N(-1, ~4): tokens exit at different steps
                p.copy_(-1.0 + torch.randn(p.shape, generator=g) * 0.5)
            elif name == "exit_gate.weight":
                p.copy_(torch.randn(p.shape, generator=g) * (2 / math.sqrt(p.shape[1])))
            elif name == "output.weight":  # logits of std ~3, as a tied head's are larger still
                p.copy_(torch.randn(p.shape, generator=g) * (3 / math.sqrt(p.shape[1])))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
    return model.eval()


def nudged_fp16(seed: int):
    """A kv_hook rounding K and V to fp16 after multiplying each value by 1 ± NUDGE (random signs)."""
    g = torch.Generator().manual_seed(seed)

    def hook(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def nudge(x: torch.Tensor) -> torch.Tensor:
            signs = torch.randint(0, 2, x.shape, generator=g).to(x.dtype) * 2 - 1
            return (x * (1 + NUDGE * signs)).half().to(x.dtype)

        return nudge(k), nudge(v)

    return hook


@torch.no_grad()
def reference(model: LoopedLlama, tokens: list[int], loops: int, greedy: int, threshold: float | None,
              policy: str = "exact") -> dict:
    """`crosscheck logits` at one depth; `model` in float64."""
    r = generate(model, tokens, greedy, loops, threshold, kv_fp16=True, policy=policy)
    rows = torch.cat((r["prompt_logits"], r["logits"]))
    noise = 0.0
    for seed in range(NUDGED_RUNS):
        nudged = generate(model, tokens, greedy, loops, threshold, kv_fp16=False, forced=r["tokens"],
                          kv_hook=nudged_fp16(seed), policy=policy)
        if nudged["exit_steps"] != r["exit_steps"]:
            raise SystemExit(f"loops {loops}: an exit decision is within float32 noise of the threshold (exit steps "
                             f"{r['exit_steps']}, nudged {nudged['exit_steps']}): choose a prompt or model further from it")
        noise = max(noise, (rows - torch.cat((nudged["prompt_logits"], nudged["logits"]))).abs().max().item())
    top2 = r["logits"].topk(min(2, r["logits"].shape[-1]), dim=-1).values
    out = {"logits": r["prompt_logits"].tolist(), "greedy": r["tokens"], "greedy_logits": r["logits"].tolist(),
           "greedy_margins": (top2[:, 0] - top2[:, -1]).tolist(), "rounding_noise": noise}
    if threshold is not None:
        out |= {"exit_steps": r["exit_steps"], "margin": r["margin"] if math.isfinite(r["margin"]) else None}
    return out


@torch.no_grad()
def check_out_of_text_head() -> int:
    from .train import OutOfTextHead  # noqa: PLC0415 (train pulls in tqdm; only this check needs it)

    c = LoopedConfig(dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=500, default_loops=3)
    model = random_model(c, 5)
    g = torch.Generator().manual_seed(6)
    seen = torch.randperm(500, generator=g)[:120].sort().values
    head = OutOfTextHead(model, seen.numpy())
    head.other.copy_(torch.randn(32, generator=g))
    x = torch.randint(0, 500, (2, 24), generator=g)  # inputs and targets, seen and unseen
    y = torch.randint(0, 500, (2, 24), generator=g)
    restricted = head.loss(model, x, y, 2).item()
    exported = head.export_embedding(model)
    full = torch.nn.functional.cross_entropy(exported(x, 2).reshape(-1, 500), y.reshape(-1)).item()
    print(json.dumps({"restricted": restricted, "full": full}))
    return 0 if abs(restricted - full) < 1e-4 * abs(full) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("out")
    mk.add_argument("--seed", type=int, default=1)
    mk.add_argument("--dim", type=int, default=64)
    mk.add_argument("--heads", type=int, default=4)
    mk.add_argument("--kv-heads", type=int, default=2)
    mk.add_argument("--ffn", type=int, default=192)
    mk.add_argument("--vocab", type=int, default=1000)
    mk.add_argument("--loops", type=int, default=8)
    mk.add_argument("--untied", action="store_true")
    mk.add_argument("--bf16", action="store_true", help="hold the weights in bf16 before saving")
    hf = sub.add_parser("make-hf")
    hf.add_argument("out")
    hf.add_argument("--dtype", choices=("BF16", "F16", "F32"), default="BF16")
    hf.add_argument("--shards", type=int, default=1)
    for p in (mk, hf):
        if p is hf:
            for name, default in (("--seed", 1), ("--dim", 64), ("--heads", 4), ("--kv-heads", 2), ("--ffn", 192), ("--vocab", 1000), ("--loops", 4)):
                p.add_argument(name, type=int, default=default)
            p.add_argument("--untied", action="store_true")
        p.add_argument("--layers", type=int, default=3 if p is hf else 1)
        p.add_argument("--exit-threshold", type=float, default=None)
        p.add_argument("--max-seq", type=int, default=256)
    mk.add_argument("--sandwich", action="store_true")
    mk.add_argument("--step-norm", action="store_true")
    mk.add_argument("--exit-gate", action="store_true")
    lg = sub.add_parser("logits")
    lg.add_argument("model")
    lg.add_argument("--tokens", required=True)
    lg.add_argument("--loops", default="1,4,8")
    lg.add_argument("--greedy", type=int, default=0)
    lg.add_argument("--exit-threshold", type=float, default=None)
    lg.add_argument("--exit-policy", choices=EXIT_POLICIES, default="exact")
    sub.add_parser("head")
    a = ap.parse_args(argv)

    if a.cmd == "head":
        return check_out_of_text_head()

    if a.cmd == "make-hf":
        c = LoopedConfig(dim=a.dim, n_heads=a.heads, n_kv_heads=a.kv_heads, ffn_dim=a.ffn, vocab_size=a.vocab,
                         default_loops=a.loops, max_seq_len=a.max_seq, tied_output=not a.untied, n_layers=a.layers,
                         norm_layout="sandwich", step_norm=True, exit_gate=True, exit_threshold=a.exit_threshold)
        model = random_model(c, a.seed)
        write_ouro(model, a.out, a.dtype, a.shards)
        print(json.dumps({"path": a.out, "tensors": len(model_tensors(model))}))
        return 0

    if a.cmd == "make":
        c = LoopedConfig(dim=a.dim, n_heads=a.heads, n_kv_heads=a.kv_heads, ffn_dim=a.ffn, vocab_size=a.vocab,
                         default_loops=a.loops, max_seq_len=a.max_seq, tied_output=not a.untied, n_layers=a.layers,
                         norm_layout="sandwich" if a.sandwich else "pre", step_norm=a.step_norm, exit_gate=a.exit_gate,
                         exit_threshold=a.exit_threshold)
        model = random_model(c, a.seed)
        if a.bf16:
            model = model.to(torch.bfloat16)
        save(model, a.out, {"description": "random weights from loopserve_torch.crosscheck"})
        back = load(a.out)
        worst = 0.0
        for (name, saved), (_, loaded) in zip(model_tensors(model), model_tensors(back)):
            want = saved.detach().float().half().float()
            worst = max(worst, (want - loaded).abs().max().item())
        print(json.dumps({"path": a.out, "tensors": len(model_tensors(model)), "max_roundtrip_diff": worst}))
        return 0 if worst == 0.0 else 1

    model = load_any(a.model).double()
    tokens = [int(t) for t in a.tokens.split(",")]
    depths = [int(d) for d in a.loops.split(",")]
    if a.exit_threshold is not None and not model.config.exit_gate:
        raise SystemExit(f"{a.model}: --exit-threshold needs a model with the exit gate")
    json.dump({str(d): reference(model, tokens, d, a.greedy, a.exit_threshold, a.exit_policy) for d in depths}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
