"""Split residual VQ against the reference package (test-only oracle), random codebooks."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from agent.plugins.personaplex.quantizer import (
    SplitResidualVectorQuantizer,
    rename_legacy_codebook_keys,
)
from tests.support.oracles import require as require_oracle

pytestmark = pytest.mark.model

ref_vq = require_oracle("moshi.quantization")

CONFIG = {"dimension": 8, "n_q": 6, "bins": 32, "input_dimension": 12, "output_dimension": 12}


def random_reference(seed: int = 0):
    torch.manual_seed(seed)
    reference = ref_vq.SplitResidualVectorQuantizer(**CONFIG).eval()
    for name, buffer in reference.named_buffers():
        if name.endswith("cluster_usage"):
            buffer.copy_(torch.rand_like(buffer) + 0.5)
        elif name.endswith("embedding_sum"):
            buffer.copy_(torch.randn_like(buffer))
        elif name.endswith("_initialized"):
            buffer.fill_(1.0)
    return reference


def load_ours(reference, tmp_path, num_codebooks: int):
    path = tmp_path / "q.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(path))
    ours = SplitResidualVectorQuantizer(**CONFIG)
    ours.load_state_dict(load_file(str(path)), strict=True)
    ours.set_num_codebooks(num_codebooks)
    reference.set_num_codebooks(num_codebooks)
    return ours


@pytest.mark.parametrize("num_codebooks", [1, 4, 6])
def test_codes_and_latents_match_reference(num_codebooks, tmp_path) -> None:
    reference = random_reference()
    ours = load_ours(reference, tmp_path, num_codebooks)
    latent = torch.randn(3, 12, 7)
    with torch.no_grad():
        codes = ours.encode(latent)
        ref_codes = reference.encode(latent)
        assert codes.shape == (3, num_codebooks, 7)
        assert torch.equal(codes, ref_codes)
        # The codes are not trivial: several distinct centroids are used per level.
        assert all(codes[:, level].unique().numel() > 3 for level in range(num_codebooks))
        decoded = ours.decode(codes)
        assert decoded.shape == (3, 12, 7)
        assert (decoded - reference.decode(ref_codes)).abs().max().item() <= 1e-5


def test_decode_accepts_fewer_codebooks_than_encoded(tmp_path) -> None:
    reference = random_reference(1)
    ours = load_ours(reference, tmp_path, 6)
    codes = torch.randint(0, CONFIG["bins"], (2, 3, 5))
    with torch.no_grad():
        assert (ours.decode(codes) - reference.decode(codes)).abs().max().item() <= 1e-5


def test_centroids_follow_a_reload(tmp_path) -> None:
    ours = load_ours(random_reference(2), tmp_path, 6)
    latent = torch.randn(1, 12, 4)
    first = ours.encode(latent)
    other = random_reference(3)
    ours2 = load_ours(other, tmp_path, 6)
    ours.load_state_dict(ours2.state_dict())
    with torch.no_grad():
        assert torch.equal(ours.encode(latent), other.encode(latent))
    assert not torch.equal(first, ours.encode(latent))


def test_legacy_buffer_names_are_renamed(tmp_path) -> None:
    reference = random_reference(4)
    legacy = {}
    for key, value in reference.state_dict().items():
        key = key.replace("embedding_sum", "embed_avg").replace("cluster_usage", "cluster_size")
        legacy[key] = value
    ours = SplitResidualVectorQuantizer(**CONFIG)
    ours.load_state_dict(rename_legacy_codebook_keys(legacy), strict=True)
    latent = torch.randn(2, 12, 3)
    with torch.no_grad():
        assert torch.equal(ours.encode(latent), reference.encode(latent))


def test_num_codebooks_bounds() -> None:
    ours = SplitResidualVectorQuantizer(**CONFIG)
    with pytest.raises(ValueError, match="num_codebooks"):
        ours.set_num_codebooks(7)
    with pytest.raises(ValueError, match="num_codebooks"):
        ours.set_num_codebooks(0)
