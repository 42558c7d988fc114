"""Held-out perplexity of a model file with the PyTorch reference, on the
protocol of bench/quality.ts: `--windows` texts of max_seq_len tokens spread
evenly over the held-out split (text i starts at token i * stride * len,
stride = floor(available windows / count)), each predicting its tokens
2..T from the ones before; perplexity = exp(mean negative log-likelihood of
the full-vocabulary softmax). K and V are rounded to fp16 as the server's
cache holds them.

    /usr/bin/python3 -m loopserve_torch.evaluate MODEL --val .cache/kjv/val.bin \\
        [--depths 1,2,3,4] [--thresholds 0.5,0.9] [--windows 32] [--out results.json]

Per fixed depth: perplexity. With the exit gate, per threshold: perplexity
and mean steps when every position decodes as a sampled token (the
server's rule, docs/early-exit.md, model.exit_forward) under each exit
policy ("exact": every step runs and the exit step's logits are taken;
"copy": the deeper cache slots of an exited token hold copies), and, as an
independent check of "exact", every step computed for every position and
each position's logits gathered at its exit step (Hugging Face
OuroForCausalLM's exit_threshold evaluation).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
import torch

from .data import read_tokens
from .hf import load_any
from .model import EXIT_POLICIES, ExitState, gate_lambda


def windows(tokens: np.ndarray, length: int, count: int) -> list[np.ndarray]:
    avail = len(tokens) // length
    if avail < count:
        raise SystemExit(f"held-out text has {avail} windows of {length} tokens, {count} asked for")
    stride = avail // count
    return [tokens[i * stride * length : (i * stride + 1) * length] for i in range(count)]


def nll(logits: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """NLL of each of text[1:] given logits (T, V) of positions 0..T-2 (float64 log-softmax)."""
    lp = torch.log_softmax(logits[:-1].double(), dim=-1)
    return -lp.gather(1, text[1:, None])[:, 0]


def nll_sum(logits: torch.Tensor, text: torch.Tensor) -> float:
    return nll(logits, text).sum().item()


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--val", required=True, help="held-out tokens (uint16, `loopserve tokenize`)")
    ap.add_argument("--depths", default=None, help="default: 1..default_loops")
    ap.add_argument("--thresholds", default="", help="exit thresholds (a model with the gate)")
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    model = load_any(a.model)
    c = model.config
    depths = [int(d) for d in a.depths.split(",")] if a.depths else list(range(1, c.default_loops + 1))
    thresholds = [float(t) for t in a.thresholds.split(",")] if a.thresholds else []
    if thresholds and not c.exit_gate:
        raise SystemExit(f"{a.model}: --thresholds needs a model with the exit gate")
    texts = [torch.from_numpy(w.astype(np.int64)) for w in windows(read_tokens(a.val), c.max_seq_len, a.windows)]
    deepest = max(depths + [c.default_loops if thresholds else 0])
    W = model.head_weight()
    fixed = {d: 0.0 for d in depths}
    gathered = {t: [0.0, 0] for t in thresholds}  # HF-style: all steps, logits gathered at the exit step
    decoded = {t: {policy: [0.0, 0] for policy in EXIT_POLICIES} for t in thresholds}  # the server's decoding rule, each policy
    n = 0
    started = time.perf_counter()
    for k, text in enumerate(texts):
        x = text[None]
        states = model.step_states(x, deepest, kv_fp16=True)
        per_step = {d: nll(model.head_input(states[d - 1][0]) @ W.t(), text) for d in sorted(set(depths) | set(range(1, deepest + 1) if thresholds else []))}
        for d in depths:
            fixed[d] += per_step[d].sum().item()
        if thresholds:
            L = c.default_loops
            lams = [gate_lambda(model, states[s][0]) for s in range(L)]
            for t in thresholds:
                st = ExitState((x.shape[1],), t, L)
                step = torch.full((x.shape[1],), L - 1, dtype=torch.long)
                done = torch.zeros(x.shape[1], dtype=torch.bool)
                for s in range(L):
                    now = st.update(s, lams[s]) & ~done
                    step[now] = s
                    done |= now
                table = torch.stack([per_step[s + 1] for s in range(L)])  # (L, T - 1)
                gathered[t][0] += table[step[:-1], torch.arange(x.shape[1] - 1)].sum().item()
                gathered[t][1] += (step[:-1] + 1).sum().item()
                for policy in EXIT_POLICIES:
                    logits, exit_step = model.exit_forward(x, L, t, kv_fp16=True, policy=policy)
                    decoded[t][policy][0] += nll_sum(logits[0], text)
                    decoded[t][policy][1] += (exit_step[0, :-1] + 1).sum().item()
        n += len(text) - 1
        print(f"window {k + 1}/{len(texts)}, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    result = {
        "model": a.model, "windows": len(texts), "window_tokens": c.max_seq_len, "positions": n,
        "fixed": {str(d): math.exp(v / n) for d, v in fixed.items()},
        "exit": {str(t): {**{policy: {"perplexity": math.exp(decoded[t][policy][0] / n), "mean_steps": decoded[t][policy][1] / n}
                             for policy in EXIT_POLICIES},
                          "hf_gather_perplexity": math.exp(gathered[t][0] / n), "hf_gather_mean_steps": gathered[t][1] / n}
                 for t in thresholds},
    }
    print(json.dumps(result, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
