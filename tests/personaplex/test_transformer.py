"""Parity of our streaming transformer with the reference `moshi` one (test-only oracle)."""

from __future__ import annotations

import os

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # keep torch.compile out of CPU tests

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agent.plugins.personaplex import streaming
from agent.plugins.personaplex.transformer import ProjectedTransformer, StreamingTransformer
from tests.support.oracles import require as require_oracle

pytestmark = pytest.mark.model

ref_transformer = require_oracle("moshi.modules.transformer")

MIMI_STYLE = dict(
    d_model=32,
    num_heads=4,
    num_layers=2,
    causal=True,
    layer_scale=0.01,
    context=10,
    conv_layout=True,
    max_period=10000,
    gating="none",
    norm="layer_norm",
    positional_embedding="rope",
    dim_feedforward=64,
    input_dimension=24,
    output_dimensions=[24, 16],
)

LM_STYLE = dict(
    d_model=48,
    num_heads=4,
    num_layers=2,
    dim_feedforward=int(4.125 * 48),
    causal=True,
    layer_scale=None,
    context=8,
    max_period=10000,
    gating="silu",
    norm="rms_norm_f32",
    positional_embedding="rope",
)


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Random weights everywhere, including norms and layer scales (which init to constants)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(
                torch.randn(param.shape, generator=gen) * 0.3 + (1.0 if param.dim() == 1 else 0.0)
            )


def _roundtrip(reference: torch.nn.Module, ours: torch.nn.Module, tmp_path: Path) -> None:
    path = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(path))
    result = ours.load_state_dict(load_file(str(path)), strict=True)
    assert not result.missing_keys and not result.unexpected_keys


def _build_pair(tmp_path: Path, name: str, config: dict, seed: int
                ) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The reference's module class `name` with random weights, and ours loaded from them."""
    torch.manual_seed(0)
    reference = getattr(ref_transformer, name)(**config).eval()
    _randomize(reference, seed)
    ours = {"ProjectedTransformer": ProjectedTransformer,
            "StreamingTransformer": StreamingTransformer}[name](**config).eval()
    _roundtrip(reference, ours, tmp_path)
    return reference, ours


