"""GraphedMimi: state save/restore (CPU) and graph replay == eager streaming (CUDA only)."""

from __future__ import annotations

import copy

import pytest
import torch

from agent.plugins.personaplex.mimi_config import build_mimi
from agent.plugins.personaplex.mimi_graph import (
    GraphedMimi,
    restore_state,
    save_state,
    streaming_layers,
)
from agent.plugins.personaplex.streaming import reset_slots, start_streaming
from agent.plugins.personaplex.tiny_checkpoint import mimi_architecture

pytestmark = pytest.mark.model

FRAME = 1920


def tiny_mimi(device: str = "cpu"):
    torch.manual_seed(0)
    mimi = build_mimi(mimi_architecture("tiny"), device, torch.float32)
    mimi.set_num_codebooks(8)
    return mimi


def test_saved_state_restores_exactly() -> None:
    mimi = tiny_mimi()
    start_streaming(mimi, 2)
    audio = torch.randn(2, 1, FRAME * 6)
    layers = streaming_layers(mimi)
    with torch.no_grad():
        for t in range(2):
            mimi.decode(mimi.encode(audio[..., t * FRAME : (t + 1) * FRAME]))
        saved = save_state(layers)
        first = [
            mimi.decode(mimi.encode(audio[..., t * FRAME : (t + 1) * FRAME])) for t in range(2, 6)
        ]
        restore_state(layers, saved)
        again = [
            mimi.decode(mimi.encode(audio[..., t * FRAME : (t + 1) * FRAME])) for t in range(2, 6)
        ]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_eager_fallback_is_the_model() -> None:
    mimi = tiny_mimi()
    twin = copy.deepcopy(mimi)
    graphed = GraphedMimi(twin, use_graph=False)
    start_streaming(mimi, 1)
    start_streaming(twin, 1)
    audio = torch.randn(1, 1, FRAME * 3)
    active = torch.tensor([True])
    with torch.no_grad():
        for chunk in audio.split(FRAME, dim=-1):
            codes = mimi.encode(chunk)
            assert torch.equal(graphed.encode(chunk, active=active), codes)
            assert torch.equal(graphed.decode(codes), mimi.decode(codes))
    with pytest.raises(ValueError, match="CUDA"):
        GraphedMimi(mimi, use_graph=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replay_matches_eager_streaming() -> None:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    eager = tiny_mimi("cuda")
    graphed_model = copy.deepcopy(eager)
    graphed = GraphedMimi(graphed_model)
    batch, frames = 3, 12
    audio = torch.randn(batch, 1, FRAME * frames, device="cuda") * 0.3
    for restart in range(2):  # a new start_streaming reallocates state: graphs are re-captured
        start_streaming(eager, batch)
        start_streaming(graphed_model, batch)
        with torch.no_grad():
            for t, chunk in enumerate(audio.split(FRAME, dim=-1)):
                if t == 5:
                    mask = torch.tensor([False, True, False], device="cuda")
                    reset_slots(eager, mask)
                    reset_slots(graphed_model, mask)
                # Slot 2 is frozen on a few ticks: the mask is an input of the same graph.
                active = torch.tensor([True, True, t not in (7, 8)], device="cuda")
                codes = eager.encode(chunk, active=active)
                assert torch.equal(graphed.encode(chunk, active=active), codes), (restart, t)
                out = eager.decode(codes, active=active)
                assert (graphed.decode(codes, active=active) - out).abs().max().item() <= 1e-4, (
                    restart,
                    t,
                )
                if t == 10:
                    assert torch.equal(graphed.encode(chunk), eager.encode(chunk))
