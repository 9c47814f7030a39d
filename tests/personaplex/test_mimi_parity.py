"""Mimi against the reference `moshi.models.compression.MimiModel` (test-only oracle).

Random weights in a tiny config with the released framing (24 kHz, 12.5 Hz, SEANet ratios
[8, 6, 5, 4] so one frame is 1920 samples). The transformer context is short so the ring KV
cache wraps within the test.
"""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import save_file

from agent.plugins.personaplex.mimi_config import MimiConfigError, build_mimi, load_mimi
from agent.plugins.personaplex.streaming import reset_slots, start_streaming, stop_streaming
from tests.support.oracles import require as require_oracle

pytestmark = pytest.mark.model

loaders = require_oracle("moshi.models.loaders")

FRAME = 1920
TINY_MIMI = {
    "sample_rate": 24000,
    "channels": 1,
    "frame_rate": 12.5,
    "seanet": {
        "channels": 1, "dimension": 32, "causal": True, "n_filters": 4, "n_residual_layers": 1,
        "activation": "ELU", "compress": 2, "dilation_base": 2, "disable_norm_outer_blocks": 0,
        "kernel_size": 7, "residual_kernel_size": 3, "last_kernel_size": 3, "norm": "none",
        "pad_mode": "constant", "ratios": [8, 6, 5, 4], "true_skip": True,
    },
    "quantizer": {
        "dimension": 16, "n_q": 10, "bins": 64, "input_dimension": 32, "output_dimension": 32,
    },
    "transformer": {
        "d_model": 32, "num_heads": 2, "num_layers": 2, "causal": True, "layer_scale": 0.01,
        "context": 7, "conv_layout": True, "max_period": 10000, "gating": "none",
        "norm": "layer_norm", "positional_embedding": "rope", "dim_feedforward": 64,
        "input_dimension": 32, "output_dimensions": [32],
    },
}
NUM_CODEBOOKS = 8


def make_reference(seed: int = 0):
    torch.manual_seed(seed)
    reference = loaders.get_mimi(
        None, copy.deepcopy(TINY_MIMI), device="cpu", num_codebooks=NUM_CODEBOOKS
    )
    with torch.no_grad():
        for name, tensor in reference.state_dict().items():
            if name.endswith("cluster_usage"):
                tensor.copy_(torch.rand_like(tensor) + 0.5)
            elif name.endswith("embedding_sum"):
                tensor.copy_(torch.randn_like(tensor))
            elif name.endswith("layer_scale_1.scale") or name.endswith("layer_scale_2.scale"):
                # Make the transformers matter: the default 0.01 scale hides their errors.
                tensor.copy_(torch.rand_like(tensor) + 0.5)
    return reference.eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    reference = make_reference()
    path = tmp_path_factory.mktemp("mimi") / "mimi.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(path))
    ours = load_mimi(path, TINY_MIMI, "cpu", torch.float32, NUM_CODEBOOKS)
    return reference, ours, path


def test_reference_state_dict_loads_exactly(pair) -> None:
    reference, ours, _ = pair
    assert set(ours.state_dict()) == set(reference.state_dict())
    for key, value in reference.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    assert ours.num_codebooks == NUM_CODEBOOKS
    assert ours.total_codebooks == 10
    assert ours.frame_size == FRAME


def test_streaming_encode_decode_match_reference(pair) -> None:
    reference, ours, _ = pair
    torch.manual_seed(10)
    batch, frames = 2, 14
    audio = torch.randn(batch, 1, FRAME * frames) * 0.3
    start_streaming(ours, batch)
    worst = 0.0
    with torch.no_grad(), reference.streaming(batch):
        for t in range(frames):
            chunk = audio[..., t * FRAME : (t + 1) * FRAME]
            codes = ours.encode(chunk)
            ref_codes = reference.encode(chunk)
            assert codes.shape == (batch, NUM_CODEBOOKS, 1)
            assert torch.equal(codes, ref_codes), f"frame {t}"
            out = ours.decode(codes)
            ref_out = reference.decode(ref_codes)
            assert out.shape == (batch, 1, FRAME)
            worst = max(worst, (out - ref_out).abs().max().item())
    assert worst <= 1e-4
    # Not a trivially silent decoder.
    assert ref_out.abs().max().item() > 1e-3


def test_multi_frame_calls_match_reference(pair) -> None:
    """Several frames per call also stream like the reference (whose ring KV cache holds
    `context` steps, so a multi-step call is not bit-equal to one-frame calls; both agree)."""
    reference, ours, _ = pair
    torch.manual_seed(11)
    audio = torch.randn(2, 1, FRAME * 9) * 0.3
    start_streaming(ours, 2)
    with torch.no_grad(), reference.streaming(2):
        for lo, hi in ((0, 3), (3, 4), (4, 7), (7, 9)):
            chunk = audio[..., lo * FRAME : hi * FRAME]
            codes, ref_codes = ours.encode(chunk), reference.encode(chunk)
            assert codes.shape == (2, NUM_CODEBOOKS, hi - lo)
            assert torch.equal(codes, ref_codes)
            out, ref_out = ours.decode(codes), reference.decode(ref_codes)
            assert out.shape == chunk.shape
            assert (out - ref_out).abs().max().item() <= 1e-4