def _build_projected(tmp_path: Path, config: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    return _build_pair(tmp_path, "ProjectedTransformer", config, 1)


def test_mimi_style_full_sequence_matches(tmp_path: Path) -> None:
    reference, ours = _build_projected(tmp_path, MIMI_STYLE)
    x = torch.randn(3, 24, 37)
    with torch.no_grad():
        expected = reference(x)
        got = ours(x)
    assert len(got) == 2
    for e, g in zip(expected, got, strict=False):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_mimi_style_streaming_matches_with_ring_wrap(tmp_path: Path) -> None:
    """Two steps per call (Mimi's 25 Hz transformer), 30 calls through a context of 10."""
    reference, ours = _build_projected(tmp_path, MIMI_STYLE)
    x = torch.randn(2, 24, 60)
    streaming.start_streaming(ours, 2)
    with torch.no_grad(), reference.streaming(2):
        for t in range(0, 60, 2):
            expected = reference(x[:, :, t : t + 2])
            got = ours(x[:, :, t : t + 2])
            for e, g in zip(expected, got, strict=False):
                torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def _build_lm_style(tmp_path: Path, **overrides: object
                    ) -> tuple[torch.nn.Module, torch.nn.Module]:
    return _build_pair(tmp_path, "StreamingTransformer", {**LM_STYLE, **overrides}, 2)


@pytest.mark.parametrize("overrides, batch, frames", [
    ({}, 3, 30),  # RMSNorm f32, gated SiLU, RoPE; context 8 over 30 frames (a ring wrap)
    ({"kv_repeat": 2, "norm": "rms_norm", "gating": "gelu"}, 2, 12),  # shared KV heads
])
def test_lm_style_streaming_matches(tmp_path: Path, overrides: dict, batch: int,
                                    frames: int) -> None:
    reference, ours = _build_lm_style(tmp_path, **overrides)
    x = torch.randn(batch, frames, 48)
    streaming.start_streaming(ours, batch)
    with torch.no_grad(), reference.streaming(batch):
        for t in range(frames):
            torch.testing.assert_close(ours(x[:, t : t + 1]), reference(x[:, t : t + 1]),
                                       atol=1e-5, rtol=1e-5)


def test_context_really_limits_attention(tmp_path: Path) -> None:
    """Past its receptive field (layers x (context - 1) frames) an input no longer counts."""
    _, ours = _build_lm_style(tmp_path)
    x = torch.randn(1, 20, 48)
    y = x.clone()
    y[:, 0] += 5.0
    outs = []
    for inputs in (x, y):
        streaming.start_streaming(ours, 1)
        with torch.no_grad():
            outs.append(torch.cat([ours(inputs[:, t : t + 1]) for t in range(20)], dim=1))
    assert not torch.allclose(outs[0][:, :8], outs[1][:, :8])
    assert not torch.allclose(outs[0][:, 14], outs[1][:, 14])
    torch.testing.assert_close(outs[0][:, 15:], outs[1][:, 15:], atol=0, rtol=0)


def test_weights_per_step_depformer_style_matches(tmp_path: Path) -> None:
    """Depformer layout: no positional embedding, context None, one weight set per step."""
    schedule = [0, 1, 1, 2]
    reference, ours = _build_lm_style(
        tmp_path,
        context=None,
        positional_embedding="none",
        weights_per_step=4,
        weights_per_step_schedule=schedule,
        dim_feedforward=[64, 80, 96],
    )
    x = torch.randn(2, 4, 48)
    streaming.start_streaming(ours, 2)
    with torch.no_grad(), reference.streaming(2):
        for step in range(4):
            got = ours(x[:, step : step + 1], weights_step=step)
            torch.testing.assert_close(got, reference(x[:, step : step + 1]), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        streaming.stop_streaming(ours)
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=1e-5)


def test_fused_in_proj_checkpoint_keys_load(tmp_path: Path) -> None:
    """Released checkpoints store `self_attn.in_proj_weight` fused over step weight sets."""
    reference, _ = _build_lm_style(
        tmp_path, context=None, positional_embedding="none", weights_per_step=3
    )
    fused = {}
    for key, value in reference.state_dict().items():
        if ".in_projs.0." in key or ".out_projs.0." in key:
            kind = "in" if ".in_projs." in key else "out"
            stem = key.split(f".{kind}_projs.")[0]
            parts = [reference.state_dict()[f"{stem}.{kind}_projs.{i}.weight"] for i in range(3)]
            fused[f"{stem}.in_proj_weight" if kind == "in" else f"{stem}.out_proj.weight"] = (
                torch.cat(parts)
            )
        elif ".in_projs." not in key and ".out_projs." not in key:
            fused[key] = value
    ours = StreamingTransformer(
        **{**LM_STYLE, "context": None, "positional_embedding": "none", "weights_per_step": 3}
    )
    ours.load_state_dict(fused, strict=True)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, atol=0, rtol=0)


def test_slots_joining_late_match_running_alone(tmp_path: Path) -> None:
    """B=4 slots reset at different frames give exactly what each gives in a batch of one,
    and a reset slot never sees the KV its previous occupant left behind."""
    _, ours = _build_lm_style(tmp_path)
    frames = 20
    starts = [0, 3, 10, 14]
    inputs = torch.randn(4, frames, 48)
    garbage = torch.randn(4, frames, 48) * 3

    alone = []
    for slot, start in enumerate(starts):
        streaming.start_streaming(ours, 1)
        with torch.no_grad():
            alone.append(
                torch.cat(
                    [ours(inputs[slot : slot + 1, t : t + 1]) for t in range(frames - start)], dim=1
                )
            )

    streaming.start_streaming(ours, 4)
    got: list[list[torch.Tensor]] = [[] for _ in starts]
    with torch.no_grad():
        for frame in range(frames):
            joining = torch.tensor([frame == start for start in starts])
            if joining.any():
                streaming.reset_slots(ours, joining)
            step_in = torch.stack(
                [
                    inputs[slot, frame - start] if frame >= start else garbage[slot, frame]
                    for slot, start in enumerate(starts)
                ]
            )[:, None]
            out = ours(step_in)
            for slot, start in enumerate(starts):
                if frame >= start:
                    got[slot].append(out[slot : slot + 1])
    for slot in range(4):
        torch.testing.assert_close(torch.cat(got[slot], dim=1), alone[slot], atol=1e-5, rtol=1e-5)


