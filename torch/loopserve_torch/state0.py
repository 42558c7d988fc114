"""The first state of a model with input injection (docs/model-format.md,
"Recurrent depth"): element i at position pos is std times a standard
normal truncated to [-3, 3], drawn from a counter-based generator keyed by
the position (kernels/loopserve.h writes it out), so the state is the same
for every request and every batch. Computed in double, rounded to fp32 as
the kernels keep it.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _uniform(seed: int, counter: int) -> float:
    x = _mix64((_mix64(seed) + (counter + 1) * 0x9E3779B97F4A7C15) & M64)
    return (x >> 11) * 2.0**-53


@lru_cache(maxsize=65536)
def standard_state(pos: int, dim: int) -> tuple[float, ...]:
    """The truncated standard normals of position `pos`, before the std."""
    seed = _mix64(0x7374617465 ^ pos)
    out = []
    for i in range(dim):
        z = 0.0
        for a in range(64):
            c = 2 * (i * 64 + a)
            v = math.sqrt(-2.0 * math.log(1.0 - _uniform(seed, c))) * math.cos(6.283185307179586 * _uniform(seed, c + 1))
            if abs(v) <= 3.0:
                z = v
                break
        out.append(z)
    return tuple(out)


def state0(pos: int, dim: int, std: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """std x standard_state(pos, dim), rounded to fp32, in `dtype`."""
    return torch.tensor([std * z for z in standard_state(pos, dim)], dtype=torch.float32).to(dtype)