def test_offline_encode_matches_reference(pair) -> None:
    reference, ours, _ = pair
    torch.manual_seed(12)
    audio = torch.randn(2, 1, FRAME * 3 + 500)  # not whole frames: padded like the reference
    stop_streaming(ours)
    with torch.no_grad():
        codes = ours.encode(audio)
        assert torch.equal(codes, reference.encode(audio))
        assert (ours.decode(codes) - reference.decode(codes)).abs().max().item() <= 1e-4


def test_slot_reset_gives_what_each_slot_gives_alone(pair) -> None:
    _, ours, _ = pair
    torch.manual_seed(13)
    frames, reset_at = 12, 5
    audio = torch.randn(3, 1, FRAME * frames) * 0.3

    def run_alone(signal: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        start_streaming(ours, 1)
        codes, outs = [], []
        for chunk in signal.split(FRAME, dim=-1):
            codes.append(ours.encode(chunk))
            outs.append(ours.decode(codes[-1]))
        return codes, outs

    with torch.no_grad():
        alone = [run_alone(audio[i : i + 1]) for i in range(3)]
        restarted = run_alone(audio[1:2, :, FRAME * reset_at :])
        start_streaming(ours, 3)
        for t, chunk in enumerate(audio.split(FRAME, dim=-1)):
            if t == reset_at:
                reset_slots(ours, torch.tensor([False, True, False]))
            codes = ours.encode(chunk)
            out = ours.decode(codes)
            for slot in range(3):
                if slot == 1 and t >= reset_at:
                    want_codes, want_out = restarted[0][t - reset_at], restarted[1][t - reset_at]
                else:
                    want_codes, want_out = alone[slot][0][t], alone[slot][1][t]
                assert torch.equal(codes[slot : slot + 1], want_codes), (slot, t)
                assert (out[slot : slot + 1] - want_out).abs().max().item() <= 1e-5, (slot, t)


def test_frozen_slot_state_is_untouched(pair) -> None:
    """A slot marked inactive for some ticks continues as if those ticks never happened."""
    _, ours, _ = pair
    torch.manual_seed(14)
    frames, frozen = 10, (3, 4, 5)
    audio = torch.randn(3, 1, FRAME * frames) * 0.3
    kept = [t for t in range(frames) if t not in frozen]

    with torch.no_grad():
        start_streaming(ours, 1)
        alone = []
        for t in kept:
            codes = ours.encode(audio[1:2, :, t * FRAME : (t + 1) * FRAME])
            alone.append((codes, ours.decode(codes)))
        start_streaming(ours, 3)
        got = []
        for t, chunk in enumerate(audio.split(FRAME, dim=-1)):
            active = torch.tensor([True, t not in frozen, True])
            codes = ours.encode(chunk, active=active)
            out = ours.decode(codes, active=active)
            if t not in frozen:
                got.append((codes[1:2], out[1:2]))
    for (codes, out), (want_codes, want_out) in zip(got, alone, strict=True):
        assert torch.equal(codes, want_codes)
        assert (out - want_out).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="active"):
        ours.encode(audio[..., :FRAME], active=torch.ones(2, dtype=torch.bool))


def test_streaming_rejects_partial_frames(pair) -> None:
    _, ours, _ = pair
    start_streaming(ours, 1)
    with pytest.raises(ValueError, match="multiple of the frame size 1920"):
        ours.encode(torch.zeros(1, 1, 1000))
    with pytest.raises(ValueError, match=r"\[B, 1, T\]"):
        ours.encode(torch.zeros(1, 1920))


def test_bf16_weights_compute_in_requested_dtype(pair, tmp_path) -> None:
    reference, _, _ = pair
    path = tmp_path / "bf16.safetensors"
    state = {
        k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
        for k, v in reference.state_dict().items()
    }
    save_file(state, str(path))
    ours = load_mimi(path, TINY_MIMI, "cpu", torch.float32, NUM_CODEBOOKS)
    assert all(p.dtype == torch.float32 for p in ours.parameters())
    start_streaming(ours, 1)
    with torch.no_grad():
        out = ours.decode(ours.encode(torch.randn(1, 1, FRAME)))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_load_errors_are_clear(pair, tmp_path) -> None:
    _, _, path = pair
    with pytest.raises(MimiConfigError, match="not found"):
        load_mimi(tmp_path / "missing.safetensors", TINY_MIMI, "cpu", torch.float32, NUM_CODEBOOKS)
    bigger = copy.deepcopy(TINY_MIMI)
    bigger["transformer"]["num_layers"] = 3
    with pytest.raises(MimiConfigError, match="missing"):
        load_mimi(path, bigger, "cpu", torch.float32, NUM_CODEBOOKS)
    wider = copy.deepcopy(TINY_MIMI)
    wider["quantizer"]["bins"] = 128
    with pytest.raises(MimiConfigError, match="shape"):
        load_mimi(path, wider, "cpu", torch.float32, NUM_CODEBOOKS)
    with pytest.raises(MimiConfigError, match="num_codebooks"):
        load_mimi(path, TINY_MIMI, "cpu", torch.float32, 11)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(MimiConfigError, match="cannot read"):
        load_mimi(garbage, TINY_MIMI, "cpu", torch.float32, NUM_CODEBOOKS)


def test_built_model_has_varied_codes() -> None:
    torch.manual_seed(0)
    model = build_mimi(TINY_MIMI, "cpu", torch.float32)
    start_streaming(model, 1)
    with torch.no_grad():
        codes = model.encode(torch.randn(1, 1, FRAME * 3))
    assert codes.unique().numel() > 4
