"""GraphedLMStep: same tokens as the plain stepper; its warm-up assumption holds."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from agent.plugins.personaplex import streaming
from agent.plugins.personaplex.lm import LMModel
from agent.plugins.personaplex.lm_graph import GraphedLMStep
from agent.plugins.personaplex.lm_stepper import LMStepOutput, LMStepper

from .helpers import TINY_LM_KWARGS

pytestmark = pytest.mark.model

# The PersonaPlex layout, and a context short enough to wrap within a few steps.
CONFIG: dict[str, Any] = {**TINY_LM_KWARGS, "dep_q": 16, "context": 6}


def _lm(device: str = "cpu") -> LMModel:
    torch.manual_seed(0)
    model = LMModel(**CONFIG).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(2.0)
    return model.to(device)


def _inputs(t: int, batch: int, device: str) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(100 + t)
    kwargs: dict[str, Any] = {
        "user_codes": torch.randint(0, CONFIG["card"], (batch, 8), generator=gen).to(device)
    }
    if t < 4:
        kwargs["forced_text"] = torch.tensor([3] + [-1] * (batch - 1), device=device)
        kwargs["forced_agent"] = torch.full((batch, 8), -1, device=device)
        kwargs["forced_agent"][0] = torch.arange(8)
    if t in (1, 2):
        kwargs["input_embeddings"] = torch.randn(batch, CONFIG["dim"], generator=gen).to(device)
        kwargs["embeddings_mask"] = torch.tensor(
            [False, True] + [False] * (batch - 2), device=device
        )
    if t % 5 == 3:
        kwargs["active"] = torch.tensor([True, False] + [True] * (batch - 2), device=device)
    return kwargs


def _as_lists(out: LMStepOutput) -> tuple:
    return (
        out.text_tokens.tolist(),
        out.audio_codes.tolist(),
        out.audio_valid.tolist(),
        out.aligned_text.tolist(),
    )


def _compare(device: str, use_graph: bool) -> None:
    lm_plain = _lm(device)
    lm_graphed = copy.deepcopy(lm_plain)
    plain = LMStepper(lm_plain, 3)
    graphed = GraphedLMStep(LMStepper(lm_graphed, 3), use_graph=use_graph)
    for t in range(16):
        if t == 9:  # a session joins mid-way
            mask = torch.tensor([False, False, True], device=device)
            plain.reset_slots(mask)
            graphed.stepper.reset_slots(mask)
        kwargs = _inputs(t, 3, device)
        assert _as_lists(graphed.step(**kwargs)) == _as_lists(plain.step(**kwargs)), f"step {t}"


def test_buffered_eager_path_matches_plain_stepper() -> None:
    _compare("cpu", use_graph=False)


def test_all_frozen_step_leaves_slot_state_untouched() -> None:
    """What makes capturing safe at any time: a warm-up with every slot frozen."""
    stepper = LMStepper(_lm(), 3)
    for t in range(5):
        stepper.step(**_inputs(t, 3, "cpu"))
    depformer_scratch = {name for name, _ in streaming.streaming_modules(stepper.lm.depformer)}
    before = {
        name: {k: v.clone() for k, v in module.state.items()}
        for name, module in streaming.streaming_modules(stepper)
        if name.removeprefix("lm.")
        not in {f"depformer{'.' + n if n else ''}" for n in depformer_scratch}
    }
    frozen = torch.zeros(3, dtype=torch.bool)
    for t in range(5, 8):
        stepper.step(**{**_inputs(t, 3, "cpu"), "active": frozen})
    after = dict(streaming.streaming_modules(stepper))
    assert before
    for name, state in before.items():
        for key, value in state.items():
            assert torch.equal(after[name].state[key], value), f"{name}:{key}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_matches_eager() -> None:
    _compare("cuda", use_graph=True)
