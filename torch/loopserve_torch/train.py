"""Trains a LoopedLlama on a token file with a random loop depth per step.

The output softmax runs over the training text's own vocabulary plus one
shared vector for every other GPT-2 token (OutOfTextHead below). That is the
full-vocabulary softmax of the exported model exactly (the exported
embedding gives every out-of-text token that shared vector) at a fraction
of its cost: the head is most of a step's work at this size.

Every step draws its depth uniformly from [--min-loops, --loops], so every
depth up to the default gives usable next-token predictions: the property
self-speculative decoding relies on (a shallow pass drafts, the default
depth verifies). AdamW with linear warm-up and cosine decay, gradient
clipping, one fixed seed for weights, batches and depths. Validation loss
is measured at several depths every --eval-every steps; a checkpoint (model,
optimizer, step, random states) and a loopserve model file are written every
--ckpt-every steps, and --resume continues from the checkpoint.

With --exit-gate (an Ouro-class stack: --layers, --norm-layout sandwich,
--step-norm) every step runs all --loops steps and trains the exit gate as
Ouro does (Zhu et al. 2025, "Scaling Latent Reasoning via Looped Language
Models"): stage 1 minimises sum_t p_t CE_t - beta H(p), p the exit
distribution the gates give (p_t = lambda_t prod_{j<t}(1 - lambda_j), the
last step the remainder), for --steps steps; stage 2 (--gate-steps more
steps) trains the gate alone towards lambda_t = 1 where the next step
improves the token's loss by less than --gate-margin nats (binary
cross-entropy), the trunk frozen.

    /usr/bin/python3 -m loopserve_torch.train --data DIR --out DIR [options]

DIR holds train.bin and val.bin (`loopserve tokenize`). OUT gets ckpt.pt,
model.safetensors and log.jsonl (one JSON object per evaluation).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time

import numpy as np
import torch
from tqdm import tqdm

from .data import read_tokens
from .model import LoopedConfig, LoopedLlama, gate_lambda
from .safetensors_io import save

EVAL_DEPTHS = (1, 2, 4, 8)


class OutOfTextHead(torch.nn.Module):
    """Tied output head over the tokens seen in the training text (`seen`)
    plus one vector `other` shared by the |U| tokens never seen.

    With every unseen embedding row equal to `other`, the full softmax's
    normaliser is sum_seen exp(x.e_s) + |U| exp(x.other): one extra logit
    with log|U| added. Unseen tokens are never inputs either, so writing
    `other` into their rows (export) gives a model whose full-vocabulary
    distribution is exactly the one trained here.
    """

    def __init__(self, model: LoopedLlama, seen: np.ndarray) -> None:
        super().__init__()
        vocab = model.config.vocab_size
        self.register_buffer("seen", torch.from_numpy(seen.astype(np.int64)))
        index = np.full(vocab, len(seen), dtype=np.int64)  # unseen -> the shared slot
        index[seen] = np.arange(len(seen))
        self.register_buffer("index", torch.from_numpy(index))
        self.unseen = vocab - len(seen)
        with torch.no_grad():
            mean = model.tok_embeddings.weight[self.seen].mean(0)
        # One vector, not decayed (the rows it stands for are never updated one by one).
        self.other = torch.nn.Parameter(mean.clone())

    def weight(self, model: LoopedLlama) -> torch.Tensor:
        return torch.cat((model.tok_embeddings.weight[self.seen], self.other[None, :]))

    def nll(self, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-token cross-entropy (nats) of the full-vocabulary model; x: head inputs (..., dim)."""
        logits = x.reshape(-1, x.shape[-1]) @ w.t()
        if self.unseen == 0:
            logits = logits[:, :-1]
        else:
            logits[:, -1] += math.log(self.unseen)
        target = self.index[y.reshape(-1)]
        nll = torch.nn.functional.cross_entropy(logits, target, reduction="none")
        # an unseen target is one of |U| tokens sharing the slot's probability
        return nll + (target == len(self.seen)).float() * math.log(max(1, self.unseen))

    def step_nll(self, model: LoopedLlama, x: torch.Tensor, y: torch.Tensor, loops: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(per-token cross-entropy after each step (loops, B*T), h after each step)."""
        w = self.weight(model)
        # inputs embed as the exported model embeds them: an unseen token reads `other`
        states = model.step_states(x, loops, h=w[self.index[x]])
        return torch.stack([self.nll(model.head_input(h), w, y) for h in states]), states

    def loss(self, model: LoopedLlama, x: torch.Tensor, y: torch.Tensor, loops: int) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) of the full-vocabulary model."""
        w = self.weight(model)
        h = model.hidden(x, loops, h=w[self.index[x]])
        return self.nll(h, w, y).mean()

    def export_embedding(self, model: LoopedLlama) -> LoopedLlama:
        """A copy of `model` whose unseen embedding rows are `other`."""
        out = LoopedLlama(model.config)
        out.load_state_dict(model.state_dict())
        out.eval()
        with torch.no_grad():
            unseen = torch.ones(model.config.vocab_size, dtype=torch.bool)
            unseen[self.seen] = False
            out.tok_embeddings.weight[unseen] = self.other.detach()
        return out


def exit_distribution(lams: list[torch.Tensor]) -> torch.Tensor:
    """p (T, N) from the gates of steps 0..T-2 (each (N,)): p_t = lambda_t * remaining, the last the remainder."""
    remaining = torch.ones_like(lams[0]) if lams else None
    ps = []
    for lam in lams:
        ps.append(lam * remaining)
        remaining = remaining * (1 - lam)
    return torch.stack(ps + [remaining])


def gate_lambdas(model: LoopedLlama, states: list[torch.Tensor]) -> list[torch.Tensor]:
    return [gate_lambda(model, h).reshape(-1) for h in states[:-1]]


def stage1_loss(model: LoopedLlama, head: OutOfTextHead, x: torch.Tensor, y: torch.Tensor, loops: int, beta: float) -> tuple[torch.Tensor, dict]:
    """Ouro's stage 1: expected cross-entropy under the exit distribution minus beta times its entropy."""
    nll, states = head.step_nll(model, x, y, loops)
    p = exit_distribution(gate_lambdas(model, states))
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(0)
    loss = (p * nll).sum(0).mean() - beta * entropy.mean()
    return loss, {"ce_last": nll[-1].mean().item(), "mean_steps": (p * torch.arange(1, loops + 1)[:, None]).sum(0).mean().item()}


def stage2_loss(model: LoopedLlama, head: OutOfTextHead, x: torch.Tensor, y: torch.Tensor, loops: int, margin: float) -> tuple[torch.Tensor, dict]:
    """Ouro's stage 2, the trunk frozen: lambda_t towards 1 where step t+1 improves the token's loss by < margin."""
    with torch.no_grad():
        nll, states = head.step_nll(model, x, y, loops)
    lams = torch.stack(gate_lambdas(model, [h.detach() for h in states]))
    target = ((nll[:-1] - nll[1:]) < margin).float()
    loss = torch.nn.functional.binary_cross_entropy(lams.clamp(1e-6, 1 - 1e-6), target)
    return loss, {"ce_last": nll[-1].mean().item(), "stop_share": target.mean().item()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder with train.bin and val.bin")
    ap.add_argument("--out", required=True, help="folder for ckpt.pt, model.safetensors, log.jsonl")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--loops", type=int, default=8, help="default depth, and the deepest one trained")
    ap.add_argument("--min-loops", type=int, default=1, help="the shallowest depth trained (without --exit-gate)")
    ap.add_argument("--layers", type=int, default=1, help="distinct layers in the stack (format version 2 when > 1)")
    ap.add_argument("--norm-layout", choices=("pre", "sandwich"), default="pre")
    ap.add_argument("--step-norm", action="store_true", help="rmsnorm(h, norm) after every step (Ouro)")
    ap.add_argument("--exit-gate", action="store_true", help="train the exit gate (Ouro stage 1, then --gate-steps of stage 2)")
    ap.add_argument("--beta", type=float, default=0.05, help="stage 1 entropy weight")
    ap.add_argument("--uniform-steps", type=int, default=0,
                    help="stage 1 opens with this many steps of the mean loss over all depths (a uniform exit "
                         "distribution, gate untouched): without it a small model's gate collapses onto step 1 "
                         "while step 1 is still the best, and the deeper steps never learn")
    ap.add_argument("--gate-steps", type=int, default=0, help="stage 2 steps (gate only) after --steps")
    ap.add_argument("--gate-margin", type=float, default=0.02, help="stage 2: stop when the next step improves the loss by less (nats)")
    ap.add_argument("--gate-lr", type=float, default=1e-3)
    ap.add_argument("--exit-threshold", type=float, default=None, help="the default exit threshold written into the file")
    ap.add_argument("--seq", type=int, default=256, help="training context, written as max_seq_len")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=24, help="validation windows of --seq tokens")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    return ap.parse_args(argv)


def lr_at(step: int, a: argparse.Namespace) -> float:
    if step >= a.steps:  # stage 2: the gate alone, constant rate
        return a.gate_lr
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    progress = (step - a.warmup) / max(1, a.steps - a.warmup)
    floor = a.lr * a.min_lr_ratio
    return floor + 0.5 * (a.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


def batch_at(tokens: np.ndarray, rng: np.random.Generator, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
    x = np.stack([tokens[s : s + seq] for s in starts])
    y = np.stack([tokens[s + 1 : s + seq + 1] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


@torch.no_grad()
def evaluate(model: LoopedLlama, head: OutOfTextHead, val: np.ndarray, seq: int, windows: int, depths: tuple[int, ...]) -> dict[int, float]:
    """Mean validation loss (nats/token) at each depth over the first `windows` windows.
    With the exit gate, every depth 1..max(depths) comes from one pass (a
    fixed depth t is the first t steps), and "exp" is the expected loss under
    the gates' exit distribution."""
    model.eval()
    n = min(windows, (len(val) - 1) // seq)
    x = torch.from_numpy(np.stack([val[i * seq : (i + 1) * seq] for i in range(n)]))
    y = torch.from_numpy(np.stack([val[i * seq + 1 : (i + 1) * seq + 1] for i in range(n)]))
    out: dict = {}
    if model.config.exit_gate:
        T = max(depths)
        sums = torch.zeros(T + 1, dtype=torch.float64)
        for i in range(0, n, 4):
            nll, states = head.step_nll(model, x[i : i + 4], y[i : i + 4], T)
            p = exit_distribution(gate_lambdas(model, states))
            sums[:T] += nll.sum(1).double()
            sums[T] += (p * nll).sum().double()
        count = n * seq
        out = {d: (sums[d - 1] / count).item() for d in range(1, T + 1)}
        out["exp"] = (sums[T] / count).item()
    else:
        for d in depths:
            losses = [head.loss(model, x[i : i + 4], y[i : i + 4], d).item() * len(x[i : i + 4]) for i in range(0, n, 4)]
            out[d] = sum(losses) / n
    model.train()
    return out


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    train = read_tokens(os.path.join(a.data, "train.bin"))
    val = read_tokens(os.path.join(a.data, "val.bin"))
    config = LoopedConfig(
        dim=a.dim, n_heads=a.heads, n_kv_heads=a.kv_heads, ffn_dim=a.ffn,
        default_loops=a.loops, max_seq_len=a.seq, tied_output=True,
        n_layers=a.layers, norm_layout=a.norm_layout, step_norm=a.step_norm, exit_gate=a.exit_gate,
        exit_threshold=a.exit_threshold,
    )
    depths = tuple(range(1, a.loops + 1)) if a.exit_gate else EVAL_DEPTHS
    model = LoopedLlama(config)
    model.init_weights(a.seed)
    head = OutOfTextHead(model, np.unique(train))
    print(f"{len(train)} training tokens, {len(head.seen)} distinct; {head.unseen} GPT-2 tokens share one vector")
    params = list(model.named_parameters()) + [("other", head.other)]
    decay = [p for n, p in params if p.dim() >= 2]
    no_decay = [p for n, p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    gate_opt = None
    if a.exit_gate:  # stage 2's own optimizer: the gate alone
        gate_params = list(model.exit_gate.parameters())
        gate_opt = torch.optim.AdamW(gate_params, lr=a.gate_lr, betas=(0.9, 0.95), weight_decay=0.0)
    total_steps = a.steps + (a.gate_steps if a.exit_gate else 0)
    rng = np.random.default_rng(a.seed)
    depth_rng = random.Random(a.seed)
    step = 0
    trained_s = 0.0  # training time before this process (resume), for the log
    ckpt_path = os.path.join(a.out, "ckpt.pt")
    if a.resume:
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        head.load_state_dict(ck["head"])
        opt.load_state_dict(ck["opt"])
        if gate_opt is not None and "gate_opt" in ck:
            gate_opt.load_state_dict(ck["gate_opt"])
        step = ck["step"]
        rng.bit_generator.state = ck["rng"]
        depth_rng.setstate(ck["depth_rng"])
        trained_s = ck.get("trained_s", 0.0)
        print(f"resumed from {ckpt_path} at step {step}")

    def checkpoint() -> None:
        tmp = ckpt_path + ".tmp"
        torch.save({"model": model.state_dict(), "head": head.state_dict(), "opt": opt.state_dict(), "step": step,
                    "gate_opt": gate_opt.state_dict() if gate_opt is not None else None,
                    "rng": rng.bit_generator.state, "depth_rng": depth_rng.getstate(), "args": vars(a),
                    "trained_s": trained_s + time.perf_counter() - started}, tmp)
        os.replace(tmp, ckpt_path)
        save(head.export_embedding(model), os.path.join(a.out, "model.safetensors"), {
            "description": ("Ouro-class looped stack" if a.exit_gate else "looped-llama")
            + " trained on the King James Bible (public domain)",
            "training_steps": str(step),
            "training_tokens": str(step * a.batch * a.seq),
        })

    log = open(os.path.join(a.out, "log.jsonl"), "a")
    model.train()
    bar = tqdm(total=total_steps, initial=step, dynamic_ncols=True, mininterval=2.0)
    tokens_done, started = 0, time.perf_counter()
    while step < total_steps:
        x, y = batch_at(train, rng, a.batch, a.seq)
        stage2 = step >= a.steps
        active = gate_opt if stage2 else opt
        for g in active.param_groups:
            g["lr"] = lr_at(step, a)
        extra: dict = {}
        if a.exit_gate:
            depth = a.loops
            if stage2:
                loss, extra = stage2_loss(model, head, x, y, depth, a.gate_margin)
            elif step < a.uniform_steps:
                nll, _ = head.step_nll(model, x, y, depth)
                loss = nll.mean()
                extra = {"ce_last": nll[-1].mean().item(), "mean_steps": (depth + 1) / 2}
            else:
                loss, extra = stage1_loss(model, head, x, y, depth, a.beta)
        else:
            depth = depth_rng.randint(a.min_loops, a.loops)
            loss = head.loss(model, x, y, depth)
        active.zero_grad(set_to_none=True)
        loss.backward()
        clipped = [p for p in model.exit_gate.parameters()] if stage2 else [p for _, p in params]
        grad_norm = torch.nn.utils.clip_grad_norm_(clipped, a.clip).item()
        active.step()
        step += 1
        tokens_done += x.numel()
        rate = tokens_done / (time.perf_counter() - started)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", depth=depth, tok_s=f"{rate:.0f}",
                        **{k: f"{v:.3f}" for k, v in extra.items()}, refresh=False)
        if step % a.eval_every == 0 or step == a.steps or step == total_steps:
            losses = evaluate(model, head, val, a.seq, a.eval_windows, depths)
            record = {"step": step, "stage": 2 if stage2 else 1, "lr": lr_at(step - 1, a), "train_loss": loss.item(),
                      "grad_norm": grad_norm, **extra,
                      "tokens_per_s": rate, "elapsed_s": trained_s + time.perf_counter() - started,
                      "val_loss": {str(d): v for d, v in losses.items()},
                      "val_ppl": {str(d): math.exp(v) for d, v in losses.items()}}
            log.write(json.dumps(record) + "\n")
            log.flush()
            bar.write("step {}: val ppl {}".format(step, ", ".join(f"L{d} {math.exp(v):.1f}" for d, v in losses.items())))
        if step % a.ckpt_every == 0 or step == a.steps or step == total_steps:
            checkpoint()
    bar.close()


if __name__ == "__main__":
    main()