def test_frozen_slots_keep_their_state(tmp_path: Path) -> None:
    """A slot marked inactive for some calls continues as if those calls never happened."""
    _, ours = _build_lm_style(tmp_path)
    x = torch.randn(2, 12, 48)
    streaming.start_streaming(ours, 1)
    with torch.no_grad():
        alone = torch.cat([ours(x[1:2, t : t + 1]) for t in range(12)], dim=1)
    streaming.start_streaming(ours, 2)
    outs = []
    with torch.no_grad():
        t_slot1 = 0
        for call in range(20):
            active = torch.tensor([True, call % 3 != 1])
            step_in = torch.stack([x[0, call % 12], x[1, t_slot1 % 12]])[:, None]
            out = ours(step_in, active=active)
            if active[1] and t_slot1 < 12:
                outs.append(out[1:2])
                t_slot1 += 1
    torch.testing.assert_close(torch.cat(outs, dim=1), alone, atol=1e-5, rtol=1e-5)


def test_export_import_slot_snapshot(tmp_path: Path) -> None:
    _, ours = _build_lm_style(tmp_path)
    x = torch.randn(1, 15, 48)
    streaming.start_streaming(ours, 3)
    with torch.no_grad():
        for t in range(9):
            ours(x[:, t : t + 1].expand(3, -1, -1))
        snapshot = streaming.export_slot(ours, 0)
        streaming.reset_slots(ours, torch.tensor([False, False, True]))
        streaming.import_slot(ours, 2, snapshot)
        tail = x[:, 9:].expand(3, -1, -1)
        outs = torch.cat([ours(tail[:, t : t + 1]) for t in range(6)], dim=1)
    torch.testing.assert_close(outs[2], outs[0], atol=1e-5, rtol=1e-5)


def test_snapshot_holds_only_the_filled_ring_and_imports_into_a_used_slot(tmp_path: Path) -> None:
    _, ours = _build_lm_style(tmp_path)  # context 8
    x = torch.randn(3, 20, 48)
    streaming.start_streaming(ours, 3)
    with torch.no_grad():
        for t in range(3):
            ours(x[:1, t : t + 1].expand(3, -1, -1))
        short = streaming.export_slot(ours, 0)
        for t in range(3, 12):
            ours(x[:1, t : t + 1].expand(3, -1, -1))
        wrapped = streaming.export_slot(ours, 0)
        assert short["layers.0.self_attn:keys"].shape[1] == 3
        assert wrapped["layers.0.self_attn:keys"].shape[1] == 8
        # Slot 1 has 12 frames of history; after the import it continues exactly like a
        # slot that only ever saw the first 3 frames.
        streaming.start_streaming(ours, 1)
        for t in range(3):
            ours(x[:1, t : t + 1])
        expected = torch.cat([ours(x[2:3, t : t + 1]) for t in range(3, 10)], dim=1)
    streaming.start_streaming(ours, 3)
    with torch.no_grad():
        for t in range(12):
            ours(x[:1, t : t + 1].expand(3, -1, -1))
        streaming.import_slot(ours, 1, short)
        got = torch.cat(
            [ours(x[2:3, t : t + 1].expand(3, -1, -1))[1:2] for t in range(3, 10)], dim=1
        )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional_embedding", ["sin", "sin_rope", "rope_concat", "none"])
def test_other_positional_embeddings_match(tmp_path: Path, positional_embedding: str) -> None:
    """The reference LMModel's depformer defaults to "sin"; the others are accepted options."""
    reference, ours = _build_lm_style(
        tmp_path, positional_embedding=positional_embedding, positional_scale=0.7
    )
    x = torch.randn(2, 12, 48)
    streaming.start_streaming(ours, 2)
    with torch.no_grad(), reference.streaming(2):
        for t in range(12):
            torch.testing.assert_close(
                ours(x[:, t : t + 1]), reference(x[:, t : t + 1]), atol=1e-5, rtol=1e-5
            )
    with torch.no_grad():
        streaming.stop_streaming(ours)
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=1e-5)
