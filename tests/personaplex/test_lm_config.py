"""config.json is read exactly as the reference `CheckpointInfo` reads it; loading errors are
clear."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from agent.plugins.personaplex.lm_config import (
    MOSHI_7B_LM_KWARGS,
    build_lm,
    load_checkpoint_info,
    load_lm,
    personaplex_7b_lm_kwargs,
)
from tests.support.oracles import require as require_oracle

from .helpers import TINY_LM_KWARGS

pytestmark = pytest.mark.model

ref_loaders = require_oracle("moshi.models.loaders")

# Smaller still than the shared tiny layout: 4 streams, a 1-layer model.
TINY_LM: dict[str, Any] = {
    **TINY_LM_KWARGS, "dim": 16, "text_card": 20, "n_q": 4, "dep_q": 2, "card": 12,
    "num_heads": 2, "num_layers": 1, "hidden_scale": 2, "context": 4, "depformer_dim": 8,
    "depformer_num_heads": 2, "delays": [0, 0, 1, 0, 1],
}

MIMI_CONFIG = {"sample_rate": 24000, "channels": 1, "frame_rate": 12.5, "seanet": {"dimension": 8}}


def _write_dir(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_config_fields_match_reference_checkpoint_info(tmp_path: Path) -> None:
    config = {
        **TINY_LM,
        "moshi_name": "lm.safetensors",
        "mimi_name": "codec.safetensors",
        "tokenizer_name": "spm.model",
        "mimi_config_name": "mimi.json",
        "model_type": "moshi",
        "lm_gen_config": {"temp": 0.6, "top_k": 100},
        "depformer_causal": True,
    }
    directory = _write_dir(tmp_path / "ckpt", config)
    (directory / "mimi.json").write_text(json.dumps(MIMI_CONFIG))
    ours = load_checkpoint_info(directory)
    reference = ref_loaders.CheckpointInfo.from_hf_repo(
        "unused/unused",
        moshi_weights=directory / "lm.safetensors",
        mimi_weights=directory / "codec.safetensors",
        tokenizer=directory / "spm.model",
        config_path=directory / "config.json",
        mimi_config_path=directory / "mimi.json",
    )
    assert ours.lm_kwargs == reference.lm_config
    assert ours.mimi_config == reference.mimi_config == MIMI_CONFIG
    assert ours.lm_gen_config == reference.lm_gen_config
    assert ours.model_type == reference.model_type
    assert ours.moshi_path == directory / "lm.safetensors"
    assert ours.mimi_path == directory / "codec.safetensors"
    assert ours.tokenizer_path == directory / "spm.model"
    assert ours.mimi_num_codebooks == 2
    # Built from the same kwargs, our module tree has exactly the reference's parameter names.
    reference_lm = ref_loaders.get_moshi_lm(
        None, lm_kwargs=reference.lm_config, dtype=torch.float32
    )
    assert set(build_lm(ours).state_dict()) == set(reference_lm.state_dict())


def test_missing_config_means_moshi_7b_like_reference(tmp_path: Path) -> None:
    directory = tmp_path / "legacy"
    directory.mkdir()
    info = load_checkpoint_info(directory)
    assert info.lm_kwargs == ref_loaders._lm_kwargs == MOSHI_7B_LM_KWARGS
    assert info.moshi_name == ref_loaders.MOSHI_NAME
    assert info.mimi_name == ref_loaders.MIMI_NAME
    assert info.tokenizer_name == ref_loaders.TEXT_TOKENIZER_NAME
    assert info.mimi_config is None
    assert personaplex_7b_lm_kwargs()["dep_q"] == 16 and MOSHI_7B_LM_KWARGS["dep_q"] == 8
    assert info.mimi_num_codebooks == 8
    info.lm_kwargs = personaplex_7b_lm_kwargs()
    assert info.mimi_num_codebooks == 8  # PersonaPlex's codec also runs 8 codebooks


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"moshi_name": "../outside.safetensors"}, "inside the checkpoint directory"),
        ({"moshi_name": "/abs/model.safetensors"}, "inside the checkpoint directory"),
        ({"mimi_name": "hf://kyutai/x/y.safetensors"}, "only local files"),
        ({"mimi_config_name": "absent.json"}, "is missing"),
    ],
)
def test_bad_config_entries_are_refused(
    tmp_path: Path, override: dict[str, Any], message: str
) -> None:
    directory = _write_dir(tmp_path / "ckpt", {**TINY_LM, **override})
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_checkpoint_info(directory)


def test_unreadable_and_unsupported_configs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_checkpoint_info(tmp_path / "nope")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_checkpoint_info(broken)
    unknown = _write_dir(tmp_path / "unknown", {**TINY_LM, "frobnicate": 3})
    with pytest.raises(ValueError, match="does not know"):
        build_lm(load_checkpoint_info(unknown))
    lora = _write_dir(tmp_path / "lora", {**TINY_LM, "lora": True})
    with pytest.raises(ValueError, match="LoRA"):
        build_lm(load_checkpoint_info(lora))


def test_weights_missing_or_mismatched(tmp_path: Path) -> None:
    directory = _write_dir(tmp_path / "ckpt", TINY_LM)
    info = load_checkpoint_info(directory)
    with pytest.raises(FileNotFoundError, match="LM weights"):
        load_lm(info)
    state = build_lm(info).state_dict()
    state.pop("text_linear.weight")
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    with pytest.raises(ValueError, match="text_linear.weight"):
        load_lm(info)


def test_memory_estimate_matches_real_tensors_and_7b_sizes(tmp_path: Path) -> None:
    from agent.plugins.personaplex import streaming
    from agent.plugins.personaplex.lm_config import estimate_lm_memory
    from agent.plugins.personaplex.lm_stepper import LMStepper

    info = load_checkpoint_info(_write_dir(tmp_path / "ckpt", TINY_LM))
    estimate = estimate_lm_memory(info, dtype=torch.float32)
    model = build_lm(info, dtype=torch.float32)
    stepper = LMStepper(model, 3)
    real_state = sum(
        v.numel() * v.element_size()
        for _, m in streaming.streaming_modules(stepper)
        for v in (m.state or {}).values()
    )
    assert estimate.weight_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert estimate.total_bytes(3) == estimate.weight_bytes + real_state

    info.lm_kwargs = personaplex_7b_lm_kwargs()
    big = estimate_lm_memory(info, dtype=torch.bfloat16)
    assert 8.3e9 < big.weight_bytes / 2 < 8.45e9  # PersonaPlex: about 8.37 B parameters
    # KV cache of 32 layers x 3000 frames x 4096 x (K and V) in bf16, per slot.
    assert big.state_bytes_per_slot >= 32 * 3000 * 4096 * 2 * 2
