"""Released checkpoint layouts both references read: fused or split attention names, and a
config.json that spells "no conditioning" as `"conditioners": {}` / `"fuser": null`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agent.plugins.personaplex import lm_config, mimi_config
from agent.plugins.personaplex import tiny_checkpoint as writer

pytestmark = pytest.mark.model


def split_copy(source: Path, target: Path) -> None:
    """The same weights under our per-step names (`in_projs.N` / `out_projs.N`)."""
    state = load_file(str(source))
    split: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for fused, name in ((".self_attn.in_proj_weight", "in_projs"),
                            (".self_attn.out_proj.weight", "out_projs")):
            if key.endswith(fused):
                stem = key[: -len(fused)]
                # The tiny models have one weight set per attention (no per-step weights)
                # except the depformer, whose steps are stacked rows of equal size.
                split[f"{stem}.self_attn.{name}.0.weight"] = value
                break
        else:
            split[key] = value
    save_file(split, str(target))


def test_mimi_loads_fused_and_split_attention_names_alike(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    info = lm_config.load_checkpoint_info(tiny_checkpoint)
    fused_path = tiny_checkpoint / writer.MIMI_WEIGHTS_NAME
    assert any(k.endswith(".self_attn.in_proj_weight") for k in load_file(str(fused_path)))
    split_path = tmp_path / "mimi_split.safetensors"
    split_copy(fused_path, split_path)
    fused = mimi_config.load_mimi(fused_path, info.mimi_config, "cpu", torch.float32, 8)
    split = mimi_config.load_mimi(split_path, info.mimi_config, "cpu", torch.float32, 8)
    fused_state, split_state = fused.state_dict(), split.state_dict()
    assert set(fused_state) == set(split_state)
    for key, value in fused_state.items():
        assert torch.equal(value, split_state[key]), key


def test_lm_loads_fused_and_split_attention_names_alike(tiny_checkpoint: Path) -> None:
    info = lm_config.load_checkpoint_info(tiny_checkpoint)
    fused = lm_config.load_lm(info, "cpu", torch.float32)
    saved = load_file(str(tiny_checkpoint / writer.LM_WEIGHTS_NAME))
    assert any(k.endswith(".self_attn.in_proj_weight") for k in saved)
    # Our own per-step names, written back from the loaded model, load to the same weights.
    split_dir = Path(str(tiny_checkpoint) + "-split")
    shutil.copytree(tiny_checkpoint, split_dir, dirs_exist_ok=True)
    save_file({k: v.contiguous() for k, v in fused.state_dict().items()},
              str(split_dir / writer.LM_WEIGHTS_NAME))
    split = lm_config.load_lm(lm_config.load_checkpoint_info(split_dir), "cpu", torch.float32)
    for key, value in fused.state_dict().items():
        assert torch.equal(value, split.state_dict()[key]), key


def _with_config(tiny_checkpoint: Path, tmp_path: Path, **changes: object) -> Path:
    directory = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_empty_conditioning_builds_the_unconditioned_lm(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    directory = _with_config(tiny_checkpoint, tmp_path, conditioners={}, fuser=None)
    lm = lm_config.load_lm(lm_config.load_checkpoint_info(directory), "cpu", torch.float32)
    plain = lm_config.load_lm(lm_config.load_checkpoint_info(tiny_checkpoint), "cpu", torch.float32)
    assert set(lm.state_dict()) == set(plain.state_dict())


@pytest.mark.parametrize("changes", [
    {"conditioners": {"description": {"type": "lut"}}},
    {"conditioners": {}, "fuser": {"sum": ["description"]}},
])
def test_real_conditioning_is_refused(tiny_checkpoint: Path, tmp_path: Path,
                                      changes: dict[str, object]) -> None:
    directory = _with_config(tiny_checkpoint, tmp_path, **changes)
    with pytest.raises(ValueError, match="conditioned LMs"):
        lm_config.load_lm(lm_config.load_checkpoint_info(directory), "cpu", torch.float32)
