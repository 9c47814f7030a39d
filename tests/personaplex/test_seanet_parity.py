"""Streaming convs and SEANet against the reference package (test-only oracle), random weights."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from agent.plugins.personaplex.conv import (
    StreamingConv1d,
    StreamingConvTranspose1d,
    conv1d_gemm,
    conv_transpose1d_gemm,
    fold_weight_norm,
)
from agent.plugins.personaplex.mimi_config import STANDARD_SEANET
from agent.plugins.personaplex.seanet import SEANetDecoder, SEANetEncoder
from agent.plugins.personaplex.streaming import reset_slots, start_streaming, stop_streaming
from tests.support.oracles import require as require_oracle

pytestmark = pytest.mark.model

ref_conv = require_oracle("moshi.modules.conv")
ref_seanet = require_oracle("moshi.modules.seanet")

# The released codec's SEANet settings at a size that runs in milliseconds.
TINY_SEANET = {**STANDARD_SEANET, "dimension": 16, "n_filters": 4, "ratios": [4, 3, 2]}


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return a.shape == b.shape and (a - b).abs().max().item() <= atol


def transfer(reference: torch.nn.Module, ours: torch.nn.Module, tmp_path) -> None:
    """Reference state dict -> safetensors file -> ours, strictly (no missing/unexpected keys)."""
    path = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(path))
    ours.load_state_dict(load_file(str(path)), strict=True)


@pytest.mark.parametrize(
    "kernel,stride,dilation,pad_mode",
    [
        (7, 1, 1, "constant"),
        (3, 1, 2, "constant"),
        (8, 4, 1, "constant"),
        (4, 2, 1, "replicate"),
        (1, 1, 1, "constant"),
    ],
)
def test_conv1d_streams_like_reference(kernel, stride, dilation, pad_mode, tmp_path) -> None:
    torch.manual_seed(0)
    reference = ref_conv.StreamingConv1d(
        3, 5, kernel, stride, dilation=dilation, causal=True, pad_mode=pad_mode
    )
    ours = StreamingConv1d(3, 5, kernel, stride, dilation=dilation, pad_mode=pad_mode)
    transfer(reference, ours, tmp_path)
    x = torch.randn(2, 3, stride * 24)
    with torch.no_grad():
        # Offline (48 output rows) uses torch's conv, a few rows per call a GEMM: both agree.
        assert close(ours(x), reference(x))
        start_streaming(ours, 2)
        with reference.streaming(2):
            for chunk in x.split(stride * 3, dim=-1):
                assert close(ours(chunk), reference(chunk))
        stop_streaming(ours)


@pytest.mark.parametrize("kernel,stride,groups", [(8, 4, 1), (4, 2, 6), (2, 2, 1), (5, 1, 1)])
def test_conv_transpose_streams_like_reference(kernel, stride, groups, tmp_path) -> None:
    torch.manual_seed(1)
    reference = ref_conv.StreamingConvTranspose1d(6, 6, kernel, stride, groups=groups, causal=True)
    ours = StreamingConvTranspose1d(6, 6, kernel, stride, groups=groups)
    transfer(reference, ours, tmp_path)
    x = torch.randn(2, 6, 20)
    with torch.no_grad():
        assert close(ours(x), reference(x))
        start_streaming(ours, 2)
        streamed = []
        with reference.streaming(2):
            for chunk in x.split(2, dim=-1):
                out = ours(chunk)
                assert torch.allclose(out, reference(chunk), atol=1e-6, rtol=0)
                streamed.append(out)
        stop_streaming(ours)
    # Streaming reproduces the offline output (the last overhang is still pending).
    assert torch.allclose(torch.cat(streamed, dim=-1), ours(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("batch,steps", [(1, 1), (1, 4), (3, 2), (8, 2)])
def test_gemm_paths_equal_torch_convs(batch, steps) -> None:
    torch.manual_seed(5)
    x = torch.randn(batch, 24, steps * 4 + 4)
    weight, bias = torch.randn(40, 24, 8) / 10, torch.randn(40)
    assert close(conv1d_gemm(x, weight, bias, 4), F.conv1d(x, weight, bias, 4))
    assert close(conv1d_gemm(x, weight, None, 4), F.conv1d(x, weight, None, 4))
    z = torch.randn(batch, 24, steps)
    for kernel, stride in ((8, 4), (6, 2), (3, 3), (4, 1)):
        tr_weight = torch.randn(24, 40, kernel) / 10
        assert close(
            conv_transpose1d_gemm(z, tr_weight, stride),
            F.conv_transpose1d(z, tr_weight, None, stride),
        )


def test_conv_rejects_partial_strides() -> None:
    conv = StreamingConv1d(1, 1, 4, 2)
    with pytest.raises(ValueError, match="multiple of the stride"):
        conv(torch.zeros(1, 1, 3))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_weight_norm_checkpoint_folds_to_plain_weights(tmp_path) -> None:
    torch.manual_seed(2)
    reference = ref_conv.StreamingConv1d(3, 4, 3, causal=True, norm="weight_norm")
    state = reference.state_dict()
    assert any(key.endswith("weight_g") or "parametrizations" in key for key in state)
    ours = StreamingConv1d(3, 4, 3)
    ours.load_state_dict(fold_weight_norm(state), strict=True)
    x = torch.randn(1, 3, 10)
    with torch.no_grad():
        assert torch.allclose(ours(x), reference(x), atol=1e-6)


def build_pair(tmp_path, config=TINY_SEANET):
    torch.manual_seed(3)
    ref_enc, ref_dec = ref_seanet.SEANetEncoder(**config), ref_seanet.SEANetDecoder(**config)
    enc, dec = SEANetEncoder(**config), SEANetDecoder(**config)
    transfer(ref_enc, enc, tmp_path)
    transfer(ref_dec, dec, tmp_path)
    return ref_enc.eval(), ref_dec.eval(), enc.eval(), dec.eval()


def test_seanet_streams_like_reference(tmp_path) -> None:
    ref_enc, ref_dec, enc, dec = build_pair(tmp_path)
    hop = enc.hop_length
    assert hop == 24
    audio = torch.randn(3, 1, hop * 2 * 12)
    start_streaming(enc, 3)
    start_streaming(dec, 3)
    with torch.no_grad(), ref_enc.streaming(3), ref_dec.streaming(3):
        for chunk in audio.split(hop * 2, dim=-1):
            latent, ref_latent = enc(chunk), ref_enc(chunk)
            assert latent.shape == (3, 16, 2)
            assert close(latent, ref_latent)
            out, ref_out = dec(latent), ref_dec(ref_latent)
            assert out.shape == chunk.shape
            assert (out - ref_out).abs().max().item() <= 1e-5


def test_seanet_slot_reset_matches_alone(tmp_path) -> None:
    _, _, enc, dec = build_pair(tmp_path)
    hop = enc.hop_length
    frames = 8
    audio = torch.randn(3, 1, hop * frames)
    reset_at = 3

    def run_alone(signal: torch.Tensor) -> list[torch.Tensor]:
        start_streaming(enc, 1)
        start_streaming(dec, 1)
        outs = [dec(enc(chunk)) for chunk in signal.split(hop, dim=-1)]
        return outs

    with torch.no_grad():
        alone = [run_alone(audio[i : i + 1]) for i in range(3)]
        slot1_after_reset = run_alone(audio[1:2, :, hop * reset_at :])
        start_streaming(enc, 3)
        start_streaming(dec, 3)
        for t, chunk in enumerate(audio.split(hop, dim=-1)):
            if t == reset_at:
                mask = torch.tensor([False, True, False])
                reset_slots(enc, mask)
                reset_slots(dec, mask)
            out = dec(enc(chunk))
            for slot in (0, 2):
                assert torch.allclose(out[slot : slot + 1], alone[slot][t], atol=1e-6, rtol=0)
            expected_1 = alone[1][t] if t < reset_at else slot1_after_reset[t - reset_at]
            assert torch.allclose(out[1:2], expected_1, atol=1e-6, rtol=0)
