"""Token choice for a batch of slots: greedy, or temperature/top-k sampling with per-slot seeds.

Sampling noise is a pure function of (slot seed, slot step, token row, candidate rank), made
by an integer hash in plain tensor ops. So a slot samples the same tokens whatever else is in
the batch and whenever it joined, there is no per-slot `torch.Generator` to loop over, and the
step stays graph-capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK31 = 0x7FFFFFFF
_MIX = 0x045D9F3B  # < 2**27, so products of 31-bit values stay inside int64


@dataclass(frozen=True)
class SamplingConfig:
    """Greedy unless `use_sampling`; defaults are the PersonaPlex demo's."""

    use_sampling: bool = False
    temp: float = 0.8
    top_k: int = 250
    temp_text: float = 0.7
    top_k_text: int = 25


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = ((x >> 16) ^ x) * _MIX & _MASK31
    x = ((x >> 16) ^ x) * _MIX & _MASK31
    return (x >> 16) ^ x


def hashed_uniform(seed: torch.Tensor, step: torch.Tensor, row: int, count: int) -> torch.Tensor:
    """Uniform (0, 1) noise [B, count] from per-slot `seed` and `step` ([B] int64)."""
    x = _mix(seed & _MASK31)
    x = _mix(x ^ (step & _MASK31))
    x = _mix(x ^ (row * 0x9E3779B1 & _MASK31))
    ranks = torch.arange(count, device=seed.device, dtype=torch.long)
    x = _mix(x[:, None] ^ ranks[None, :])
    mantissa = (x >> 8).to(torch.float32)  # 23 bits: exact in float32, never 0 or 1 below
    return (mantissa + 0.5) / float(1 << 23)


def choose_tokens(
    logits: torch.Tensor,
    use_sampling: bool,
    temp: float,
    top_k: int,
    seed: torch.Tensor,
    step: torch.Tensor,
    row: int,
) -> torch.Tensor:
    """logits [B, V] -> tokens [B]."""
    if not use_sampling or temp <= 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temp, dim=-1)
    candidates = None
    if 0 < top_k < probs.shape[-1]:
        probs, candidates = torch.topk(probs, top_k, dim=-1)
    # argmax(p / E) with E ~ Exp(1) draws index i with probability p_i.
    exponential = -torch.log(hashed_uniform(seed, step, row, probs.shape[-1]))
    choice = (probs / exponential).argmax(dim=-1)
    if candidates is None:
        return choice
    return candidates.gather(-1, choice[:, None])[:, 0]
