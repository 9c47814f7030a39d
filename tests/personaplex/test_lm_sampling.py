"""Seeded per-slot sampling: reproducible, batch-independent, and distributed as asked."""

from __future__ import annotations

import torch

from agent.plugins.personaplex.sampling import choose_tokens, hashed_uniform


def test_hashed_uniform_is_deterministic_and_uniform() -> None:
    seed = torch.arange(2000) * 7919
    step = torch.arange(2000) % 37
    a = hashed_uniform(seed, step, row=3, count=64)
    b = hashed_uniform(seed, step, row=3, count=64)
    assert torch.equal(a, b)
    assert float(a.min()) > 0.0 and float(a.max()) < 1.0
    assert abs(float(a.mean()) - 0.5) < 0.01
    histogram = torch.histc(a, bins=10, min=0.0, max=1.0) / a.numel()
    assert float((histogram - 0.1).abs().max()) < 0.01
    assert not torch.equal(a, hashed_uniform(seed, step, row=4, count=64))
    assert not torch.equal(a, hashed_uniform(seed + 1, step, row=3, count=64))


def test_greedy_is_argmax() -> None:
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(0))
    zeros = torch.zeros(5, dtype=torch.long)
    assert torch.equal(choose_tokens(logits, False, 0.8, 10, zeros, zeros, 0), logits.argmax(-1))


def test_sampling_follows_softmax_within_top_k() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    draws = 20000
    steps = torch.arange(draws)
    seed = torch.full((draws,), 1234)
    tokens = choose_tokens(logits.expand(draws, -1), True, 0.8, 4, seed, steps, 0)
    counts = torch.bincount(tokens, minlength=6).float() / draws
    expected = torch.softmax(logits[:4] / 0.8, dim=-1)
    assert counts[4:].sum() == 0  # never outside the top k
    assert float((counts[:4] - expected).abs().max()) < 0.015


def test_sampling_depends_only_on_the_slot_seed_and_step() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    seed = torch.tensor([5, 6, 7, 8])
    step = torch.tensor([0, 3, 3, 9])
    together = choose_tokens(logits, True, 1.0, 0, seed, step, 2)
    for slot in range(4):
        alone = choose_tokens(
            logits[slot : slot + 1], True, 1.0, 0, seed[slot : slot + 1], step[slot : slot + 1], 2
        )
        assert int(alone[0]) == int(together[slot])
