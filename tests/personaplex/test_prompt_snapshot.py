"""Prompt snapshots: a session opened from the cached post-prompt state produces the same
tokens as one that ran the whole prefill in its own slot; prefills run apart from live slots."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from agent.plugins.personaplex.prompt import (
    SILENCE_FRAMES,
    PromptCache,
    persona_tokens,
    run_prefill,
)
from agent.plugins.personaplex.stepper import BatchedStepper

from .helpers import TinyModels, load_tiny, speech_like_frames

pytestmark = pytest.mark.model

PERSONA = "You enjoy talking about the weather."


@pytest.fixture(scope="module")
def models(tiny_checkpoint: Path) -> TinyModels:
    return load_tiny(tiny_checkpoint)


def _tokens(results: list) -> list:
    return [(r.text_token, r.audio_codes) for r in results]


def test_snapshot_equals_full_prefill(models: TinyModels) -> None:
    frames = speech_like_frames(seed=7, count=10)
    cache = PromptCache(models.lm, lambda voice, persona: models.plan(voice, persona))
    try:
        snapshot = cache.get_blocking(("NATM1.pt", PERSONA))
    finally:
        cache.close()

    stepper = BatchedStepper(models.lm, models.mimi, capacity=3)
    bystander = stepper.acquire(None)  # a live call in slot 0 while slot 1 prefills
    prefilled = stepper.acquire(None)
    plan = models.plan("NATM1.pt", PERSONA)
    bystander_before = stepper.step([bystander], frames[:1])  # bystander is mid-call
    run_prefill(stepper.lm_stepper, prefilled.slot, plan)
    assert stepper.lm_stepper.state is not None
    assert int(stepper.lm_stepper.state["offset"][prefilled.slot]) == plan.frames
    assert plan.frames == plan.voice.frames + 2 * SILENCE_FRAMES + len(plan.text_tokens)
    # The prefill of slot 1 left the bystander's slot where it was.
    assert int(stepper.lm_stepper.state["offset"][bystander.slot]) == 1
    from_snapshot = stepper.acquire(snapshot)

    outputs = stepper.step([bystander, prefilled, from_snapshot],
                           np.stack([frames[1], frames[0], frames[0]]))
    a_results, b_results = [outputs[1]], [outputs[2]]
    for frame in frames[1:]:
        _, a, b = stepper.step(
            [bystander, prefilled, from_snapshot], np.stack([frame, frame, frame])
        )
        a_results.append(a)
        b_results.append(b)
    assert _tokens(a_results) == _tokens(b_results)
    np.testing.assert_allclose(np.stack([r.audio for r in a_results]),
                               np.stack([r.audio for r in b_results]), atol=1e-5)
    # The first frame out after the prompt is the prompt's last (forced) silence frame.
    assert a_results[0].text_token == models.lm.text_padding_token_id
    # The bystander started fresh: its first step had no complete agent frame yet.
    assert bystander_before[0].audio_codes is None


def test_persona_tokens_are_wrapped_in_system_tags(models: TinyModels) -> None:
    tokens = persona_tokens(models.tokenizer, "  Be brief. ")
    assert models.tokenizer.decode(list(tokens)) == "<system> Be brief. <system>"


def test_snapshots_are_made_once_per_voice_and_persona(models: TinyModels) -> None:
    cache = PromptCache(models.lm, lambda voice, persona: models.plan(voice, persona))
    try:
        first = cache.get_blocking(("NATF2.pt", PERSONA))
        again = cache.get_blocking(("NATF2.pt", PERSONA))
        other = cache.get_blocking(("NATF2.pt", "Another persona."))
        assert again is first
        assert cache.prefills_run == 2
        assert any(not torch.equal(first[k], other[k]) for k in first)
    finally:
        cache.close()


def test_prefill_does_not_touch_live_slots(models: TinyModels) -> None:
    """A live call stepped while a prefill runs on the prompt thread gets exactly the output
    it gets with no prefill at all (the prefill has its own model state)."""
    frames = speech_like_frames(seed=9, count=6)

    def run_live(with_prefill: bool) -> list:
        stepper = BatchedStepper(models.lm, models.mimi, capacity=1)
        handle = stepper.acquire(None)
        cache = PromptCache(models.lm, lambda voice, persona: models.plan(voice, persona))
        try:
            pending = cache.submit(("VARF0.pt", PERSONA)) if with_prefill else None
            results = [stepper.step([handle], frame[None])[0] for frame in frames]
            if pending is not None:
                pending.result()
        finally:
            cache.close()
        return _tokens(results)

    assert run_live(with_prefill=True) == run_live(with_prefill=False)
