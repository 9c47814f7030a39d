"""Batch equivalence: sessions joining (and leaving) at different ticks produce exactly the
tokens (and audio) each produces when stepped alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from agent.plugins.personaplex.prompt import PromptCache
from agent.plugins.personaplex.stepper import BatchedStepper

from .helpers import TinyModels, load_tiny, speech_like_frames

pytestmark = pytest.mark.model

FRAMES = 14
# (voice, join tick, leave tick or None) per session
SESSIONS = [("NATF2.pt", 0, None), ("NATM1.pt", 2, 9), ("VARF0.pt", 3, None), ("NATF2.pt", 6, None)]


@pytest.fixture(scope="module")
def models(tiny_checkpoint: Path) -> TinyModels:
    return load_tiny(tiny_checkpoint)


@pytest.fixture(scope="module")
def snapshots(models: TinyModels) -> dict[str, dict[str, torch.Tensor]]:
    cache = PromptCache(models.lm, lambda voice, persona: models.plan(voice, persona))
    try:
        return {voice: cache.get_blocking((voice, "Be kind.")) for voice, _, _ in SESSIONS}
    finally:
        cache.close()


def _run_alone(models: TinyModels, snapshot: dict, frames: np.ndarray) -> list:
    stepper = BatchedStepper(models.lm, models.mimi, capacity=1)
    handle = stepper.acquire(snapshot)
    return [stepper.step([handle], frame[None])[0] for frame in frames]


@pytest.mark.parametrize("bucketed", [False, True], ids=["packed", "bucketed"])
def test_batch_of_four_equals_each_alone(
    models: TinyModels, snapshots: dict, bucketed: bool
) -> None:
    """`bucketed` steps power-of-two prefixes (free slots ride along inactive), the shape
    discipline the CUDA-graph path uses; checked here on CPU."""
    inputs = [speech_like_frames(seed=10 + i, count=FRAMES) for i in range(len(SESSIONS))]
    stepper = BatchedStepper(models.lm, models.mimi, capacity=4, bucketed=bucketed)
    handles: dict[int, object] = {}
    batched: dict[int, list] = {i: [] for i in range(len(SESSIONS))}
    for tick in range(FRAMES + 6):
        for index, (voice, join, leave) in enumerate(SESSIONS):
            if tick == join:
                handles[index] = stepper.acquire(snapshots[voice])
            if leave is not None and tick == leave and index in handles:
                stepper.release(handles.pop(index))
        live = [i for i in handles if len(batched[i]) < FRAMES]
        if not live:
            continue
        frames = np.stack([inputs[i][len(batched[i])] for i in live])
        for i, result in zip(live, stepper.step([handles[i] for i in live], frames), strict=False):
            batched[i].append(result)

    for index, (voice, join, leave) in enumerate(SESSIONS):
        got = batched[index]
        expected = _run_alone(models, snapshots[voice], inputs[index][: len(got)])
        assert len(got) == (leave - join if leave is not None else FRAMES)
        assert [r.text_token for r in got] == [r.text_token for r in expected], index
        assert [r.audio_codes for r in got] == [r.audio_codes for r in expected], index
        assert [r.user_codes for r in got] == [r.user_codes for r in expected], index
        np.testing.assert_allclose(np.stack([r.audio for r in got]),
                                   np.stack([r.audio for r in expected]), atol=1e-5)


def test_fresh_slot_is_silent_until_the_first_output_frame(tiny_moshi_checkpoint: Path) -> None:
    models = load_tiny(tiny_moshi_checkpoint)
    stepper = BatchedStepper(models.lm, models.mimi, capacity=2)
    first = stepper.acquire(None)
    frames = speech_like_frames(seed=3, count=4)
    results = [stepper.step([first], frame[None])[0] for frame in frames[:2]]
    # Moshi's acoustic delay: the first step has no complete agent frame yet.
    assert results[0].audio_codes is None and results[0].text_token is None
    assert not np.any(results[0].audio)
    assert results[1].audio_codes is not None
    # A second session joining later sees the same: silence first, then audio.
    second = stepper.acquire(None)
    out = stepper.step([first, second], frames[2:4])
    assert out[0].audio_codes is not None and out[1].audio_codes is None
    assert not np.any(out[1].audio)


def test_capacity_is_enforced(models: TinyModels) -> None:
    stepper = BatchedStepper(models.lm, models.mimi, capacity=1)
    stepper.acquire(None)
    with pytest.raises(RuntimeError):
        stepper.acquire(None)


def test_bucket_width() -> None:
    from agent.plugins.personaplex.stepper import bucket_width

    assert [bucket_width(n, 64) for n in (1, 2, 3, 5, 8, 9, 33, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    assert bucket_width(5, 6) == 6


def test_mixed_sampling_batch_equals_alone(models: TinyModels, snapshots: dict) -> None:
    """Greedy and sampling sessions in one batch (one LM pass per sampling config, the
    others frozen) each get what they get alone."""
    from agent.plugins.personaplex.sampling import SamplingConfig

    sampled = SamplingConfig(use_sampling=True, temp=1.0, top_k=50, temp_text=1.0, top_k_text=10)
    frames = [speech_like_frames(seed=30 + i, count=6) for i in range(3)]
    configs = [(SamplingConfig(), 0), (sampled, 7), (sampled, 8)]

    def alone(index: int) -> list:
        stepper = BatchedStepper(models.lm, models.mimi, capacity=1)
        handle = stepper.acquire(snapshots["NATF2.pt"], *configs[index])
        return [stepper.step([handle], f[None])[0] for f in frames[index]]

    stepper = BatchedStepper(models.lm, models.mimi, capacity=3)
    handles = [stepper.acquire(snapshots["NATF2.pt"], *config) for config in configs]
    batched: list[list] = [[], [], []]
    for tick in range(6):
        for index, result in enumerate(stepper.step(handles, np.stack([f[tick] for f in frames]))):
            batched[index].append(result)
    for index in range(3):
        expected = alone(index)
        assert [(r.text_token, r.audio_codes) for r in batched[index]] == \
            [(r.text_token, r.audio_codes) for r in expected], index
    assert [r.audio_codes for r in batched[1]] != [r.audio_codes for r in batched[2]]
