"""The tiny checkpoint writer produces a directory the real loaders (ours and the reference's
key layout) accept unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sentencepiece
import torch
from safetensors.torch import load_file

from agent.plugins.personaplex import checkpoint, lm_config, mimi_config
from agent.plugins.personaplex import tiny_checkpoint as writer
from tests.support.oracles import require as require_oracle

pytestmark = pytest.mark.model


@pytest.mark.parametrize("layout, dep_q", [("personaplex", 16), ("moshi", 8)])
def test_round_trip_through_loaders(
    layout: str, dep_q: int, tiny_checkpoint: Path, tiny_moshi_checkpoint: Path
) -> None:
    model_dir = tiny_checkpoint if layout == "personaplex" else tiny_moshi_checkpoint
    files = checkpoint.inspect_checkpoint(model_dir, need_voices=True)
    checkpoint.check_layout(files.config, dep_q, layout)
    info = lm_config.load_checkpoint_info(model_dir)
    assert info.lm_kwargs["dep_q"] == dep_q
    assert "moshi_name" not in info.lm_kwargs and "mimi_config_name" not in info.lm_kwargs
    lm = lm_config.load_lm(info, "cpu", torch.float32)  # strict: every key present
    saved = load_file(str(model_dir / writer.LM_WEIGHTS_NAME))
    # The release layout: fused attention weights, as NVIDIA's loader reads them strictly.
    assert not any(".in_projs." in key or ".out_projs." in key for key in saved)
    loaded = writer.fuse_attention(lm.state_dict())
    assert set(loaded) == set(saved)
    for key, value in loaded.items():
        assert torch.equal(value, saved[key]), key
    mimi_saved = load_file(str(files.mimi_weights))
    assert any(key.endswith(".self_attn.in_proj_weight") for key in mimi_saved)
    mimi = mimi_config.load_mimi(files.mimi_weights, info.mimi_config, "cpu", torch.float32, 8)
    assert mimi.frame_size == 1920 and mimi.num_codebooks == 8
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(files.tokenizer))
    assert tokenizer.get_piece_size() == info.lm_kwargs["text_card"]
    assert tokenizer.id_to_piece(3) == "<pad>"
    assert set(files.voice_names) >= {"NATF2.pt"} and len(files.voice_names) >= 2
    voice = files.load_voice("NATF2.pt", torch.device("cpu"))
    assert voice["embeddings"].shape[1:] == (1, 1, info.lm_kwargs["dim"])
    assert voice["cache"].shape == (1, info.lm_kwargs["n_q"] + 1, 4)


def test_config_is_what_the_reference_checkpoint_info_reads(tiny_checkpoint: Path) -> None:
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    for key in ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name", "model_type"):
        assert key in config
    mimi_arch = json.loads((tiny_checkpoint / config["mimi_config_name"]).read_text())
    assert set(mimi_arch) == {"sample_rate", "channels", "frame_rate", "seanet", "quantizer",
                              "transformer"}


def test_reference_modules_load_the_written_weights(tiny_checkpoint: Path) -> None:
    """The files use the reference key layout: the oracle package loads them strictly."""
    loaders = require_oracle("moshi.models.loaders")
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    lm_kwargs = {k: v for k, v in config.items()
                 if k not in ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name",
                              "model_type")}
    lm = loaders.get_moshi_lm(None, lm_kwargs=lm_kwargs, device="cpu", dtype=torch.float32)
    state = load_file(str(tiny_checkpoint / "model.safetensors"))
    missing, unexpected = lm.load_state_dict(state, strict=False)
    assert not missing and not unexpected
    mimi_arch = json.loads((tiny_checkpoint / config["mimi_config_name"]).read_text())
    mimi = loaders.get_mimi(str(tiny_checkpoint / config["mimi_name"]), mimi_arch, device="cpu")
    assert mimi.frame_size == 1920


def test_writing_is_deterministic(tmp_path: Path) -> None:
    first = writer.write_checkpoint(tmp_path / "a", "tiny", "moshi", seed=5)
    second = writer.write_checkpoint(tmp_path / "b", "tiny", "moshi", seed=5)
    for name in ("model.safetensors", "tokenizer-e351c8d8-checkpoint125.safetensors",
                 "config.json", "tokenizer_spm_32k_3.model"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_cli_writes_a_small_checkpoint(tmp_path: Path) -> None:
    writer.main([str(tmp_path / "small"), "--size", "small", "--layout", "moshi"])
    files = checkpoint.inspect_checkpoint(tmp_path / "small", need_voices=True)
    assert files.config["dep_q"] == 8 and files.config["num_layers"] == 2
